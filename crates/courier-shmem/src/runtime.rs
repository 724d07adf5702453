//! The job layer as OpenSHMEM needs it (Courier's `Job` and `JobWorld`): rank and size, a
//! key-value exchange (put, then a fence, then get), a barrier, an abort of the whole job,
//! and an endpoint to each PE, made the first time it is needed.
//!
//! Whatever started the process (`courier run`/`oshrun`, mpirun, srun, or nothing: a job
//! of one PE) is the job layer's business.

use std::sync::OnceLock;
use std::time::Duration;

use courier::{Endpoint, Job, JobWorld, Worker};

/// How long the launcher's exchange and barriers may take (the job's start-up included).
const TIMEOUT: Duration = Duration::from_secs(300);

/// The job this process belongs to.
pub struct Runtime {
    job: Job,
    world: OnceLock<JobWorld>,
}

impl Runtime {
    /// Join the job the launcher started, or become a job of one.
    pub fn init() -> Result<Runtime, String> {
        let job = Job::init().map_err(|e| e.to_string())?;
        Ok(Runtime {
            job,
            world: OnceLock::new(),
        })
    }

    /// Publish `worker`'s address so that peers can connect to it (collective).
    pub fn attach(&self, worker: &Worker) -> Result<(), String> {
        let w =
            JobWorld::with_name(&self.job, worker, "shmem", TIMEOUT).map_err(|e| e.to_string())?;
        let _ = self.world.set(w);
        Ok(())
    }

    /// Connect to every PE now, then wait (progressing) until every PE has: afterwards no
    /// PE needs another's progress to reach it.
    pub fn connect_all(&self) -> Result<(), String> {
        let w = self
            .world
            .get()
            .ok_or("the worker's address was never published")?;
        w.connect_all().map_err(|e| e.to_string())?;
        w.barrier(TIMEOUT).map_err(|e| e.to_string())
    }

    /// A barrier of the job during which this PE's worker keeps progressing.
    pub fn barrier_progressing(&self) -> Result<(), String> {
        match self.world.get() {
            Some(w) => w.barrier(TIMEOUT).map_err(|e| e.to_string()),
            None => self.barrier(),
        }
    }

    /// This PE's rank in the job.
    pub fn rank(&self) -> usize {
        self.job.rank() as usize
    }

    /// The number of PEs.
    pub fn size(&self) -> usize {
        self.job.size() as usize
    }

    /// Publish `value` under `key` (visible to others after `exchange`).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.job.put(key, value).map_err(|e| e.to_string())
    }

    /// Commit what this PE put and wait until every PE has (collective).
    pub fn exchange(&self) -> Result<(), String> {
        self.job.fence(TIMEOUT).map_err(|e| e.to_string())
    }

    /// What PE `rank` put under `key` before the last `exchange`.
    pub fn get(&self, rank: usize, key: &str) -> Result<Vec<u8>, String> {
        self.job
            .get(rank as u32, key, TIMEOUT)
            .map_err(|e| e.to_string())
    }

    /// Wait until every PE is here (the launcher's barrier: for init and finalize).
    pub fn barrier(&self) -> Result<(), String> {
        self.job.barrier(TIMEOUT).map_err(|e| e.to_string())
    }

    /// An endpoint of the worker to PE `rank` (never this PE: its memory is reached in place).
    pub fn endpoint(&self, _worker: &Worker, rank: usize) -> Result<Endpoint, String> {
        self.world
            .get()
            .ok_or_else(|| "the worker's address was never published".to_string())?
            .endpoint(rank as u32)
            .map_err(|e| e.to_string())
    }

    /// End the whole job with `code`, saying why.
    pub fn abort(&self, code: i32, why: &str) -> ! {
        self.job.abort(code, why)
    }

    /// Leave the job (after the library's own final barrier).
    pub fn finalize(&self) -> Result<(), String> {
        self.job.finalize();
        Ok(())
    }
}
