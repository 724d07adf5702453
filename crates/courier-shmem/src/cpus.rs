//! Whether the PEs of this machine outnumber the CPUs they may run on, which decides how
//! waits spin (`init::WaitCfg`). Each PE publishes its machine and its CPU affinity at
//! `shmem_init`; the union over this machine's PEs is the set they share, whoever bound
//! them (`courier run`, mpirun, `taskset`). A machine is a kernel (`courier::machine_id`),
//! not a host in the transport's sense: PEs in two network namespaces of one machine talk
//! over tcp, as if on two hosts, but compete for the same CPUs. (mpirun, told they are two
//! hosts, binds a rank of each to the same first core.)

use rustix::thread::{CpuSet, sched_getaffinity};

pub use crate::record::{SET_BYTES, elsewhere, shared};

// The record's set holds every CPU the kernel's affinity calls name.
const _: () = assert!(SET_BYTES == CpuSet::MAX_CPU / 8);

/// This process's CPU affinity, as published (all zero if the kernel does not say).
pub fn mine() -> Vec<u8> {
    let mut v = vec![0u8; SET_BYTES];
    if let Ok(set) = sched_getaffinity(None) {
        for i in (0..CpuSet::MAX_CPU).filter(|&i| set.is_set(i)) {
            v[i / 8] |= 1 << (i % 8);
        }
    }
    v
}

/// What a PE publishes: its machine (`courier::machine_id`), then its affinity (`mine`).
pub fn published() -> Vec<u8> {
    let mut v = courier::machine_id().to_vec();
    v.extend(mine());
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::union_count;

    #[test]
    fn this_process_runs_on_some_cpu() {
        let n = union_count([(0, &mine()[..])]).unwrap();
        assert!(n >= 1);
    }
}
