//! One-sided communication: memory regions, remote keys, put / get / atomics /
//! put-with-signal, fences, signal words and semaphores.
//!
//! The owner maps memory (`courier_mem_map`), packs a remote key (`courier_rkey_pack`) and
//! sends it to a peer by any means; the peer unpacks it on its endpoint to the owner
//! (`courier_ep_rkey_unpack`) and reads, writes and updates the region with addresses in
//! the owner's process (`courier_mem_query` gives the base). Same-host peers reach
//! allocated memory directly; otherwise the owner's worker carries operations out while it
//! progresses, so the owner must keep progressing.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use courier_core::{
    AtomicOp, Buf, Cmp, MemMapParams, Memory, MemoryType, RemoteKey, Semaphore, SignalOp, access,
};

use crate::context::courier_context_t;
use crate::endpoint::courier_ep_t;
use crate::ffi::*;
use crate::handle::*;
use crate::request::{courier_op_params_t, courier_request_t, start};
use crate::status::*;
use crate::worker::courier_worker_t;

// ----- memory regions -----------------------------------------------------------------

/// Host memory.
pub const COURIER_MEMORY_TYPE_HOST: u32 = 0;
/// CUDA device memory (`COURIER_ERR_NO_DEVICE` / `COURIER_ERR_UNSUPPORTED` without CUDA).
pub const COURIER_MEMORY_TYPE_CUDA: u32 = 1;
/// On-NIC memory (falls back to host memory where there is none; see `courier_mem_query`).
pub const COURIER_MEMORY_TYPE_NIC: u32 = 2;

/// Peers may read the region (get).
pub const COURIER_ACCESS_READ: u32 = 1;
/// Peers may write the region (put, put-with-signal).
pub const COURIER_ACCESS_WRITE: u32 = 2;
/// Peers may run atomics on the region.
pub const COURIER_ACCESS_ATOMIC: u32 = 4;
/// All of the above (the default).
pub const COURIER_ACCESS_ALL: u32 = 7;

const _: () = {
    assert!(COURIER_ACCESS_READ == access::READ as u32);
    assert!(COURIER_ACCESS_WRITE == access::WRITE as u32);
    assert!(COURIER_ACCESS_ATOMIC == access::ATOMIC as u32);
    assert!(COURIER_ACCESS_ALL == access::ALL as u32);
};

/// `courier_mem_map_params_t.address` is set: register that existing buffer.
pub const COURIER_MEM_MAP_FIELD_ADDRESS: u64 = 1 << 0;
/// `courier_mem_map_params_t.length` is set.
pub const COURIER_MEM_MAP_FIELD_LENGTH: u64 = 1 << 1;
/// `courier_mem_map_params_t.flags` is set.
pub const COURIER_MEM_MAP_FIELD_FLAGS: u64 = 1 << 2;
/// `courier_mem_map_params_t.memory_type` is set (otherwise host).
pub const COURIER_MEM_MAP_FIELD_MEMORY_TYPE: u64 = 1 << 3;
/// `courier_mem_map_params_t.access` is set (otherwise `COURIER_ACCESS_ALL`).
pub const COURIER_MEM_MAP_FIELD_ACCESS: u64 = 1 << 4;

const MEM_MAP_FIELDS: u64 = COURIER_MEM_MAP_FIELD_ADDRESS
    | COURIER_MEM_MAP_FIELD_LENGTH
    | COURIER_MEM_MAP_FIELD_FLAGS
    | COURIER_MEM_MAP_FIELD_MEMORY_TYPE
    | COURIER_MEM_MAP_FIELD_ACCESS;

/// Allocate the memory (host memory goes in a shared segment same-host peers map).
pub const COURIER_MEM_MAP_FLAG_ALLOCATE: u32 = 1 << 0;

