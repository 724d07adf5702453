//! Extended Sockets (EXS) on Courier: the Open Group's ES-API shape (memory registration,
//! event queues, asynchronous socket calls), as UNH-EXS implemented it over verbs, here over
//! Courier's shared memory and tcp, and over kernel sockets through epoll.
//!
//! Rooms:
//! - `abi`: the C types and constants (`include/exs.h` is written by hand and must agree;
//!   the sizes are checked at build time here and by the C tests there).
//! - `api`, `api_q`: the exported functions, each behind the panic boundary, returning -1
//!   with `errno` on failure.
//! - `queue`: event queues, their reservations and their pollable descriptor.
//! - `mem`: memory registrations.
//! - `msg`: `exs_sendmsg` and `exs_recvmsg` (scatter/gather over a `msghdr`).
//! - `sock`: the descriptor table and connection set-up (listen, accept, connect, close).
//! - `conn`: a Courier connection's set-up, dispatch and close; `recv` and `send`: its data
//!   path (advertisements, eager data, credits, direct placement with a put-with-signal);
//!   `wire`: the messages.
//! - `place`: large chunks placed by Courier's rendezvous (both processes copy, over
//!   shared memory) instead of one put-with-signal.
//! - `engine`: progress, the completion thread, busy-polling.
//! - `ksock`: the same calls on kernel sockets.
//!
//! One process-wide library (`exs_init`): one Courier context and one multi-thread worker,
//! one state behind one lock. Lock order: the state, then the worker. Courier runs
//! callbacks (active-message handlers, completions, endpoint errors) inside progress with
//! its worker unlocked, and they take the state: so nothing here calls anything that
//! progresses (flush, close, waits) while holding the state.

pub(crate) mod abi;
mod api;
mod api_q;
mod conn;
mod engine;
mod inplace;
mod ksock;
mod mem;
mod msg;
mod place;
mod queue;
mod recv;
mod send;
mod sock;
mod wire;

pub use abi::*;
pub use api::*;
pub use api_q::*;
pub use msg::{exs_recvmsg, exs_sendmsg};

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use courier_core::{Context, ContextParams, Error, Features, Status, Worker, WorkerParams};

use crate::ffi::set_last_error;

/// A failure: the errno to report and the sentence behind it.
#[derive(Debug, Clone)]
pub(crate) struct Fail {
    pub errno: i32,
    pub detail: String,
}

pub(crate) type XResult<T> = Result<T, Fail>;

/// A failure with `errno` and why.
pub(crate) fn fail(errno: i32, detail: impl Into<String>) -> Fail {
    Fail {
        errno,
        detail: detail.into(),
    }
}

/// The errno that says what a Courier error means to a sockets programmer.
pub(crate) fn errno_of(e: &Error) -> i32 {
    // An error that came from a system call says which.
    if let Some(n) = os_errno(e.detail()) {
        return n;
    }
    match e.status() {
        Status::PeerFailure => libc::ECONNRESET,
        Status::EndpointClosed => libc::EPIPE,
        Status::Rejected => libc::ECONNREFUSED,
        Status::Unreachable => libc::EHOSTUNREACH,
        Status::Timeout => libc::ETIMEDOUT,
        Status::NoMemory => libc::ENOMEM,
        Status::NoResource => libc::EAGAIN,
        Status::InvalidParam | Status::BadConfig => libc::EINVAL,
        Status::InvalidAddress => libc::EADDRNOTAVAIL,
        Status::Unsupported | Status::NoDevice => libc::EOPNOTSUPP,
        Status::Canceled => libc::ECANCELED,
        Status::MessageTruncated => libc::EMSGSIZE,
        Status::AccessDenied | Status::OutOfRange | Status::InvalidKey => libc::EFAULT,
        Status::ProtocolError => libc::EPROTO,
        _ => libc::EIO,
    }
}

