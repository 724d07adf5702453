//! Remote keys: what an owner packs and sends so peers can reach one memory region.
//!
//! ```text
//! 0       4    5      6        8         16                  32       40       48
//! +-------+----+------+--------+---------+-------------------+--------+--------+
//! | "CRK1"| ver| mtype| access | region  | secret (128 bits) | base   | length |
//! +-------+----+------+--------+---------+-------------------+--------+--------+
//! 48       56          72     76         80          84      88
//! | ctx id | host id   | pid  | table fd | region fd | check |
//! ```
//! Integers are little-endian (the secret as one 128-bit integer). Version 1 (76 bytes,
//! a 64-bit secret) is refused: a key is a claim its owner checks, and the owner checks
//! 128 bits. The check value is the CRC-32C of every other byte of the key, the device
//! trailer included: a key changed after its owner packed it (a bit flipped in storage or
//! in transit, a field edited) is refused when it is unpacked, before it routes anything.
//! It is no protection against a forger, who can recompute it; the owner's checks are.
//! A key of CUDA device memory may carry 72 more bytes: the driver's 64-byte IPC handle
//! of the allocation holding the region, then that allocation's base address in the
//! owner's process (a same-host peer opens the handle and copies with its own driver).
//! The key is a claim, not a capability: every access is checked against the owner's own
//! record of the region (its registry, or the shared key table it publishes), so a forged
//! or stale key is refused without touching memory.

/// Magic that opens every packed key.
pub const MAGIC: &[u8; 4] = b"CRK1";
/// Layout version.
pub const VERSION: u8 = 2;
/// Packed length.
pub const LEN: usize = 88;
/// Length of the device-memory trailer.
pub const IPC_LEN: usize = 72;

/// A region's secret: 128 random bits from the kernel, which every access must name.
pub type Secret = u128;

/// Whether two secrets are equal, in a time that does not depend on which bits differ: both
/// halves are compared, the differences OR'ed together, with no early exit to time.
#[inline(always)]
pub fn secret_eq(a: Secret, b: Secret) -> bool {
    let d = a ^ b;
    let folded = std::hint::black_box((d as u64) | ((d >> 64) as u64));
    folded == 0
}

/// Byte ranges of the packed key's fields.
pub mod field {
    use std::ops::Range;
    /// `MAGIC`.
    pub const MAGIC: Range<usize> = 0..4;
    /// `VERSION`.
    pub const VERSION: usize = 4;
    /// Memory type code.
    pub const MEM_TYPE: usize = 5;
    /// Access rights (u16).
    pub const ACCESS: Range<usize> = 6..8;
    /// Region id.
    pub const REGION: Range<usize> = 8..16;
    /// The region's secret (u128).
    pub const SECRET: Range<usize> = 16..32;
    /// Start address in the owner's process.
    pub const BASE: Range<usize> = 32..40;
    /// Length.
    pub const LENGTH: Range<usize> = 40..48;
    /// The owner's context id.
    pub const CTX_ID: Range<usize> = 48..56;
    /// The owner's host id.
    pub const HOST_ID: Range<usize> = 56..72;
    /// The owner's process id (u32).
    pub const PID: Range<usize> = 72..76;
    /// The owner's key-table fd number (i32).
    pub const TABLE_FD: Range<usize> = 76..80;
    /// The owner's region memfd number (i32).
    pub const REGION_FD: Range<usize> = 80..84;
    /// CRC-32C of every other byte of the key (u32).
    pub const CHECK: Range<usize> = 84..88;
}

/// CRC-32C (Castagnoli, reflected) lookup table, built at compile time.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32C of `parts`, one after another.
fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for b in parts.iter().flat_map(|p| p.iter()) {
        crc = (crc >> 8) ^ CRC_TABLE[((crc ^ u32::from(*b)) & 0xff) as usize];
    }
    !crc
}

/// The check value a packed key (`LEN` bytes, or `LEN + IPC_LEN`) must carry.
pub fn check_value(key: &[u8]) -> u32 {
    let split = field::CHECK.start.min(key.len());
    let rest = key.get(field::CHECK.end..).unwrap_or(&[]);
    crc32c(&[&key[..split], rest])
}

/// Write a packed key's check value for its current bytes (`pack` does): for tests that
/// edit a key's fields as a forger would.
pub fn reseal(key: &mut [u8]) {
    if key.len() >= field::CHECK.end {
        let c = check_value(key);
        key[field::CHECK].copy_from_slice(&c.to_le_bytes());
    }
}

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
    pub secret: Secret,
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
    #[error(
        "remote key version {0} is not supported (this side reads version {VERSION}: 128-bit secrets)"
    )]
    Version(u8),
    /// Impossible field.
    #[error("remote key field {0} is invalid")]
    BadField(&'static str),
    /// The check value does not match the bytes.
    #[error(
        "remote key is damaged: its check value is {carried:#010x}, its bytes give {computed:#010x} (changed after its owner packed it)"
    )]
    Damaged {
        /// The value the key carries.
        carried: u32,
        /// The value its bytes give.
        computed: u32,
    },
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

