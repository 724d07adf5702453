//! The job layer as OpenSHMEM needs it: rank and size, a key-value exchange (put, commit
//! with fence, get), a barrier, an abort of the whole job, and an endpoint to each PE.
//!
//! A program started without a launcher is a job of one PE (the specification's
//! "singleton"), which needs none of these beyond itself.

use std::collections::HashMap;
use std::sync::Mutex;

use courier::{Endpoint, Worker};

/// The job this process belongs to.
pub struct Runtime {
    kind: Kind,
}

enum Kind {
    /// One PE, no launcher.
    Single { kv: Mutex<HashMap<String, Vec<u8>>> },
}

impl Runtime {
    /// Join the job the launcher started, or become a job of one.
    pub fn init() -> Result<Runtime, String> {
        Ok(Runtime {
            kind: Kind::Single {
                kv: Mutex::new(HashMap::new()),
            },
        })
    }

    /// This PE's rank in the job.
    pub fn rank(&self) -> usize {
        match &self.kind {
            Kind::Single { .. } => 0,
        }
    }

    /// The number of PEs.
    pub fn size(&self) -> usize {
        match &self.kind {
            Kind::Single { .. } => 1,
        }
    }

    /// Publish `value` under `key` (visible to others after `exchange`).
    pub fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        match &self.kind {
            Kind::Single { kv } => {
                lock(kv).insert(key.to_string(), value.to_vec());
                Ok(())
            }
        }
    }

    /// Commit what this PE put and wait until every PE has (collective).
    pub fn exchange(&self) -> Result<(), String> {
        match &self.kind {
            Kind::Single { .. } => Ok(()),
        }
    }

    /// What PE `rank` put under `key` before the last `exchange`.
    pub fn get(&self, rank: usize, key: &str) -> Result<Vec<u8>, String> {
        match &self.kind {
            Kind::Single { kv } => lock(kv)
                .get(key)
                .filter(|_| rank == 0)
                .cloned()
                .ok_or_else(|| format!("PE {rank} published no '{key}'")),
        }
    }

    /// Wait until every PE is here (the launcher's barrier: slow, for init and finalize).
    pub fn barrier(&self) -> Result<(), String> {
        match &self.kind {
            Kind::Single { .. } => Ok(()),
        }
    }

    /// An endpoint of `worker` to PE `rank` (never this PE: its memory is reached in place).
    pub fn endpoint(&self, _worker: &Worker, rank: usize) -> Result<Endpoint, String> {
        match &self.kind {
            Kind::Single { .. } => Err(format!("PE {rank} is not in this job of one PE")),
        }
    }

    /// End the whole job with `code`, saying why.
    pub fn abort(&self, code: i32, _why: &str) -> ! {
        match &self.kind {
            Kind::Single { .. } => std::process::exit(code),
        }
    }

    /// Leave the job (collective).
    pub fn finalize(&self) -> Result<(), String> {
        self.barrier()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
