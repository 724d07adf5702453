//! The streaming tests' loops: sends and receives finished by a counting callback with a
//! window in flight (`tag_bw`, `tag_sync_bw`, `ucp_am_bw`, `stream_bw`, as ucx_perftest
//! runs them), and the windowed sweeps' rounds (`tag_bibw`, `tag_win_bw`, as osu_bibw and
//! osu_bw run them).

use crate::perf::clock::Instant;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use courier::{AmFlags, Info, Request};

use super::link::{Idle, Link};
use super::twosided::{Outgoing, check_tag, send, slot};
use super::{AM_PING, TAG_FIN, TAG_PING, TAG_PONG};
use crate::error::{CliError, CliResult};
use crate::perf::params::{Params, TestKind};
use crate::perf::report::Meter;

/// Operations finished by a counting callback (`counted_recvs`, `counted_sends`): how many
/// (failed ones too), and the first failure.
struct OpCount {
    /// The size every received message must have (`None` for sends).
    size: Option<usize>,
    finished: AtomicU64,
    any_failed: AtomicBool,
    failed: Mutex<Option<OpFailed>>,
}

/// How a counted operation failed.
enum OpFailed {
    /// The library reported an error.
    Op(courier::Error),
    /// A message of the wrong size arrived: (its size, the size expected).
    Size(usize, usize),
}

impl OpCount {
    fn new(size: Option<usize>) -> Box<OpCount> {
        Box::new(OpCount {
            size,
            finished: AtomicU64::new(0),
            any_failed: AtomicBool::new(false),
            failed: Mutex::new(None),
        })
    }

    /// The callback word for `op_counted`.
    fn user(&self) -> usize {
        self as *const OpCount as usize
    }

    fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// The first failure, as the run's error.
    #[inline]
    fn failure(&self, link: &Link, what: &str) -> Option<CliError> {
        if !self.any_failed.load(Ordering::Relaxed) {
            return None;
        }
        self.take_failure(link, what)
    }

    #[cold]
    #[inline(never)]
    fn take_failure(&self, link: &Link, what: &str) -> Option<CliError> {
        let m = self.failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        Some(match m {
            Some(OpFailed::Op(e)) => link.req_err(&e),
            Some(OpFailed::Size(got, want)) => CliError::run(format!(
                "{what} {} has {got} bytes, expected {want}",
                link.peer
            )),
            None => link.failed(),
        })
    }

    /// Free the count once none of the `posted` operations can still call back; a failed
    /// run may leave some posted, whose callbacks may yet run, so the count stays where
    /// they point (a failed run ends the test; this is its cost). True if it was leaked.
    fn release(self: Box<Self>, posted: u64) -> bool {
        if self.finished() >= posted {
            false
        } else {
            Box::leak(self);
            true
        }
    }
}