/// Parameters of `courier_mem_map`: either an address and length to register, or a length
/// with `COURIER_MEM_MAP_FLAG_ALLOCATE`.
#[repr(C)]
pub struct courier_mem_map_params_t {
    /// Which fields below are set (`COURIER_MEM_MAP_FIELD_*`).
    pub field_mask: u64,
    /// The buffer to register (stays the caller's; must outlive the mapping).
    pub address: *mut c_void,
    /// Length in bytes.
    pub length: usize,
    /// `COURIER_MEM_MAP_FLAG_*`.
    pub flags: u32,
    /// `COURIER_MEMORY_TYPE_*` asked for.
    pub memory_type: u32,
    /// `COURIER_ACCESS_*` rights given to peers.
    pub access: u32,
}

/// What `courier_mem_query` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct courier_mem_attr_t {
    /// Start address (in this process; peers use it as the remote address).
    pub address: *mut c_void,
    /// Length in bytes.
    pub length: usize,
    /// The `COURIER_MEMORY_TYPE_*` actually given.
    pub memory_type: u32,
}

/// A mapped memory region.
pub struct courier_mem_t {
    pub(crate) mem: Memory,
}
handle_kind!(courier_mem_t, 6, "memory");

fn mem_type_from(t: u32) -> Result<MemoryType, courier_core::Error> {
    match t {
        COURIER_MEMORY_TYPE_HOST => Ok(MemoryType::Host),
        COURIER_MEMORY_TYPE_CUDA => Ok(MemoryType::Cuda),
        COURIER_MEMORY_TYPE_NIC => Ok(MemoryType::Nic),
        _ => Err(invalid(&format!("unknown memory type {t}"))),
    }
}

fn mem_type_to(t: MemoryType) -> u32 {
    match t {
        MemoryType::Host => COURIER_MEMORY_TYPE_HOST,
        MemoryType::Cuda => COURIER_MEMORY_TYPE_CUDA,
        MemoryType::Nic => COURIER_MEMORY_TYPE_NIC,
    }
}

/// Register (`COURIER_MEM_MAP_FIELD_ADDRESS` + length) or allocate
/// (`COURIER_MEM_MAP_FLAG_ALLOCATE` + length) memory peers can reach with a remote key.
/// `COURIER_ERR_INVALID_PARAM` for unknown bits in `field_mask`, `flags` or `access`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_mem_map(
    context: *const courier_context_t,
    params: *const courier_mem_map_params_t,
    mem_out: *mut *mut courier_mem_t,
) -> courier_status_t {
    boundary(|| {
        let c = get(context, "context")?;
        // SAFETY: NULL (refused or defaulted) or the caller's valid params struct.
        let p = unsafe { arg(params, "params") }?;
        let out = out_arg(mem_out, "mem_out")?;
        known_bits("mem_map field_mask", p.field_mask, MEM_MAP_FIELDS)?;
        let address = has(p.field_mask, COURIER_MEM_MAP_FIELD_ADDRESS).then_some(p.address);
        let length = if has(p.field_mask, COURIER_MEM_MAP_FIELD_LENGTH) {
            p.length
        } else {
            0
        };
        let mut allocate = false;
        if has(p.field_mask, COURIER_MEM_MAP_FIELD_FLAGS) {
            known_bits(
                "mem_map flags",
                p.flags as u64,
                COURIER_MEM_MAP_FLAG_ALLOCATE as u64,
            )?;
            allocate = p.flags & COURIER_MEM_MAP_FLAG_ALLOCATE != 0;
        }
        let mut mp = match (address, allocate) {
            (Some(_), true) => {
                return Err(invalid(
                    "give an address to register, or allocate, not both",
                ));
            }
            // SAFETY: courier_mem_map's documented contract: the caller's buffer stays
            // valid until courier_mem_unmap, and it does not touch it while remote
            // operations may access it.
            (Some(a), false) => unsafe { MemMapParams::register(a as *mut u8, length) },
            (None, true) => MemMapParams::allocate(length),
            (None, false) => MemMapParams::default(),
        };
        if has(p.field_mask, COURIER_MEM_MAP_FIELD_MEMORY_TYPE) {
            mp.memory_type = mem_type_from(p.memory_type)?;
        }
        if has(p.field_mask, COURIER_MEM_MAP_FIELD_ACCESS) {
            known_bits("mem_map access", p.access as u64, COURIER_ACCESS_ALL as u64)?;
            mp.access = p.access as u16;
        }
        let mem = c.ctx.mem_map(mp)?;
        let h = insert(courier_mem_t { mem })?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Release a region's handle, unmapping it. Remote keys made from it stop working;
/// allocated memory is released (once no call on another thread still uses it).
/// `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a region already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_mem_destroy(mem: *mut courier_mem_t) -> courier_status_t {
    boundary(|| {
        drop(remove(mem, "mem")?);
        Ok(COURIER_OK)
    })
}

/// `courier_mem_destroy` by the name that pairs with `courier_mem_map` (as UCX's
/// `ucp_mem_unmap` does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_mem_unmap(mem: *mut courier_mem_t) -> courier_status_t {
    // SAFETY: forwarded contract.
    unsafe { courier_mem_destroy(mem) }
}

/// Address, length and the memory type actually given.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_mem_query(
    mem: *const courier_mem_t,
    attr_out: *mut courier_mem_attr_t,
) -> courier_status_t {
    boundary(|| {
        let m = get(mem, "mem")?;
        let out = out_arg(attr_out, "attr_out")?;
        let a = m.mem.query();
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe {
            *out = courier_mem_attr_t {
                address: a.address as *mut c_void,
                length: a.length,
                memory_type: mem_type_to(a.memory_type),
            }
        };
        Ok(COURIER_OK)
    })
}

