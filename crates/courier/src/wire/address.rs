//! Worker addresses: the opaque, versioned byte string a peer connects to.
//!
//! ```text
//! 0       4    5      6        8            16          32     36
//! +-------+----+------+--------+------------+-----------+------+------+---------+-----+------------
//! | "CRWA"| ver| flags| frame k| worker id  | host id   | pid  | nlen | uds name| ntcp| tcp addrs...
//! +-------+----+------+--------+------------+-----------+------+------+---------+-----+------------
//! tcp address: family (4 | 6), 4 or 16 address bytes, port (u16 LE)
//! ```
//!
//! `frame k` (u16 LE, once reserved and written 0): the largest frame the worker accepts
//! from a peer (`COURIER_MAX_FRAME`), in KiB; 0 says nothing (a build from before it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Magic that opens every worker address.
pub const MAGIC: &[u8; 4] = b"CRWA";
/// Layout version.
pub const VERSION: u8 = 1;
/// The worker offers shared memory (its uds name is set).
pub const FLAG_SHM: u8 = 1 << 0;
/// The worker offers tcp.
pub const FLAG_TCP: u8 = 1 << 1;

/// A decoded worker address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddress {
    /// Random identity of the worker.
    pub worker_id: u64,
    /// Boot identity of its host.
    pub host_id: [u8; 16],
    /// Its process.
    pub pid: u32,
    /// Abstract unix socket name for shared-memory wireup (empty: no shm).
    pub uds_name: Vec<u8>,
    /// TCP addresses it accepts wireup on.
    pub tcp: Vec<SocketAddr>,
    /// The largest frame it accepts from a peer, in KiB (`COURIER_MAX_FRAME`); 0: not
    /// said.
    pub max_frame_k: u16,
}

/// Why an address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Too short for what it claims.
    #[error("worker address truncated at byte {0}")]
    Truncated(usize),
    /// Not a Courier worker address.
    #[error("not a Courier worker address (bad magic)")]
    BadMagic,
    /// Unsupported layout version.
    #[error("worker address version {0} is not supported (this build speaks {VERSION})")]
    Version(u8),
    /// A field with an impossible value.
    #[error("worker address field {0} is invalid")]
    BadField(&'static str),
    /// Bytes after the last field.
    #[error("worker address has {0} trailing bytes")]
    Trailing(usize),
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], AddressError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(AddressError::Truncated(self.pos))?;
        let s = self
            .b
            .get(self.pos..end)
            .ok_or(AddressError::Truncated(self.pos))?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, AddressError> {
        Ok(self.take(1)?[0])
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], AddressError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
}

impl WorkerAddress {
    /// Encode.
    pub fn pack(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(MAGIC);
        v.push(VERSION);
        let mut fl = 0;
        if !self.uds_name.is_empty() {
            fl |= FLAG_SHM;
        }
        if !self.tcp.is_empty() {
            fl |= FLAG_TCP;
        }
        v.push(fl);
        v.extend_from_slice(&self.max_frame_k.to_le_bytes());
        v.extend_from_slice(&self.worker_id.to_le_bytes());
        v.extend_from_slice(&self.host_id);
        v.extend_from_slice(&self.pid.to_le_bytes());
        let n = self.uds_name.len().min(255);
        v.push(n as u8);
        v.extend_from_slice(&self.uds_name[..n]);
        let ntcp = self.tcp.len().min(255);
        v.push(ntcp as u8);
        for a in &self.tcp[..ntcp] {
            match a.ip() {
                IpAddr::V4(ip) => {
                    v.push(4);
                    v.extend_from_slice(&ip.octets());
                }
                IpAddr::V6(ip) => {
                    v.push(6);
                    v.extend_from_slice(&ip.octets());
                }
            }
            v.extend_from_slice(&a.port().to_le_bytes());
        }
        v
    }