/// The callback of a counted operation. `user` is the address of an `OpCount` that
/// outlives every operation started with it (`OpCount::release`).
fn op_counted(user: usize, r: courier::Result<Info>, _info: Info) {
    // SAFETY: see above; the count is only read and written through atomics and a mutex.
    let c = unsafe { &*(user as *const OpCount) };
    let failure = match r {
        Err(e) => Some(OpFailed::Op(e)),
        Ok(i) if c.size.is_some_and(|s| s != i.length) => {
            Some(OpFailed::Size(i.length, c.size.unwrap_or_default()))
        }
        Ok(_) => None,
    };
    if let Some(m) = failure {
        let mut g = c.failed.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(m);
        }
        c.any_failed.store(true, Ordering::Relaxed);
    }
    // One thread progresses the worker: a load and a store count without a locked
    // instruction.
    c.finished
        .store(c.finished.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Receive `total` tag messages of `size` bytes with `w` receives posted at a time, all into
/// the same buffer at `rbase` (their contents are not looked at), each finished by a
/// callback that counts it: ucx_perftest's receiver (`tag_recv_cb`, `wait_recv_window`). A
/// receive that finds its message already waiting finishes at once, without a callback.
/// Also says whether receives may still be posted (a failed run): then the buffer must
/// stay mapped.
pub(super) fn counted_recvs(
    link: &Link,
    total: u64,
    w: usize,
    rbase: *mut u8,
    size: usize,
) -> (CliResult<()>, bool) {
    let count = OpCount::new(Some(size));
    let user = count.user();
    let mut posted = 0u64;
    let mut at_once = 0u64;
    let mut idle = Idle::default();
    let result = loop {
        if let Some(e) = count.failure(link, "a message from") {
            break Err(e);
        }
        let done = count.finished() + at_once;
        if done >= total {
            break Ok(());
        }
        if posted < total && posted - done < w as u64 {
            let buf = (rbase as usize, size);
            // SAFETY: the buffer lies inside the receive area, which outlives this call;
            // the receives overwrite one another's bytes, which nobody reads.
            let started = unsafe {
                link.worker
                    .tag_recv_fn(buf, TAG_PING, u64::MAX, op_counted, user)
            };
            match link.check(started) {
                Ok(courier::Started::Done(info)) if info.length != size => {
                    break Err(CliError::run(format!(
                        "message from {} has {} bytes, expected {size}",
                        link.peer, info.length
                    )));
                }
                Ok(courier::Started::Done(_)) => at_once += 1,
                Ok(courier::Started::Pending(_)) => {}
                Err(e) => break Err(e),
            }
            posted += 1;
            continue;
        }
        if let Err(e) = link.poll(&mut idle) {
            break Err(e);
        }
    };
    let still_posted = count.release(posted - at_once);
    (result, still_posted)
}

/// The client of `tag_bw`, `tag_sync_bw`, `ucp_am_bw` and `stream_bw`: `total` sends with
/// at most `w` in flight, each finished by a callback that counts it (ucx_perftest's
/// sender: its send callback, `wait_window`); a send the library finishes at once (an
/// eager message written to the link) needs no callback and no request. Returns the run's
/// row, and whether sends may still be in flight (a failed run): then the caller must
/// keep their memory (`buf`) alive.
pub(super) fn counted_sends(
    link: &Link,
    p: &Params,
    meter: &mut Meter<'_>,
    buf: &courier::Buf,
) -> (CliResult<crate::perf::report::Row>, bool) {
    let total = p.total();
    let warm = p.warmup;
    let w = p.window.max(1) as u64;
    let count = OpCount::new(None);
    let user = count.user();
    let mut posted = 0u64;
    let mut at_once = 0u64;
    let mut idle = Idle::default();
    let mut t = Instant::now();
    let mut run = || -> CliResult<()> {
        for i in 0..total {
            if i == warm {
                t = Instant::now();
                meter.begin(t, i);
            }
            while posted - (count.finished() + at_once) >= w {
                link.poll(&mut idle)?;
            }
            if let Some(e) = count.failure(link, "a send to") {
                return Err(e);
            }
            let cb = courier::Callback::Raw(op_counted, user);
            // SAFETY: `buf` is the send buffer, which the caller keeps alive until every
            // send finished (or for good, if one may still be in flight).
            let started = unsafe { send_raw(link, p.test, buf.clone(), cb) };
            if let courier::Started::Done(_) = link.check(started)? {
                at_once += 1;
            }
            posted += 1;
            let now = Instant::now();
            if i >= warm {
                meter.record(now, t);
            }
            t = now;
        }
        while count.finished() + at_once < posted {
            link.poll(&mut idle)?;
        }
        if let Some(e) = count.failure(link, "a send to") {
            return Err(e);
        }
        let mut fin = [0u8; 8];
        link.recv_ctrl(TAG_FIN, &mut fin)?;
        Ok(())
    };
    let r = run();
    let leaked = count.release(posted - at_once);
    (r.map(|()| meter.finish(Instant::now())), leaked)
}

/// Start one send of a two-sided bandwidth test, finished by `cb` unless it finished at once.
///
/// # Safety
/// As the library's `*_raw` sends: `data` stays valid until the send finished.
unsafe fn send_raw(
    link: &Link,
    kind: TestKind,
    data: courier::Buf,
    cb: courier::Callback,
) -> courier::Result<courier::Started> {
    // SAFETY: the caller's contract.
    unsafe {
        match kind {
            TestKind::TagSyncBw => link.ep.tag_send_raw(data, TAG_PING, true, cb),
            TestKind::AmBw => link
                .ep
                .am_send_raw(AM_PING, &[], data, AmFlags::default(), cb),
            TestKind::StreamBw => link.ep.stream_send_raw(data, cb),
            _ => link.ep.tag_send_raw(data, TAG_PING, false, cb),
        }
    }
}

/// One bi-directional window: `w` receives (tag `rtag`) and `w` sends (tag `stag`) of
/// `msg` (the data and its IOV) in flight at once. `sends` and `recvs` are room for the
/// requests, kept across windows (a window allocates nothing).
pub(super) fn bibw_round<'a>(
    link: &'a Link,
    p: &Params,
    msg: (&'a [u8], &[&'a [u8]]),
    rbase: *mut u8,
    (stag, rtag): (u64, u64),
    sends: &mut Vec<Request<'a>>,
    recvs: &mut Vec<Request<'a>>,
) -> CliResult<()> {
    let w = p.window.max(1);
    let size = p.msg_size();
    sends.clear();
    recvs.clear();
    for k in 0..w {
        // SAFETY: slot k of the receive buffers, one request per slot: the last window's
        // were dropped by `clear` above, and the caller's buffers outlive `recvs`.
        let rb = unsafe { slot(rbase, k, size) };
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        recvs.push(link.check(unsafe { link.worker.tag_recv_nb(rb, rtag, u64::MAX) })?);
    }
    for _ in 0..w {
        sends.push(send(
            link,
            Outgoing::new(TestKind::TagBibw, msg.0, msg.1).tag(stag),
        )?);
    }
    for r in sends.iter_mut().chain(recvs.iter_mut()) {
        link.wait(r)?;
    }
    Ok(())
}

