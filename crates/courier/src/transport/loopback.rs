//! self — frames between two endpoints of one worker.
//!
//! Both halves live in the same worker and are used under its lock, so the queue is a plain
//! shared buffer. Frame buffers are recycled so a steady exchange does not allocate.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Caps, RawFrame, RndvMode, TxError};
use crate::base::Result;

#[derive(Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    free: Vec<Vec<u8>>,
    closed: bool,
}

/// One direction's queue, and whether it holds a frame or is closed: what a progress call
/// with nothing to do asks of it, without taking the lock.
#[derive(Default)]
struct Inner {
    q: Mutex<Queue>,
    ready: AtomicBool,
}

type Shared = Arc<Inner>;

/// The queue, locked; `ready` is brought up to date when the guard goes.
struct Locked<'a> {
    q: MutexGuard<'a, Queue>,
    ready: &'a AtomicBool,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Queue;
    fn deref(&self) -> &Queue {
        &self.q
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Queue {
        &mut self.q
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Both halves are used under their worker's lock, which orders this store.
        self.ready.store(
            !self.q.frames.is_empty() || self.q.closed,
            Ordering::Relaxed,
        );
    }
}

fn lock(s: &Shared) -> Locked<'_> {
    Locked {
        // A poisoned queue only means a panic elsewhere; the data is plain bytes.
        q: s.q.lock().unwrap_or_else(|p| p.into_inner()),
        ready: &s.ready,
    }
}

/// Sending half.
pub struct Tx {
    q: Shared,
    caps: Caps,
}

/// Receiving half.
pub struct Rx {
    q: Shared,
    /// The frame handed out by `peek`, kept here so its bytes stay put until `consume`.
    current: Option<Vec<u8>>,
}

/// The transport's name, as `COURIER_TLS` and the selection lines say it.
pub const NAME: &str = "self";

fn caps() -> Caps {
    Caps {
        name: NAME,
        device: "memory".into(),
        // Every frame is one copy into the peer's queue inside the call, whatever its
        // length: all of them take the inline path.
        max_short: 1 << 20,
        max_frame: 1 << 20,
        rndv: RndvMode::RemoteRead,
        rndv_thresh: 64 << 10,
        zcopy_min: usize::MAX,
        place_min: usize::MAX,
        peer_failure: true,
        wakeup: true,
        data_via_fd: false,
        frames_in_place: false,
        peer_memory: false,
        latency_ns: 0.0,
        bandwidth_mbs: 20000.0,
    }
}

/// Two connected (Tx, Rx) pairs: what the first sends, the second receives, and back.
pub fn pair() -> ((Tx, Rx), (Tx, Rx)) {
    let a: Shared = Arc::default();
    let b: Shared = Arc::default();
    (
        (
            Tx {
                q: b.clone(),
                caps: caps(),
            },
            Rx {
                q: a.clone(),
                current: None,
            },
        ),
        (
            Tx { q: a, caps: caps() },
            Rx {
                q: b,
                current: None,
            },
        ),
    )
}

impl Tx {
    pub(crate) fn send(&mut self, parts: &[&[u8]]) -> Result<(), TxError> {
        let mut q = lock(&self.q);
        let mut v = q.free.pop().unwrap_or_default();
        v.clear();
        for p in parts {
            v.extend_from_slice(p);
        }
        q.frames.push_back(v);
        Ok(())
    }
    pub(crate) fn flush(&mut self) -> Result<bool> {
        Ok(true)
    }
    pub(crate) fn caps(&self) -> &Caps {
        &self.caps
    }
    pub(crate) unsafe fn remote_read(
        &mut self,
        local: &[(usize, usize)],
        remote: &[(u64, u64)],
    ) -> Result<()> {
        // SAFETY: same process; the caller guarantees `local` is writable and the protocol
        // guarantees `remote` segments are the sender's live buffers (same address space).
        unsafe { super::copy_segments(local, remote) }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        lock(&self.q).closed = true;
    }
}

impl Rx {
    /// Whether `peek` has something to say: a frame, or the other half's close. A worker
    /// with nothing to do asks this at every progress call.
    pub(crate) fn ready(&self) -> bool {
        self.current.is_some() || self.q.ready.load(Ordering::Relaxed)
    }
    pub(crate) fn peek(&mut self) -> Result<Option<RawFrame>> {
        if self.current.is_none() {
            let mut q = lock(&self.q);
            self.current = q.frames.pop_front();
            // The other side let go of its half (a forced close drops it without a word):
            // once its frames are taken, that is the peer's failure, as a hung-up socket
            // is on the other transports.
            if self.current.is_none() && q.closed {
                return Err(crate::base::Error::new(
                    crate::base::Status::PeerFailure,
                    "the peer endpoint in this worker closed the connection",
                ));
            }
        }
        Ok(self
            .current
            .as_ref()
            .map(|v| RawFrame::private(v.as_ptr(), v.len())))
    }
    pub(crate) fn consume(&mut self) {
        if let Some(v) = self.current.take() {
            let mut q = lock(&self.q);
            if q.free.len() < 64 {
                q.free.push(v);
            }
        }
    }
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    pub(crate) fn on_readable(&mut self) -> Result<()> {
        Ok(())
    }
    pub(crate) fn arm(&mut self) -> Result<bool> {
        Ok(self.current.is_none() && lock(&self.q).frames.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ready` is what a worker with nothing to do asks at every progress call: it must
    /// say "nothing" when nothing is there (or every call takes the general pass), and
    /// never miss a frame or the other half's close.
    #[test]
    fn ready_says_whether_a_frame_or_a_close_waits() {
        let ((mut tx, _), (_, mut rx)) = pair();
        assert!(!rx.ready());
        tx.send(&[b"ab", b"c"]).expect("send");
        assert!(rx.ready());
        let f = rx.peek().expect("peek").expect("a frame");
        // SAFETY: the frame stays put until `consume`.
        assert_eq!(unsafe { f.copy_whole() }, b"abc");
        assert!(rx.ready(), "a frame handed out still waits until consumed");
        rx.consume();
        assert!(!rx.ready());
        tx.send(&[b"d"]).expect("send");
        drop(tx);
        assert!(rx.ready());
        assert!(
            rx.peek()
                .expect("the frame sent before the close")
                .is_some()
        );
        rx.consume();
        assert!(rx.ready(), "the close waits to be seen");
        assert!(rx.peek().is_err());
    }
}
