//! Communication contexts: `SHMEM_CTX_DEFAULT`, `shmem_ctx_create`, team contexts.
//!
//! Every context issues through the PE's one worker; a context remembers its team (PE
//! numbers given to its operations are team-relative) and its options. `shmem_ctx_quiet`
//! completes the context's operations by completing every operation of the PE: stronger
//! than asked, never weaker.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::error::fatal;
use crate::init::World;
use crate::team::{self, TeamData, TeamHandle};

/// `SHMEM_CTX_PRIVATE`.
pub const CTX_PRIVATE: i64 = 1 << 0;
/// `SHMEM_CTX_SERIALIZED`.
pub const CTX_SERIALIZED: i64 = 1 << 1;
/// `SHMEM_CTX_NOSTORE`.
pub const CTX_NOSTORE: i64 = 1 << 2;

/// A context (what a `shmem_ctx_t` points at).
pub struct Ctx {
    /// The team its PE numbers refer to (`None`: the world).
    pub team: Option<&'static TeamData>,
    /// The handle of that team.
    pub team_handle: Option<TeamHandle>,
    /// `SHMEM_CTX_*` options (hints: every context is safe for any use).
    #[allow(dead_code)]
    pub options: i64,
}

/// `SHMEM_CTX_DEFAULT`'s object.
pub static DEFAULT: Ctx = Ctx {
    team: None,
    team_handle: None,
    options: 0,
};

/// A handle as C sees it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtxHandle(pub *mut c_void);
// SAFETY: a handle is an address of a context that lives for the rest of the process.
unsafe impl Sync for CtxHandle {}
// SAFETY: as above.
unsafe impl Send for CtxHandle {}

/// `SHMEM_CTX_INVALID`.
pub const INVALID: CtxHandle = CtxHandle(std::ptr::null_mut());

/// `SHMEM_CTX_DEFAULT`'s handle.
pub const fn default_handle() -> CtxHandle {
    CtxHandle(&DEFAULT as *const Ctx as *mut c_void)
}

static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

impl Ctx {
    /// The world, checked (before init, after finalize).
    #[inline(always)]
    pub fn world(&self, call: &'static str) -> &'static World {
        crate::init::world(call)
    }
    /// The world PE of this context's PE `pe`, checked.
    #[inline(always)]
    pub fn pe(&self, w: &World, call: &'static str, pe: i32) -> usize {
        match self.team {
            None => w.check_pe(call, pe),
            Some(t) => t.world_pe(call, pe),
        }
    }
}

/// The context behind a C handle; an invalid or unknown one is a fatal error of `call`.
#[inline(always)]
pub fn from_handle(call: &'static str, h: CtxHandle) -> &'static Ctx {
    if h == default_handle() {
        return &DEFAULT;
    }
    other(call, h)
}

#[cold]
#[inline(never)]
fn other(call: &'static str, h: CtxHandle) -> &'static Ctx {
    if h.0.is_null() {
        fatal(call, "ctx=SHMEM_CTX_INVALID: not a usable context")
    }
    let known = LIVE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|s| s.contains(&(h.0 as usize)));
    if !known {
        fatal(
            call,
            format_args!(
                "ctx={:p}: not a context of this PE (never created, or destroyed)",
                h.0
            ),
        )
    }
    // SAFETY: live handles point at leaked `Ctx` objects.
    unsafe { &*(h.0 as *const Ctx) }
}

/// `shmem_ctx_create` / `shmem_team_create_ctx`: 0 and the handle, or nonzero.
pub fn create(
    call: &'static str,
    team: Option<TeamHandle>,
    options: i64,
    out: &mut CtxHandle,
) -> i32 {
    *out = INVALID;
    crate::init::world(call);
    if options & !(CTX_PRIVATE | CTX_SERIALIZED | CTX_NOSTORE) != 0 {
        crate::error::debug(format_args!("{call}: options={options:#x}: unknown bits"));
        return -1;
    }
    let (t, th) = match team {
        None => (None, None),
        Some(h) => match team::lookup(call, h) {
            None => return -1,
            // A world-team context is the plain one.
            Some(d) if d.id == 0 => (None, Some(h)),
            Some(d) => (Some(d), Some(h)),
        },
    };
    let c: &'static Ctx = Box::leak(Box::new(Ctx {
        team: t,
        team_handle: th,
        options,
    }));
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(c as *const Ctx as usize);
    *out = CtxHandle(c as *const Ctx as *mut c_void);
    0
}

/// `shmem_ctx_destroy`: completes its operations, then the handle is dead.
pub fn destroy(call: &'static str, h: CtxHandle) {
    if h.0.is_null() {
        return;
    }
    if h == default_handle() {
        fatal(call, "ctx=SHMEM_CTX_DEFAULT cannot be destroyed")
    }
    let c = from_handle(call, h);
    let _ = c;
    crate::rma::quiet_all(crate::init::world(call), call);
    if let Some(s) = LIVE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        s.remove(&(h.0 as usize));
    }
}

/// `shmem_ctx_get_team`.
pub fn get_team(call: &'static str, h: CtxHandle, out: &mut TeamHandle) -> i32 {
    *out = team::INVALID;
    if h.0.is_null() {
        return -1;
    }
    let c = from_handle(call, h);
    *out = c.team_handle.unwrap_or_else(team::world_handle);
    0
}
