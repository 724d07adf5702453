//! Requests: operations in flight, completed by a callback, `courier_request_test`, or
//! `courier_request_wait`.
//!
//! An operation that finishes at once returns `COURIER_OK`, writes no request (`*req_out`
//! is set to NULL), runs no callback, and writes `params->info` if given. One that fails
//! returns the error and never runs its callback. One that starts
//! returns `COURIER_INPROGRESS` and a request the caller must `courier_request_free`; its
//! callback (if any) runs once, inside progress, when it completes. Freeing a request that
//! is still in flight does not stop the operation: its buffer must stay valid and its
//! callback still runs.
//!
//! A request is shared by the C handle and the library's completion (an `Arc`): the
//! completion path never touches the worker, so an operation that never completes (a
//! receive nobody matched when the worker goes away) holds no worker alive.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use courier_core::{Backoff, Callback, Error, Info, Started, Status, Worker};

use crate::ffi::*;
use crate::handle::*;
use crate::status::*;

/// What a completed operation reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct courier_request_info_t {
    /// Bytes moved (for a receive: the message length).
    pub length: usize,
    /// The message's tag (tag receives).
    pub tag: u64,
    /// The word's old value (fetching atomics: `courier_ep_atomic`).
    pub value: u64,
}

impl From<Info> for courier_request_info_t {
    fn from(i: Info) -> Self {
        courier_request_info_t {
            length: i.length,
            tag: i.tag,
            value: i.value,
        }
    }
}

/// Completion callback: the final status, what the operation reported, and the
/// `user_data` given with the operation. Runs inside progress. On failure,
/// `courier_last_error_detail()` holds the reason while the callback runs.
pub type courier_completion_cb_t = Option<
    unsafe extern "C-unwind" fn(
        status: courier_status_t,
        info: *const courier_request_info_t,
        user_data: *mut c_void,
    ),
>;

/// `courier_op_params_t.cb` is set.
pub const COURIER_OP_FIELD_CALLBACK: u64 = 1 << 0;
/// `courier_op_params_t.user_data` is set.
pub const COURIER_OP_FIELD_USER_DATA: u64 = 1 << 1;
/// `courier_op_params_t.info` is set.
pub const COURIER_OP_FIELD_INFO: u64 = 1 << 2;

const OP_FIELDS: u64 =
    COURIER_OP_FIELD_CALLBACK | COURIER_OP_FIELD_USER_DATA | COURIER_OP_FIELD_INFO;

/// Options of a non-blocking operation (may be NULL: no callback). Unknown bits in
/// `field_mask` make the operation fail with `COURIER_ERR_INVALID_PARAM` before it starts.
#[repr(C)]
pub struct courier_op_params_t {
    /// Which fields below are set (`COURIER_OP_FIELD_*`).
    pub field_mask: u64,
    /// Called when an operation that returned `COURIER_INPROGRESS` completes.
    pub cb: courier_completion_cb_t,
    /// Passed to `cb`.
    pub user_data: *mut c_void,
    /// Written when the operation completes at once (`COURIER_OK`).
    pub info: *mut courier_request_info_t,
}

/// An operation in flight.
pub struct courier_request_t {
    result: OnceLock<(courier_status_t, courier_request_info_t, Option<Error>)>,
    cb: courier_completion_cb_t,
    user_data: usize,
    /// For `courier_request_wait`; taken by `courier_request_free`.
    worker: Mutex<Option<Worker>>,
    /// The library's id of an operation that completes through its callback (0: none).
    id: AtomicU64,
    /// The start call failed: no callback may run (the library may still complete it).
    abandoned: AtomicBool,
}
handle_kind!(courier_request_t, 8, "request");

/// Requests that may be in flight at once without handles, beyond which a new operation is
/// refused before it starts (`COURIER_ERR_NO_RESOURCE`): room for every thread that passes
/// the check at the same time to still get its handle.
const REQUEST_HEADROOM: usize = 1 << 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct OpParams {
    cb: courier_completion_cb_t,
    user_data: usize,
    info: *mut courier_request_info_t,
}

/// Every operation reads these: the unknown-bits check is one AND and a cold branch.
unsafe fn op_params(p: *const courier_op_params_t) -> Result<OpParams, Error> {
    let mut o = OpParams {
        cb: None,
        user_data: 0,
        info: std::ptr::null_mut(),
    };
    // SAFETY: NULL or a valid struct.
    if let Some(p) = unsafe { p.as_ref() } {
        known_bits("op params field_mask", p.field_mask, OP_FIELDS)?;
        if has(p.field_mask, COURIER_OP_FIELD_CALLBACK) {
            o.cb = p.cb;
        }
        if has(p.field_mask, COURIER_OP_FIELD_USER_DATA) {
            o.user_data = p.user_data as usize;
        }
        if has(p.field_mask, COURIER_OP_FIELD_INFO) {
            o.info = p.info;
        }
    }
    Ok(o)
}