    /// Decode, checking every field.
    pub fn unpack(b: &[u8]) -> Result<WorkerAddress, AddressError> {
        let mut r = Reader { b, pos: 0 };
        if r.take(4)? != MAGIC {
            return Err(AddressError::BadMagic);
        }
        let ver = r.u8()?;
        if ver != VERSION {
            return Err(AddressError::Version(ver));
        }
        let fl = r.u8()?;
        let max_frame_k = u16::from_le_bytes(r.arr()?);
        let worker_id = u64::from_le_bytes(r.arr()?);
        let host_id = r.arr::<16>()?;
        let pid = u32::from_le_bytes(r.arr()?);
        let nlen = r.u8()? as usize;
        let uds_name = r.take(nlen)?.to_vec();
        if (fl & FLAG_SHM != 0) == uds_name.is_empty() {
            return Err(AddressError::BadField("shm flag"));
        }
        if uds_name.len() > 107 {
            return Err(AddressError::BadField("uds name length"));
        }
        let ntcp = r.u8()? as usize;
        let mut tcp = Vec::with_capacity(ntcp);
        for _ in 0..ntcp {
            let ip = match r.u8()? {
                4 => IpAddr::V4(Ipv4Addr::from(r.arr::<4>()?)),
                6 => IpAddr::V6(Ipv6Addr::from(r.arr::<16>()?)),
                _ => return Err(AddressError::BadField("tcp address family")),
            };
            let port = u16::from_le_bytes(r.arr()?);
            if port == 0 {
                return Err(AddressError::BadField("tcp port"));
            }
            tcp.push(SocketAddr::new(ip, port));
        }
        if (fl & FLAG_TCP != 0) == tcp.is_empty() {
            return Err(AddressError::BadField("tcp flag"));
        }
        if r.pos != b.len() {
            return Err(AddressError::Trailing(b.len() - r.pos));
        }
        Ok(WorkerAddress {
            worker_id,
            host_id,
            pid,
            uds_name,
            tcp,
            max_frame_k,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> WorkerAddress {
        WorkerAddress {
            worker_id: 0x0123_4567_89ab_cdef,
            host_id: [7; 16],
            pid: 4242,
            uds_name: b"courier-4242-1".to_vec(),
            tcp: vec![
                "127.0.0.1:5000".parse().unwrap(),
                "[::1]:6000".parse().unwrap(),
            ],
            max_frame_k: 64,
        }
    }

    #[test]
    fn the_frame_limit_is_carried_and_zero_from_older_builds() {
        let p = sample().pack();
        assert_eq!(&p[6..8], &64u16.to_le_bytes());
        let mut old = p.clone();
        old[6..8].copy_from_slice(&[0, 0]);
        assert_eq!(WorkerAddress::unpack(&old).unwrap().max_frame_k, 0);
    }

    #[test]
    fn round_trip() {
        let a = sample();
        assert_eq!(WorkerAddress::unpack(&a.pack()).unwrap(), a);
        let b = WorkerAddress {
            uds_name: vec![],
            tcp: vec![],
            ..sample()
        };
        assert_eq!(WorkerAddress::unpack(&b.pack()).unwrap(), b);
    }

    #[test]
    fn rejects() {
        let p = sample().pack();
        assert_eq!(WorkerAddress::unpack(b"XXXX"), Err(AddressError::BadMagic));
        let mut v = p.clone();
        v[4] = 9;
        assert_eq!(WorkerAddress::unpack(&v), Err(AddressError::Version(9)));
        for cut in 0..p.len() {
            assert!(
                WorkerAddress::unpack(&p[..cut]).is_err(),
                "accepted a cut at {cut}"
            );
        }
        let mut v = p.clone();
        v.push(0);
        assert_eq!(WorkerAddress::unpack(&v), Err(AddressError::Trailing(1)));
    }

    proptest! {
        #[test]
        fn unpack_never_panics(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = WorkerAddress::unpack(&b);
        }

        #[test]
        fn unpack_never_panics_after_magic(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            let mut v = b"CRWA\x01".to_vec();
            v.extend(b);
            let _ = WorkerAddress::unpack(&v);
        }
    }
}
