//! The shared segment: one memfd, mapped by both processes.
//!
//! ```text
//! offset 0            SegHeader (one page): magic, version, layout, sizes, pids, map bases, probe
//! HEADER              FIFO 0 (connector -> acceptor): FifoCtl (256 B), then N cells of 256 B
//! HEADER + FIFO       FIFO 1 (acceptor -> connector): same
//! ```
//!
//! Every field the peer can write is an atomic, read through a shared reference to atomics
//! (sound for memory another process mutates) or through raw pointers; nothing here hands
//! out plain references to peer-written bytes.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::base::{Error, Result, Status};

/// Bytes per FIFO cell.
pub(super) const CELL: usize = 256;
/// Bytes of frame header at the start of a frame's first cell.
pub(super) const CELL_HDR: usize = 16;
/// Segment magic.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"CRSHMSEG");
/// Layout version; bump on any change of the layout below.
pub(super) const VERSION: u32 = 2;
/// Bytes reserved for the segment header.
pub(super) const HEADER_SIZE: usize = 4096;
/// Bytes reserved for each FIFO's control block (before its cells).
pub(super) const CTL_SIZE: usize = 256;
/// Smallest and largest cell counts accepted from a peer.
pub(super) const MIN_CELLS: usize = 16;
pub(super) const MAX_CELLS: usize = 65536;

/// A fingerprint of the compiled layout, so two builds that disagree never talk.
pub(super) const LAYOUT: u64 = (CELL as u64)
    | ((CELL_HDR as u64) << 12)
    | ((HEADER_SIZE as u64) << 20)
    | ((CTL_SIZE as u64) << 36)
    | ((std::mem::size_of::<SegHeader>() as u64) << 48);

/// The segment header. Written by the connector at creation, except `pid[1]` and
/// `map_base[1]`, which the acceptor fills in before it replies.
#[repr(C, align(64))]
pub(super) struct SegHeader {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub cell_size: AtomicU32,
    pub ncells: AtomicU32,
    pub _pad: AtomicU32,
    pub seg_size: AtomicU64,
    pub layout: AtomicU64,
    /// Process ids as each side sees itself: `[connector, acceptor]` (informational; the
    /// pid used for CMA comes from SO_PEERCRED, which is namespace-correct).
    pub pid: [AtomicU32; 2],
    /// Where each side mapped the segment, for the CMA probe: `[connector, acceptor]`.
    pub map_base: [AtomicU64; 2],
    /// A random word; each side reads it from the other's mapping with process_vm_readv.
    pub probe: AtomicU64,
}

/// Offset of the probe word inside the segment.
pub(super) const PROBE_OFFSET: usize = std::mem::offset_of!(SegHeader, probe);

const _: () = assert!(std::mem::size_of::<SegHeader>() <= HEADER_SIZE);

/// Bytes of one FIFO (control block and cells).
pub(super) fn fifo_bytes(ncells: usize) -> usize {
    CTL_SIZE + ncells * CELL
}

/// Offset of FIFO `k` (0 or 1).
pub(super) fn fifo_offset(ncells: usize, k: usize) -> usize {
    HEADER_SIZE + k * fifo_bytes(ncells)
}

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
    if !seals.contains(SealFlags::SHRINK) {
        return Err("passed memfd is not sealed against shrinking".into());
    }
    let map = Mapping::map(fd, want).map_err(|e| e.to_string())?;
    let h = map.header();
    let checks = [
        (h.magic.load(Relaxed) == MAGIC, "bad magic"),
        (
            h.version.load(Relaxed) == VERSION,
            "layout version mismatch",
        ),
        (
            h.layout.load(Relaxed) == LAYOUT,
            "layout hash mismatch (different Courier build)",
        ),
        (
            h.cell_size.load(Relaxed) as usize == CELL,
            "cell size mismatch",
        ),
        (
            h.ncells.load(Relaxed) as usize == ncells,
            "cell count in header differs from hello",
        ),
        (
            h.seg_size.load(Relaxed) == want as u64,
            "segment size in header differs from hello",
        ),
    ];
    for (ok, why) in checks {
        if !ok {
            return Err(format!("segment header: {why}"));
        }
    }
    Ok(map)
}
