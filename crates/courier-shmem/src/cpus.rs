//! Whether the PEs of this machine outnumber the CPUs they may run on, which decides how
//! waits spin (`init::WaitCfg`). Each PE publishes its machine and its CPU affinity at
//! `shmem_init`; the union over this machine's PEs is the set they share, whoever bound
//! them (`courier run`, mpirun, `taskset`). A machine is a kernel (`courier::machine_id`),
//! not a host in the transport's sense: PEs in two network namespaces of one machine talk
//! over tcp, as if on two hosts, but compete for the same CPUs. (mpirun, told they are two
//! hosts, binds a rank of each to the same first core.)

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

/// What a PE publishes: its machine (`courier::machine_id`), then its affinity (`mine`).
pub fn published() -> Vec<u8> {
    let mut v = courier::machine_id().to_vec();
    v.extend(mine());
    v
}

/// From every PE's `published` bytes (`all[p]` is PE `p`'s): how many PEs run on PE `me`'s
/// machine, and how many CPUs the union of their affinities holds. `Err` names the first PE
/// whose bytes are not such.
pub fn shared(me: usize, all: &[Vec<u8>]) -> Result<(usize, usize), String> {
    let parts = all
        .iter()
        .enumerate()
        .map(|(pe, b)| {
            if b.len() != 16 + SET_BYTES {
                return Err(format!(
                    "PE {pe} published {} bytes of machine and CPUs, not {}",
                    b.len(),
                    16 + SET_BYTES
                ));
            }
            Ok((pe, b.split_at(16)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some(&(_, (machine, _))) = parts.get(me) else {
        return Err(format!("no CPUs published by PE {me}"));
    };
    let local: Vec<_> = parts
        .iter()
        .filter(|(_, (m, _))| *m == machine)
        .map(|&(pe, (_, set))| (pe, set))
        .collect();
    Ok((local.len(), union_count(local)?))
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

    fn of(machine: u8, cpus: &[usize]) -> Vec<u8> {
        let mut v = vec![machine; 16];
        v.extend(set(cpus));
        v
    }

    /// Two PEs of one machine bound to the same CPU share it, whatever else runs on other
    /// machines; a PE alone on its machine has its CPUs to itself.
    #[test]
    fn pes_of_one_machine_share_its_cpus() {
        // As mpirun binds them across two namespace "hosts" of one machine: PEs 0 and 1
        // on CPU 0; PE 2 elsewhere, on CPUs 0 and 1.
        let all = [of(7, &[0]), of(7, &[0]), of(9, &[0, 1])];
        assert_eq!(shared(0, &all), Ok((2, 1)));
        assert_eq!(shared(1, &all), Ok((2, 1)));
        assert_eq!(shared(2, &all), Ok((1, 2)));
        let spread = [of(7, &[0]), of(7, &[1])];
        assert_eq!(shared(0, &spread), Ok((2, 2)));
    }

    #[test]
    fn published_bytes_of_another_size_are_refused() {
        let mut all = vec![of(7, &[0]), of(7, &[0])];
        all[1].truncate(20);
        let e = shared(0, &all).unwrap_err();
        assert!(e.contains("PE 1") && e.contains("20 bytes"), "{e}");
        assert!(shared(5, &all[..1]).is_err());
    }

    #[test]
    fn this_process_runs_on_some_cpu() {
        let n = union_count([(0, &mine()[..])]).unwrap();
        assert!(n >= 1);
    }
}
