//! Memory management: `shmem_malloc` and kin, collective over the world. Each returns
//! after a barrier, so every PE has the block before anyone uses it; `shmem_free` and
//! `shmem_realloc` synchronize first, so nobody still uses the old one.

use std::ffi::{c_long, c_void};
use std::sync::Once;

use crate::coll::{barrier_world, sync_team};
use crate::error::{guard, warn};
use crate::heap::{AllocError, MIN_ALIGN};
use crate::init::{World, world};
use crate::team::world_team;

/// `SHMEM_MALLOC_ATOMICS_REMOTE`, `SHMEM_MALLOC_SIGNAL_REMOTE`.
const SPEC_HINTS: c_long = 0b11;
/// Open MPI's `SHMEM_HINT_*` bits (`shmemx.h`): low-latency, high-bandwidth, near-NIC,
/// GPU and NIC memory, pSync, pWrk, atomics.
const OMPI_HINTS: c_long = 0b1_1111 | (0b111 << 16);
/// `SHMEM_HINT_DEVICE_NIC_MEM`.
const HINT_NIC: c_long = 1 << 4;

fn alloc(w: &World, call: &'static str, size: usize, align: usize) -> *mut c_void {
    alloc_zeroed(w, call, size, align, false)
}

/// Allocate (zeroing the local block when `zero`, before the barrier: after it, peers may
/// already write into it).
fn alloc_zeroed(
    w: &World,
    call: &'static str,
    size: usize,
    align: usize,
    zero: bool,
) -> *mut c_void {
    let got = if size == 0 {
        None
    } else {
        let mut a = w.alloc.lock().unwrap_or_else(|p| p.into_inner());
        match a.alloc(size, align) {
            Ok(off) => {
                if zero {
                    // SAFETY: a fresh block of `size` bytes of this PE's heap; nobody else
                    // knows of it before the barrier below.
                    unsafe { std::ptr::write_bytes((w.heap.base + off) as *mut u8, 0, size) };
                }
                Some(off)
            }
            Err(AllocError::BadAlign) => {
                warn(
                    call,
                    format_args!(
                        "alignment={align}: not a power of two of at most 32 MiB (the heap's own alignment); returning NULL"
                    ),
                );
                None
            }
            Err(AllocError::Exhausted { largest }) => {
                warn(
                    call,
                    format_args!(
                        "size={size}: the symmetric heap is exhausted (its largest free block has {largest} of {} bytes; raise SHMEM_SYMMETRIC_SIZE); returning NULL",
                        a.capacity()
                    ),
                );
                None
            }
        }
    };
    barrier_world(w, call);
    match got {
        Some(off) => (w.heap.base + off) as *mut c_void,
        None => std::ptr::null_mut(),
    }
}

/// The heap offset of a block `ptr` that an allocation returned, or a fatal error.
fn block_of(w: &World, call: &'static str, ptr: *mut c_void) -> usize {
    let off = (ptr as usize).wrapping_sub(w.heap.base);
    let a = w.alloc.lock().unwrap_or_else(|p| p.into_inner());
    if off >= w.heap.len || a.block_len(off).is_none() {
        drop(a);
        crate::error::fatal(
            call,
            format_args!(
                "ptr={ptr:p}: not a block of the symmetric heap (never allocated, or already freed)"
            ),
        )
    }
    off
}