/// The library's completion: `word` is the operation's reference to the request.
fn on_complete(word: usize, r: Result<Info, Error>, info: Info) {
    // SAFETY: `word` came from Arc::into_raw in `start`, and the library calls this once.
    let req = unsafe { Arc::from_raw(word as *const courier_request_t) };
    req.finish(r, info);
}

/// How many finished requests a thread keeps for its next operations.
const SPARES_MAX: usize = 64;

thread_local! {
    /// Requests this thread finished with (operations that completed at once, handles it
    /// freed), for its next operations: a caller frees many requests at once when a window
    /// of sends completes, then starts as many, and they need no allocation.
    static SPARES: RefCell<Vec<Arc<courier_request_t>>> = const { RefCell::new(Vec::new()) };
}

/// Keep `r` (held by nobody else) for this thread's next operation, if there is room.
fn keep_spare(r: Arc<courier_request_t>) {
    // At thread exit the list may be gone: then `r` is simply dropped.
    let _ = SPARES.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && s.len() < SPARES_MAX
        {
            s.push(r);
        }
    });
}

impl courier_request_t {
    fn new(worker: Option<Worker>, p: &OpParams) -> courier_request_t {
        courier_request_t {
            result: OnceLock::new(),
            cb: p.cb,
            user_data: p.user_data,
            worker: Mutex::new(worker),
            id: AtomicU64::new(0),
            abandoned: AtomicBool::new(false),
        }
    }

    /// A request for `start`: this thread's spare, or a new one. It has no worker yet.
    fn take(p: &OpParams) -> Arc<courier_request_t> {
        let spare = SPARES
            .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
            .ok()
            .flatten();
        if let Some(mut r) = spare
            && let Some(m) = Arc::get_mut(&mut r)
        {
            *m = courier_request_t::new(None, p);
            return r;
        }
        Arc::new(courier_request_t::new(None, p))
    }

    /// Record the outcome; `info` is reported also on failure (a truncated receive's real
    /// length and tag).
    fn finish(&self, r: Result<Info, Error>, info: Info) {
        let (status, info, err) = match r {
            Ok(i) => (COURIER_OK, i.into(), None),
            Err(e) => (e.status().code(), info.into(), Some(e)),
        };
        if self.result.set((status, info, err.clone())).is_err()
            || self.abandoned.load(Ordering::Acquire)
        {
            return;
        }
        if let Some(cb) = self.cb {
            if let Some(e) = &err {
                record(e);
            }
            let ud = self.user_data as *mut c_void;
            // SAFETY: a C callback with the user's own data.
            call_user((), || unsafe { cb(status, &info, ud) });
        }
    }

    /// The final status, if complete.
    pub(crate) fn poll(&self) -> Option<courier_status_t> {
        self.result.get().map(|r| r.0)
    }

    fn report(&self) -> courier_status_t {
        match self.result.get() {
            Some((s, _, Some(e))) => {
                record(e);
                *s
            }
            Some((s, _, None)) => *s,
            None => COURIER_INPROGRESS,
        }
    }

    /// Progress until complete, or until `deadline` (then `Timeout`, the request still in
    /// flight).
    fn wait(&self, deadline: Option<Instant>) -> Result<courier_status_t, Error> {
        let mut backoff = Backoff::new();
        loop {
            if self.poll().is_some() {
                return Ok(self.report());
            }
            if let Some(d) = deadline
                && Instant::now() >= d
            {
                return Err(Error::new(
                    Status::Timeout,
                    "the request did not complete within the timeout; it is still in flight",
                ));
            }
            if in_callback() {
                return Err(invalid(
                    "courier_request_wait inside a callback cannot progress the worker; complete the request from outside the callback",
                ));
            }
            let w = lock(&self.worker)
                .clone()
                .ok_or_else(|| invalid("request has no worker"))?;
            if w.progress() > 0 {
                backoff.busy();
                continue;
            }
            // Spin, yield, then sleep; an error is the wrong thread for a single-thread
            // worker, or a worker that is gone.
            backoff.idle(&w)?;
        }
    }
}

