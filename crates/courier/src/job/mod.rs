//! job — N processes that know their rank and find each other.
//!
//! A surface above `api`: it uses only the public objects (`Context`, `Worker`, `Endpoint`,
//! worker addresses) and the launcher that started the process, found from the environment
//! in this order:
//!
//! | launcher | seen as | protocol |
//! | --- | --- | --- |
//! | `courier run` | `COURIER_RUN_FD` | its own exchange over an inherited Unix socket (`runwire`) |
//! | Open MPI `mpirun`, Slurm `srun --mpi=pmix` | `PMIX_NAMESPACE` + `PMIX_RANK` | PMIx, through `libpmix.so.2` loaded at run time |
//! | Slurm `srun --mpi=pmi2` | `PMI_FD` + `PMI_JOBID` | the PMI-2 wire protocol |
//! | MPICH `mpiexec` (hydra) | `PMI_FD` + `PMI_RANK` + `PMI_SIZE` | the PMI-1 wire protocol |
//! | none | | a job of one (rank 0 of 1), said in an info log line |
//!
//! `COURIER_JOB_LAUNCHER` (run, pmix, pmi2, pmi1, single) picks one instead of looking.
//!
//! The job is one per process: `Job::init` makes it the first time and hands out the same
//! job afterwards. It offers a key-value exchange (`put`, `commit`, `fence`, `get`), a
//! barrier, `abort`, and a per-job random authentication key (`auth_key`): `courier run`
//! makes it from the OS's random source and hands it to each rank over its private socket;
//! under other launchers rank 0 makes it and shares it through the launcher's exchange at
//! `Job::init`. The job's key authenticates the job's connections: every context the
//! process makes after `Job::init` uses it (`COURIER_AUTH`; a key file named by
//! `COURIER_AUTH_KEY_FILE` wins). A key shared through another launcher's exchange is as
//! private as that exchange (PMIx and PMI serve each rank on a local socket; between
//! hosts it travels in the launcher's daemons' own traffic): it keeps out every process
//! outside the job that cannot read that traffic, and a key file is there for those who
//! want more. [`JobWorld`] publishes a worker's address and
//! connects to other ranks lazily, on first use, or all at once (`connect_all`).

mod crun;
mod pmi1;
mod pmi2;
mod pmix;
pub mod runwire;
mod single;
pub mod text;
mod world;

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use world::JobWorld;

use crate::base::{Error, Result, Status};

/// Which launcher started this process.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LauncherKind {
    /// `courier run`.
    CourierRun,
    /// PMIx (Open MPI's `mpirun`, `srun --mpi=pmix`).
    Pmix,
    /// PMI-2 (`srun --mpi=pmi2`).
    Pmi2,
    /// PMI-1 (MPICH's hydra `mpiexec`).
    Pmi1,
    /// No launcher: a job of one.
    Single,
}

impl LauncherKind {
    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            LauncherKind::CourierRun => "courier run",
            LauncherKind::Pmix => "pmix",
            LauncherKind::Pmi2 => "pmi2",
            LauncherKind::Pmi1 => "pmi1",
            LauncherKind::Single => "single",
        }
    }
}

/// What the launcher told this process about the job.
#[derive(Clone, Debug)]
pub(crate) struct Info {
    pub kind: LauncherKind,
    pub rank: u32,
    pub size: u32,
    pub local_rank: u32,
    pub local_size: u32,
    pub host: u32,
    pub jobid: String,
}

/// One launcher's client. Calls are made one at a time (the job holds a lock).
pub(crate) trait Launcher: Send {
    /// Publish `key` for this rank (visible to others after commit or fence).
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()>;
    /// Make the puts so far visible.
    fn commit(&mut self) -> Result<()>;
    /// Commit, and wait until every rank has reached the same fence.
    fn fence(&mut self, timeout: Duration) -> Result<()>;
    /// A barrier with no data; a fence unless the launcher has something cheaper.
    fn barrier(&mut self, timeout: Duration) -> Result<()> {
        self.fence(timeout)
    }
    /// `rank`'s committed `key`.
    fn get(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Ask the launcher to end the whole job with `code` (the caller exits after).
    fn abort(&mut self, code: i32, message: &str);
    /// Leave the exchange (at exit).
    fn finalize(&mut self);
}

struct Inner {
    info: Info,
    auth_key: [u8; 32],
    launcher: Mutex<Option<Box<dyn Launcher>>>,
}

/// The job this process belongs to. Cheap to clone; one per process.
#[derive(Clone)]
pub struct Job {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("launcher", &self.inner.info.kind)
            .field("rank", &self.inner.info.rank)
            .field("size", &self.inner.info.size)
            .finish()
    }
}

