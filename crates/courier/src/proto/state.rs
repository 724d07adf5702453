//! The protocol layer's state: requests, endpoints, matching queues, pending work.
//!
//! Everything here lives inside the worker's state cell and is touched only under it.
//! Request and endpoint ids are (generation << 32 | slot) so a stale or forged id from a
//! peer is detected instead of hitting a reused slot.

use std::collections::VecDeque;

use crate::base::{Error, Status};
use crate::transport::{Caps, LinkRx, LinkTx};
use crate::wire::frame::Header;

/// What a completed operation reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// Bytes moved; for a truncated receive, the real length of the message.
    pub len: usize,
    /// The message's tag (tag receives).
    pub tag: u64,
    /// The old value (fetching atomics).
    pub value: u64,
}

/// Completion notification for a request.
pub enum Callback {
    /// Poll or wait.
    None,
    /// A Rust closure, run inside progress.
    Rust(Box<dyn FnOnce(Result<Info, Error>) + Send>),
    /// A plain function and a user word (for the C ABI and bindings; no allocation). The
    /// `Info` is passed also on failure (a truncated receive's real length).
    Raw(RawFn, usize),
}

/// A plain completion function: the user word, the result, and the operation's `Info`
/// (passed also on failure).
pub type RawFn = fn(usize, Result<Info, Error>, Info);

/// A buffer as address/length segments in this process.
#[derive(Clone, Debug)]
pub enum Buf {
    /// One contiguous segment: (address, length).
    One((usize, usize)),
    /// Scattered segments.
    Many(Vec<(usize, usize)>),
}

impl Buf {
    pub(crate) const EMPTY: Buf = Buf::One((0, 0));

    pub(crate) fn segs(&self) -> &[(usize, usize)] {
        match self {
            Buf::One(p) => std::slice::from_ref(p),
            Buf::Many(v) => v,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Buf::One((_, l)) => *l,
            Buf::Many(v) => v.iter().map(|s| s.1).sum(),
        }
    }

    /// Copy `src` into this buffer starting at byte `offset`; returns bytes copied.
    ///
    /// # Safety
    /// The segments must be valid for writes.
    pub(crate) unsafe fn write_at(&self, mut offset: usize, src: &[u8]) -> usize {
        let mut done = 0;
        for &(addr, len) in self.segs() {
            if done == src.len() {
                break;
            }
            if len == 0 {
                continue;
            }
            if offset >= len {
                offset -= len;
                continue;
            }
            let n = (len - offset).min(src.len() - done);
            // SAFETY: within the segment by construction; caller guarantees validity.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(done), (addr + offset) as *mut u8, n)
            };
            done += n;
            offset = 0;
        }
        done
    }

    /// Sub-range [off, off+len) as segments.
    pub(crate) fn slice(&self, off: usize, len: usize) -> Segs<usize> {
        seg_range(self.segs(), off, len)
    }

    /// Sub-range [off, off+len) as a buffer of its own (`Buf::One` when it is one segment).
    pub(crate) fn part(&self, off: usize, len: usize) -> Buf {
        Buf::from(self.slice(off, len))
    }
}

/// A list of (address, length) segments, local (`usize`) or a peer's (`u64`), held inline
/// up to two: the buffers a rendezvous moves nearly always have one or two, and the lists
/// each message's copy is described with then cost no allocation. A plain struct, not an
/// enum: an enum of these two shapes is moved in odd-sized pieces (a word loaded from byte
/// 2), and a load that straddles the stores which just built the list stalls; that stall
/// was 2-3% of a 1 MiB rendezvous receiver's time.
#[derive(Clone, Debug)]
pub(crate) struct Segs<T> {
    /// How many segments; more than two: all of them are in `spill`.
    len: usize,
    inline: [(T, T); 2],
    spill: Vec<(T, T)>,
}

