//! Remote keys: what an owner packs and sends so peers can reach one memory region.
//!
//! ```text
//! 0       4    5      6        8         16        24       32       40       48
//! +-------+----+------+--------+---------+---------+--------+--------+--------+
//! | "CRK1"| ver| mtype| access | region  | secret  | base   | length | ctx id |
//! +-------+----+------+--------+---------+---------+--------+--------+--------+
//! 48          64     68         72          76
//! | host id   | pid  | table fd | region fd |
//! ```
//! A key of CUDA device memory may carry 72 more bytes: the driver's 64-byte IPC handle
//! of the allocation holding the region, then that allocation's base address in the
//! owner's process (a same-host peer opens the handle and copies with its own driver).
//! The key is a claim, not a capability: every access is checked against the owner's own
//! record of the region (its registry, or the shared key table it publishes), so a forged
//! or stale key is refused without touching memory.

/// Magic that opens every packed key.
pub const MAGIC: &[u8; 4] = b"CRK1";
/// Layout version.
pub const VERSION: u8 = 1;
/// Packed length.
pub const LEN: usize = 76;
/// Length of the device-memory trailer.
pub const IPC_LEN: usize = 72;

/// Access rights.
pub mod access {
    /// Remote reads (get).
    pub const READ: u16 = 1;
    /// Remote writes (put).
    pub const WRITE: u16 = 2;
    /// Remote atomics.
    pub const ATOMIC: u16 = 4;
    /// All of them.
    pub const ALL: u16 = READ | WRITE | ATOMIC;
}

/// A decoded key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RkeyRepr {
    /// Memory type code (0 host, 1 cuda, 2 nic).
    pub mem_type: u8,
    /// Access rights claimed.
    pub access: u16,
    /// Region id in the owner's registry.
    pub region: u64,
    /// Random secret of the region.
    pub secret: u64,
    /// Start address in the owner's process.
    pub base: u64,
    /// Length.
    pub length: u64,
    /// Random id of the owner's context.
    pub ctx_id: u64,
    /// Owner's host.
    pub host_id: [u8; 16],
    /// Owner's process.
    pub pid: u32,
    /// Owner's key-table fd number (-1: none).
    pub table_fd: i32,
    /// Owner's region memfd number (-1: not in a shared segment).
    pub region_fd: i32,
    /// Device memory: the driver's IPC handle of the allocation holding the region.
    pub ipc: Option<DeviceHandle>,
}

/// What a same-host peer needs to map an owner's device memory itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceHandle {
    /// The driver's IPC handle (`CUipcMemHandle`).
    pub handle: [u8; 64],
    /// The allocation's start in the owner's process.
    pub alloc_base: u64,
}

/// Why a key was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RkeyError {
    /// Wrong size.
    #[error("remote key is {0} bytes, expected {LEN} (or {with_ipc} for device memory)", with_ipc = LEN + IPC_LEN)]
    Length(usize),
    /// Not a key.
    #[error("not a Courier remote key (bad magic)")]
    BadMagic,
    /// Unsupported version.
    #[error("remote key version {0} is not supported")]
    Version(u8),
    /// Impossible field.
    #[error("remote key field {0} is invalid")]
    BadField(&'static str),
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}

