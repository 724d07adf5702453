//! CUDA device memory in operations: staged through host memory.
//!
//! Neither the CPU nor the kernel (CMA, sockets) can touch device memory, so an operation
//! given device memory works on a host copy: a send gathers the device bytes into host
//! memory first and sends that; a receive lands in host memory and the bytes are copied to
//! the device when the request completes, before its completion is reported. The host copy
//! belongs to the request and is freed with it.
//!
//! Tag receives are the exception: their host copy is made only when a message matches and
//! its bytes must pass through host memory (`Stage::host_target`). An eager message is
//! copied from the frame to the device and a peer's device memory is read device to
//! device, with no host copy. A same-host peer's host memory is read into a page-locked
//! host copy while the pool has one to give (the two sides then copy it together, and the
//! device takes it in one transfer), else through two page-locked pieces that the device
//! copies in while the CPU reads the next (`to_device_bounced`).
//!
//! Whether a buffer is device memory is asked of the driver only once it is loaded
//! (`base::cuda::active`), so a process without CUDA pays one load per operation.
//!
//! Host copies are page-locked memory from the driver, kept for reuse (`StageBuf`): a
//! copy between page-locked memory and the device is one DMA transfer, where a copy from
//! ordinary memory goes through the driver's own bounce buffers, and a reused buffer has
//! no page to fault in. At most `COURIER_CUDA_STAGING` bytes (`PINNED_MAX`) are
//! page-locked per process; beyond that, and for a driver without `cuMemHostAlloc`, host
//! copies are ordinary memory.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::State;
use super::buf::Buf;
use super::request::Info;
use super::request::Started;
use crate::base::cuda;
use crate::base::{Error, Result, Status};

/// Page-locked bytes one process keeps at most (in use or free for reuse):
/// `COURIER_CUDA_STAGING`, as the last context created set it.
static PINNED_MAX: AtomicUsize = AtomicUsize::new(256 << 20);

/// Keep at most `max` bytes page-locked from now on (buffers already allocated stay).
pub(crate) fn set_pinned_max(max: usize) {
    PINNED_MAX.store(max, Ordering::Relaxed);
}
/// The smallest staging buffer is 2^`MIN_SHIFT` bytes; sizes round up to powers of two.
const MIN_SHIFT: u32 = 12;
/// Size classes: 4 KiB up to 2^(MIN_SHIFT + CLASSES - 1) = 128 MiB.
const CLASSES: usize = 16;

/// The free page-locked buffers, by size class, and how many bytes are page-locked.
struct Pool {
    free: [Vec<usize>; CLASSES],
    pinned: usize,
}

