//! Jobs: rank and size from whichever launcher started the process (courier run, mpirun,
//! srun, hydra; none = a job of one), a key-value exchange, a barrier, abort, the job's
//! authentication key, and wire-up: endpoints to other ranks made on first use.

use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

use courier_core::{Job, JobWorld};

use crate::endpoint::courier_ep_t;
use crate::ffi::*;
use crate::handle::*;
use crate::status::*;
use crate::worker::courier_worker_t;

/// The job this process belongs to (one per process; handles share it).
pub struct courier_job_t {
    job: Job,
}
handle_kind!(courier_job_t, 10, "job");

/// A worker's view of the job: rank to endpoint, connected on first use.
pub struct courier_job_world_t {
    world: JobWorld,
    /// The handles given out, one per rank, owned by the world (handle values as integers).
    handles: std::sync::Mutex<std::collections::HashMap<u32, usize>>,
}
handle_kind!(courier_job_world_t, 11, "job world");

impl Drop for courier_job_world_t {
    fn drop(&mut self) {
        let h = self.handles.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, p) in h.drain() {
            // Ends the handle (the connection stays with its worker). A handle the caller
            // destroyed against the rules is already gone: nothing to do.
            let _ = remove(p as *const courier_ep_t, "ep");
        }
    }
}

/// Length of the job's authentication key.
pub const COURIER_JOB_AUTH_KEY_LEN: usize = 32;

fn ms(t: u64) -> Duration {
    Duration::from_millis(t)
}

/// Join the job: detect the launcher from the environment (see docs/scale.md and the
/// README). The first call in a process connects to the launcher; later calls return a new
/// handle to the same job. Without a launcher the process is a job of one (rank 0 of 1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_init(job_out: *mut *mut courier_job_t) -> courier_status_t {
    boundary(|| {
        let out = out_arg(job_out, "job_out")?;
        let job = Job::init()?;
        let h = insert(courier_job_t { job })?;
        // SAFETY: the out-pointer was checked non-null by out_arg above; written once.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Release a handle. The job itself leaves its launcher's exchange at process exit (or at
/// `courier_job_finalize`). `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a
/// handle already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_destroy(job: *mut courier_job_t) -> courier_status_t {
    boundary(|| {
        drop(remove(job, "job")?);
        Ok(COURIER_OK)
    })
}

/// Leave the launcher's exchange now (later exchange calls fail).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_finalize(job: *const courier_job_t) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        j.job.finalize();
        Ok(COURIER_OK)
    })
}

fn number(job: *const courier_job_t, out: *mut u32, f: fn(&Job) -> u32) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        let o = out_arg(out, "out")?;
        // SAFETY: the out-pointer was checked non-null by out_arg above; written once.
        unsafe { *o = f(&j.job) };
        Ok(COURIER_OK)
    })
}

/// This process's rank (0 to size - 1), into `out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_rank(
    job: *const courier_job_t,
    out: *mut u32,
) -> courier_status_t {
    number(job, out, Job::rank)
}

/// Ranks in the job, into `out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_size(
    job: *const courier_job_t,
    out: *mut u32,
) -> courier_status_t {
    number(job, out, Job::size)
}

/// Rank among the job's processes on this host, into `out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_local_rank(
    job: *const courier_job_t,
    out: *mut u32,
) -> courier_status_t {
    number(job, out, Job::local_rank)
}

/// The job's processes on this host, into `out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_local_size(
    job: *const courier_job_t,
    out: *mut u32,
) -> courier_status_t {
    number(job, out, Job::local_size)
}

/// This host's index in the job (0 under courier run), into `out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_host_id(
    job: *const courier_job_t,
    out: *mut u32,
) -> courier_status_t {
    number(job, out, Job::host_id)
}

