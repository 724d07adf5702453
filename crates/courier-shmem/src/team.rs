//! Teams: `SHMEM_TEAM_WORLD`, `SHMEM_TEAM_SHARED` (the PEs whose memory this PE reaches
//! with loads and stores), strided and 2-D splits, translation, destruction.
//!
//! A team is its members' world PE numbers in team order. Collectives need no per-team
//! symmetric state (they synchronize on pairwise counters, `coll`), so creating one costs
//! a synchronization of the parent and nothing else.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::fatal;
use crate::init::World;

/// `shmem_team_config_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TeamConfig {
    /// Contexts the team is expected to create.
    pub num_contexts: i32,
}

/// `SHMEM_TEAM_NUM_CONTEXTS`: the mask bit of `num_contexts`.
pub const TEAM_NUM_CONTEXTS: i64 = 1;

/// A team (what a `shmem_team_t` points at).
pub struct Team {
    data: OnceLock<TeamData>,
}

/// What a team is.
pub struct TeamData {
    /// World PE numbers, in team order.
    pub members: Vec<usize>,
    /// Team index of each world PE (-1: not a member).
    pub index: Vec<i32>,
    /// This PE's index.
    pub me: usize,
    /// Its configuration.
    pub config: TeamConfig,
    /// A number for messages.
    pub id: u64,
    /// Set by `shmem_team_destroy`.
    pub destroyed: AtomicBool,
}

/// `SHMEM_TEAM_WORLD`'s object.
pub static WORLD_TEAM: Team = Team {
    data: OnceLock::new(),
};
/// `SHMEM_TEAM_SHARED`'s object.
pub static SHARED_TEAM: Team = Team {
    data: OnceLock::new(),
};

/// A handle as C sees it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TeamHandle(pub *mut c_void);
// SAFETY: a handle is an address; the team behind it is shared through `&'static`.
unsafe impl Sync for TeamHandle {}
// SAFETY: as above.
unsafe impl Send for TeamHandle {}

/// `SHMEM_TEAM_INVALID`.
pub const INVALID: TeamHandle = TeamHandle(std::ptr::null_mut());

impl TeamHandle {
    fn of(t: &'static Team) -> TeamHandle {
        TeamHandle(t as *const Team as *mut c_void)
    }
}

static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(2);

fn live() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

fn make(
    members: Vec<usize>,
    npes: usize,
    me_world: usize,
    config: TeamConfig,
    id: u64,
) -> TeamData {
    let mut index = vec![-1i32; npes];
    for (i, &pe) in members.iter().enumerate() {
        index[pe] = i as i32;
    }
    let me = index[me_world].max(0) as usize;
    TeamData {
        members,
        index,
        me,
        config,
        id,
        destroyed: AtomicBool::new(false),
    }
}

/// Set up the world and shared teams (at init).
pub fn init_predefined(w: &World) {
    let world = make(
        (0..w.npes).collect(),
        w.npes,
        w.me,
        TeamConfig::default(),
        0,
    );
    let _ = WORLD_TEAM.data.set(world);
    let shared: Vec<usize> = (0..w.npes).filter(|&p| w.same_host(p)).collect();
    let _ = SHARED_TEAM
        .data
        .set(make(shared, w.npes, w.me, TeamConfig::default(), 1));
    let mut g = live();
    let set = g.get_or_insert_with(HashSet::new);
    set.insert(&WORLD_TEAM as *const Team as usize);
    set.insert(&SHARED_TEAM as *const Team as usize);
}

/// The team behind `h`, or `None` for `SHMEM_TEAM_INVALID`; a handle that is no team of
/// this job, or a destroyed one, is a fatal error of `call`.
pub fn lookup(call: &'static str, h: TeamHandle) -> Option<&'static TeamData> {
    if h.0.is_null() {
        return None;
    }
    let known = live().as_ref().is_some_and(|s| s.contains(&(h.0 as usize)));
    if !known {
        fatal(
            call,
            format_args!(
                "team={:p}: not a team of this job (never created, or destroyed)",
                h.0
            ),
        )
    }
    // SAFETY: a live team handle points at a `Team` that is never freed.
    let t = unsafe { &*(h.0 as *const Team) };
    let d = t
        .data
        .get()
        .unwrap_or_else(|| fatal(call, "team used before shmem_init"));
    if d.destroyed.load(Ordering::Relaxed) {
        fatal(
            call,
            format_args!("team={:p}: used after shmem_team_destroy", h.0),
        )
    }
    Some(d)
}

/// The world team.
pub fn world_team() -> &'static TeamData {
    WORLD_TEAM
        .data
        .get()
        .unwrap_or_else(|| fatal("shmem", "the world team is not set up"))
}

impl TeamData {
    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }
    /// The world PE of team member `i`, checked.
    pub fn world_pe(&self, call: &'static str, i: i32) -> usize {
        if i < 0 || i as usize >= self.members.len() {
            fatal(
                call,
                format_args!(
                    "pe={i}: out of range for a team of {} PEs",
                    self.members.len()
                ),
            )
        }
        self.members[i as usize]
    }
}