static JOB: Mutex<Option<Job>> = Mutex::new(None);

/// Key under which rank 0 shares the authentication key (launchers other than courier run).
const AUTH_KEY: &str = "courier.auth";

/// Most ranks a job may have: 16 M, about twice the largest MPI jobs run. A launcher's
/// size beyond it is refused before anything is sized by it (a node layout, a table of
/// peers), so that a wrong `PMI_SIZE` is an error, not an allocation that ends the process.
pub const MAX_RANKS: u32 = 1 << 24;

/// How long `Job::init` waits at its start-up fence, and `JobWorld`'s default timeout:
/// `COURIER_JOB_TIMEOUT`, 120 s unless set.
pub fn default_timeout() -> Result<Duration> {
    match env("COURIER_JOB_TIMEOUT") {
        None => Ok(Duration::from_secs(120)),
        Some(v) => crate::base::config::parse_duration(&v)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                Error::msg(
                    Status::BadConfig,
                    format!("COURIER_JOB_TIMEOUT={v:?}: give a duration above 0, such as 120s"),
                )
            }),
    }
}

pub(crate) fn ms(d: Duration) -> u32 {
    d.as_millis().min(u32::MAX as u128) as u32
}

fn log_init() {
    let level = crate::base::Config::from_env()
        .map(|c| c.log_level)
        .unwrap_or(crate::base::config::LogLevel::Warn);
    crate::base::log::init(level);
}

