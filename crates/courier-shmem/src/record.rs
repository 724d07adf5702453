//! What PEs publish to each other through the job's exchange, as bytes: each PE's
//! segment record (`symmetric`: its heap's and data segment's base, length and key, and
//! its host) and its CPU record (`cpus`: its machine and CPU affinity). Every PE parses
//! every other's, so these are parsers of peer input.
//!
//! This file uses std alone: the fuzz targets (`fuzz/src/lib.rs`) compile it as it is,
//! rather than link this crate (whose static and dynamic libraries left the core crate
//! uninstrumented in cargo fuzz's builds).

/// Bytes of a published CPU set: one bit per CPU (bit `i % 8` of byte `i / 8`), for the
/// 1,024 CPUs the kernel's affinity calls name.
pub const SET_BYTES: usize = 1024 / 8;

/// The bytes of a record: the host, then per segment base and length (u64 LE), the key's
/// length (u32 LE) and the key.
pub fn emit(p: &Published<'_>) -> Vec<u8> {
    let mut out = p.host.to_vec();
    for (base, len, key) in p.segs {
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
    }
    out
}

/// A peer's published blob, parsed (every length checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published<'a> {
    /// Its host id.
    pub host: [u8; 16],
    /// (base, len, key) per segment; len 0 = none.
    pub segs: [(u64, u64, &'a [u8]); 2],
}

/// Parse what `symmetric::publish` wrote.
pub fn parse(blob: &[u8]) -> Result<Published<'_>, String> {
    let bad = || format!("a malformed segment record of {} bytes", blob.len());
    let host: [u8; 16] = blob
        .get(..16)
        .ok_or_else(bad)?
        .try_into()
        .map_err(|_| bad())?;
    let mut at = 16;
    let mut segs = [(0u64, 0u64, &blob[..0]); 2];
    for s in segs.iter_mut() {
        let word = |at: usize, n: usize| blob.get(at..at + n).ok_or_else(bad);
        let base = u64::from_le_bytes(word(at, 8)?.try_into().map_err(|_| bad())?);
        let len = u64::from_le_bytes(word(at + 8, 8)?.try_into().map_err(|_| bad())?);
        let klen = u32::from_le_bytes(word(at + 16, 4)?.try_into().map_err(|_| bad())?) as usize;
        let key = word(at + 20, klen)?;
        *s = (base, len, key);
        at += 20 + klen;
    }
    if at != blob.len() {
        return Err(bad());
    }
    Ok(Published { host, segs })
}

/// From every PE's `cpus::published` bytes (`all[p]` is PE `p`'s): how many PEs run on
/// PE `me`'s machine, and how many CPUs the union of their affinities holds. `Err` names
/// the first PE whose bytes are not such.
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

/// From every PE's `cpus::published` bytes: for each PE, whether it runs on PE `me`'s
/// machine on CPUs that `me` may never run on (both affinities known and disjoint): a wait
/// for it need not give `me`'s CPU away. A PE whose bytes are not a record may share it.
pub fn elsewhere(me: usize, all: &[Vec<u8>]) -> Vec<bool> {
    fn split(b: &[u8]) -> Option<(&[u8], &[u8])> {
        (b.len() == 16 + SET_BYTES).then(|| b.split_at(16))
    }
    let known = |s: &[u8]| s.iter().any(|&b| b != 0);
    let mine = all.get(me).and_then(|b| split(b)).filter(|(_, s)| known(s));
    all.iter()
        .map(|b| match (mine, split(b)) {
            (Some((m0, s0)), Some((m1, s1))) => {
                m0 == m1 && known(s1) && s0.iter().zip(s1).all(|(x, y)| x & y == 0)
            }
            _ => false,
        })
        .collect()
}

/// CPUs in the union of `sets` (as `cpus::mine` makes them); `Err` names the first set
/// that is not one (a peer's bytes: checked).
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

    #[test]
    fn records_round_trip() {
        let key = [7u8; 40];
        let p = Published {
            host: [3; 16],
            segs: [(0x7f00_0000_0000, 1 << 26, &key[..]), (0, 0, &[][..])],
        };
        let b = emit(&p);
        assert_eq!(b.len(), 16 + 20 + 40 + 20);
        assert_eq!(parse(&b).expect("parses"), p);
    }

    #[test]
    fn parse_rejects_short_and_long_blobs() {
        assert!(parse(&[0u8; 10]).is_err());
        let mut ok = vec![0u8; 16 + 20 + 20];
        assert!(parse(&ok).is_ok());
        ok.push(1);
        assert!(parse(&ok).is_err());
        let mut lying = vec![0u8; 16 + 20 + 20];
        lying[32] = 200; // a key length past the end
        assert!(parse(&lying).is_err());
    }

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

    /// Bound round robin, 4 PEs on 2 CPUs: PE 0 shares CPU 0 with PE 2 and never runs
    /// where PEs 1 and 3 do. Unbound, on another machine, or of unknown affinity: may share.
    #[test]
    fn pes_bound_to_other_cpus_run_elsewhere() {
        let all = [
            of(7, &[0]),
            of(7, &[1]),
            of(7, &[0]),
            of(7, &[1]),
            of(9, &[1]),
        ];
        assert_eq!(elsewhere(0, &all), [false, true, false, true, false]);
        assert_eq!(elsewhere(3, &all), [true, false, true, false, false]);
        let loose = [of(7, &[0]), of(7, &[0, 1]), of(7, &[]), vec![7; 20]];
        assert_eq!(elsewhere(0, &loose), [false; 4]);
        assert_eq!(elsewhere(2, &loose), [false; 4]);
        assert_eq!(elsewhere(9, &loose), [false; 4]);
    }

    #[test]
    fn published_bytes_of_another_size_are_refused() {
        let mut all = vec![of(7, &[0]), of(7, &[0])];
        all[1].truncate(20);
        let e = shared(0, &all).unwrap_err();
        assert!(e.contains("PE 1") && e.contains("20 bytes"), "{e}");
        assert!(shared(5, &all[..1]).is_err());
    }
}