static POOL: std::sync::Mutex<Pool> = std::sync::Mutex::new(Pool {
    free: [const { Vec::new() }; CLASSES],
    pinned: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The size class of a `len`-byte buffer, if it has one.
fn class_of(len: usize) -> Option<usize> {
    let shift = len
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_SHIFT);
    let c = (shift - MIN_SHIFT) as usize;
    (c < CLASSES).then_some(c)
}

/// Host memory for a staged copy: page-locked from the pool where it can be, else
/// ordinary memory. Its bytes are initialized (zeroed when first allocated).
pub(crate) struct StageBuf {
    ptr: *mut u8,
    len: usize,
    /// The pool class of page-locked memory; `None` for `heap`.
    class: Option<usize>,
    heap: Vec<u8>,
}

// SAFETY: the buffer is owned memory (page-locked or heap), moved with its owner.
unsafe impl Send for StageBuf {}

impl StageBuf {
    /// `len` bytes for a host copy.
    pub(crate) fn new(len: usize) -> StageBuf {
        if let Some(b) = Self::from_pool(len, 0) {
            return b;
        }
        let mut heap = vec![0u8; len];
        StageBuf {
            ptr: heap.as_mut_ptr(),
            len,
            class: None,
            heap,
        }
    }

    /// `len` bytes of page-locked memory from the pool (`pinned`, leaving `keep` bytes of
    /// the limit free when it makes a new buffer), if it has them to give.
    fn from_pool(len: usize, keep: usize) -> Option<StageBuf> {
        let (d, c) = (cuda::loaded()?, class_of(len)?);
        let ptr = Self::pinned(d, c, keep)?;
        Some(StageBuf {
            ptr,
            len,
            class: Some(c),
            heap: Vec::new(),
        })
    }

    /// No bytes (no allocation).
    fn empty() -> StageBuf {
        StageBuf {
            ptr: std::ptr::NonNull::dangling().as_ptr(),
            len: 0,
            class: None,
            heap: Vec::new(),
        }
    }

    /// A free page-locked buffer of class `c`, or a new one within `PINNED_MAX`.
    /// A new one is made only if `keep` bytes of the limit stay free after it.
    fn pinned(d: &cuda::Driver, c: usize, keep: usize) -> Option<*mut u8> {
        let size = 1usize << (c as u32 + MIN_SHIFT);
        {
            let mut p = pool();
            if let Some(a) = p.free[c].pop() {
                return Some(a as *mut u8);
            }
            if p.pinned + size + keep > PINNED_MAX.load(Ordering::Relaxed) {
                return None;
            }
            p.pinned += size; // claimed before the (slow) allocation, given back on failure
        }
        match d.pinned_alloc(size) {
            Ok(ptr) => Some(ptr),
            Err(e) => {
                pool().pinned -= size;
                tracing::debug!("staging in ordinary memory: {e}");
                None
            }
        }
    }
}

impl Drop for StageBuf {
    fn drop(&mut self) {
        if let Some(c) = self.class {
            pool().free[c].push(self.ptr as usize);
        }
    }
}

impl std::ops::Deref for StageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.class.is_none() {
            return &self.heap;
        }
        // SAFETY: `len` initialized bytes of a buffer this value owns.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for StageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.class.is_none() {
            return &mut self.heap;
        }
        // SAFETY: as above, and borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A request's host copy of its device memory.
pub(crate) struct Stage {
    /// The copy; `None` for a receive that has not needed one (yet).
    host: Option<StageBuf>,
    /// Receives: the device buffer `host` is copied into when the request completes.
    fill: Option<Buf>,
    /// Receives: the data went straight into `fill` (a peer's device memory read through
    /// its IPC handle), so `host` holds nothing to copy.
    direct: bool,
}

fn driver() -> Result<&'static cuda::Driver> {
    cuda::loaded().ok_or_else(|| {
        Error::new(
            Status::NoDevice,
            "device memory without a loaded CUDA driver",
        )
    })
}

/// Copy `len` bytes of host memory to device memory.
///
/// # Safety
/// `src` readable and `dst` device memory, for `len` bytes.
pub(crate) unsafe fn to_device(dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
    // SAFETY: per the contract.
    unsafe { driver()?.to_device(dst as usize, src, len) }
}

/// Copy `len` bytes of device memory to host memory.
///
/// # Safety
/// `dst` writable and `src` device memory, for `len` bytes.
pub(crate) unsafe fn from_device(dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
    // SAFETY: per the contract.
    unsafe { driver()?.to_host(dst, src as usize, len) }
}

/// Copy `len` bytes from `src` to `dst`, each an address and whether it is device
/// memory: a plain copy between host buffers, else the driver's.
///
/// # Safety
/// Both must be valid for `len` bytes of their kind (`dst` writable).
pub(crate) unsafe fn copy(dst: (usize, bool), src: (usize, bool), len: usize) -> Result<()> {
    // SAFETY: per the contract, for every arm.
    unsafe {
        match (dst.1, src.1) {
            (false, false) => {
                std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.0 as *mut u8, len);
                Ok(())
            }
            (true, false) => to_device(dst.0 as *mut u8, src.0 as *const u8, len),
            (false, true) => from_device(dst.0 as *mut u8, src.0 as *const u8, len),
            (true, true) => driver()?.device_to_device(dst.0, src.0, len),
        }
    }
}

/// Whether device memory may be in play at all (a CUDA driver was loaded): when not, no
/// buffer needs the device checks.
#[inline]
pub(crate) fn device_active() -> bool {
    cuda::active()
}

/// Whether any segment of `buf` is device memory (false at once without a driver).
#[inline]
pub(crate) fn has_device(buf: &Buf) -> bool {
    cuda::active() && any_device(buf)
}

#[cold]
fn any_device(buf: &Buf) -> bool {
    buf.segs().iter().any(|&(a, l)| l > 0 && cuda::is_device(a))
}