/// Start an operation that completes through the library's callback.
pub(crate) unsafe fn start(
    worker: &Worker,
    params: *const courier_op_params_t,
    req_out: *mut *mut courier_request_t,
    op: impl FnOnce(Callback) -> Result<Started, Error>,
) -> Result<courier_status_t, Error> {
    let out = out_arg(req_out, "req_out")?;
    // SAFETY: `params` is NULL or the caller's valid struct (op_params' contract).
    let p = unsafe { op_params(params) }?;
    // Refused before it starts, so an operation that started always gets its handle.
    if <courier_request_t as Handle>::table().count() >= crate::handle::CAPACITY - REQUEST_HEADROOM
    {
        return Err(Error::msg(
            Status::NoResource,
            format!(
                "too many requests in flight or not freed (at most {}); free some first",
                crate::handle::CAPACITY - REQUEST_HEADROOM
            ),
        ));
    }
    let req = courier_request_t::take(&p);
    let word = Arc::into_raw(req.clone()) as usize;
    match op(Callback::Raw(on_complete, word)) {
        Ok(Started::Done(info)) => {
            // SAFETY: the library runs no callback for `Done`: take the operation's reference back.
            drop(unsafe { Arc::from_raw(word as *const courier_request_t) });
            if !p.info.is_null() {
                // SAFETY: `p.info` is the caller's info struct (checked non-NULL just above).
                unsafe { *p.info = info.into() };
            }
            // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
            unsafe { *out = std::ptr::null_mut() };
            keep_spare(req);
            Ok(COURIER_OK)
        }
        Ok(Started::Pending(id)) => {
            // Only now: an operation that completed at once needs no worker reference. The
            // completion may already be running elsewhere; it reads neither field.
            *lock(&req.worker) = Some(worker.clone());
            req.id.store(id, Ordering::Release);
            match insert_arc(req.clone()) {
                Ok(h) => {
                    // SAFETY: `out` was checked non-NULL by out_arg; the caller's output.
                    unsafe { *out = h };
                    Ok(COURIER_INPROGRESS)
                }
                // Out of reach after the headroom check above (it would take 2^16 threads
                // starting operations at the same instant): the operation goes on without
                // a handle or a callback, as one whose start failed.
                Err(e) => {
                    req.abandoned.store(true, Ordering::Release);
                    lock(&req.worker).take();
                    Err(e)
                }
            }
        }
        Err(e) => {
            // The library may still complete the request (it fails every request of an
            // endpoint that broke during the call), so the operation's reference stays with
            // it, holding no worker; the caller was told it failed, so no callback runs.
            req.abandoned.store(true, Ordering::Release);
            lock(&req.worker).take();
            Err(e)
        }
    }
}

/// `COURIER_INPROGRESS` while the request is in flight, else its final status (on failure
/// the reason is in `courier_last_error_detail()`). Does not progress the worker.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_test(req: *const courier_request_t) -> courier_status_t {
    boundary(|| {
        let r = get(req, "req")?;
        r.poll();
        Ok(r.report())
    })
}

/// Progress the request's worker until the request completes; returns its final status.
/// Must run on a thread allowed to progress the worker, never inside a callback. Between
/// progress calls that find nothing it spins, then (after 5 us of nothing) gives the CPU
/// away now and then, for a process that shares it, then (after 200 us) sleeps on the
/// worker until something arrives: Rust's `courier::Backoff`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_wait(req: *const courier_request_t) -> courier_status_t {
    boundary(|| get(req, "req")?.wait(None))
}

/// `courier_request_wait` for at most `timeout_ms` milliseconds: the request's final status,
/// or `COURIER_ERR_TIMEOUT` with the request still in flight (wait again, cancel it, or
/// free it; its buffer stays in use until it completes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_wait_timeout(
    req: *const courier_request_t,
    timeout_ms: u64,
) -> courier_status_t {
    boundary(|| {
        let r = get(req, "req")?;
        r.wait(Instant::now().checked_add(Duration::from_millis(timeout_ms)))
    })
}

/// Finish an operation whichever way it started, so its result is read in one place. Pass
/// the operation's return value, its request, and the `info` the operation's params pointed
/// to (`COURIER_OP_FIELD_INFO`; NULL if not wanted):
///
/// - `COURIER_OK`: the operation already wrote `*info`; returns `COURIER_OK`.
/// - `COURIER_INPROGRESS`: waits for `req` (progressing its worker), writes `*info` (also on
///   failure: a truncated receive's real length), frees `req`, and returns the final status.
/// - an error: returned as it is (`req` was not made).
///
/// If the wait itself cannot run (inside a callback, on the wrong thread), that error is
/// returned and `req` stays the caller's. `status` and `req` come from separate statements:
/// `s = op(..., &req); s = courier_request_finish(s, req, &info);`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_finish(
    status: courier_status_t,
    req: *mut courier_request_t,
    info: *mut courier_request_info_t,
) -> courier_status_t {
    boundary(|| {
        if status != COURIER_INPROGRESS {
            return Ok(status);
        }
        let final_status = {
            // With INPROGRESS, `req` is the request the operation made (checked).
            let r = get(req, "req")?;
            let s = r.wait(None)?;
            if let (Some((_, i, _)), false) = (r.result.get(), info.is_null()) {
                // SAFETY: the caller's info struct (checked non-NULL).
                unsafe { *info = *i };
            }
            s
        };
        // Finished here; the caller gave it up by calling us.
        release(req)?;
        Ok(final_status)
    })
}