/// Pack the region's remote key: bytes to send to peers. Release `*buffer_out` with
/// `courier_buffer_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_rkey_pack(
    mem: *const courier_mem_t,
    buffer_out: *mut *mut c_void,
    length_out: *mut usize,
) -> courier_status_t {
    boundary(|| {
        let m = get(mem, "mem")?;
        let out = out_arg(buffer_out, "buffer_out")?;
        let len_out = out_arg(length_out, "length_out")?;
        let k = m.mem.pack_rkey()?;
        let p = malloc_copy(&k)?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe {
            *out = p;
            *len_out = k.len();
        }
        Ok(COURIER_OK)
    })
}

// ----- remote keys ----------------------------------------------------------------------

/// A peer's remote key, unpacked for use on one endpoint.
pub struct courier_rkey_t {
    pub(crate) key: RemoteKey,
}
handle_kind!(courier_rkey_t, 7, "remote key");

/// Unpack a peer's packed remote key for operations on `ep` (the endpoint to that peer).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_rkey_unpack(
    ep: *const courier_ep_t,
    buffer: *const c_void,
    length: usize,
    rkey_out: *mut *mut courier_rkey_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let out = out_arg(rkey_out, "rkey_out")?;
        // SAFETY: the caller promises that many readable bytes (NULL only with 0).
        let bytes = unsafe { bytes_arg(buffer, length, "buffer") }?;
        let key = e.ep.rkey_unpack(bytes)?;
        let h = insert(courier_rkey_t { key })?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Release an unpacked remote key. Operations in flight keep what they need.
/// `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a key already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_rkey_destroy(rkey: *mut courier_rkey_t) -> courier_status_t {
    boundary(|| {
        drop(remove(rkey, "rkey")?);
        Ok(COURIER_OK)
    })
}

/// The region's start address and length in the owner's process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_rkey_bounds(
    rkey: *const courier_rkey_t,
    base_out: *mut u64,
    length_out: *mut u64,
) -> courier_status_t {
    boundary(|| {
        let k = get(rkey, "rkey")?;
        let b = out_arg(base_out, "base_out")?;
        let l = out_arg(length_out, "length_out")?;
        let (base, len) = k.key.bounds();
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe {
            *b = base;
            *l = len;
        }
        Ok(COURIER_OK)
    })
}