/// A host copy of `data` when some of it is device memory, gathered in order.
#[inline]
pub(crate) fn gather(data: &Buf) -> Result<Option<StageBuf>> {
    if !cuda::active() {
        return Ok(None);
    }
    gather_device(data)
}

#[cold]
fn gather_device(data: &Buf) -> Result<Option<StageBuf>> {
    if !any_device(data) {
        return Ok(None);
    }
    host_copy(data).map(Some)
}

/// A host copy of `data`, which holds device memory (`has_device`), gathered in order.
#[cold]
pub(crate) fn host_copy(data: &Buf) -> Result<StageBuf> {
    let mut host = StageBuf::new(data.len());
    let mut off = 0;
    for &(a, l) in data.segs() {
        if l == 0 {
            continue;
        }
        let dst = host[off..off + l].as_mut_ptr();
        if cuda::is_device(a) {
            // SAFETY: `a` is device memory of the caller's buffer; `dst` has `l` bytes.
            unsafe { from_device(dst, a as *const u8, l)? };
        } else {
            // SAFETY: a host segment of the caller's buffer.
            unsafe { std::ptr::copy_nonoverlapping(a as *const u8, dst, l) };
        }
        off += l;
    }
    Ok(host)
}

/// Copy `host` into the segments of `buf`, device or host, in order.
///
/// # Safety
/// `buf`'s segments must be writable (host) or device memory, for their lengths.
pub(crate) unsafe fn scatter(buf: &Buf, host: &[u8]) -> Result<()> {
    let mut off = 0;
    for &(a, l) in buf.segs() {
        if off >= host.len() {
            break;
        }
        let n = l.min(host.len() - off);
        if n == 0 {
            continue;
        }
        let src = host[off..].as_ptr();
        if cuda::is_device(a) {
            // SAFETY: per the contract.
            unsafe { to_device(a as *mut u8, src, n)? };
        } else {
            // SAFETY: per the contract.
            unsafe { std::ptr::copy_nonoverlapping(src, a as *mut u8, n) };
        }
        off += n;
    }
    Ok(())
}

/// Copy the bytes of `remote` (device memory of a peer, opened here) into `local`, in
/// order, with the driver: into host segments, or device ones.
///
/// # Safety
/// `remote` must be device memory valid for its lengths, `local` writable (host) or
/// device memory for its lengths.
pub(crate) unsafe fn copy_from_device(
    local: &[(usize, usize)],
    remote: &[(u64, u64)],
) -> Result<()> {
    crate::transport::walk_segments(local, remote, |dst, src, n| {
        let (src, device) = (src as usize, cuda::is_device(dst));
        // SAFETY: per the contract, inside both segments.
        unsafe {
            if device || n < BOUNCE_MIN {
                copy((dst, device), (src, true), n)
            } else {
                to_host_bounced(dst as *mut u8, src, n)
            }
        }
    })
}

/// Device-to-host copies from this size go through page-locked bounce buffers, in pieces
/// of `BOUNCE_PIECE`: the driver copies into ordinary (pageable) memory at a fraction of
/// the speed of a DMA into page-locked memory, and a piece that size is copied on by the
/// CPU while still in its cache.
const BOUNCE_MIN: usize = 64 << 10;
const BOUNCE_PIECE: usize = 1 << 20;

/// Receives into device memory read from a same-host peer's host memory take a
/// page-locked host copy up to this size: both sides copy into it (a split rendezvous) and
/// the device takes it in one transfer. Longer ones go through the bounce pieces: on an
/// H100, 16 MiB messages with host copies ran at 4-5 GB/s in runs of 100-200 (a new
/// page-locked 16 MiB buffer takes milliseconds, and 32 in flight fill the pool), through
/// the pieces at 8-8.6; at 1 MiB host copies ran at 12-13 GB/s.
const HOST_COPY_MAX: usize = 4 << 20;

/// Two bounce buffers of `BOUNCE_PIECE` bytes for a copy of `n` bytes in pieces (one where
/// one piece holds it), or `None` where no page-locked memory can be had. They are always
/// that size, so that copies of every length reuse the same ones from the pool.
fn bounces(n: usize) -> Option<[StageBuf; 2]> {
    let a = StageBuf::new(BOUNCE_PIECE);
    a.class?;
    if n <= BOUNCE_PIECE {
        return Some([a, StageBuf::empty()]);
    }
    let b = StageBuf::new(BOUNCE_PIECE);
    b.class.map(|_| [a, b])
}