/// A new random authentication key from the kernel's random source (what `courier run`
/// hands its ranks, and rank 0 makes under other launchers).
pub fn new_auth_key() -> Result<[u8; 32]> {
    let mut k = [0u8; 32];
    let mut got = 0;
    while got < k.len() {
        match rustix::rand::getrandom(&mut k[got..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::io("getrandom for the job's authentication key", e)),
        }
    }
    Ok(k)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn detect() -> Result<LauncherKind> {
    if let Some(forced) = env("COURIER_JOB_LAUNCHER") {
        return match forced.to_ascii_lowercase().as_str() {
            "run" | "courier" => Ok(LauncherKind::CourierRun),
            "pmix" => Ok(LauncherKind::Pmix),
            "pmi2" => Ok(LauncherKind::Pmi2),
            "pmi1" | "pmi" => Ok(LauncherKind::Pmi1),
            "single" | "none" => Ok(LauncherKind::Single),
            "auto" => detect_auto(),
            other => Err(Error::msg(
                Status::BadConfig,
                format!(
                    "COURIER_JOB_LAUNCHER={other:?}: accepted values are auto, run, pmix, pmi2, pmi1, single"
                ),
            )),
        };
    }
    detect_auto()
}

fn detect_auto() -> Result<LauncherKind> {
    Ok(if env(runwire::ENV_FD).is_some() {
        LauncherKind::CourierRun
    } else if env("PMIX_NAMESPACE").is_some() && env("PMIX_RANK").is_some() {
        LauncherKind::Pmix
    } else if env("PMI_FD").is_some() && env("PMI_JOBID").is_some() {
        LauncherKind::Pmi2
    } else if env("PMI_FD").is_some() && env("PMI_RANK").is_some() {
        LauncherKind::Pmi1
    } else {
        LauncherKind::Single
    })
}

extern "C" fn finalize_at_exit() {
    // At exit another thread may still hold the job's lock; then leave it to the launcher
    // to see the process go.
    let job = match JOB.try_lock() {
        Ok(g) => g.clone(),
        Err(_) => return,
    };
    if let Some(job) = job {
        if let Ok(mut l) = job.inner.launcher.try_lock() {
            if let Some(mut l) = l.take() {
                l.finalize();
            }
        }
    }
}

impl Job {
    /// The job this process belongs to, found from the environment (see the module docs).
    /// The first call connects to the launcher; later calls return the same job.
    pub fn init() -> Result<Job> {
        let mut g = JOB.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(j) = g.as_ref() {
            return Ok(j.clone());
        }
        log_init();
        let kind = detect()?;
        let (launcher, info, key): (Box<dyn Launcher>, Info, Option<[u8; 32]>) = match kind {
            LauncherKind::CourierRun => {
                let fd = env(runwire::ENV_FD).ok_or_else(|| {
                    Error::msg(
                        Status::InvalidParam,
                        format!(
                            "COURIER_JOB_LAUNCHER=run, but {} is not set: start the program with courier run",
                            runwire::ENV_FD
                        ),
                    )
                })?;
                let (c, info, key) = crun::connect(&fd)?;
                // `courier run` handed it over its private socket: contexts of this process
                // authenticate their peers with it (unless a key file is named).
                crate::base::auth::set_job_key(&key, "the job's key (courier run)")?;
                (Box::new(c), info, Some(key))
            }
            LauncherKind::Pmix => {
                let (c, info) = pmix::connect()?;
                (Box::new(c), info, None)
            }
            LauncherKind::Pmi2 => {
                let (c, info) = pmi2::connect()?;
                (Box::new(c), info, None)
            }
            LauncherKind::Pmi1 => {
                let (c, info) = pmi1::connect()?;
                (Box::new(c), info, None)
            }
            LauncherKind::Single => {
                tracing::info!(
                    "no launcher in the environment ({}, PMIX_RANK, PMI_FD unset): this process is a job of one (rank 0 of 1)",
                    runwire::ENV_FD
                );
                let (c, info) = single::Local::new();
                (Box::new(c), info, Some(new_auth_key()?))
            }
        };
        if info.size > MAX_RANKS {
            return Err(Error::msg(
                Status::ProtocolError,
                format!(
                    "{} gave a job of {} ranks: Courier takes at most {MAX_RANKS}",
                    info.kind.name(),
                    info.size
                ),
            ));
        }
        let mut launcher = launcher;
        let auth_key = match key {
            Some(k) => k,
            None => {
                let k = share_auth_key(launcher.as_mut(), &info)?;
                // Contexts of this process authenticate their peers with it too: a job
                // across hosts needs no configuration under any launcher.
                let source = format!(
                    "the job's key (made by rank 0, shared through {}'s exchange)",
                    info.kind.name()
                );
                crate::base::auth::set_job_key(&k, &source)?;
                k
            }
        };
        tracing::debug!(
            "job: rank {} of {} (local {} of {}, host {}) under {}",
            info.rank,
            info.size,
            info.local_rank,
            info.local_size,
            info.host,
            info.kind.name()
        );
        let job = Job {
            inner: Arc::new(Inner {
                info,
                auth_key,
                launcher: Mutex::new(Some(launcher)),
            }),
        };
        if kind != LauncherKind::Single {
            // SAFETY: registers a plain extern "C" function with no arguments; it only
            // touches statics of this library, which live as long as the process.
            unsafe {
                libc::atexit(finalize_at_exit);
            }
        }
        *g = Some(job.clone());
        Ok(job)
    }

    /// This process's rank, 0 to size - 1.
    pub fn rank(&self) -> u32 {
        self.inner.info.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.inner.info.size
    }

    /// Rank among the job's processes on this host.
    pub fn local_rank(&self) -> u32 {
        self.inner.info.local_rank
    }

    /// The job's processes on this host.
    pub fn local_size(&self) -> u32 {
        self.inner.info.local_size
    }

    /// This host's index in the job (0 under `courier run`, which is one host).
    pub fn host_id(&self) -> u32 {
        self.inner.info.host
    }

    /// The launcher that started this process.
    pub fn launcher(&self) -> LauncherKind {
        self.inner.info.kind
    }

    /// The launcher's name for the job (a PMIx namespace, a Slurm job id, ...).
    pub fn jobid(&self) -> &str {
        &self.inner.info.jobid
    }

    /// The job's random 32-byte authentication key, the same in every rank and unknown
    /// outside the job. Under `courier run`, contexts made after `Job::init` authenticate
    /// their peers with it.
    pub fn auth_key(&self) -> Option<[u8; 32]> {
        Some(self.inner.auth_key)
    }

    fn with<T>(&self, f: impl FnOnce(&mut dyn Launcher) -> Result<T>) -> Result<T> {
        let mut g = self
            .inner
            .launcher
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match g.as_mut() {
            Some(l) => f(l.as_mut()),
            None => Err(Error::new(
                Status::EndpointClosed,
                "the job has left its launcher's exchange (finalized)",
            )),
        }
    }

    /// Publish `value` under `key` for this rank; other ranks see it after `commit` or
    /// `fence`.
    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        runwire::check_key(key)?;
        self.with(|l| l.put(key, value))
    }

    /// Make this rank's puts visible to the others.
    pub fn commit(&self) -> Result<()> {
        self.with(|l| l.commit())
    }

    /// Commit, then wait until every rank has reached this fence (at most `timeout`; a
    /// timed-out fence names the ranks that did not come, where the launcher can tell).
    pub fn fence(&self, timeout: Duration) -> Result<()> {
        self.with(|l| l.fence(timeout))
    }

    /// `rank`'s value for `key`, waiting at most `timeout` for it to be committed (launchers
    /// that cannot wait need a fence between the put and the get).
    pub fn get(&self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        runwire::check_key(key)?;
        if rank >= self.size() {
            return Err(Error::msg(
                Status::InvalidParam,
                format!("rank {rank} is not in this job of {}", self.size()),
            ));
        }
        self.with(|l| l.get(rank, key, timeout))
    }

    /// Wait until every rank has reached this barrier (at most `timeout`).
    pub fn barrier(&self, timeout: Duration) -> Result<()> {
        self.with(|l| l.barrier(timeout))
    }

    /// End the whole job: every rank, under every launcher. The launcher exits with `code`
    /// where it can; this process exits with it in any case.
    pub fn abort(&self, code: i32, message: &str) -> ! {
        eprintln!(
            "courier: rank {} of {} aborts the job with code {code}: {message}",
            self.rank(),
            self.size()
        );
        if let Ok(mut g) = self.inner.launcher.try_lock() {
            if let Some(l) = g.as_mut() {
                l.abort(code, message);
                // The launcher ends every rank, this one included. Exiting at once races
                // its teardown (Slurm's PMI-2 then lets the other ranks' fence pass without
                // this one), so wait a moment to be ended, and exit ourselves only after.
                if self.launcher() != LauncherKind::Single {
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        }
        let status = if code == 0 { 1 } else { code };
        // SAFETY: _exit ends the process at once, with no unwinding or destructors; the
        // launcher is ending the job anyway.
        unsafe { libc::_exit(status & 0xff) }
    }

    /// Leave the launcher's exchange now instead of at exit. Later calls that need the
    /// launcher fail.
    pub fn finalize(&self) {
        let mut g = self
            .inner
            .launcher
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(mut l) = g.take() {
            l.finalize();
        }
    }
}

/// Rank 0 makes the key and publishes it; everyone fences and reads it.
fn share_auth_key(l: &mut dyn Launcher, info: &Info) -> Result<[u8; 32]> {
    let timeout = default_timeout()?;
    let mine = if info.rank == 0 {
        let k = new_auth_key()?;
        l.put(AUTH_KEY, &k)?;
        Some(k)
    } else {
        None
    };
    l.fence(timeout).map_err(|e| {
        Error::msg(
            e.status(),
            format!(
                "job start-up under {}: the first fence (sharing the authentication key; COURIER_JOB_TIMEOUT): {}",
                info.kind.name(),
                e.detail()
            ),
        )
    })?;
    if let Some(k) = mine {
        return Ok(k);
    }
    let v = l.get(0, AUTH_KEY, timeout)?;
    v.as_slice().try_into().map_err(|_| {
        Error::msg(
            Status::ProtocolError,
            format!("rank 0's authentication key is {} bytes, not 32", v.len()),
        )
    })
}