/// What the completed request reported. `COURIER_INPROGRESS` (nothing written) while in
/// flight.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_info(
    req: *const courier_request_t,
    info_out: *mut courier_request_info_t,
) -> courier_status_t {
    boundary(|| {
        let r = get(req, "req")?;
        let out = out_arg(info_out, "info_out")?;
        r.poll();
        match r.result.get() {
            Some((_, info, _)) => {
                // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
                unsafe { *out = *info };
                Ok(COURIER_OK)
            }
            None => Ok(COURIER_INPROGRESS),
        }
    })
}

/// Ask to cancel a request that has not started moving data. `COURIER_OK`: it completes
/// with `COURIER_ERR_CANCELED` in the next progress (its callback runs then).
/// `COURIER_ERR_NO_RESOURCE`: too late to cancel (already moving data, or complete), or not
/// cancelable. Cancelable: tag and stream receives, sends still queued behind earlier ones.
/// A rendezvous active-message receive has asked the sender for the data when it starts,
/// so it is not.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_cancel(req: *const courier_request_t) -> courier_status_t {
    boundary(|| {
        let r = get(req, "req")?;
        if r.result.get().is_some() {
            return Err(Error::new(Status::NoResource, "request already completed"));
        }
        let canceled = {
            let id = r.id.load(Ordering::Acquire);
            let w = lock(&r.worker).clone();
            match w {
                Some(w) if id != 0 => w.cancel_pending(id),
                _ => false,
            }
        };
        if !canceled {
            return Err(Error::new(
                Status::NoResource,
                "request already moving data or complete; cannot cancel",
            ));
        }
        r.poll();
        Ok(COURIER_OK)
    })
}

/// End a request handle: later uses of it are refused.
fn release(req: *mut courier_request_t) -> Result<(), Error> {
    let r = remove(req, "req")?;
    lock(&r.worker).take();
    // Completed and held by nobody else: this thread's next operation reuses it (most
    // callers free one request and start the next on the same thread).
    if let Some(mut r) = r.finish()
        && Arc::get_mut(&mut r).is_some()
    {
        keep_spare(r);
    }
    Ok(())
}

/// Release the request handle. An operation still in flight continues (its buffer must
/// stay valid, its callback still runs). `COURIER_ERR_INVALID_HANDLE` (nothing done) for
/// NULL or a request already released (a stale handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_destroy(req: *mut courier_request_t) -> courier_status_t {
    boundary(|| {
        release(req)?;
        Ok(COURIER_OK)
    })
}

/// The older name of `courier_request_destroy`, kept for callers built against it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_request_free(req: *mut courier_request_t) -> courier_status_t {
    // SAFETY: forwarded contract.
    unsafe { courier_request_destroy(req) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_params() -> OpParams {
        OpParams {
            cb: None,
            user_data: 0,
            info: std::ptr::null_mut(),
        }
    }

    #[test]
    fn freed_requests_are_reused_up_to_a_bound() {
        // A window's worth of requests freed together comes back for the next window.
        let reqs: Vec<_> = (0..SPARES_MAX + 8)
            .map(|_| courier_request_t::take(&no_params()))
            .collect();
        let addrs: Vec<_> = reqs.iter().map(|r| Arc::as_ptr(r) as usize).collect();
        for r in reqs {
            keep_spare(r);
        }
        assert_eq!(SPARES.with_borrow(|s| s.len()), SPARES_MAX);
        let again: Vec<_> = (0..SPARES_MAX)
            .map(|_| courier_request_t::take(&no_params()))
            .collect();
        for r in &again {
            assert!(addrs.contains(&(Arc::as_ptr(r) as usize)));
            // Reset as new: no result, no worker, nothing abandoned.
            assert!(r.result.get().is_none());
            assert!(lock(&r.worker).is_none());
            assert!(!r.abandoned.load(Ordering::Relaxed));
        }
        assert_eq!(SPARES.with_borrow(|s| s.len()), 0);
        // A request someone else still holds is not handed out again, even when it is the
        // next spare.
        let mut again = again;
        let first = again.remove(0);
        let held = first.clone();
        for r in again {
            keep_spare(r);
        }
        keep_spare(first);
        let fresh = courier_request_t::take(&no_params());
        assert!(!Arc::ptr_eq(&fresh, &held));
    }
}
