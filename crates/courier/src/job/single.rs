//! The job of one: a process started without a launcher is rank 0 of 1, and its exchange is
//! a map in this process.

use std::collections::HashMap;
use std::time::Duration;

use super::{Info, Launcher, LauncherKind};
use crate::base::{Error, Result, Status};

pub(super) struct Local {
    pending: HashMap<String, Vec<u8>>,
    committed: HashMap<String, Vec<u8>>,
}

impl Local {
    pub(super) fn new() -> (Local, Info) {
        let info = Info {
            kind: LauncherKind::Single,
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            host: 0,
            jobid: format!("single-{}", std::process::id()),
        };
        (
            Local {
                pending: HashMap::new(),
                committed: HashMap::new(),
            },
            info,
        )
    }
}

impl Launcher for Local {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.pending.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        self.committed.extend(self.pending.drain());
        Ok(())
    }

    fn fence(&mut self, _timeout: Duration) -> Result<()> {
        self.commit()
    }

    fn get(&mut self, _rank: u32, key: &str, _timeout: Duration) -> Result<Vec<u8>> {
        // One rank: nobody else can commit it later, so waiting would only waste the timeout.
        self.committed.get(key).cloned().ok_or_else(|| {
            Error::msg(
                Status::NoMessage,
                format!("job key {key:?} was never committed by rank 0 (this job of one)"),
            )
        })
    }

    fn abort(&mut self, _code: i32, _message: &str) {}

    fn finalize(&mut self) {}
}
