//! The event-queue exports of `exs.h`.

use std::ffi::{c_int, c_long};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::abi::*;
use super::engine;
use super::queue::{DEPTH_MAX, QUEUES_MAX, Queue};
use super::{boundary, boundary_handle, fail, lib};

/// A queue of at most `depth` events (events waiting plus operations in flight).
#[unsafe(no_mangle)]
pub extern "C" fn exs_qcreate(depth: c_int) -> exs_qhandle_t {
    boundary_handle(EXS_QHANDLE_INVALID, || {
        let l = lib()?;
        if depth < 1 || depth as usize > DEPTH_MAX {
            return Err(fail(
                libc::EINVAL,
                format!("queue depth {depth} outside [1, {DEPTH_MAX}]"),
            ));
        }
        let mut st = l.st();
        if st.queues.len() >= QUEUES_MAX {
            return Err(fail(
                libc::EMFILE,
                format!("{QUEUES_MAX} event queues already"),
            ));
        }
        // Handles are never reused (a stale one is refused), until they wrap.
        let id = loop {
            st.next_q = if st.next_q >= c_int::MAX - 1 {
                1
            } else {
                st.next_q + 1
            };
            if !st.queues.contains_key(&st.next_q) {
                break st.next_q;
            }
        };
        st.queues
            .insert(id, Arc::new(Queue::new(id, depth as usize)));
        Ok(id)
    })
}

/// Delete a queue; `EBUSY` while operations in flight will post to it. Events not
/// dequeued are dropped.
#[unsafe(no_mangle)]
pub extern "C" fn exs_qdelete(qh: exs_qhandle_t) -> c_int {
    boundary(|| {
        let l = lib()?;
        let mut st = l.st();
        let q = st.queue(qh)?;
        let busy = q.reserved();
        if busy > 0 {
            return Err(fail(
                libc::EBUSY,
                format!("{busy} operations in flight will post to queue {qh}"),
            ));
        }
        st.queues.remove(&qh);
        q.wake_all();
        Ok(0)
    })
}

/// Change an attribute: `EXS_QATTR_DEPTH`, `EXS_QATTR_WAIT`, `EXS_QATTR_SIGNAL`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_qmodify(qh: exs_qhandle_t, attr: c_int, value: c_long) -> c_int {
    boundary(|| {
        let q = lib()?.st().queue(qh)?;
        match attr {
            EXS_QATTR_DEPTH => {
                if value < 1 || value as usize > DEPTH_MAX {
                    return Err(fail(
                        libc::EINVAL,
                        format!("queue depth {value} outside [1, {DEPTH_MAX}]"),
                    ));
                }
                q.set_depth(value as usize)?;
            }
            EXS_QATTR_WAIT => {
                if !(EXS_WAIT_DEFAULT..=EXS_WAIT_ADAPTIVE).contains(&{ value }) {
                    return Err(fail(libc::EINVAL, format!("wait mode {value}")));
                }
                q.wait.store(value, Ordering::Relaxed);
            }
            EXS_QATTR_SIGNAL => {
                if value < 0 || value > libc::SIGRTMAX() as c_long {
                    return Err(fail(libc::EINVAL, format!("signal {value}")));
                }
                q.signal.store(value as i32, Ordering::Relaxed);
            }
            _ => {
                return Err(fail(
                    libc::EINVAL,
                    format!("queue attribute {attr} cannot be changed"),
                ));
            }
        }
        Ok(0)
    })
}

/// Read an attribute: `EXS_QATTR_DEPTH`, `_EVENTS` (waiting), `_RESERVED` (operations in
/// flight), `_WAIT`, `_SIGNAL`, `_FD` (the pollable descriptor).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_qstatus(qh: exs_qhandle_t, attr: c_int, value: *mut c_long) -> c_int {
    boundary(|| {
        if value.is_null() {
            return Err(fail(libc::EFAULT, "value is NULL"));
        }
        let q = lib()?.st().queue(qh)?;
        let v = match attr {
            EXS_QATTR_DEPTH => q.depth() as c_long,
            EXS_QATTR_EVENTS => q.len() as c_long,
            EXS_QATTR_RESERVED => q.reserved() as c_long,
            EXS_QATTR_WAIT => q.wait.load(Ordering::Relaxed) as c_long,
            EXS_QATTR_SIGNAL => q.signal.load(Ordering::Relaxed) as c_long,
            EXS_QATTR_FD => q.fd()? as c_long,
            _ => return Err(fail(libc::EINVAL, format!("queue attribute {attr}"))),
        };
        // SAFETY: checked non-NULL; the caller's long.
        unsafe { *value = v };
        Ok(0)
    })
}