/// How operations with this key reach the region: "local", "direct", "cma" or "remote"
/// (static string; "" for an invalid handle, with the reason in
/// `courier_last_error_detail()`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_rkey_path(rkey: *const courier_rkey_t) -> *const c_char {
    boundary_or(c"".as_ptr(), || match get(rkey, "rkey") {
        Ok(k) => match k.key.path() {
            "local" => c"local".as_ptr(),
            "direct" => c"direct".as_ptr(),
            "cma" => c"cma".as_ptr(),
            _ => c"remote".as_ptr(),
        },
        Err(e) => {
            record(&e);
            c"".as_ptr()
        }
    })
}

/// A pointer valid in this process for `remote_addr`, when the region is mapped here
/// (same host and allocated memory, or this very context); `COURIER_ERR_UNSUPPORTED`
/// otherwise, `COURIER_ERR_OUT_OF_RANGE` for an address outside the key's region, and
/// `COURIER_ERR_INVALID_KEY` for a region its owner no longer maps or a key that does not
/// match it. Such memory may be accessed with plain loads and stores.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_rkey_ptr(
    rkey: *const courier_rkey_t,
    remote_addr: u64,
    ptr_out: *mut *mut c_void,
) -> courier_status_t {
    boundary(|| {
        let k = get(rkey, "rkey")?;
        let out = out_arg(ptr_out, "ptr_out")?;
        let p = k.key.local_ptr(remote_addr)?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = p as *mut c_void };
        Ok(COURIER_OK)
    })
}

// ----- operations -------------------------------------------------------------------------

/// `*p += value`
pub const COURIER_ATOMIC_OP_ADD: u32 = 0;
/// `*p &= value`
pub const COURIER_ATOMIC_OP_AND: u32 = 1;
/// `*p |= value`
pub const COURIER_ATOMIC_OP_OR: u32 = 2;
/// `*p ^= value`
pub const COURIER_ATOMIC_OP_XOR: u32 = 3;
/// `*p = value`
pub const COURIER_ATOMIC_OP_SWAP: u32 = 4;
/// `if (*p == compare) *p = value`
pub const COURIER_ATOMIC_OP_CSWAP: u32 = 5;

/// Put-with-signal: store the value in the signal word.
pub const COURIER_SIGNAL_SET: u32 = 0;
/// Put-with-signal: add the value to the signal word.
pub const COURIER_SIGNAL_ADD: u32 = 1;

fn atomic_op(op: u32) -> Result<AtomicOp, courier_core::Error> {
    Ok(match op {
        COURIER_ATOMIC_OP_ADD => AtomicOp::Add,
        COURIER_ATOMIC_OP_AND => AtomicOp::And,
        COURIER_ATOMIC_OP_OR => AtomicOp::Or,
        COURIER_ATOMIC_OP_XOR => AtomicOp::Xor,
        COURIER_ATOMIC_OP_SWAP => AtomicOp::Swap,
        COURIER_ATOMIC_OP_CSWAP => AtomicOp::Cswap,
        _ => return Err(invalid(&format!("unknown atomic op {op}"))),
    })
}

fn signal_op(op: u32) -> Result<SignalOp, courier_core::Error> {
    Ok(match op {
        COURIER_SIGNAL_SET => SignalOp::Set,
        COURIER_SIGNAL_ADD => SignalOp::Add,
        _ => return Err(invalid(&format!("unknown signal op {op}"))),
    })
}

/// Write `length` bytes from `buffer` at `remote_addr` in the peer's region. Completes when
/// `buffer` may be reused (`COURIER_OK` at once when the region is mapped here or reached by
/// CMA, the data then in place); when the owner carries the put out (tcp), once the data has
/// left this process. `courier_ep_flush` says when every earlier put is in place.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_put(
    ep: *const courier_ep_t,
    buffer: *const c_void,
    length: usize,
    remote_addr: u64,
    rkey: *const courier_rkey_t,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let k = get(rkey, "rkey")?;
        let b = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.put_raw(b, remote_addr, &k.key, cb)
            })
        }
    })
}