/// The launcher's name: "courier run", "pmix", "pmi2", "pmi1" or "single" (static string;
/// "" for an invalid handle, with the reason in `courier_last_error_detail()`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_launcher(job: *const courier_job_t) -> *const c_char {
    boundary_or(c"".as_ptr(), || {
        let j = match get(job, "job") {
            Ok(j) => j,
            Err(e) => {
                record(&e);
                return c"".as_ptr();
            }
        };
        match j.job.launcher() {
            courier_core::LauncherKind::CourierRun => c"courier run".as_ptr(),
            courier_core::LauncherKind::Pmix => c"pmix".as_ptr(),
            courier_core::LauncherKind::Pmi2 => c"pmi2".as_ptr(),
            courier_core::LauncherKind::Pmi1 => c"pmi1".as_ptr(),
            courier_core::LauncherKind::Single => c"single".as_ptr(),
        }
    })
}

/// The job's random authentication key (`COURIER_JOB_AUTH_KEY_LEN` bytes into `key_out`),
/// the same in every rank.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_auth_key(
    job: *const courier_job_t,
    key_out: *mut u8,
) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        let o = out_arg(key_out, "key_out")?;
        let k = j.job.auth_key().ok_or_else(|| {
            courier_core::Error::new(
                courier_core::Status::NoMessage,
                "this job has no authentication key",
            )
        })?;
        // SAFETY: the caller gives COURIER_JOB_AUTH_KEY_LEN writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(k.as_ptr(), o, k.len()) };
        Ok(COURIER_OK)
    })
}

/// Publish `length` bytes under `key` (NUL-terminated) for this rank; others see it after
/// `courier_job_commit` or `courier_job_fence`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_put(
    job: *const courier_job_t,
    key: *const c_char,
    value: *const c_void,
    length: usize,
) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        // SAFETY: the caller's pointer, as courier.h documents it; the helper checks it for null.
        let k = unsafe { str_arg(key, "key") }?;
        // SAFETY: the caller's pointer, as courier.h documents it; the helper checks it for null.
        let v = unsafe { bytes_arg(value, length, "value") }?;
        j.job.put(k, v)?;
        Ok(COURIER_OK)
    })
}

/// Make this rank's puts visible.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_commit(job: *const courier_job_t) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        j.job.commit()?;
        Ok(COURIER_OK)
    })
}

/// Commit, then wait (at most `timeout_ms`) until every rank has reached this fence.
/// `COURIER_ERR_TIMEOUT` names the missing ranks under `courier run` and PMIx (mpirun,
/// `srun --mpi=pmix`); PMI-1 and PMI-2 cannot tell.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_fence(
    job: *const courier_job_t,
    timeout_ms: u64,
) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        j.job.fence(ms(timeout_ms))?;
        Ok(COURIER_OK)
    })
}

/// Wait (at most `timeout_ms`) until every rank has reached this barrier.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_barrier(
    job: *const courier_job_t,
    timeout_ms: u64,
) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        j.job.barrier(ms(timeout_ms))?;
        Ok(COURIER_OK)
    })
}

/// `rank`'s value for `key`, waiting at most `timeout_ms` for it to be committed. The value
/// is allocated: release it with `courier_buffer_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_get(
    job: *const courier_job_t,
    rank: u32,
    key: *const c_char,
    timeout_ms: u64,
    value_out: *mut *mut c_void,
    length_out: *mut usize,
) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        // SAFETY: the caller's pointer, as courier.h documents it; the helper checks it for null.
        let k = unsafe { str_arg(key, "key") }?;
        let out = out_arg(value_out, "value_out")?;
        let len_out = out_arg(length_out, "length_out")?;
        let v = j.job.get(rank, k, ms(timeout_ms))?;
        // SAFETY: plain allocation; released by courier_buffer_free (free).
        let p = unsafe { libc::malloc(v.len().max(1)) } as *mut u8;
        if p.is_null() {
            return Err(courier_core::Error::new(
                courier_core::Status::NoMemory,
                "malloc failed",
            ));
        }
        // SAFETY: p was just allocated with room for v.len() bytes; out and len_out were
        // checked non-null by out_arg above.
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len());
            *out = p as *mut c_void;
            *len_out = v.len();
        }
        Ok(COURIER_OK)
    })
}