/// The queue's descriptor: readable while events wait (for poll/epoll). Owned by the queue.
#[unsafe(no_mangle)]
pub extern "C" fn exs_qfd(qh: exs_qhandle_t) -> c_int {
    boundary(|| {
        let q = lib()?.st().queue(qh)?;
        q.fd()
    })
}

/// How long `exs_qdequeue` busy-polls in `EXS_WAIT_ADAPTIVE` before it sleeps.
const ADAPTIVE_SPIN: Duration = Duration::from_micros(50);
/// Longest single sleep on a queue (the wait re-checks then).
const SLEEP_SLICE: Duration = Duration::from_millis(100);

/// Dequeue events into `events`. `n > 0`: up to `n`, waiting (up to `timeout`; NULL: no
/// limit; zero: not at all) for the first; `n < 0`: wait until at least `-n` are there (or
/// the timeout passes), then up to `-n`. Returns how many.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_qdequeue(
    qh: exs_qhandle_t,
    events: *mut exs_event_t,
    n: c_int,
    timeout: *const libc::timespec,
) -> c_int {
    boundary(|| {
        let l = lib()?;
        if n == 0 {
            return Ok(0);
        }
        if events.is_null() {
            return Err(fail(libc::EFAULT, "events is NULL"));
        }
        let max = n.unsigned_abs() as usize;
        let want = if n < 0 { max } else { 1 };
        let q = l.st().queue(qh)?;
        if want > q.depth() {
            return Err(fail(
                libc::EINVAL,
                format!(
                    "waiting for {want} events on a queue of depth {}",
                    q.depth()
                ),
            ));
        }
        // SAFETY: a non-NULL timespec is the caller's.
        let deadline = match unsafe { timeout.as_ref() } {
            None => None,
            Some(t) if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) => {
                return Err(fail(libc::EINVAL, "invalid timeout"));
            }
            Some(t) => Some(Instant::now() + Duration::new(t.tv_sec as u64, t.tv_nsec as u32)),
        };
        // SAFETY: the caller gives room for |n| events.
        let out = unsafe { std::slice::from_raw_parts_mut(events, max) };
        let mode = match q.wait.load(Ordering::Relaxed) {
            EXS_WAIT_DEFAULT if l.engine.busy_poll.load(Ordering::Relaxed) => EXS_WAIT_BUSY_POLL,
            EXS_WAIT_DEFAULT => EXS_WAIT_NOTIFY,
            m => m,
        };
        let got = wait(l, &q, out, want, deadline, mode);
        Ok(got as c_int)
    })
}

fn wait(
    l: &'static super::Lib,
    q: &Queue,
    out: &mut [exs_event_t],
    want: usize,
    deadline: Option<Instant>,
    mode: i64,
) -> usize {
    let expired = |now: Instant| deadline.is_some_and(|d| now >= d);
    if q.len() >= want {
        return q.take(out);
    }
    let spin_until = match mode {
        EXS_WAIT_BUSY_POLL => None,
        EXS_WAIT_ADAPTIVE => Some(Instant::now() + ADAPTIVE_SPIN),
        // Notify: only the completion thread progresses. (A progress here would take the
        // transport's wake-up request from under the sleeping completion thread: the
        // peer then sees nobody asleep and rings no one.)
        _ => Some(Instant::now()),
    };
    if mode != EXS_WAIT_NOTIFY {
        // Busy-poll: progress here, spinning.
        l.engine.poll_enter();
        let mut idle = 0u32;
        loop {
            if q.len() >= want {
                break;
            }
            if engine::progress(l) == 0 {
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            } else {
                idle = 0;
            }
            let now = Instant::now();
            if expired(now) || spin_until.is_some_and(|s| now >= s) {
                break;
            }
        }
        l.engine.poll_leave();
    }
    // Notify: the completion thread delivers; sleep on the queue.
    while q.len() < want {
        let now = Instant::now();
        if expired(now) {
            break;
        }
        let slice = now + SLEEP_SLICE;
        let until = deadline.map_or(slice, |d| d.min(slice));
        q.sleep_until(want, Some(until));
    }
    q.take(out)
}
