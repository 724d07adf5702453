//! Whether this host's PEs outnumber the CPUs they may run on, which decides how waits
//! spin (`init::WaitCfg`). Each PE publishes its CPU affinity at `shmem_init`; the union
//! over this host's PEs is the set they share, whoever bound them (`courier run`, mpirun,
//! `taskset`).

use rustix::thread::{CpuSet, sched_getaffinity};

/// Bytes of a published CPU set: one bit per CPU (bit `i % 8` of byte `i / 8`).
pub const SET_BYTES: usize = CpuSet::MAX_CPU / 8;

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

/// CPUs in the union of `sets` (as `mine` publishes them); `Err` names the first set that
/// is not one (a peer's bytes: checked).
pub fn union_count<'a>(sets: impl IntoIterator<Item = (usize, &'a [u8])>) -> Result<usize, String> {
    let mut all = [0u8; SET_BYTES];
    for (pe, s) in sets {
        if s.len() != SET_BYTES {
            return Err(format!(
                "PE {pe} published a CPU set of {} bytes, not {SET_BYTES}",
                s.len()
            ));
        }
        for (a, b) in all.iter_mut().zip(s) {
            *a |= b;
        }
    }
    Ok(all.iter().map(|b| b.count_ones() as usize).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[usize]) -> Vec<u8> {
        let mut v = vec![0u8; SET_BYTES];
        for &c in cpus {
            v[c / 8] |= 1 << (c % 8);
        }
        v
    }

    #[test]
    fn the_union_counts_each_cpu_once() {
        let (a, b, c) = (set(&[0]), set(&[1]), set(&[0, 1, 9]));
        assert_eq!(union_count([(0, &a[..]), (1, &b[..])]), Ok(2));
        assert_eq!(union_count([(0, &a[..]), (1, &a[..])]), Ok(1));
        assert_eq!(union_count([(0, &a[..]), (1, &c[..])]), Ok(3));
    }

    #[test]
    fn a_set_of_another_size_is_refused() {
        let a = set(&[0]);
        let e = union_count([(0, &a[..]), (3, &a[..5])]).unwrap_err();
        assert!(e.contains("PE 3") && e.contains("5 bytes"), "{e}");
    }

    #[test]
    fn this_process_runs_on_some_cpu() {
        let n = union_count([(0, &mine()[..])]).unwrap();
        assert!(n >= 1);
    }
}