/// Register a new team object and return its handle.
fn publish(d: TeamData) -> TeamHandle {
    let t: &'static Team = Box::leak(Box::new(Team {
        data: OnceLock::new(),
    }));
    let _ = t.data.set(d);
    live()
        .get_or_insert_with(HashSet::new)
        .insert(t as *const Team as usize);
    TeamHandle::of(t)
}

/// `shmem_team_split_strided`: members `start + k * stride` (k < size) of `parent`.
#[allow(clippy::too_many_arguments)]
pub fn split_strided(
    call: &'static str,
    w: &World,
    parent: TeamHandle,
    start: i32,
    stride: i32,
    size: i32,
    config: Option<TeamConfig>,
    mask: i64,
    out: &mut TeamHandle,
) -> i32 {
    *out = INVALID;
    let Some(p) = lookup(call, parent) else {
        return -1;
    };
    let n = p.size() as i64;
    let (s0, st, sz) = (start as i64, stride as i64, size as i64);
    let last = s0 + st * (sz - 1);
    let valid =
        sz >= 1 && sz <= n && s0 >= 0 && s0 < n && last >= 0 && last < n && (st != 0 || sz == 1);
    // Everyone in the parent synchronizes, valid or not, so nobody is left waiting.
    crate::coll::sync_team(w, call, p);
    if !valid {
        crate::error::debug(format_args!(
            "{call}: start={start} stride={stride} size={size} do not fit a parent of {n} PEs"
        ));
        return -1;
    }
    let members: Vec<usize> = (0..sz).map(|k| p.members[(s0 + st * k) as usize]).collect();
    if !members.contains(&w.me) {
        return 0;
    }
    let cfg = match config {
        Some(c) if mask & TEAM_NUM_CONTEXTS != 0 => c,
        _ => TeamConfig::default(),
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    *out = publish(make(members, w.npes, w.me, cfg, id));
    0
}

/// `shmem_team_split_2d`: rows of `xrange` consecutive members, and the columns.
#[allow(clippy::too_many_arguments)]
pub fn split_2d(
    call: &'static str,
    w: &World,
    parent: TeamHandle,
    xrange: i32,
    xcfg: Option<TeamConfig>,
    xmask: i64,
    xout: &mut TeamHandle,
    ycfg: Option<TeamConfig>,
    ymask: i64,
    yout: &mut TeamHandle,
) -> i32 {
    *xout = INVALID;
    *yout = INVALID;
    let Some(p) = lookup(call, parent) else {
        return -1;
    };
    if xrange <= 0 {
        crate::coll::sync_team(w, call, p);
        return -1;
    }
    let n = p.size();
    let x = (xrange as usize).min(n);
    let me = p.me;
    let row = me / x;
    let col = me % x;
    let row_start = row * x;
    let row_len = x.min(n - row_start);
    // Both splits are collective over the parent; each PE joins its own row and column.
    crate::coll::sync_team(w, call, p);
    let pick = |c: Option<TeamConfig>, m: i64| match c {
        Some(c) if m & TEAM_NUM_CONTEXTS != 0 => c,
        _ => TeamConfig::default(),
    };
    let xs: Vec<usize> = (0..row_len).map(|k| p.members[row_start + k]).collect();
    let ys: Vec<usize> = (col..n).step_by(x).map(|k| p.members[k]).collect();
    *xout = publish(make(
        xs,
        w.npes,
        w.me,
        pick(xcfg, xmask),
        NEXT_ID.fetch_add(1, Ordering::Relaxed),
    ));
    *yout = publish(make(
        ys,
        w.npes,
        w.me,
        pick(ycfg, ymask),
        NEXT_ID.fetch_add(1, Ordering::Relaxed),
    ));
    crate::coll::sync_team(w, call, p);
    0
}

/// `shmem_team_destroy`.
pub fn destroy(call: &'static str, h: TeamHandle) {
    let Some(d) = lookup(call, h) else { return };
    if h.0 == &WORLD_TEAM as *const Team as *mut c_void
        || h.0 == &SHARED_TEAM as *const Team as *mut c_void
    {
        fatal(
            call,
            "the predefined teams (SHMEM_TEAM_WORLD, SHMEM_TEAM_SHARED) cannot be destroyed",
        )
    }
    d.destroyed.store(true, Ordering::Relaxed);
    if let Some(s) = live().as_mut() {
        s.remove(&(h.0 as usize));
    }
}

/// `shmem_team_translate_pe`.
pub fn translate(call: &'static str, src: TeamHandle, pe: i32, dst: TeamHandle) -> i32 {
    let (Some(s), Some(d)) = (lookup(call, src), lookup(call, dst)) else {
        return -1;
    };
    if pe < 0 || pe as usize >= s.size() {
        return -1;
    }
    d.index[s.members[pe as usize]]
}

/// The world handles, for the C statics.
pub fn world_handle() -> TeamHandle {
    TeamHandle::of(&WORLD_TEAM)
}