fn free(w: &World, call: &'static str, ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let off = block_of(w, call, ptr);
    barrier_world(w, call);
    w.alloc.lock().unwrap_or_else(|p| p.into_inner()).free(off);
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_malloc(size: usize) -> *mut c_void {
    guard("shmem_malloc", || {
        alloc(world("shmem_malloc"), "shmem_malloc", size, MIN_ALIGN)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmalloc(size: usize) -> *mut c_void {
    guard("shmalloc", || {
        alloc(world("shmalloc"), "shmalloc", size, MIN_ALIGN)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_calloc(count: usize, size: usize) -> *mut c_void {
    guard("shmem_calloc", || {
        let w = world("shmem_calloc");
        let Some(total) = count.checked_mul(size) else {
            warn(
                "shmem_calloc",
                format_args!("count={count} × size={size} overflows; returning NULL"),
            );
            barrier_world(w, "shmem_calloc");
            return std::ptr::null_mut();
        };
        alloc_zeroed(w, "shmem_calloc", total, MIN_ALIGN, true)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_align(alignment: usize, size: usize) -> *mut c_void {
    guard("shmem_align", || {
        alloc(world("shmem_align"), "shmem_align", size, alignment)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmemalign(alignment: usize, size: usize) -> *mut c_void {
    guard("shmemalign", || {
        alloc(world("shmemalign"), "shmemalign", size, alignment)
    })
}

fn with_hints(call: &'static str, size: usize, hints: c_long) -> *mut c_void {
    let w = world(call);
    if hints & !(SPEC_HINTS | OMPI_HINTS) != 0 {
        crate::error::debug(format_args!(
            "{call}: hints={hints:#x}: unknown bits ignored"
        ));
    }
    if hints & HINT_NIC != 0 {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            tracing::info!(
                "{call}: SHMEM_HINT_DEVICE_NIC_MEM: no RDMA device with on-chip memory here; the block is host memory of the symmetric heap"
            )
        });
    }
    alloc(w, call, size, MIN_ALIGN)
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_malloc_with_hints(size: usize, hints: c_long) -> *mut c_void {
    guard("shmem_malloc_with_hints", || {
        with_hints("shmem_malloc_with_hints", size, hints)
    })
}

/// Open MPI's name (`shmemx.h`), so programs written for OSHMEM link.
#[unsafe(no_mangle)]
pub extern "C" fn shmemx_malloc_with_hint(size: usize, hint: c_long) -> *mut c_void {
    guard("shmemx_malloc_with_hint", || {
        with_hints("shmemx_malloc_with_hint", size, hint)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_free(ptr: *mut c_void) {
    guard("shmem_free", || {
        free(world("shmem_free"), "shmem_free", ptr)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shfree(ptr: *mut c_void) {
    guard("shfree", || free(world("shfree"), "shfree", ptr))
}

fn realloc(call: &'static str, ptr: *mut c_void, size: usize) -> *mut c_void {
    let w = world(call);
    if ptr.is_null() {
        return alloc(w, call, size, MIN_ALIGN);
    }
    if size == 0 {
        free(w, call, ptr);
        return std::ptr::null_mut();
    }
    let off = block_of(w, call, ptr);
    // Everything aimed at the old block has landed before it moves.
    barrier_world(w, call);
    let moved = {
        let mut a = w.alloc.lock().unwrap_or_else(|p| p.into_inner());
        let old = a.block_len(off).unwrap_or(0);
        if a.resize_in_place(off, size) {
            Ok(off)
        } else {
            match a.alloc(size, MIN_ALIGN) {
                Ok(new) => {
                    // SAFETY: two distinct blocks of this PE's heap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            (w.heap.base + off) as *const u8,
                            (w.heap.base + new) as *mut u8,
                            old.min(size),
                        )
                    };
                    a.free(off);
                    Ok(new)
                }
                Err(_) => Err(a.largest_free()),
            }
        }
    };
    sync_team(w, call, world_team());
    match moved {
        Ok(o) => (w.heap.base + o) as *mut c_void,
        Err(largest) => {
            warn(
                call,
                format_args!(
                    "size={size}: the symmetric heap is exhausted (largest free block {largest} bytes); the old block is kept; returning NULL"
                ),
            );
            std::ptr::null_mut()
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    guard("shmem_realloc", || realloc("shmem_realloc", ptr, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn shrealloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    guard("shrealloc", || realloc("shrealloc", ptr, size))
}