/// End the whole job, every rank, with exit code `code`; does not return.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_abort(
    job: *const courier_job_t,
    code: c_int,
    message: *const c_char,
) {
    boundary_or((), || {
        // SAFETY: the caller's pointer, as courier.h documents it; the helper checks it for null.
        let msg = unsafe { str_arg(message, "message") }.unwrap_or("(no message)");
        // An invalid handle (NULL, destroyed) still ends the process, as asked.
        match get(job, "job") {
            Ok(j) => j.job.abort(code, msg),
            Err(_) => {
                eprintln!("courier_job_abort without a job: {msg}");
                // SAFETY: ends the process at once.
                unsafe { libc::_exit(if code == 0 { 1 } else { code & 0xff }) }
            }
        }
    })
}

/// Publish `worker`'s address and fence (collective: every rank calls it). Endpoints are
/// then made on first use (`courier_job_world_endpoint`) or all at once
/// (`courier_job_world_connect_all`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_world_create(
    job: *const courier_job_t,
    worker: *const courier_worker_t,
    world_out: *mut *mut courier_job_world_t,
) -> courier_status_t {
    boundary(|| {
        let j = get(job, "job")?;
        let w = get(worker, "worker")?;
        let out = out_arg(world_out, "world_out")?;
        let world = JobWorld::new(&j.job, &w.w)?;
        let h = courier_job_world_t {
            world,
            handles: Default::default(),
        };
        let h = insert(h)?;
        // SAFETY: the out-pointer was checked non-null by out_arg above; written once.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Release a world and the endpoint handles it gave out (the connections stay with the
/// worker): later uses of those endpoint handles get `COURIER_ERR_INVALID_HANDLE`.
/// `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a world already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_world_destroy(
    world: *mut courier_job_world_t,
) -> courier_status_t {
    boundary(|| {
        drop(remove(world, "world")?);
        Ok(COURIER_OK)
    })
}

/// The endpoint to `rank`, connecting on first use. The handle belongs to the world: use
/// it until `courier_job_world_destroy`, and do not close or destroy it yourself.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_world_endpoint(
    world: *const courier_job_world_t,
    rank: u32,
    ep_out: *mut *mut courier_ep_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(world, "world")?;
        let out = out_arg(ep_out, "ep_out")?;
        let mut handles = w.handles.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&p) = handles.get(&rank) {
            // SAFETY: the out-pointer was checked non-null by out_arg above; written once.
            unsafe { *out = p as *mut courier_ep_t };
            return Ok(COURIER_OK);
        }
        let ep = w.world.endpoint(rank)?;
        let p = courier_ep_t::new_owned(ep, None)?;
        handles.insert(rank, p as usize);
        // SAFETY: the out-pointer was checked non-null by out_arg above; written once.
        unsafe { *out = p };
        Ok(COURIER_OK)
    })
}

/// Eager mode: connect to every rank now and wait until each connection is up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_world_connect_all(
    world: *const courier_job_world_t,
) -> courier_status_t {
    boundary(|| {
        let w = get(world, "world")?;
        w.world.connect_all()?;
        Ok(COURIER_OK)
    })
}

/// A job barrier during which the world's worker keeps progressing (so that peers waiting
/// on this rank's connections are served); prefer it to `courier_job_barrier` once
/// endpoints are in use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_world_barrier(
    world: *const courier_job_world_t,
    timeout_ms: u64,
) -> courier_status_t {
    boundary(|| {
        let w = get(world, "world")?;
        w.world.barrier(ms(timeout_ms))?;
        Ok(COURIER_OK)
    })
}

/// How many endpoints the world has made so far (into `count_out`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_job_world_connected(
    world: *const courier_job_world_t,
    count_out: *mut usize,
) -> courier_status_t {
    boundary(|| {
        let w = get(world, "world")?;
        let o = out_arg(count_out, "count_out")?;
        // SAFETY: the out-pointer was checked non-null by out_arg above; written once.
        unsafe { *o = w.world.connected() };
        Ok(COURIER_OK)
    })
}
