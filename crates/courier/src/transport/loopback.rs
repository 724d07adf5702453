//! self — frames between two endpoints of one worker.
//!
//! Both halves live in the same worker and are used under its lock, so the queue is a plain
//! shared buffer. Frame buffers are recycled so a steady exchange does not allocate.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Caps, RawFrame, RndvMode, TxError};
use crate::base::Result;

#[derive(Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    free: Vec<Vec<u8>>,
    closed: bool,
}

type Shared = Arc<Mutex<Queue>>;

fn lock(q: &Shared) -> MutexGuard<'_, Queue> {
    // A poisoned queue only means a panic elsewhere; the data is plain bytes.
    q.lock().unwrap_or_else(|p| p.into_inner())
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