impl<T: Copy + Default> Segs<T> {
    pub(crate) fn new() -> Self {
        Segs {
            len: 0,
            inline: [(T::default(), T::default()); 2],
            spill: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, s: (T, T)) {
        let n = self.len;
        if n < self.inline.len() {
            self.inline[n] = s;
        } else {
            if n == self.inline.len() {
                self.spill.reserve(n * 2);
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(s);
        }
        self.len = n + 1;
    }
}

impl<T: Copy + Default> Default for Segs<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::ops::Deref for Segs<T> {
    type Target = [(T, T)];

    fn deref(&self) -> &[(T, T)] {
        if self.len <= self.inline.len() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl<'a, T> IntoIterator for &'a Segs<T> {
    type Item = &'a (T, T);
    type IntoIter = std::slice::Iter<'a, (T, T)>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Copy + Default> FromIterator<(T, T)> for Segs<T> {
    fn from_iter<I: IntoIterator<Item = (T, T)>>(it: I) -> Self {
        let mut out = Segs::new();
        for s in it {
            out.push(s);
        }
        out
    }
}

impl<T: Copy> From<Segs<T>> for Vec<(T, T)> {
    fn from(s: Segs<T>) -> Self {
        if s.len <= s.inline.len() {
            s.inline[..s.len].to_vec()
        } else {
            s.spill
        }
    }
}

impl From<Segs<usize>> for Buf {
    /// One segment as `Buf::One`, without an allocation.
    fn from(s: Segs<usize>) -> Self {
        if s.len == 1 {
            Buf::One(s.inline[0])
        } else {
            Buf::Many(s.into())
        }
    }
}

/// Bytes `[off, off + len)` of a list of (address, length) segments, as segments: local
/// (`usize`) or a peer's (`u64`).
pub(crate) fn seg_range<T>(segs: &[(T, T)], mut off: T, mut len: T) -> Segs<T>
where
    T: Copy + Ord + Default + std::ops::Add<Output = T> + std::ops::Sub<Output = T>,
{
    let zero = T::default();
    let mut out = Segs::new();
    for &(a, l) in segs {
        if len == zero {
            break;
        }
        if off >= l {
            off = off - l;
            continue;
        }
        let n = (l - off).min(len);
        out.push((a + off, n));
        len = len - n;
        off = zero;
    }
    out
}

/// What a request is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReqKind {
    Send,
    TagRecv,
    StreamRecv,
    AmData,
    /// Put, atomic, put-with-signal: acknowledged by the target.
    Rma,
    /// Get: answered with data.
    Get,
}

pub(crate) struct ReqSlot {
    pub generation: u32,
    pub live: bool,
    pub done: bool,
    pub result: Result<Info, Error>,
    pub kind: ReqKind,
    pub ep: Option<u32>,
    pub buf: Buf,
    /// Receives: bytes expected (rendezvous) and received so far.
    pub expect: usize,
    pub got: usize,
    pub tag: u64,
    /// Stream receives: complete only when the buffer is full.
    pub waitall: bool,
    /// Receiving rendezvous data pushed by the sender.
    pub rndv_push: bool,
    /// The real length of the message being received (truncation reports).
    pub real_len: usize,
    /// What the request reports, also when it failed (a truncated receive's real length).
    pub info: Info,
    pub callback: Callback,
    /// No handle refers to the request any more: free it on completion.
    pub detached: bool,
    /// Sends: all frames are with the link, which still writes the last from the buffer;
    /// completes with `info` when the link reports the request's id as written.
    pub zc_wait: bool,
    /// The host copy of device memory the request works on (`proto::stage`).
    pub stage: Option<Box<crate::proto::stage::Stage>>,
}

impl ReqSlot {
    /// A slot never used yet (generation 0: its first request gets generation 1).
    pub(crate) fn vacant() -> ReqSlot {
        ReqSlot {
            generation: 0,
            live: false,
            done: false,
            result: Ok(Info::default()),
            kind: ReqKind::Send,
            ep: None,
            buf: Buf::EMPTY,
            expect: 0,
            got: 0,
            tag: 0,
            waitall: false,
            rndv_push: false,
            real_len: 0,
            info: Info::default(),
            callback: Callback::None,
            detached: false,
            zc_wait: false,
            stage: None,
        }
    }

    /// Mark the slot free: it lets go of the caller's buffer and callback (the slot goes
    /// on the free list beside this call). A polled request (no callback, one segment,
    /// nothing staged), the common case, holds nothing that needs dropping.
    #[inline]
    pub(crate) fn release(&mut self) {
        self.live = false;
        if matches!(self.callback, Callback::None)
            && matches!(self.buf, Buf::One(_))
            && self.stage.is_none()
        {
            self.buf = Buf::EMPTY;
            return;
        }
        self.release_owned();
    }

    /// `release` of a slot holding a callback, a list of segments or a staged copy.
    #[inline(never)]
    fn release_owned(&mut self) {
        self.callback = Callback::None;
        self.buf = Buf::EMPTY;
        self.stage = None;
    }

    /// Whether this live request on endpoint `e` expects `n` bytes at `offset`.
    pub(crate) fn takes(&self, e: u32, offset: u64, n: usize) -> bool {
        self.ep == Some(e)
            && !self.done
            && offset
                .checked_add(n as u64)
                .is_some_and(|x| x <= self.expect as u64)
    }
}

pub(crate) struct Slab<T> {
    pub slots: Vec<T>,
    pub free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

pub(crate) fn make_id(generation: u32, idx: u32) -> u64 {
    ((generation as u64) << 32) | idx as u64
}

pub(crate) fn split_id(id: u64) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

/// An unexpected tag message.
/// A posted tag receive waiting for its message: the matching fields beside the request's
/// id, so matching an arrival reads only this queue.
#[derive(Copy, Clone)]
pub(crate) struct Posted {
    pub tag: u64,
    pub mask: u64,
    pub id: u64,
}

pub(crate) struct Unexpected {
    pub tag: u64,
    pub ep: u32,
    pub len: usize,
    pub body: UnexpBody,
}

pub(crate) enum UnexpBody {
    Eager(Vec<u8>),
    EagerSync(Vec<u8>, u64),
    Rts {
        sreq: u64,
        segs: Segs<u64>,
        /// The sender's shared-segment key for `segs`, if it offered one.
        key: Option<Box<[u8]>>,
    },
}

/// A frame that could not be sent yet (back-pressure or link not up).
pub(crate) struct Pending {
    pub req: Option<u64>,
    pub hdr: Header,
    /// Bytes after the header owned by the pending op (segment lists, addresses).
    pub extra: Vec<u8>,
    /// User data segments after `extra`.
    pub data: Buf,
    /// `data` lies in one of this context's regions (a get's answer): checked against the
    /// registry again before the frame leaves, so nothing is sent from a region unmapped
    /// while the frame waited.
    pub region: Option<RegionRead>,
}

/// Where a queued get answer's bytes lie: the region as the get named it, and the
/// requester's get.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegionRead {
    pub region: u64,
    pub secret: u64,
    pub addr: u64,
    pub req: u64,
}

/// Data to push to a peer after it said it is ready (rendezvous without remote read).
pub(crate) struct PushJob {
    pub sreq: u64,
    pub rreq: u64,
    pub data: Buf,
    pub offset: usize,
    pub total: usize,
}

/// How a worker's single-copy rendezvous copies (reads and writes of a same-host peer's
/// buffers, each part of a split counted once) were made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RndvCopies {
    /// Through a shared segment of memory the peer allocated with `mem_map`.
    pub shared: u64,
    /// Through the kernel (CMA, or a copy within the process for `self`).
    pub link: u64,
    /// From a same-host peer's device memory, opened with its CUDA IPC handle.
    pub device: u64,
}

/// A split rendezvous receive: this side reads the first part, the sender writes the rest;
/// it ends when both are done.
pub(crate) struct SplitWait {
    pub rreq: u64,
    pub ep: u32,
    pub sreq: u64,
    /// Result of this side's own read, once complete.
    pub own: Option<crate::base::Result<()>>,
    /// The sender's answer (0 or an error code), once it came.
    pub rest: Option<i32>,
    /// The rest: where it goes here, and where it lies in the sender (for a fallback read).
    pub rest_local: Segs<usize>,
    pub rest_remote: Segs<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EpStatus {
    /// Waiting for the peer to accept (listener flow) or for a link upgrade.
    Connecting,
    Connected,
    /// Failed or closed; operations fail with this error.
    Dead(Error),
}

pub(crate) struct EpSlot {
    pub generation: u32,
    pub live: bool,
    pub status: EpStatus,
    pub tx: Option<LinkTx>,
    pub rx: Option<LinkRx>,
    /// A link being replaced (listener flow: the tcp link while the shm one comes up).
    pub old: Option<(LinkTx, LinkRx)>,
    pub caps: Option<Caps>,
    pub rndv_thresh: usize,
    pub pending: VecDeque<Pending>,
    pub push: VecDeque<PushJob>,
    pub stream_in: VecDeque<u8>,
    pub stream_reqs: VecDeque<u64>,
    pub err_handler: Option<crate::proto::core::ErrorHandler>,
    pub err_reported: bool,
    pub peer: String,
    pub conn_id: u64,
    /// The peer's worker id (when known) and whether it runs in this process's worker.
    pub peer_worker: u64,
    /// A handler is running on a frame of this endpoint's rx: do not drop the link now.
    pub rx_busy: bool,
    /// Puts or posted atomics were sent that the target acknowledges only by refusing
    /// them: a flush must ask the target to confirm.
    pub rma_unacked: bool,
    /// The first refusal of an unacknowledged put or posted atomic, reported by the next
    /// flush.
    pub rma_error: Option<Error>,
    /// Operations were sent through the owner (puts, gets, atomics) that no fence or flush
    /// has waited for since.
    pub rma_via_owner: bool,
    /// A remote key unpacked on this endpoint reaches memory without the owner (mapped
    /// here, or CMA): an operation through the owner may be overtaken by one of those.
    pub rma_direct_keys: bool,
    /// Target side: the rest of a put refused at its first frame (`Kind::PutBegin`), as
    /// bytes of put data still to drop unwritten on this link, and the refusal's status.
    pub put_refused: Option<(u64, Status)>,
    /// Set when the endpoint fails or closes. Remote keys unpacked on it hold it, so that
    /// their direct paths (plain stores into a same-host peer's memory, which never go
    /// through the worker) see it without the worker's lock.
    pub gone: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl EpSlot {
    pub(crate) fn dead_error(&self) -> Option<Error> {
        match &self.status {
            EpStatus::Dead(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// Fail every request on `ep` (called when the endpoint dies).
pub(crate) fn fail_error(peer: &str, why: &Error) -> Error {
    if why.status() == Status::PeerFailure
        || why.status() == Status::EndpointClosed
        || why.status() == Status::Rejected
    {
        why.clone()
    } else {
        Error::msg(
            why.status(),
            format!("connection to {peer} failed: {}", why.detail()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_lists_hold_two_inline_and_grow_past_them() {
        let mut s: Segs<u64> = Segs::new();
        assert!(s.is_empty());
        s.push((0x1000, 10));
        s.push((0x2000, 20));
        assert!(
            s.spill.is_empty() && s.spill.capacity() == 0,
            "two stay inline"
        );
        assert_eq!(&*s, &[(0x1000, 10), (0x2000, 20)]);
        s.push((0x3000, 30));
        s.push((0x4000, 40));
        assert_eq!(s.spill.len(), 4, "past two, all of them spill");
        assert_eq!(
            &*s,
            &[(0x1000, 10), (0x2000, 20), (0x3000, 30), (0x4000, 40)]
        );
        let v: Vec<(u64, u64)> = s.into();
        assert_eq!(v.len(), 4);
        let two: Segs<u64> = [(1, 2), (3, 4)].into_iter().collect();
        assert_eq!(Vec::from(two), vec![(1, 2), (3, 4)]);
        // One segment becomes `Buf::One`, more `Buf::Many`, in order.
        let one: Segs<usize> = [(0x10, 4)].into_iter().collect();
        assert!(matches!(Buf::from(one), Buf::One((0x10, 4))));
        let two: Segs<usize> = [(0x10, 4), (0x20, 8)].into_iter().collect();
        assert_eq!(Buf::from(two).segs(), &[(0x10, 4), (0x20, 8)]);
    }

    #[test]
    fn ranges_of_segment_lists() {
        let segs = [(100u64, 10u64), (200, 10), (300, 10)];
        // Within one segment, across two, across all three, and past the end.
        assert_eq!(&*seg_range(&segs, 2, 5), &[(102, 5)]);
        assert_eq!(&*seg_range(&segs, 8, 4), &[(108, 2), (200, 2)]);
        assert_eq!(&*seg_range(&segs, 5, 20), &[(105, 5), (200, 10), (300, 5)]);
        assert_eq!(&*seg_range(&segs, 25, 100), &[(305, 5)]);
        assert!(seg_range(&segs, 30, 4).is_empty());
    }
}