/// Read `length` bytes at `remote_addr` in the peer's region into `buffer`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_get(
    ep: *const courier_ep_t,
    buffer: *mut c_void,
    length: usize,
    remote_addr: u64,
    rkey: *const courier_rkey_t,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let k = get(rkey, "rkey")?;
        let b = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.get_raw(b, remote_addr, &k.key, cb)
            })
        }
    })
}

/// An atomic `op` (`COURIER_ATOMIC_OP_*`) on the `size`-byte word (4 or 8, aligned) at
/// `remote_addr`. The word's old value is the completion info's `value` (`params->info` when
/// it completes at once, else `courier_request_info` or the callback's info). `compare` is
/// used by `COURIER_ATOMIC_OP_CSWAP` only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_atomic(
    ep: *const courier_ep_t,
    op: u32,
    value: u64,
    compare: u64,
    size: u32,
    remote_addr: u64,
    rkey: *const courier_rkey_t,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let k = get(rkey, "rkey")?;
        let op = atomic_op(op)?;
        let bits32 = atomic_bits32(size)?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.atomic_raw(op, value, compare, remote_addr, &k.key, bits32, cb)
            })
        }
    })
}

/// Whether an atomic of `size` bytes works on a 32-bit word (4) or a 64-bit one (8).
fn atomic_bits32(size: u32) -> Result<bool, courier_core::Error> {
    match size {
        4 => Ok(true),
        8 => Ok(false),
        _ => Err(invalid(&format!("atomic size {size} (expected 4 or 8)"))),
    }
}

/// A posted (non-fetching) atomic: `op` (`COURIER_ATOMIC_OP_ADD`, `_AND`, `_OR` or `_XOR`)
/// with `value` on the `size`-byte word (4 or 8, aligned) at `remote_addr`; no old value, no
/// request. On a region mapped here it is done when this returns; otherwise the owner answers
/// only if it refuses it, and `courier_ep_flush` confirms it or reports the refusal.
/// `COURIER_ATOMIC_OP_SWAP` and `_CSWAP` fetch by nature: `COURIER_ERR_INVALID_PARAM` (use
/// `courier_ep_atomic`). What the key itself shows to be wrong is refused at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_atomic_post(
    ep: *const courier_ep_t,
    op: u32,
    value: u64,
    size: u32,
    remote_addr: u64,
    rkey: *const courier_rkey_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let k = get(rkey, "rkey")?;
        let op = atomic_op(op)?;
        let bits32 = atomic_bits32(size)?;
        e.ep.atomic_post(op, value, remote_addr, &k.key, bits32)?;
        Ok(COURIER_OK)
    })
}

/// Write `length` bytes at `remote_addr`, then update the 8-byte signal word at
/// `signal_addr` (`COURIER_SIGNAL_SET` or `COURIER_SIGNAL_ADD` `signal_value`), as one
/// operation: whoever sees the signal change sees the data.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_put_signal(
    ep: *const courier_ep_t,
    buffer: *const c_void,
    length: usize,
    remote_addr: u64,
    rkey: *const courier_rkey_t,
    signal_addr: u64,
    signal_rkey: *const courier_rkey_t,
    signal_value: u64,
    signal_op_: u32,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
) -> courier_status_t {
    boundary(|| {
        let e = get(ep, "ep")?;
        let k = get(rkey, "rkey")?;
        let sk = get(signal_rkey, "signal_rkey")?;
        let op = signal_op(signal_op_)?;
        let b: Buf = one(buffer, length, "buffer")?;
        // SAFETY: the caller keeps the buffers valid until completion (courier.h's contract).
        unsafe {
            start(e.ep.worker(), params, req_out, |cb| {
                e.ep.put_signal_raw(
                    b,
                    remote_addr,
                    &k.key,
                    signal_addr,
                    &sk.key,
                    signal_value,
                    op,
                    cb,
                )
            })
        }
    })
}