/// Copy `n` bytes of device memory at `src` to host memory at `dst` through two page-locked
/// bounce buffers: the device copies one piece in while the CPU copies the one before out
/// (straight, where no page-locked memory can be had).
///
/// # Safety
/// `dst` writable and `src` device memory, for `n` bytes.
unsafe fn to_host_bounced(dst: *mut u8, src: usize, n: usize) -> Result<()> {
    let Some(mut bufs) = bounces(n) else {
        // SAFETY: per the contract.
        return unsafe { from_device(dst, src as *const u8, n) };
    };
    let piece = n.min(BOUNCE_PIECE);
    driver()?.overlapped(|c| {
        // SAFETY: every piece lies inside both of the caller's buffers and its bounce
        // buffer, and a bounce buffer is refilled only after the CPU copied it out.
        unsafe {
            c.to_host(bufs[0].as_mut_ptr(), src, piece)?;
            let mut done = 0;
            let mut k = 0;
            while done < n {
                let len = (n - done).min(piece);
                c.wait()?;
                let next = done + len;
                if next < n {
                    let m = (n - next).min(piece);
                    c.to_host(bufs[(k + 1) % 2].as_mut_ptr(), src + next, m)?;
                }
                std::ptr::copy_nonoverlapping(bufs[k % 2].as_ptr(), dst.add(done), len);
                done = next;
                k += 1;
            }
        }
        Ok(())
    })
}

/// Fill `local` (device segments, or host ones) with `n` bytes through two page-locked
/// bounce buffers, a piece at a time: `read(piece, offset, len)` fills a bounce buffer with
/// the bytes at `offset` on the CPU while the device copies the piece before it in.
///
/// # Safety
/// `local` must be writable host memory or device memory, for its lengths (at least `n`
/// bytes in all).
pub(crate) unsafe fn to_device_bounced(
    local: &[(usize, usize)],
    n: usize,
    mut read: impl FnMut(&[(usize, usize)], usize, usize) -> Result<()>,
) -> Result<()> {
    let Some(mut bufs) = bounces(n) else {
        // Ordinary memory only: read everything into one host copy, then scatter it.
        let mut host = StageBuf::new(n);
        read(&[(host.as_mut_ptr() as usize, n)], 0, n)?;
        // SAFETY: per the contract.
        return unsafe { scatter(&Buf::from(super::buf::seg_range(local, 0, n)), &host) };
    };
    let piece = n.min(BOUNCE_PIECE);
    driver()?.overlapped(|c| {
        let (mut done, mut k) = (0, 0);
        while done < n {
            let len = (n - done).min(piece);
            let b = &mut bufs[k % 2];
            read(&[(b.as_mut_ptr() as usize, len)], done, len)?;
            // The piece before is in: its buffer is free for the next one.
            c.wait()?;
            let mut off = 0;
            for &(a, l) in super::buf::seg_range(local, done, len).iter() {
                let src = b[off..off + l].as_ptr();
                if cuda::is_device(a) {
                    // SAFETY: device memory of the caller's, `l` bytes of it; the bounce
                    // buffer is left alone until the copy is waited for.
                    unsafe { c.to_device(a, src, l)? };
                } else {
                    // SAFETY: a host segment of the caller's, `l` bytes of it.
                    unsafe { std::ptr::copy_nonoverlapping(src, a as *mut u8, l) };
                }
                off += l;
            }
            done += len;
            k += 1;
        }
        Ok(())
    })
}

fn host_buf(host: &mut [u8]) -> Buf {
    Buf::One((host.as_mut_ptr() as usize, host.len()))
}

impl Stage {
    /// A send's host copy, kept with its request.
    pub(crate) fn send_copy(host: StageBuf) -> Stage {
        Stage {
            host: Some(host),
            fill: None,
            direct: false,
        }
    }

    /// A receive into device buffer `fill` whose host copy is made only if its data must
    /// pass through host memory (`host_target`). Its request's buffer is `fill` itself
    /// until then: whoever writes the data checks for the stage first.
    pub(crate) fn deferred_recv(fill: Buf) -> Stage {
        Stage {
            host: None,
            fill: Some(fill),
            direct: false,
        }
    }

