//! Teams and contexts, and the predefined handles.

use std::ffi::{c_int, c_long};

use crate::ctx::{self, CtxHandle};
use crate::error::guard;
use crate::init::world;
use crate::team::{self, Team, TeamConfig, TeamHandle};

/// `SHMEM_TEAM_WORLD`.
#[unsafe(no_mangle)]
pub static SHMEM_TEAM_WORLD: TeamHandle = TeamHandle(&team::WORLD_TEAM as *const Team as *mut _);
/// `SHMEM_TEAM_SHARED`.
#[unsafe(no_mangle)]
pub static SHMEM_TEAM_SHARED: TeamHandle = TeamHandle(&team::SHARED_TEAM as *const Team as *mut _);
/// `SHMEM_CTX_DEFAULT`.
#[unsafe(no_mangle)]
pub static SHMEM_CTX_DEFAULT: CtxHandle = ctx::default_handle();

#[unsafe(no_mangle)]
pub extern "C" fn shmem_team_my_pe(t: TeamHandle) -> c_int {
    guard("shmem_team_my_pe", || {
        world("shmem_team_my_pe");
        team::lookup("shmem_team_my_pe", t).map_or(-1, |d| d.me as c_int)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_team_n_pes(t: TeamHandle) -> c_int {
    guard("shmem_team_n_pes", || {
        world("shmem_team_n_pes");
        team::lookup("shmem_team_n_pes", t).map_or(-1, |d| d.size() as c_int)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_team_get_config(
    t: TeamHandle,
    mask: c_long,
    config: *mut TeamConfig,
) -> c_int {
    guard("shmem_team_get_config", || {
        world("shmem_team_get_config");
        let Some(d) = team::lookup("shmem_team_get_config", t) else {
            return -1;
        };
        if config.is_null() {
            crate::error::fatal("shmem_team_get_config", "config=NULL")
        }
        if mask & team::TEAM_NUM_CONTEXTS != 0 {
            // SAFETY: the caller's config struct.
            unsafe { (*config).num_contexts = d.config.num_contexts };
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_team_translate_pe(src: TeamHandle, pe: c_int, dst: TeamHandle) -> c_int {
    guard("shmem_team_translate_pe", || {
        world("shmem_team_translate_pe");
        team::translate("shmem_team_translate_pe", src, pe, dst)
    })
}

/// A config pointer from C (may be NULL).
unsafe fn cfg(p: *const TeamConfig) -> Option<TeamConfig> {
    // SAFETY: per the caller: NULL or the caller's struct.
    (!p.is_null()).then(|| unsafe { *p })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_team_split_strided(
    parent: TeamHandle,
    start: c_int,
    stride: c_int,
    size: c_int,
    config: *const TeamConfig,
    mask: c_long,
    new_team: *mut TeamHandle,
) -> c_int {
    const CALL: &str = "shmem_team_split_strided";
    guard(CALL, || {
        let w = world(CALL);
        if new_team.is_null() {
            crate::error::fatal(CALL, "new_team=NULL")
        }
        let mut out = team::INVALID;
        // SAFETY: NULL or the caller's config.
        let r = team::split_strided(
            CALL,
            w,
            parent,
            start,
            stride,
            size,
            unsafe { cfg(config) },
            mask,
            &mut out,
        );
        // SAFETY: checked non-null; the caller's handle.
        unsafe { *new_team = out };
        r
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shmem_team_split_2d(
    parent: TeamHandle,
    xrange: c_int,
    xcfg: *const TeamConfig,
    xmask: c_long,
    xteam: *mut TeamHandle,
    ycfg: *const TeamConfig,
    ymask: c_long,
    yteam: *mut TeamHandle,
) -> c_int {
    const CALL: &str = "shmem_team_split_2d";
    guard(CALL, || {
        let w = world(CALL);
        if xteam.is_null() || yteam.is_null() {
            crate::error::fatal(CALL, "xaxis_team or yaxis_team is NULL")
        }
        let (mut x, mut y) = (team::INVALID, team::INVALID);
        // SAFETY: NULL or the caller's configs.
        let r = unsafe {
            team::split_2d(
                CALL,
                w,
                parent,
                xrange,
                cfg(xcfg),
                xmask,
                &mut x,
                cfg(ycfg),
                ymask,
                &mut y,
            )
        };
        // SAFETY: checked non-null.
        unsafe {
            *xteam = x;
            *yteam = y;
        }
        r
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_team_destroy(t: TeamHandle) {
    guard("shmem_team_destroy", || {
        world("shmem_team_destroy");
        team::destroy("shmem_team_destroy", t)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_ctx_create(options: c_long, out: *mut CtxHandle) -> c_int {
    guard("shmem_ctx_create", || {
        if out.is_null() {
            crate::error::fatal("shmem_ctx_create", "ctx=NULL")
        }
        let mut h = ctx::INVALID;
        let r = ctx::create("shmem_ctx_create", None, options, &mut h);
        // SAFETY: checked non-null.
        unsafe { *out = h };
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_team_create_ctx(
    t: TeamHandle,
    options: c_long,
    out: *mut CtxHandle,
) -> c_int {
    guard("shmem_team_create_ctx", || {
        if out.is_null() {
            crate::error::fatal("shmem_team_create_ctx", "ctx=NULL")
        }
        let mut h = ctx::INVALID;
        let r = ctx::create("shmem_team_create_ctx", Some(t), options, &mut h);
        // SAFETY: checked non-null.
        unsafe { *out = h };
        r
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn shmem_ctx_destroy(c: CtxHandle) {
    guard("shmem_ctx_destroy", || ctx::destroy("shmem_ctx_destroy", c))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shmem_ctx_get_team(c: CtxHandle, t: *mut TeamHandle) -> c_int {
    guard("shmem_ctx_get_team", || {
        if t.is_null() {
            crate::error::fatal("shmem_ctx_get_team", "team=NULL")
        }
        let mut h = team::INVALID;
        let r = ctx::get_team("shmem_ctx_get_team", c, &mut h);
        // SAFETY: checked non-null.
        unsafe { *t = h };
        r
    })
}
