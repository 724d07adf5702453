//! Wire-up over a job: each rank publishes its worker's address once; an endpoint to another
//! rank is made the first time it is asked for, so a job of N ranks opens only the
//! connections it uses (not N² at start). `connect_all` is the eager, all-to-all mode for
//! small jobs and benchmarks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Job;
use crate::api::{Endpoint, EndpointParams, Worker};
use crate::base::{Error, Result, Status};

type Handler = Arc<dyn Fn(u32, &Error) + Send + Sync>;

/// A worker's view of the job: ranks to endpoints, made on first use.
pub struct JobWorld {
    job: Job,
    worker: Worker,
    key: String,
    timeout: Duration,
    eps: Mutex<Vec<Option<Endpoint>>>,
    on_error: Mutex<Option<Handler>>,
}

impl std::fmt::Debug for JobWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobWorld")
            .field("rank", &self.job.rank())
            .field("size", &self.job.size())
            .field("key", &self.key)
            .finish()
    }
}

/// How long lookups and the publishing fence wait by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

impl JobWorld {
    /// Publish `worker`'s address and fence: collective, every rank calls it.
    pub fn new(job: &Job, worker: &Worker) -> Result<JobWorld> {
        JobWorld::with_name(job, worker, "worker", DEFAULT_TIMEOUT)
    }

    /// As `new`, for one of several workers per process (`name` tells them apart; every
    /// rank uses the same names), with the timeout for the fence and for each lookup.
    pub fn with_name(
        job: &Job,
        worker: &Worker,
        name: &str,
        timeout: Duration,
    ) -> Result<JobWorld> {
        let key = format!("addr.{name}");
        job.put(&key, &worker.address()?)?;
        job.fence(timeout)?;
        Ok(JobWorld {
            job: job.clone(),
            worker: worker.clone(),
            key,
            timeout,
            eps: Mutex::new(vec![None; job.size() as usize]),
            on_error: Mutex::new(None),
        })
    }

    /// The job.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Run `f(rank, error)` when an endpoint made from now on fails (its peer died, ...).
    pub fn on_error(&self, f: impl Fn(u32, &Error) + Send + Sync + 'static) {
        *self.on_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
    }

    /// The endpoint to `rank`, connecting on first use.
    pub fn endpoint(&self, rank: u32) -> Result<Endpoint> {
        if rank >= self.job.size() {
            return Err(Error::msg(
                Status::InvalidParam,
                format!("rank {rank} is not in this job of {}", self.job.size()),
            ));
        }
        if let Some(ep) = self.lock()[rank as usize].as_ref() {
            return Ok(ep.clone());
        }
        // Looked up without the lock: a lookup may wait on the launcher.
        let addr = self.job.get(rank, &self.key, self.timeout).map_err(|e| {
            Error::msg(
                e.status(),
                format!("looking up rank {rank}'s worker address: {}", e.detail()),
            )
        })?;
        let mut eps = self.lock();
        if let Some(ep) = eps[rank as usize].as_ref() {
            return Ok(ep.clone());
        }
        let mut params = EndpointParams::default();
        if let Some(h) = self
            .on_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            params = params.error_handler(move |e| h(rank, e));
        }
        let ep = self.worker.connect(&addr, params).map_err(|e| {
            Error::msg(
                e.status(),
                format!("connecting to rank {rank}: {}", e.detail()),
            )
        })?;
        eps[rank as usize] = Some(ep.clone());
        Ok(ep)
    }

    /// The endpoint to `rank` if one was made already.
    pub fn endpoint_if_connected(&self, rank: u32) -> Option<Endpoint> {
        self.lock().get(rank as usize).and_then(|e| e.clone())
    }

    /// Eager mode: an endpoint to every rank now, each waited for until connected.
    pub fn connect_all(&self) -> Result<()> {
        let me = self.job.rank();
        let n = self.job.size();
        // Start with the next rank, so that ranks do not all dial rank 0 first.
        let eps: Vec<Endpoint> = (1..=n)
            .map(|i| self.endpoint((me + i) % n))
            .collect::<Result<_>>()?;
        for ep in eps {
            ep.wait_connected(self.timeout)?;
        }
        Ok(())
    }

    /// A job barrier during which this worker keeps progressing (peers waiting on this
    /// rank's connections or acknowledgements are served meanwhile). The launcher is
    /// waited for on a helper thread; the worker is progressed on this one.
    pub fn barrier(&self, timeout: Duration) -> Result<()> {
        let done = std::sync::atomic::AtomicBool::new(false);
        let job = &self.job;
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let r = job.barrier(timeout);
                done.store(true, std::sync::atomic::Ordering::Release);
                r
            });
            // The launcher enforces `timeout`; the loop only needs to see the result.
            let _ = self
                .worker
                .progress_until(timeout + Duration::from_secs(10), || {
                    done.load(std::sync::atomic::Ordering::Acquire)
                });
            h.join().unwrap_or_else(|_| {
                Err(Error::new(
                    Status::IoError,
                    "the barrier's helper thread panicked",
                ))
            })
        })
    }

    /// How many endpoints have been made.
    pub fn connected(&self) -> usize {
        self.lock().iter().filter(|e| e.is_some()).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Endpoint>>> {
        self.eps.lock().unwrap_or_else(|p| p.into_inner())
    }
}