impl RkeyRepr {
    /// Encode.
    pub fn pack(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.extend_from_slice(MAGIC);
        v.push(VERSION);
        v.push(self.mem_type);
        v.extend_from_slice(&self.access.to_le_bytes());
        for w in [
            self.region,
            self.secret,
            self.base,
            self.length,
            self.ctx_id,
        ] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&self.host_id);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.table_fd.to_le_bytes());
        v.extend_from_slice(&self.region_fd.to_le_bytes());
        if let Some(d) = &self.ipc {
            v.extend_from_slice(&d.handle);
            v.extend_from_slice(&d.alloc_base.to_le_bytes());
        }
        v
    }

    /// Decode, checking every field.
    pub fn unpack(b: &[u8]) -> Result<RkeyRepr, RkeyError> {
        if b.len() != LEN && b.len() != LEN + IPC_LEN {
            return Err(RkeyError::Length(b.len()));
        }
        if &b[0..4] != MAGIC {
            return Err(RkeyError::BadMagic);
        }
        if b[4] != VERSION {
            return Err(RkeyError::Version(b[4]));
        }
        let mem_type = b[5];
        if mem_type > 2 {
            return Err(RkeyError::BadField("memory type"));
        }
        let access = u16::from_le_bytes([b[6], b[7]]);
        if access & !access::ALL != 0 {
            return Err(RkeyError::BadField("access"));
        }
        let base = u64_at(b, 24);
        let length = u64_at(b, 32);
        if base.checked_add(length).is_none() {
            return Err(RkeyError::BadField("base + length overflows"));
        }
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(&b[48..64]);
        let ipc = if b.len() == LEN + IPC_LEN {
            if mem_type != 1 {
                return Err(RkeyError::BadField("device handle on host memory"));
            }
            let mut handle = [0u8; 64];
            handle.copy_from_slice(&b[LEN..LEN + 64]);
            let alloc_base = u64_at(b, LEN + 64);
            if alloc_base > base {
                return Err(RkeyError::BadField(
                    "device allocation starts after the region",
                ));
            }
            Some(DeviceHandle { handle, alloc_base })
        } else {
            None
        };
        Ok(RkeyRepr {
            mem_type,
            access,
            region: u64_at(b, 8),
            secret: u64_at(b, 16),
            base,
            length,
            ctx_id: u64_at(b, 40),
            host_id,
            pid: u32_at(b, 64),
            table_fd: u32_at(b, 68) as i32,
            region_fd: u32_at(b, 72) as i32,
            ipc,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> RkeyRepr {
        RkeyRepr {
            mem_type: 0,
            access: access::ALL,
            region: 5,
            secret: 99,
            base: 0x1000,
            length: 4096,
            ctx_id: 7,
            host_id: [3; 16],
            pid: 42,
            table_fd: 9,
            region_fd: -1,
            ipc: None,
        }
    }

    #[test]
    fn round_trip_and_rejects() {
        let k = sample();
        let p = k.pack();
        assert_eq!(p.len(), LEN);
        assert_eq!(RkeyRepr::unpack(&p).unwrap(), k);
        assert_eq!(RkeyRepr::unpack(&p[..10]), Err(RkeyError::Length(10)));
        let mut bad = p.clone();
        bad[0] = b'X';
        assert_eq!(RkeyRepr::unpack(&bad), Err(RkeyError::BadMagic));
        let mut bad = p.clone();
        bad[6] = 0xff;
        assert!(RkeyRepr::unpack(&bad).is_err());
        let over = RkeyRepr {
            base: u64::MAX - 1,
            length: 10,
            ..sample()
        };
        assert!(RkeyRepr::unpack(&over.pack()).is_err());
        // Device memory with its handle.
        let dev = RkeyRepr {
            mem_type: 1,
            ipc: Some(DeviceHandle {
                handle: [7; 64],
                alloc_base: 0x800,
            }),
            ..sample()
        };
        let p = dev.pack();
        assert_eq!(p.len(), LEN + IPC_LEN);
        assert_eq!(RkeyRepr::unpack(&p).unwrap(), dev);
        // A handle on host memory, or an allocation starting after the region: refused.
        let mut host = p.clone();
        host[5] = 0;
        assert!(RkeyRepr::unpack(&host).is_err());
        let late = RkeyRepr {
            ipc: Some(DeviceHandle {
                handle: [7; 64],
                alloc_base: 0x2000,
            }),
            ..dev
        };
        assert!(RkeyRepr::unpack(&late.pack()).is_err());
        assert_eq!(
            RkeyRepr::unpack(&p[..LEN + 3]),
            Err(RkeyError::Length(LEN + 3))
        );
    }

    proptest! {
        #[test]
        fn unpack_never_panics(b in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = RkeyRepr::unpack(&b);
        }
        #[test]
        fn unpack_never_panics_after_magic(b in proptest::collection::vec(any::<u8>(), 72..=72)) {
            let mut v = b"CRK1".to_vec();
            v.extend(b);
            let _ = RkeyRepr::unpack(&v);
        }
        #[test]
        fn unpack_never_panics_with_a_trailer(b in proptest::collection::vec(any::<u8>(), 144..=144)) {
            let mut v = b"CRK1\x01\x01".to_vec();
            v.extend(b);
            let _ = RkeyRepr::unpack(&v);
        }
    }
}