/// Order: operations on `ep` issued after the fence are carried out after those before it.
/// (`courier_ep_flush` waits until they are all complete.)
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_ep_fence(ep: *const courier_ep_t) -> courier_status_t {
    boundary(|| {
        get(ep, "ep")?.ep.fence()?;
        Ok(COURIER_OK)
    })
}

// ----- signal words -----------------------------------------------------------------------

/// `==`
pub const COURIER_CMP_EQ: u32 = 0;
/// `!=`
pub const COURIER_CMP_NE: u32 = 1;
/// `>`
pub const COURIER_CMP_GT: u32 = 2;
/// `>=`
pub const COURIER_CMP_GE: u32 = 3;
/// `<`
pub const COURIER_CMP_LT: u32 = 4;
/// `<=`
pub const COURIER_CMP_LE: u32 = 5;

/// `courier_signal_wait_until`: after a short spin, sleep on the worker's event fd (woken
/// by a peer's put-with-signal to this worker, framed or written directly; at most
/// `COURIER_SIGNAL_NAP`, 1 ms by default, at a time for writes that wake no one) instead of
/// spinning. Without `COURIER_FEATURE_WAKEUP`, or without a worker, it spins,
/// yielding the CPU between checks.
pub const COURIER_SIGNAL_WAIT_FLAG_SLEEP: u32 = 1 << 0;

fn cmp_of(cmp: u32) -> Result<Cmp, courier_core::Error> {
    Ok(match cmp {
        COURIER_CMP_EQ => Cmp::Eq,
        COURIER_CMP_NE => Cmp::Ne,
        COURIER_CMP_GT => Cmp::Gt,
        COURIER_CMP_GE => Cmp::Ge,
        COURIER_CMP_LT => Cmp::Lt,
        COURIER_CMP_LE => Cmp::Le,
        _ => return Err(invalid(&format!("unknown comparison {cmp}"))),
    })
}

// The C numbers follow the library's order.
const _: () = {
    assert!(COURIER_CMP_EQ == Cmp::Eq as u32);
    assert!(COURIER_CMP_LE == Cmp::Le as u32);
};

/// Read the 8-byte signal word at `offset` (aligned) in a local region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_signal_fetch(
    mem: *const courier_mem_t,
    offset: usize,
    value_out: *mut u64,
) -> courier_status_t {
    boundary(|| {
        let m = get(mem, "mem")?;
        let out = out_arg(value_out, "value_out")?;
        let v = m.mem.signal_fetch(offset)?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = v };
        Ok(COURIER_OK)
    })
}

/// Wait until the signal word at `offset` satisfies `word <cmp> value` (`COURIER_CMP_*`),
/// progressing `worker` meanwhile (NULL: only watch the word, for a peer that writes it
/// directly). `timeout_ms` < 0 waits without limit; `COURIER_ERR_TIMEOUT` when it passes.
/// `*value_out` (may be NULL) gets the value that met the condition. Not inside a callback.
/// `flags`: `COURIER_SIGNAL_WAIT_FLAG_*`; unknown bits are `COURIER_ERR_INVALID_PARAM`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_signal_wait_until(
    mem: *const courier_mem_t,
    worker: *const courier_worker_t,
    offset: usize,
    cmp: u32,
    value: u64,
    flags: u32,
    timeout_ms: i64,
    value_out: *mut u64,
) -> courier_status_t {
    boundary(|| {
        let m = get(mem, "mem")?;
        // NULL: no worker to progress; otherwise a live worker handle.
        let w = if worker.is_null() {
            None
        } else {
            Some(get(worker, "worker")?)
        };
        let cmp = cmp_of(cmp)?;
        known_bits(
            "signal wait flags",
            flags as u64,
            COURIER_SIGNAL_WAIT_FLAG_SLEEP as u64,
        )?;
        if w.is_some() && in_callback() {
            return Err(invalid(
                "courier_signal_wait_until inside a callback cannot progress the worker",
            ));
        }
        let sleep = flags & COURIER_SIGNAL_WAIT_FLAG_SLEEP != 0;
        let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        let v = m.mem.signal_wait_until_timeout(
            w.as_ref().map(|w| &w.w),
            offset,
            cmp,
            value,
            sleep,
            timeout,
        )?;
        if !value_out.is_null() {
            // SAFETY: checked non-NULL just above; the caller's output.
            unsafe { *value_out = v };
        }
        Ok(COURIER_OK)
    })
}

