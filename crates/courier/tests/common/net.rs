//! The transport selection of tests/rma_refusals.rs, rma_paths.rs and rma_waits.rs (once
//! one file, rma_more.rs: more one-sided operations between real processes than tests/rma.rs).
//!
//! Two set-ups. In most tests the parent owns the memory and children (the test binary
//! re-run with `COURIER_TEST_ROLE`) connect, unpack the keys passed in their environment and
//! act, while the parent progresses and then checks its memory. Where the target's own view
//! matters (its log, a semaphore or signal it waits on) a child is the target: it prints
//! its port and keys on stdout, the parent connects and acts, and the child checks. Both
//! set-ups are in tests/common ([`super::actor`], [`super::target`]).
//!
//! Transports: shared memory with allocated memory (plain loads, stores and CPU atomics),
//! shared memory with registered memory (CMA for puts and gets, the owner's progress for
//! atomics and signals; with `COURIER_SHM_CMA=no` everything through shm frames), and tcp
//! with either kind of memory (everything through the owner's progress).

use super::{Actor, Target, Transport};

/// A transport selection, given to both sides.
#[derive(Clone, Copy, Debug)]
pub struct Net {
    pub tls: &'static str,
    pub cma: &'static str,
}

pub const SHM: Net = Net {
    tls: "all",
    cma: "auto",
};
pub const SHM_NOCMA: Net = Net {
    tls: "all",
    cma: "no",
};
pub const TCP: Net = Net {
    tls: "tcp",
    cma: "auto",
};

impl Transport for Net {
    fn env(self) -> Vec<(&'static str, String)> {
        vec![
            ("COURIER_TLS", self.tls.to_string()),
            ("COURIER_SHM_CMA", self.cma.to_string()),
        ]
    }
}

impl Net {
    pub fn from_env() -> Net {
        let tls = std::env::var("COURIER_TLS").unwrap();
        let cma = std::env::var("COURIER_SHM_CMA").unwrap();
        [SHM, SHM_NOCMA, TCP]
            .into_iter()
            .find(|n| n.tls == tls && n.cma == cma)
            .unwrap()
    }
    /// Whether refusals are decided by the target (as opposed to by this process, which
    /// reads the owner's key table on the same host).
    pub fn remote_checks(self) -> bool {
        self.tls == "tcp"
    }
}

/// A child acting on the parent's memory over the transport it was started with.
pub fn actor() -> Actor<Net> {
    super::actor(Net::from_env())
}

/// A child that is the target, over the transport it was started with.
pub fn target() -> Target {
    super::target(Net::from_env())
}