    /// Whether this is a receive whose host copy is deferred and not made yet.
    pub(crate) fn deferred(&self) -> bool {
        self.fill.is_some() && self.host.is_none()
    }

    /// A receive's first `want` bytes of device memory, to be written directly (from a
    /// peer's device memory) instead of through the host copy; `None` for a send.
    pub(crate) fn direct_target(&mut self, want: usize) -> Option<super::buf::Segs<usize>> {
        let fill = self.fill.as_ref()?;
        self.direct = true;
        Some(fill.slice(0, want))
    }

    /// The host copy a receive's data lands in, made now if it was deferred: its buffer,
    /// to become the request's. `None` for a send.
    pub(crate) fn host_target(&mut self) -> Option<Buf> {
        let fill = self.fill.as_ref()?;
        let host = self.host.get_or_insert_with(|| StageBuf::new(fill.len()));
        Some(host_buf(host))
    }

    /// As `host_target`, for a receive read from a same-host peer's host memory, but only
    /// with a page-locked copy and for at most `HOST_COPY_MAX` bytes: `None` (and nothing
    /// made) otherwise, and the receive goes through the bounce pieces.
    pub(crate) fn pinned_host_target(&mut self) -> Option<Buf> {
        let fill = self.fill.as_ref()?;
        if fill.len() > HOST_COPY_MAX {
            return None;
        }
        if self.host.is_none() {
            // Leaving room in the pool for a pair of bounce buffers, which the receives
            // that find no host copy then use.
            self.host = Some(StageBuf::from_pool(fill.len(), 2 * BOUNCE_PIECE)?);
        }
        self.host_target()
    }

    /// The request completed with `result`: fill the device buffer from the host copy
    /// (also for a truncated receive, whose buffer holds what fitted). A failed copy turns
    /// the result into its error. A receive that never made its host copy was written
    /// directly, or got nothing.
    pub(crate) fn finish(self, result: Result<Info>) -> Result<Info> {
        let (Some(fill), Some(host), false) = (&self.fill, &self.host, self.direct) else {
            return result;
        };
        let filled = match &result {
            Ok(i) => i.length.min(host.len()),
            Err(e) if e.status() == Status::MessageTruncated => host.len(),
            Err(_) => return result,
        };
        // SAFETY: `fill` is the request's own receive buffer, kept alive by the request.
        unsafe { scatter(fill, &host[..filled]) }.and(result)
    }
}

impl State {
    /// Start a send of `host` (the gathered copy of a device buffer) with `op`. The copy
    /// is parked for the request `op` makes, if it makes one (the first it allocates), and
    /// lives as long as that request; without one the link has taken the bytes already.
    pub(crate) fn staged_send(
        &mut self,
        mut host: StageBuf,
        op: impl FnOnce(&mut State, Buf) -> Result<Started>,
    ) -> Result<Started> {
        let hb = host_buf(&mut host);
        self.parked = Some(Box::new(Stage::send_copy(host)));
        let r = op(self, hb);
        self.parked = None;
        r
    }

    /// Start a receive into `buf`, which holds device memory, through a host copy that
    /// `op` fills; the device buffer is written when the receive completes, before its
    /// completion is reported.
    pub(crate) fn staged_recv(
        &mut self,
        buf: Buf,
        op: impl FnOnce(&mut State, Buf) -> Result<Started>,
    ) -> Result<Started> {
        let mut host = StageBuf::new(buf.len());
        let hb = host_buf(&mut host);
        self.parked = Some(Box::new(Stage {
            host: Some(host),
            fill: Some(buf),
            direct: false,
        }));
        let r = op(self, hb);
        let Some(stage) = self.parked.take() else {
            // The request took the copy: it is finished when the request completes.
            return r;
        };
        match r {
            // Completed at once, from an unexpected message.
            Ok(Started::Done(info)) => stage.finish(Ok(info)).map(Started::Done),
            // An immediate truncation: what fitted is delivered, the error reported.
            Err(e) if e.status() == Status::MessageTruncated => {
                stage.finish(Err(e)).map(Started::Done)
            }
            other => other,
        }
    }
}