// ----- semaphores ---------------------------------------------------------------------------

/// Value 0 or 1.
pub const COURIER_SEM_FLAG_BOOLEAN: u32 = 1;
/// Value counts up to `COURIER_SEM_MAX`.
pub const COURIER_SEM_FLAG_INTEGER: u32 = 2;
/// One producer.
pub const COURIER_SEM_FLAG_SPRODUCER: u32 = 4;
/// Many producers.
pub const COURIER_SEM_FLAG_MPRODUCER: u32 = 8;
/// One consumer.
pub const COURIER_SEM_FLAG_SCONSUMER: u32 = 16;
/// Many consumers.
pub const COURIER_SEM_FLAG_MCONSUMER: u32 = 32;
/// The largest value an integer semaphore holds.
pub const COURIER_SEM_MAX: u64 = 65535;

const _: () = {
    use courier_core::sem_flags;
    assert!(COURIER_SEM_FLAG_BOOLEAN == sem_flags::BOOLEAN);
    assert!(COURIER_SEM_FLAG_INTEGER == sem_flags::INTEGER);
    assert!(COURIER_SEM_FLAG_SPRODUCER == sem_flags::SPRODUCER);
    assert!(COURIER_SEM_FLAG_MPRODUCER == sem_flags::MPRODUCER);
    assert!(COURIER_SEM_FLAG_SCONSUMER == sem_flags::SCONSUMER);
    assert!(COURIER_SEM_FLAG_MCONSUMER == sem_flags::MCONSUMER);
    assert!(COURIER_SEM_MAX == courier_core::SEM_MAX);
};

const SEM_FLAGS: u32 = COURIER_SEM_FLAG_BOOLEAN
    | COURIER_SEM_FLAG_INTEGER
    | COURIER_SEM_FLAG_SPRODUCER
    | COURIER_SEM_FLAG_MPRODUCER
    | COURIER_SEM_FLAG_SCONSUMER
    | COURIER_SEM_FLAG_MCONSUMER;

/// A semaphore in this process's memory (Berkeley UPC `bupc_sem_t`); peers post to it with
/// an atomic add or a put-with-signal (`COURIER_SIGNAL_ADD`) through `courier_sem_remote`.
/// Its word counts posts and only rises (the owner counts its takes apart, so a wait only
/// reads the word): any other operation on it breaks the count.
pub struct courier_sem_t {
    sem: Semaphore,
}
handle_kind!(courier_sem_t, 12, "semaphore");