/// `N` of a "(os error N)" in a sentence, as Rust prints an OS error.
fn os_errno(detail: &str) -> Option<i32> {
    let at = detail.rfind("(os error ")?;
    let rest = &detail[at + "(os error ".len()..];
    let end = rest.find(')')?;
    rest[..end].parse().ok()
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail {
            errno: errno_of(&e),
            detail: e.to_string(),
        }
    }
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn panic_fail(p: Box<dyn std::any::Any + Send>) -> Fail {
    let text = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into());
    fail(
        libc::EIO,
        format!("panic caught at the C boundary (a bug in Courier's EXS): {text}"),
    )
}

/// Run an export's body behind the panic boundary: its value, or -1 with errno set (and the
/// sentence for `exs_last_error_detail`).
pub(crate) fn boundary<T: From<i8>>(f: impl FnOnce() -> XResult<T>) -> T {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_fail(p)));
    match r {
        Ok(v) => v,
        Err(e) => {
            set_last_error(&e.detail);
            set_errno(e.errno);
            T::from(-1)
        }
    }
}

/// Like `boundary` for exports that return a handle: `invalid` on failure.
pub(crate) fn boundary_handle<T>(invalid: T, f: impl FnOnce() -> XResult<T>) -> T {
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_fail(p)));
    match r {
        Ok(v) => v,
        Err(e) => {
            set_last_error(&e.detail);
            set_errno(e.errno);
            invalid
        }
    }
}

/// The process-wide library.
pub(crate) struct Lib {
    pub ctx: Context,
    pub worker: Worker,
    st: Mutex<sock::State>,
    pub engine: engine::Engine,
}

/// The library of this process (NULL before `exs_init`, and in a child after fork: the
/// parent's library, its threads and its connections are not inherited; the child may
/// call `exs_init` for its own).
static LIB: AtomicPtr<Lib> = AtomicPtr::new(std::ptr::null_mut());
static INIT: Mutex<()> = Mutex::new(());
static ATFORK: Once = Once::new();

impl Lib {
    /// The state, locked. A panic that poisoned it was caught at the boundary and reported;
    /// the state itself stays usable.
    pub(crate) fn st(&self) -> MutexGuard<'_, sock::State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The library, once `exs_init` made it in this process.
pub(crate) fn lib() -> XResult<&'static Lib> {
    lib_opt().ok_or_else(|| fail(libc::EINVAL, "exs_init has not been called in this process"))
}

/// The library if it exists (for callbacks, which only run once it does).
pub(crate) fn lib_opt() -> Option<&'static Lib> {
    let p = LIB.load(Ordering::Acquire);
    // SAFETY: a non-NULL pointer is a leaked `Lib`, never freed.
    unsafe { p.as_ref() }
}

extern "C" fn forget_in_child() {
    // The child has a copy of the parent's library without its threads: unusable. It is
    // leaked (its descriptors are copies; closing them would not touch the parent's).
    LIB.store(std::ptr::null_mut(), Ordering::Release);
}

/// Make the library (once per process): a context with active messages, remote memory
/// access and wakeup, a multi-thread worker, and the completion thread.
pub(crate) fn init() -> XResult<&'static Lib> {
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = lib_opt() {
        return Ok(l);
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic.
        unsafe {
            libc::pthread_atfork(None, None, Some(forget_in_child));
        }
    });
    let features = Features {
        tag: false,
        am: true,
        stream: false,
        rma: true,
        atomics: false,
        wakeup: true,
    };
    let ctx = Context::new(
        ContextParams::default()
            .features(features)
            .name(&format!("exs-{}", std::process::id())),
    )?;
    let worker = Worker::new(
        &ctx,
        WorkerParams {
            thread_mode: courier_core::ThreadMode::Multi,
        },
    )?;
    worker.am_set_handler(wire::AM_ID, conn::on_am)?;
    let engine = engine::Engine::new(&worker)?;
    let l: &'static Lib = Box::leak(Box::new(Lib {
        ctx,
        worker,
        st: Mutex::new(sock::State::default()),
        engine,
    }));
    LIB.store(l as *const Lib as *mut Lib, Ordering::Release);
    engine::start_thread(l)?;
    Ok(l)
}