fn u128_at(b: &[u8], o: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[o..o + 16]);
    u128::from_le_bytes(a)
}

impl RkeyRepr {
    /// Encode.
    pub fn pack(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.extend_from_slice(MAGIC);
        v.push(VERSION);
        v.push(self.mem_type);
        v.extend_from_slice(&self.access.to_le_bytes());
        v.extend_from_slice(&self.region.to_le_bytes());
        v.extend_from_slice(&self.secret.to_le_bytes());
        for w in [self.base, self.length, self.ctx_id] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&self.host_id);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.table_fd.to_le_bytes());
        v.extend_from_slice(&self.region_fd.to_le_bytes());
        v.extend_from_slice(&[0; 4]);
        if let Some(d) = &self.ipc {
            v.extend_from_slice(&d.handle);
            v.extend_from_slice(&d.alloc_base.to_le_bytes());
        }
        reseal(&mut v);
        v
    }

    /// Decode, checking every field.
    pub fn unpack(b: &[u8]) -> Result<RkeyRepr, RkeyError> {
        // Magic and version first, so that an old key (or not a key) is named as such
        // whatever its length.
        if b.len() >= field::MAGIC.end && &b[field::MAGIC] != MAGIC {
            return Err(RkeyError::BadMagic);
        }
        if b.len() > field::VERSION && b[field::VERSION] != VERSION {
            return Err(RkeyError::Version(b[field::VERSION]));
        }
        if b.len() != LEN && b.len() != LEN + IPC_LEN {
            return Err(RkeyError::Length(b.len()));
        }
        let carried = u32_at(b, field::CHECK.start);
        let computed = check_value(b);
        if carried != computed {
            return Err(RkeyError::Damaged { carried, computed });
        }
        let mem_type = b[field::MEM_TYPE];
        if mem_type > 2 {
            return Err(RkeyError::BadField("memory type"));
        }
        let access = u16::from_le_bytes([b[field::ACCESS.start], b[field::ACCESS.start + 1]]);
        if access & !access::ALL != 0 {
            return Err(RkeyError::BadField("access"));
        }
        let base = u64_at(b, field::BASE.start);
        let length = u64_at(b, field::LENGTH.start);
        if base.checked_add(length).is_none() {
            return Err(RkeyError::BadField("base + length overflows"));
        }
        let mut host_id = [0u8; 16];
        host_id.copy_from_slice(&b[field::HOST_ID]);
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
            region: u64_at(b, field::REGION.start),
            secret: u128_at(b, field::SECRET.start),
            base,
            length,
            ctx_id: u64_at(b, field::CTX_ID.start),
            host_id,
            pid: u32_at(b, field::PID.start),
            table_fd: u32_at(b, field::TABLE_FD.start) as i32,
            region_fd: u32_at(b, field::REGION_FD.start) as i32,
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
        assert!(matches!(
            RkeyRepr::unpack(&bad),
            Err(RkeyError::Damaged { .. })
        ));
        reseal(&mut bad);
        assert_eq!(RkeyRepr::unpack(&bad), Err(RkeyError::BadField("access")));
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
        reseal(&mut host);
        assert_eq!(
            RkeyRepr::unpack(&host),
            Err(RkeyError::BadField("device handle on host memory"))
        );
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

    #[test]
    fn old_versions_and_strangers_are_named() {
        let mut p = sample().pack();
        // A version-1 key (76 bytes, a 64-bit secret) is refused for its version.
        let mut v1 = p[..76].to_vec();
        v1[field::VERSION] = 1;
        assert_eq!(RkeyRepr::unpack(&v1), Err(RkeyError::Version(1)));
        let e = RkeyRepr::unpack(&v1).unwrap_err().to_string();
        assert!(e.contains("version 1") && e.contains("128-bit"), "{e}");
        p[field::MAGIC.start + 3] = b'2';
        assert_eq!(RkeyRepr::unpack(&p), Err(RkeyError::BadMagic));
        assert_eq!(RkeyRepr::unpack(b"CR"), Err(RkeyError::Length(2)));
    }

    #[test]
    fn field_map_matches_the_packing() {
        let k = RkeyRepr {
            secret: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
            region_fd: 17,
            pid: 0xabcd,
            ..sample()
        };
        let p = k.pack();
        assert_eq!(p[field::SECRET], k.secret.to_le_bytes());
        assert_eq!(p[field::REGION], k.region.to_le_bytes());
        assert_eq!(p[field::LENGTH], k.length.to_le_bytes());
        assert_eq!(p[field::HOST_ID], k.host_id);
        assert_eq!(p[field::PID], k.pid.to_le_bytes());
        assert_eq!(p[field::REGION_FD], k.region_fd.to_le_bytes());
        assert_eq!(field::REGION_FD.end, field::CHECK.start);
        assert_eq!(field::CHECK.end, LEN);
        assert_eq!(p[field::CHECK], check_value(&p).to_le_bytes());
    }

    /// A key with any one bit flipped, its device trailer's included, is refused.
    #[test]
    fn every_single_bit_flip_is_refused() {
        let dev = RkeyRepr {
            mem_type: 1,
            ipc: Some(DeviceHandle {
                handle: [7; 64],
                alloc_base: 0x800,
            }),
            ..sample()
        };
        for k in [sample(), dev] {
            let p = k.pack();
            for bit in 0..p.len() * 8 {
                let mut f = p.clone();
                f[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    RkeyRepr::unpack(&f).is_err(),
                    "bit {bit} of {} flipped",
                    p.len()
                );
            }
        }
    }

    /// The check value is the standard CRC-32C (its published check value).
    #[test]
    fn check_value_is_crc32c() {
        assert_eq!(crc32c(&[b"1234", b"56789"]), 0xe306_9283);
    }

    #[test]
    fn secrets_compare_whole() {
        let a: Secret = 0x1234_5678_9abc_def0_0fed_cba9_8765_4321;
        assert!(secret_eq(a, a));
        for bit in 0..128 {
            assert!(!secret_eq(a, a ^ (1u128 << bit)), "bit {bit}");
        }
    }

    fn arb_key() -> impl Strategy<Value = RkeyRepr> {
        (
            (0u8..=2, 0u16..=access::ALL, any::<u64>(), any::<u128>()),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<[u8; 16]>()),
            (any::<u32>(), any::<i32>(), any::<i32>()),
            (any::<bool>(), any::<[u8; 32]>(), any::<u64>()),
        )
            .prop_map(
                |(
                    (mem_type, access, region, secret),
                    (base, len, ctx_id, host_id),
                    (pid, table_fd, region_fd),
                    (dev, h, ab),
                )| {
                    let length = len.min(u64::MAX - base);
                    let mut handle = [0u8; 64];
                    handle[..32].copy_from_slice(&h);
                    let ipc = (dev && mem_type == 1).then_some(DeviceHandle {
                        handle,
                        alloc_base: ab.min(base),
                    });
                    RkeyRepr {
                        mem_type,
                        access,
                        region,
                        secret,
                        base,
                        length,
                        ctx_id,
                        host_id,
                        pid,
                        table_fd,
                        region_fd,
                        ipc,
                    }
                },
            )
    }

    proptest! {
        /// Pack then unpack is the identity, for every valid key.
        #[test]
        fn pack_unpack_round_trips(k in arb_key()) {
            let p = k.pack();
            prop_assert_eq!(p.len(), if k.ipc.is_some() { LEN + IPC_LEN } else { LEN });
            prop_assert_eq!(RkeyRepr::unpack(&p), Ok(k));
        }
        /// Whatever unpacks packs back to the same bytes.
        #[test]
        fn unpack_pack_round_trips(b in proptest::collection::vec(any::<u8>(), LEN - 8..=LEN - 8)) {
            let mut v = MAGIC.to_vec();
            v.extend_from_slice(&[VERSION, 0, 7, 0]);
            v.extend(b);
            reseal(&mut v);
            if let Ok(k) = RkeyRepr::unpack(&v) {
                prop_assert_eq!(k.pack(), v);
            }
        }
        #[test]
        fn unpack_never_panics(b in proptest::collection::vec(any::<u8>(), 0..180)) {
            let _ = RkeyRepr::unpack(&b);
        }
        #[test]
        fn unpack_never_panics_after_magic(b in proptest::collection::vec(any::<u8>(), LEN - 4..=LEN - 4)) {
            let mut v = MAGIC.to_vec();
            v.extend(b);
            let _ = RkeyRepr::unpack(&v);
            reseal(&mut v);
            let _ = RkeyRepr::unpack(&v);
        }
        #[test]
        fn unpack_never_panics_with_a_trailer(b in proptest::collection::vec(any::<u8>(), LEN + IPC_LEN - 6..=LEN + IPC_LEN - 6)) {
            let mut v = MAGIC.to_vec();
            v.extend_from_slice(&[VERSION, 1]);
            v.extend(b);
            reseal(&mut v);
            let _ = RkeyRepr::unpack(&v);
        }
    }
}