/// Create a semaphore at 0. `flags` 0 is INTEGER | MPRODUCER | MCONSUMER; otherwise exactly
/// one of BOOLEAN / INTEGER and at most one of each producer and consumer kind, and no other
/// bits (`COURIER_ERR_INVALID_PARAM`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_create(
    context: *const courier_context_t,
    flags: u32,
    sem_out: *mut *mut courier_sem_t,
) -> courier_status_t {
    boundary(|| {
        let c = get(context, "context")?;
        let out = out_arg(sem_out, "sem_out")?;
        known_bits("semaphore flags", flags as u64, SEM_FLAGS as u64)?;
        let sem = Semaphore::new(&c.ctx, flags)?;
        let h = insert(courier_sem_t { sem })?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Destroy a semaphore. `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a
/// semaphore already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_destroy(sem: *mut courier_sem_t) -> courier_status_t {
    boundary(|| {
        drop(remove(sem, "sem")?);
        Ok(COURIER_OK)
    })
}

/// Add `n`; `COURIER_ERR_INVALID_PARAM` if that would pass the maximum.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_post(sem: *const courier_sem_t, n: u64) -> courier_status_t {
    boundary(|| {
        get(sem, "sem")?.sem.post(n)?;
        Ok(COURIER_OK)
    })
}

/// Take `n` if available now: `COURIER_OK`, or `COURIER_ERR_NO_RESOURCE` (nothing taken).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_try(sem: *const courier_sem_t, n: u64) -> courier_status_t {
    boundary(|| {
        if get(sem, "sem")?.sem.try_wait(n) {
            Ok(COURIER_OK)
        } else {
            Ok(COURIER_ERR_NO_RESOURCE)
        }
    })
}

/// Wait until at least `n` is there and take it, progressing `worker` (spinning, without
/// limit). Not inside a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_wait(
    sem: *const courier_sem_t,
    worker: *const courier_worker_t,
    n: u64,
) -> courier_status_t {
    // SAFETY: forwarded contract.
    unsafe { courier_sem_wait_timeout(sem, worker, n, 0, -1) }
}

/// `courier_sem_wait` with `flags` (`COURIER_SIGNAL_WAIT_FLAG_SLEEP`: after a short spin,
/// sleep on the worker's event fd, woken by a peer's signalling put) and a limit
/// (`timeout_ms` < 0: none; `COURIER_ERR_TIMEOUT` when it passes). A wait for more than a
/// boolean semaphore holds, or unknown `flags` bits, is `COURIER_ERR_INVALID_PARAM`. Not
/// inside a callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_wait_timeout(
    sem: *const courier_sem_t,
    worker: *const courier_worker_t,
    n: u64,
    flags: u32,
    timeout_ms: i64,
) -> courier_status_t {
    boundary(|| {
        let s = get(sem, "sem")?;
        let w = get(worker, "worker")?;
        known_bits(
            "semaphore wait flags",
            flags as u64,
            COURIER_SIGNAL_WAIT_FLAG_SLEEP as u64,
        )?;
        if in_callback() {
            return Err(invalid(
                "courier_sem_wait inside a callback cannot progress the worker",
            ));
        }
        let sleep = flags & COURIER_SIGNAL_WAIT_FLAG_SLEEP != 0;
        let timeout = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        s.sem.wait_timeout(&w.w, n, sleep, timeout)?;
        Ok(COURIER_OK)
    })
}

/// The current value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_value(
    sem: *const courier_sem_t,
    value_out: *mut u64,
) -> courier_status_t {
    boundary(|| {
        let s = get(sem, "sem")?;
        let out = out_arg(value_out, "value_out")?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = s.sem.value() };
        Ok(COURIER_OK)
    })
}

/// What peers need to post remotely: the packed remote key (release `*rkey_out` with
/// `courier_buffer_free`) and the address of the semaphore's 8-byte word, the count of
/// posts: post `n` with an atomic add of `n` or a put-with-signal `COURIER_SIGNAL_ADD`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_sem_remote(
    sem: *const courier_sem_t,
    rkey_out: *mut *mut c_void,
    rkey_length_out: *mut usize,
    address_out: *mut u64,
) -> courier_status_t {
    boundary(|| {
        let s = get(sem, "sem")?;
        let out = out_arg(rkey_out, "rkey_out")?;
        let len_out = out_arg(rkey_length_out, "rkey_length_out")?;
        let addr_out = out_arg(address_out, "address_out")?;
        let (k, addr) = s.sem.remote()?;
        let p = malloc_copy(&k)?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe {
            *out = p;
            *len_out = k.len();
            *addr_out = addr;
        }
        Ok(COURIER_OK)
    })
}
