//! Worker: progress, sleeping (arm / wait / signal / event fd), its address, endpoints
//! peers opened to it.

use std::ffi::c_void;
use std::time::Duration;

use courier_core::{ThreadMode, Worker, WorkerParams};

use crate::context::courier_context_t;
use crate::ffi::*;
use crate::handle::*;
use crate::status::*;

/// Used only by the thread that created it; no locking. Calls from another thread fail
/// with `COURIER_ERR_INVALID_PARAM`.
pub const COURIER_THREAD_MODE_SINGLE: u32 = 0;
/// Usable from many threads at once.
pub const COURIER_THREAD_MODE_MULTI: u32 = 1;

/// `courier_worker_params_t.thread_mode` is set (otherwise single).
pub const COURIER_WORKER_FIELD_THREAD_MODE: u64 = 1 << 0;

/// Parameters of `courier_worker_create`.
#[repr(C)]
pub struct courier_worker_params_t {
    /// Which fields below are set (`COURIER_WORKER_FIELD_*`).
    pub field_mask: u64,
    /// `COURIER_THREAD_MODE_SINGLE` or `COURIER_THREAD_MODE_MULTI`.
    pub thread_mode: u32,
}

/// A progress engine with its own address and connections.
pub struct courier_worker_t {
    pub(crate) w: Worker,
}
handle_kind!(courier_worker_t, 2, "worker");

/// Create a worker of `context` (params may be NULL: single-thread mode).
/// `COURIER_ERR_INVALID_PARAM` for unknown bits in `field_mask` or an unknown thread mode.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_create(
    context: *const courier_context_t,
    params: *const courier_worker_params_t,
    worker_out: *mut *mut courier_worker_t,
) -> courier_status_t {
    boundary(|| {
        let c = get(context, "context")?;
        let out = out_arg(worker_out, "worker_out")?;
        let mut p = WorkerParams::default();
        // SAFETY: NULL (refused or defaulted) or the caller's valid params struct.
        let params = unsafe { params.as_ref() };
        if let Some(params) = params {
            known_bits(
                "worker field_mask",
                params.field_mask,
                COURIER_WORKER_FIELD_THREAD_MODE,
            )?;
        }
        if let Some(params) = params.filter(|p| has(p.field_mask, COURIER_WORKER_FIELD_THREAD_MODE))
        {
            p.thread_mode = match params.thread_mode {
                COURIER_THREAD_MODE_SINGLE => ThreadMode::Single,
                COURIER_THREAD_MODE_MULTI => ThreadMode::Multi,
                m => return Err(invalid(&format!("unknown thread mode {m}"))),
            };
        }
        let w = Worker::new(&c.ctx, p)?;
        let h = insert(courier_worker_t { w })?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Destroy a worker handle. Endpoints, listeners and requests made from it keep the
/// worker's state alive until they are released; release them first (using them after
/// the worker handle is destroyed is safe: it fails or completes, never undefined).
/// `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a worker already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_destroy(worker: *mut courier_worker_t) -> courier_status_t {
    boundary(|| {
        drop(remove(worker, "worker")?);
        Ok(COURIER_OK)
    })
}

/// Make progress: handle arrivals, retry queued sends, run callbacks. Returns how many
/// events were handled (0 for the wrong thread, or for an invalid handle: then
/// `courier_last_error_detail()` says why).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_progress(worker: *const courier_worker_t) -> u32 {
    boundary_or(0, || match get(worker, "worker") {
        Ok(w) => {
            let n = w.w.progress();
            n.min(u32::MAX as usize) as u32
        }
        Err(e) => {
            record(&e);
            0
        }
    })
}

/// Prepare to sleep. `*armed_out = true`: nothing is waiting and the event fd will wake on
/// the next arrival; `false`: progress instead. Needs `COURIER_FEATURE_WAKEUP`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_arm(
    worker: *const courier_worker_t,
    armed_out: *mut bool,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let out = out_arg(armed_out, "armed_out")?;
        let armed = w.w.arm()?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = armed };
        Ok(COURIER_OK)
    })
}

/// Sleep until something arrives, `courier_worker_signal` is called, or `timeout_ms`
/// passes (negative: no limit). Returns at once if there is work to progress.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_wait(
    worker: *const courier_worker_t,
    timeout_ms: i64,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let t = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        w.w.wait(t)?;
        Ok(COURIER_OK)
    })
}

/// Wake a thread sleeping in `courier_worker_wait` or on the event fd. Callable from any
/// thread, also for a single-thread worker.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_signal(
    worker: *const courier_worker_t,
) -> courier_status_t {
    boundary(|| {
        get(worker, "worker")?.w.signal()?;
        Ok(COURIER_OK)
    })
}

/// An fd that becomes readable when the worker has work (after arming); add it to your own
/// poll loop. Owned by the worker: do not close it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_event_fd(
    worker: *const courier_worker_t,
    fd_out: *mut i32,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let out = out_arg(fd_out, "fd_out")?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = w.w.event_fd() };
        Ok(COURIER_OK)
    })
}

/// This worker's address for peers to connect to (`courier_ep_create` with
/// `COURIER_EP_FIELD_REMOTE_ADDRESS`). Release `*address_out` with `courier_buffer_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_worker_address(
    worker: *const courier_worker_t,
    address_out: *mut *mut c_void,
    length_out: *mut usize,
) -> courier_status_t {
    boundary(|| {
        let w = get(worker, "worker")?;
        let out = out_arg(address_out, "address_out")?;
        let len_out = out_arg(length_out, "length_out")?;
        let a = w.w.address()?;
        // SAFETY: plain allocation; released by courier_buffer_free (free).
        let p = unsafe { libc::malloc(a.len().max(1)) } as *mut u8;
        if p.is_null() {
            return Err(courier_core::Error::new(
                courier_core::Status::NoMemory,
                "malloc failed",
            ));
        }
        // SAFETY: `p` is a fresh allocation of at least `bytes.len()` bytes (checked non-NULL).
        unsafe {
            std::ptr::copy_nonoverlapping(a.as_ptr(), p, a.len());
            *out = p as *mut c_void;
            *len_out = a.len();
        }
        Ok(COURIER_OK)
    })
}

/// Release a buffer the library allocated for the caller (NULL is fine).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_buffer_free(buffer: *mut c_void) {
    // SAFETY: allocated with malloc by the library, or NULL.
    unsafe { libc::free(buffer) }
}