/// The bytes of the receiver's ack that ends each window of `tag_win_bw` (osu_bw's size).
const WIN_ACK_LEN: usize = 4;

/// The sender's window of `tag_win_bw`, as osu_bw's: `w` sends started at once, waited for
/// together, then the receiver's ack. `sends` is scratch room for the requests (kept across
/// windows, so that a window allocates nothing).
pub(super) fn win_round_send<'a>(
    link: &Link,
    p: &Params,
    data: &'a [u8],
    iov: &[&'a [u8]],
    sends: &mut Vec<Request<'a>>,
) -> CliResult<()> {
    sends.clear();
    for _ in 0..p.window.max(1) {
        sends.push(send(
            link,
            Outgoing::new(TestKind::TagWinBw, data, iov).tag(TAG_PING),
        )?);
    }
    for r in sends.iter_mut() {
        link.wait(r)?;
    }
    let mut ack = [0u8; WIN_ACK_LEN];
    link.recv_ctrl(TAG_PONG, &mut ack)?;
    Ok(())
}

/// The receiver's window of `tag_win_bw`, as osu_bw's: `w` receives posted at once (one
/// slot each), waited for together and checked, then the ack. `recvs` is scratch room for
/// the requests (kept across windows, so that a window allocates nothing).
pub(super) fn win_round_recv<'a>(
    link: &'a Link,
    p: &Params,
    rbase: *mut u8,
    recvs: &mut Vec<Request<'a>>,
) -> CliResult<()> {
    let w = p.window.max(1);
    let size = p.msg_size();
    recvs.clear();
    for k in 0..w {
        // SAFETY: slot k of the receive buffers (a window of slots), one request per
        // slot: the last window's were dropped by `clear` above, and the caller's buffers
        // outlive `recvs`.
        let rb = unsafe { slot(rbase, k, size) };
        if p.check {
            rb.fill(0);
        }
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        recvs.push(link.check(unsafe { link.worker.tag_recv_nb(rb, TAG_PING, u64::MAX) })?);
    }
    for (k, r) in recvs.iter_mut().enumerate() {
        let info = link.wait(r)?;
        // SAFETY: as above; this slot's receive finished and nothing else reads it.
        check_tag(link, p, unsafe { slot(rbase, k, size) }, &info)?;
    }
    link.send_ctrl(TAG_PONG, &[0u8; WIN_ACK_LEN])
}
