//! The shared segment: one memfd, mapped by both processes. Its layout (header, FIFOs,
//! cells) is `wire::shm`'s.
//!
//! Every field the peer can write is an atomic, read through a shared reference to atomics
//! (sound for memory another process mutates) or through raw pointers; nothing here hands
//! out plain references to peer-written bytes.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;

use crate::base::{Error, Result, Status};

pub(super) use crate::wire::shm::{
    CELL, CELL_HDR, HEADER_SIZE, LAYOUT, MAGIC, MAX_CELLS, MIN_CELLS, PROBE_OFFSET, SegHeader,
    SegInfo, VERSION, fifo_bytes, fifo_offset,
};

/// Total segment size for `ncells` cells per FIFO, a whole number of pages.
pub(super) fn seg_size(ncells: usize) -> usize {
    let raw = HEADER_SIZE + 2 * fifo_bytes(ncells);
    let page = rustix::param::page_size().max(4096);
    raw.div_ceil(page) * page
}

/// Whether `n` is an acceptable cell count.
pub(super) fn valid_ncells(n: usize) -> bool {
    n.is_power_of_two() && (MIN_CELLS..=MAX_CELLS).contains(&n)
}

/// A shared mapping of the whole segment; unmapped on drop.
pub(super) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics or
// through the single-producer/single-consumer protocol of `fifo`, which does not depend on
// the accessing thread. Unmapping happens once, in Drop.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` shared, read-write.
    pub fn map(fd: &OwnedFd, len: usize) -> Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; it overlaps nothing of ours.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd.as_fd(),
                0,
            )
        }
        .map_err(|e| Error::io("shm: mmap of the shared segment", e))?;
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::new(Status::IoError, "shm: mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    pub fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The header (all atomics, so a shared reference is sound even while the peer writes).
    pub fn header(&self) -> &SegHeader {
        // SAFETY: the mapping is at least HEADER_SIZE bytes (checked by both constructors),
        // page-aligned, and SegHeader consists only of atomics.
        unsafe { &*self.ptr.as_ptr().cast::<SegHeader>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nothing refers to it any more (the
        // Mapping is owned by an Arc that both halves of the link share).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Create, size, seal and map a fresh segment, and write its header.
pub(super) fn create(ncells: usize) -> Result<(OwnedFd, Mapping)> {
    use rustix::fs::{MemfdFlags, SealFlags};
    if !valid_ncells(ncells) {
        return Err(Error::msg(
            Status::BadConfig,
            format!(
                "shm: FIFO size {ncells} is not a power of two from {MIN_CELLS} to {MAX_CELLS}"
            ),
        ));
    }
    let size = seg_size(ncells);
    let fd = rustix::fs::memfd_create(
        "courier-shm",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| Error::io("shm: memfd_create", e))?;
    rustix::fs::ftruncate(&fd, size as u64)
        .map_err(|e| Error::io("shm: sizing the segment (ftruncate)", e))?;
    // Sealed so that neither side can shrink the file under the other's mapping (SIGBUS).
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(|e| Error::io("shm: sealing the segment", e))?;
    let map = Mapping::map(&fd, size)?;
    let h = map.header();
    h.version.store(VERSION, Relaxed);
    h.cell_size.store(CELL as u32, Relaxed);
    h.ncells.store(ncells as u32, Relaxed);
    h.seg_size.store(size as u64, Relaxed);
    h.layout.store(LAYOUT, Relaxed);
    h.pid[0].store(std::process::id(), Relaxed);
    h.map_base[0].store(map.base() as u64, Relaxed);
    h.probe.store(crate::base::sys::random_u64() | 1, Relaxed);
    h.magic.store(MAGIC, Relaxed);
    Ok((fd, map))
}

/// Check a segment received from a peer and map it. `ncells` and `size` are what the
/// peer's hello announced. Errors are sentences for a warning log.
pub(super) fn open(
    fd: &OwnedFd,
    ncells: usize,
    size: usize,
) -> std::result::Result<Mapping, String> {
    use rustix::fs::SealFlags;
    if !valid_ncells(ncells) {
        return Err(format!(
            "FIFO size {ncells} is not a power of two from {MIN_CELLS} to {MAX_CELLS}"
        ));
    }
    let want = seg_size(ncells);
    if size != want {
        return Err(format!(
            "announced segment size {size} != {want} expected for {ncells} cells"
        ));
    }
    let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat on the passed fd: {e}"))?;
    if st.st_size < 0 || st.st_size as u64 != want as u64 {
        return Err(format!(
            "passed file is {} bytes, expected {want}",
            st.st_size
        ));
    }
    let seals = rustix::fs::fcntl_get_seals(fd)
        .map_err(|e| format!("passed fd is not a sealable memfd ({e})"))?;
    if !seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL) {
        return Err("passed memfd is not sealed against resizing".into());
    }
    let map = Mapping::map(fd, want).map_err(|e| e.to_string())?;
    SegInfo::read(map.header())
        .check(ncells, want as u64)
        .map_err(|why| format!("segment header: {why}"))?;
    Ok(map)
}
