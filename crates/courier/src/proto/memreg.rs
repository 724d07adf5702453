//! Memory regions of a context, and the key table that same-host peers check keys against.
//!
//! Every mapped region gets a slot in a shared *key table* (a memfd, 64-byte entries) that
//! holds the owner's record: region id, secret, bounds, rights, the identity of the
//! region's shared segment, and a valid word. A peer on the same host maps the table (and,
//! for allocated regions, the region's own memfd) through `pidfd_getfd`, then checks every
//! access against the owner's record before it loads, stores or runs a CPU atomic: forged
//! keys, stale keys (after unmap), accesses out of range or without the right are refused
//! without touching the region, and a segment is mapped only if it is the one the record
//! names (a key's fd number is a claim like the rest). Peers elsewhere send operations to
//! the owner's worker, which checks them against the same records.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::sys::{host_id, pid, random_u64};
use crate::base::{Error, Result, Status};
use crate::wire::rkey::{DeviceHandle, RkeyRepr, access};

/// Entries in a key table (slot 0 is the header).
pub const TABLE_SLOTS: usize = 4096;
const ENTRY: usize = 64;
const TABLE_BYTES: usize = TABLE_SLOTS * ENTRY;
const TABLE_MAGIC: u64 = 0x434f_5552_4b54_4231; // "COURKTB1"

/// Memory types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// Host memory.
    Host,
    /// CUDA device memory.
    Cuda,
    /// On-NIC memory (device memory for atomics).
    Nic,
}

impl MemoryType {
    /// Code carried in remote keys.
    pub fn code(self) -> u8 {
        match self {
            MemoryType::Host => 0,
            MemoryType::Cuda => 1,
            MemoryType::Nic => 2,
        }
    }
    /// Name as in `-m host,cuda`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryType::Host => "host",
            MemoryType::Cuda => "cuda",
            MemoryType::Nic => "nic",
        }
    }
}

/// A shared mapping that unmaps itself.
pub(crate) struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a mapping is plain shared memory; all access goes through raw pointers and atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: impl AsFd, len: usize) -> Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        // SAFETY: a fresh shared mapping of a memfd we hold; no Rust references alias it.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len.max(1),
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| Error::io("mmap", e))?;
        Ok(Mapping {
            ptr: p as *mut u8,
            len: len.max(1),
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping.
        let _ = unsafe { rustix::mm::munmap(self.ptr as *mut _, self.len) };
    }
}

fn memfd(name: &str, len: usize) -> Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, ftruncate, memfd_create};
    let fd = memfd_create(name, MemfdFlags::CLOEXEC).map_err(|e| Error::io("memfd_create", e))?;
    ftruncate(&fd, len as u64).map_err(|e| Error::io("ftruncate", e))?;
    Ok(fd)
}

/// The record of one region in a key table, read with atomics (the table is shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub valid: u64,
    pub region: u64,
    pub secret: u64,
    pub base: u64,
    pub len: u64,
    pub access: u64,
    /// `MemoryType::code` of the region.
    pub mem_type: u64,
}

#[inline]
fn word(table: *mut u8, slot: usize, w: usize) -> &'static AtomicU64 {
    // SAFETY: slot < TABLE_SLOTS, w < 8: inside the mapping, 8-byte aligned (page-aligned
    // mapping, 64-byte entries). The mapping lives as long as its owner keeps it.
    unsafe { AtomicU64::from_ptr(table.add(slot * ENTRY + w * 8) as *mut u64) }
}

/// Word 7 of a record: the inode of the region's shared segment (a memfd, on the same
/// file system as the key table), 0 for a region with none. Read only when a peer maps the
/// segment, so not part of `Record` (which the direct paths read on every access).
const SEGMENT_WORD: usize = 7;

/// The key-table slot of region id `region` (slot 0 is the table's header).
#[inline]
fn table_slot(region: u64) -> Option<usize> {
    let slot = (region & 0xfff) as usize;
    (slot != 0 && slot < TABLE_SLOTS).then_some(slot)
}

#[inline]
fn read_record(table: *mut u8, slot: usize) -> Record {
    Record {
        valid: word(table, slot, 0).load(Ordering::Acquire),
        region: word(table, slot, 1).load(Ordering::Relaxed),
        secret: word(table, slot, 2).load(Ordering::Relaxed),
        base: word(table, slot, 3).load(Ordering::Relaxed),
        len: word(table, slot, 4).load(Ordering::Relaxed),
        access: word(table, slot, 5).load(Ordering::Relaxed),
        mem_type: word(table, slot, 6).load(Ordering::Relaxed),
    }
}

/// Check an access of `len` bytes at `addr` needing `need` rights against a record. The
/// passing case (every direct put, get and atomic) is a few comparisons; the error, with
/// the first reason that applies, is built out of line.
#[inline(always)]
pub(crate) fn check(
    rec: &Record,
    region: u64,
    secret: u64,
    addr: u64,
    len: u64,
    need: u16,
) -> Result<()> {
    let need64 = need as u64;
    let fits = addr >= rec.base
        && addr
            .checked_add(len)
            .is_some_and(|e| rec.base.checked_add(rec.len).is_some_and(|lim| e <= lim));
    if rec.valid == 1
        && rec.region == region
        && rec.secret == secret
        && rec.access & need64 == need64
        && fits
    {
        return Ok(());
    }
    Err(refusal(rec, region, secret, addr, len, need))
}

/// Why `check` refused an access.
#[cold]
#[inline(never)]
fn refusal(rec: &Record, region: u64, secret: u64, addr: u64, len: u64, need: u16) -> Error {
    if rec.valid != 1 || rec.region != region {
        return Error::msg(
            Status::InvalidKey,
            format!("region {region:#x} is not mapped (stale key, or unmapped)"),
        );
    }
    if rec.secret != secret {
        return Error::msg(
            Status::InvalidKey,
            format!("remote key for region {region:#x} has a wrong secret (forged key)"),
        );
    }
    if rec.access & need as u64 != need as u64 {
        let what = match need {
            access::READ => "remote read",
            access::WRITE => "remote write",
            _ => "remote atomics",
        };
        return Error::msg(
            Status::AccessDenied,
            format!("region {region:#x} was not mapped with {what} access"),
        );
    }
    // The only reason left: the range (or a record whose own range overflows).
    Error::msg(
        Status::OutOfRange,
        format!(
            "access [{addr:#x}, +{len}) outside region [{:#x}, +{})",
            rec.base, rec.len
        ),
    )
}

struct Region {
    secret: u64,
    base: u64,
    len: u64,
    access: u16,
    mem_type: MemoryType,
    memfd: Option<OwnedFd>,
    _alloc: Option<Backing>,
    /// Device memory: the IPC handle its key carries for same-host peers.
    ipc: Option<DeviceHandle>,
}

/// What keeps an allocated region's memory alive: a shared segment, or device memory.
pub(crate) enum Backing {
    Shared {
        _map: Mapping,
    },
    Device {
        _mem: crate::base::cuda::DeviceAlloc,
    },
}

/// Where a checked access lands in this process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place {
    pub ptr: *mut u8,
    /// CUDA device memory: only the driver may copy to and from it.
    pub device: bool,
}

/// A peer process's key table and region segments, mapped here.
pub(crate) struct PeerMaps {
    pidfd: OwnedFd,
    pub table: Mapping,
    /// The device of the owner's key table: its region segments are memfds on the same
    /// file system.
    table_dev: u64,
    /// Mapped region segments by region id (never reused), not by fd number (which the
    /// owner's kernel reuses after an unmap), with the fd number they were checked under.
    regions: Mutex<HashMap<u64, (i32, Arc<Mapping>)>>,
    /// The owner's device allocations opened through their IPC handles, by region id, with
    /// the handle (regions in one allocation share its one opening).
    devices: Mutex<HashMap<u64, OpenedDevice>>,
}

impl PeerMaps {
    /// Open the owner's device allocation holding region `region` (cached per region, and
    /// only while the owner's record describes that region). Its address here. Another
    /// live region in the same allocation (same handle) shares its opening: a driver opens
    /// a handle once per process. An owner in this very process (`own`) lends its
    /// allocation as it is.
    pub(crate) fn device_region(
        &self,
        driver: &'static crate::base::cuda::Driver,
        region: u64,
        handle: &DeviceHandle,
        own: bool,
    ) -> Result<Arc<crate::base::cuda::IpcMapping>> {
        let live = |id: u64| {
            self.record(id).is_some_and(|r| {
                r.valid == 1 && r.region == id && r.mem_type == MemoryType::Cuda.code() as u64
            })
        };
        let mut g = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, m)) = g.get(&region) {
            return Ok(m.clone());
        }
        if !live(region) {
            return Err(Error::new(
                Status::InvalidKey,
                "the device region is no longer mapped by its owner",
            ));
        }
        g.retain(|id, _| live(*id));
        let opened = g
            .values()
            .find(|(h, _)| *h == handle.handle)
            .map(|(_, m)| m.clone());
        let m = match opened {
            Some(m) => m,
            None => Arc::new(if own {
                driver.own_allocation(handle.alloc_base as usize)?
            } else {
                driver.ipc_open(&handle.handle)?
            }),
        };
        g.insert(region, (handle.handle, m.clone()));
        Ok(m)
    }

    /// The first two words (`valid`, then `region`) of region `region`'s record, which
    /// change only when the owner unmaps the region or gives its slot to another; valid
    /// as long as this table mapping is.
    pub(crate) fn record_head(&self, region: u64) -> Option<*const AtomicU64> {
        Some(word(self.table.ptr, table_slot(region)?, 0) as *const AtomicU64)
    }

    #[inline]
    pub(crate) fn record(&self, region: u64) -> Option<Record> {
        Some(read_record(self.table.ptr, table_slot(region)?))
    }

    /// Map the owner's segment of region `region` (memfd `fd`, `len` bytes), cached per
    /// region. The owner's record must still describe that region, so a segment is never
    /// taken for a region that was unmapped (and its fd number reused) meanwhile, and the
    /// descriptor taken must be the segment the record names: a key naming any other of
    /// the owner's descriptors (another region's segment, its key table, a file) is refused.
    pub(crate) fn region(&self, region: u64, fd: i32, len: usize) -> Result<Arc<Mapping>> {
        self.segment(region, fd, len).map_err(Error::from)
    }

    /// `region`, telling a forged key (its fd is not the region's segment) from a segment
    /// that cannot be mapped here now (region unmapped, descriptor not to be taken, key
    /// longer than the segment).
    pub(crate) fn segment(
        &self,
        region: u64,
        fd: i32,
        len: usize,
    ) -> std::result::Result<Arc<Mapping>, SegmentRefusal> {
        use SegmentRefusal::{Forged, Unavailable};
        let mut g = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, m)) = g.get(&region) {
            if *at == fd && m.len >= len {
                return Ok(m.clone());
            }
        }
        let live = || {
            self.record(region)
                .is_some_and(|r| r.valid == 1 && r.region == region)
        };
        let gone = || {
            Unavailable(Error::new(
                Status::InvalidKey,
                "the region is no longer mapped by its owner",
            ))
        };
        if !live() {
            return Err(gone());
        }
        // Regions the owner has unmapped are dropped from the cache as we go.
        g.retain(|id, _| {
            self.record(*id)
                .is_some_and(|r| r.valid == 1 && r.region == *id)
        });
        let forged = |what: &str| {
            Forged(Error::msg(
                Status::InvalidKey,
                format!(
                    "the key names descriptor {fd} of its owner, {what}, not the memory segment \
                     of region {region:#x} (forged key)"
                ),
            ))
        };
        if fd < 0 {
            return Err(forged("which does not exist"));
        }
        let local = match rustix::process::pidfd_getfd(
            &self.pidfd,
            fd,
            rustix::process::PidfdGetfdFlags::empty(),
        ) {
            Ok(f) => f,
            // No such descriptor while the region (and so its segment) is still there.
            Err(rustix::io::Errno::BADF) if live() => return Err(forged("which is not open")),
            Err(e) => {
                return Err(Unavailable(Error::msg(
                    Status::Unreachable,
                    format!("cannot take the peer's memory segment: {e}"),
                )));
            }
        };
        let st = rustix::fs::fstat(&local).map_err(|e| Unavailable(Error::io("fstat", e)))?;
        // Read after taking the descriptor: while the record still describes the region,
        // the segment it names is open in the owner, so its inode is not reused.
        if !live() {
            return Err(gone());
        }
        let slot = (region & 0xfff) as usize;
        let ino = word(self.table.ptr, slot, SEGMENT_WORD).load(Ordering::Acquire);
        if ino == 0 {
            return Err(forged("while the region has no shared segment"));
        }
        if st.st_ino as u64 != ino || st.st_dev as u64 != self.table_dev {
            return Err(forged("which is something else"));
        }
        let size = st.st_size as usize;
        if size < len {
            return Err(Unavailable(Error::new(
                Status::InvalidKey,
                "peer's memory segment is smaller than the key claims",
            )));
        }
        let m = Arc::new(Mapping::map(&local, size).map_err(Unavailable)?);
        g.insert(region, (fd, m.clone()));
        Ok(m)
    }
}

/// Why `PeerMaps::segment` maps nothing.
pub(crate) enum SegmentRefusal {
    /// The key's fd is not the region's segment: refuse the key.
    Forged(Error),
    /// The segment cannot be mapped here (now): reach the region another way.
    Unavailable(Error),
}

impl From<SegmentRefusal> for Error {
    fn from(r: SegmentRefusal) -> Error {
        match r {
            SegmentRefusal::Forged(e) | SegmentRefusal::Unavailable(e) => e,
        }
    }
}

/// A peer's shared segment mapped here, and where the asked-for segments lie in it.
pub(crate) type SharedView = (Arc<Mapping>, super::state::Segs<u64>);
/// A peer's device allocation opened here, with the IPC handle it was opened from.
type OpenedDevice = ([u8; 64], Arc<crate::base::cuda::IpcMapping>);
/// A same-host peer's device allocation opened here, and segments translated into it.
pub(crate) type DeviceView = (Arc<crate::base::cuda::IpcMapping>, super::state::Segs<u64>);

/// Whether a rendezvous offer's key is a device region's (read through its IPC handle,
/// never with CMA or the CPU): one with the IPC trailer, which only device keys carry.
/// Asked on every keyed copy, so only the length is looked at; `device_view` checks the
/// rest (a key that fails there is an error, never a host copy).
#[inline]
pub(crate) fn is_device_key(key: &[u8]) -> bool {
    key.len() == crate::wire::rkey::LEN + crate::wire::rkey::IPC_LEN
}

/// The regions of one context.
pub struct MemRegistry {
    pub(crate) ctx_id: u64,
    table_fd: Option<OwnedFd>,
    table: Option<Mapping>,
    inner: Mutex<RegInner>,
    peers: Mutex<HashMap<(u32, u64), Arc<PeerMaps>>>,
}

struct RegInner {
    slots: Vec<Option<Region>>,
    generations: Vec<u64>,
    /// Host-memory-only table when no shared table could be made.
    private: Vec<Record>,
    /// Allocated regions (in shared segments), for rendezvous offers.
    allocs: Vec<Offer>,
    /// Device regions with an IPC handle, and their packed keys (rendezvous offers of
    /// device memory to same-host peers).
    device_offers: Vec<Offer>,
}

/// An allocated region as rendezvous offers name it: where it lies, its id, and its packed
/// key, made when the region is recorded (nothing in an allocated region's key changes),
/// so that an offer costs no packing, no system call for the process id, no allocation.
struct Offer {
    base: u64,
    len: u64,
    id: u64,
    key: Box<[u8]>,
}

/// `segs` (addresses in the owner's process), each checked against the owner's record
/// `rec` for `key`, translated into a local window of `len` bytes at `local` that holds
/// the owner's address `base`.
fn translate(
    rec: &Record,
    key: &RkeyRepr,
    segs: &[(u64, u64)],
    base: u64,
    local: usize,
    len: usize,
) -> Result<super::state::Segs<u64>> {
    let mut out = super::state::Segs::new();
    for &(a, n) in segs {
        check(rec, key.region, key.secret, a, n, 0)?;
        let off = a.checked_sub(base).ok_or(Status::OutOfRange)?;
        if off.checked_add(n).is_none_or(|end| end > len as u64) {
            return Err(Error::new(
                Status::OutOfRange,
                "the peer's memory mapped here is shorter than its record",
            ));
        }
        out.push((local as u64 + off, n));
    }
    Ok(out)
}

/// The offered region that holds every one of `segs` (address, length), if one does.
fn holding<'a>(offers: &'a [Offer], segs: &[(usize, usize)]) -> Option<&'a Offer> {
    offers.iter().find(|r| {
        segs.iter().all(|&(a, n)| {
            let (a, n) = (a as u64, n as u64);
            a >= r.base && a.checked_add(n).is_some_and(|e| e <= r.base + r.len)
        })
    })
}

impl MemRegistry {
    pub(crate) fn new() -> MemRegistry {
        let ctx_id = random_u64();
        let shared = memfd("courier-keys", TABLE_BYTES)
            .and_then(|fd| Mapping::map(&fd, TABLE_BYTES).map(|m| (fd, m)));
        let (table_fd, table) = match shared {
            Ok((fd, m)) => {
                word(m.ptr, 0, 0).store(TABLE_MAGIC, Ordering::Relaxed);
                word(m.ptr, 0, 1).store(ctx_id, Ordering::Release);
                (Some(fd), Some(m))
            }
            Err(e) => {
                tracing::info!(
                    "no shared key table ({e}); same-host peers will reach memory through this process"
                );
                (None, None)
            }
        };
        MemRegistry {
            ctx_id,
            table_fd,
            table,
            inner: Mutex::new(RegInner {
                slots: (0..TABLE_SLOTS).map(|_| None).collect(),
                generations: vec![0; TABLE_SLOTS],
                private: vec![
                    Record {
                        valid: 0,
                        region: 0,
                        secret: 0,
                        base: 0,
                        len: 0,
                        access: 0,
                        mem_type: 0,
                    };
                    TABLE_SLOTS
                ],
                allocs: Vec::new(),
                device_offers: Vec::new(),
            }),
            peers: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write a record (and the inode of the region's segment, 0 for none) into the table.
    fn publish(&self, g: &mut RegInner, slot: usize, rec: Record, segment: u64) {
        match &self.table {
            Some(t) => {
                word(t.ptr, slot, 0).store(0, Ordering::Release);
                for (w, v) in [
                    (1, rec.region),
                    (2, rec.secret),
                    (3, rec.base),
                    (4, rec.len),
                    (5, rec.access),
                    (6, rec.mem_type),
                    (SEGMENT_WORD, segment),
                ] {
                    word(t.ptr, slot, w).store(v, Ordering::Relaxed);
                }
                word(t.ptr, slot, 0).store(rec.valid, Ordering::Release);
            }
            None => g.private[slot] = rec,
        }
    }

    /// Record a region; returns its id. `alloc` keeps an allocated segment alive.
    pub(crate) fn add(
        &self,
        base: u64,
        len: u64,
        acc: u16,
        mem_type: MemoryType,
        memfd: Option<OwnedFd>,
        alloc: Option<Backing>,
    ) -> Result<(u64, u64)> {
        let mut g = self.lock();
        let slot = (1..TABLE_SLOTS)
            .find(|&i| g.slots[i].is_none())
            .ok_or_else(|| {
                Error::msg(
                    Status::NoMemory,
                    format!(
                        "too many mapped regions (at most {} per context)",
                        TABLE_SLOTS - 1
                    ),
                )
            })?;
        g.generations[slot] += 1;
        let id = (g.generations[slot] << 12) | slot as u64;
        let secret = random_u64() | 1;
        let offered = memfd.is_some() && self.table.is_some();
        // What same-host peers check a key's segment fd against.
        let segment = match &memfd {
            Some(fd) => {
                rustix::fs::fstat(fd)
                    .map_err(|e| Error::io("fstat", e))?
                    .st_ino as u64
            }
            None => 0,
        };
        let region = Region {
            secret,
            base,
            len,
            access: acc,
            mem_type,
            memfd,
            _alloc: alloc,
            ipc: None,
        };
        if offered {
            let key = self.pack_region(id, &region).into_boxed_slice();
            g.allocs.push(Offer { base, len, id, key });
        }
        g.slots[slot] = Some(region);
        self.publish(
            &mut g,
            slot,
            Record {
                valid: 1,
                region: id,
                secret,
                base,
                len,
                access: acc as u64,
                mem_type: mem_type.code() as u64,
            },
            segment,
        );
        Ok((id, secret))
    }

    /// Allocate `len` bytes in a shared segment and record them.
    pub(crate) fn allocate(
        &self,
        len: usize,
        acc: u16,
        mem_type: MemoryType,
    ) -> Result<(u64, u64, *mut u8)> {
        let fd = memfd("courier-mem", len.max(1))?;
        let m = Mapping::map(&fd, len.max(1))?;
        let ptr = m.ptr;
        let (id, secret) = self.add(
            ptr as u64,
            len as u64,
            acc,
            mem_type,
            Some(fd),
            Some(Backing::Shared { _map: m }),
        )?;
        Ok((id, secret, ptr))
    }

    /// Move the private pages `[ptr, ptr + len)` into a shared segment at the same
    /// addresses, contents kept, and record them like allocated memory (peers map the
    /// segment). The pages stay mapped when the region is removed.
    pub(crate) fn share_in_place(&self, ptr: *mut u8, len: usize, acc: u16) -> Result<u64> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        let page = rustix::param::page_size();
        if len == 0 || !(ptr as usize).is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "sharing in place needs whole pages: [{ptr:p}, +{len}) is not a non-empty multiple of {page} bytes at a page boundary"
                ),
            ));
        }
        let fd = memfd("courier-in-place", len)?;
        // Copy what is there; pages of zeros stay holes of the segment (a large bss costs
        // nothing until it is written).
        for off in (0..len).step_by(page) {
            // SAFETY: the caller's pages, readable (they are about to be shared); read as
            // bytes through a raw slice that lives only for this copy.
            let bytes = unsafe { std::slice::from_raw_parts(ptr.add(off), page) };
            if bytes.iter().all(|&b| b == 0) {
                continue;
            }
            let mut done = 0;
            while done < page {
                let n = rustix::io::pwrite(&fd, &bytes[done..], (off + done) as u64)
                    .map_err(|e| Error::io("pwrite", e))?;
                done += n;
            }
        }
        // SAFETY: replaces the caller's pages by the segment holding the same bytes, at the
        // same addresses (MAP_FIXED swaps the mappings in one step, so no other mapping can
        // land in between); the caller vouches that nothing writes them meanwhile.
        unsafe {
            mmap(
                ptr.cast(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                &fd,
                0,
            )
        }
        .map_err(|e| Error::io("mmap (in place)", e))?;
        let (id, _) = self.add(
            ptr as u64,
            len as u64,
            acc,
            MemoryType::Host,
            Some(fd),
            None,
        )?;
        Ok(id)
    }

    /// Allocate `len` bytes of CUDA device memory and record them.
    pub(crate) fn allocate_device(
        &self,
        driver: &'static crate::base::cuda::Driver,
        len: usize,
        acc: u16,
    ) -> Result<(u64, u64, *mut u8)> {
        let a = driver.alloc(len)?;
        let ptr = a.ptr as *mut u8;
        let (id, secret) = self.add(
            ptr as u64,
            len as u64,
            acc,
            MemoryType::Cuda,
            None,
            Some(Backing::Device { _mem: a }),
        )?;
        Ok((id, secret, ptr))
    }

    /// Give device region `id`'s keys the IPC handle of the allocation holding it (and,
    /// where peers can check keys against the shared table, offer it to rendezvous).
    pub(crate) fn set_ipc(&self, id: u64, ipc: DeviceHandle) {
        let slot = (id & 0xfff) as usize;
        let mut g = self.lock();
        if slot < TABLE_SLOTS && g.generations[slot] == id >> 12 {
            let Some(r) = g.slots[slot].as_mut() else {
                return;
            };
            r.ipc = Some(ipc);
            let (base, len) = (r.base, r.len);
            if self.table.is_some() {
                let key = g.slots[slot]
                    .as_ref()
                    .map(|r| self.pack_region(id, r).into_boxed_slice());
                if let Some(key) = key {
                    g.device_offers.push(Offer { base, len, id, key });
                }
            }
        }
    }

    /// Remove a region: every key made from it is refused from now on.
    pub(crate) fn remove(&self, id: u64) {
        let slot = (id & 0xfff) as usize;
        let mut g = self.lock();
        if slot > 0 && slot < TABLE_SLOTS && g.generations[slot] == id >> 12 {
            self.publish(
                &mut g,
                slot,
                Record {
                    valid: 0,
                    region: 0,
                    secret: 0,
                    base: 0,
                    len: 0,
                    access: 0,
                    mem_type: 0,
                },
                0,
            );
            g.slots[slot] = None;
            g.allocs.retain(|a| a.id != id);
            g.device_offers.retain(|a| a.id != id);
        }
    }

    /// Append to `out` the packed key of the allocated region that holds every one of `segs`
    /// (address, length), if there is one (`false`: none, `out` unchanged): a same-host peer
    /// given it copies those bytes with plain loads and stores through the region's shared
    /// segment instead of through the kernel.
    pub(crate) fn shared_key(&self, segs: &[(usize, usize)], out: &mut Vec<u8>) -> bool {
        let g = self.lock();
        match holding(&g.allocs, segs) {
            Some(o) => {
                out.extend_from_slice(&o.key);
                true
            }
            None => false,
        }
    }

    /// Whether one device region with an IPC handle holds every one of `segs`; with `out`,
    /// its packed key is appended (a same-host peer reads the bytes through the handle).
    pub(crate) fn device_key(&self, segs: &[(usize, usize)], out: Option<&mut Vec<u8>>) -> bool {
        let g = self.lock();
        match holding(&g.device_offers, segs) {
            Some(o) => {
                if let Some(out) = out {
                    out.extend_from_slice(&o.key);
                }
                true
            }
            None => false,
        }
    }

    /// The key of a rendezvous offer from the same-host peer `peer_pid` (`what`: the kind
    /// of key, for errors), and the maps of that peer's memory.
    fn offer_key(
        &self,
        key: &[u8],
        peer_pid: u32,
        what: &str,
    ) -> Result<(RkeyRepr, Arc<PeerMaps>, Record)> {
        let key = RkeyRepr::unpack(key)
            .map_err(|e| Error::msg(Status::InvalidKey, format!("{what} key: {e}")))?;
        if key.pid != peer_pid || key.host_id != host_id() {
            return Err(Error::msg(
                Status::InvalidKey,
                format!("the {what} key names another process's memory"),
            ));
        }
        let peer = self.peer(&key)?;
        let rec = peer.record(key.region).ok_or(Status::InvalidKey)?;
        Ok((key, peer, rec))
    }

    /// Where `segs` (device addresses in the same-host peer `peer_pid` that packed the
    /// device key `key`) lie in this process, through the allocation's IPC handle (opened
    /// once per region and kept). Every segment is checked against the owner's record
    /// (live device region, right secret, inside its bounds) and the opened allocation.
    pub(crate) fn device_view(
        &self,
        key: &[u8],
        peer_pid: u32,
        segs: &[(u64, u64)],
    ) -> Result<DeviceView> {
        let (key, peer, rec) = self.offer_key(key, peer_pid, "device")?;
        let ipc = key
            .ipc
            .ok_or_else(|| Error::new(Status::InvalidKey, "the device key has no IPC handle"))?;
        if rec.mem_type != MemoryType::Cuda.code() as u64 {
            return Err(Error::new(
                Status::InvalidKey,
                "the key's memory type is not the owner's",
            ));
        }
        let driver = crate::base::cuda::loaded().ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                "no CUDA driver loaded here to open the peer's device memory",
            )
        })?;
        let map = peer.device_region(driver, key.region, &ipc, key.pid == pid())?;
        let out = translate(&rec, &key, segs, ipc.alloc_base, map.ptr, map.len)?;
        Ok((map, out))
    }

    /// Where `segs` (addresses in the peer process `peer_pid` that packed `key`) lie in a
    /// local mapping of its shared segment. Every segment is checked against the owner's
    /// record (live region, right secret, inside its bounds) and the mapping's length; the
    /// mapping is returned to keep it alive while the caller copies.
    pub(crate) fn shared_view(
        &self,
        key: &[u8],
        peer_pid: u32,
        segs: &[(u64, u64)],
    ) -> Result<SharedView> {
        let (key, peer, rec) = self.offer_key(key, peer_pid, "segment")?;
        if key.region_fd < 0 {
            return Err(Error::new(
                Status::InvalidKey,
                "the segment key names no shared segment",
            ));
        }
        let map = peer.region(key.region, key.region_fd, key.length as usize)?;
        let out = translate(&rec, &key, segs, rec.base, map.ptr as usize, map.len)?;
        Ok((map, out))
    }

    /// Pack a key for region `id`.
    pub(crate) fn pack(&self, id: u64) -> Result<Vec<u8>> {
        let g = self.lock();
        let slot = (id & 0xfff) as usize;
        let r = g
            .slots
            .get(slot)
            .and_then(|r| r.as_ref())
            .filter(|_| g.generations[slot] == id >> 12)
            .ok_or(Status::InvalidKey)?;
        Ok(self.pack_region(id, r))
    }

    /// The packed key of region `id`, recorded as `r`.
    fn pack_region(&self, id: u64, r: &Region) -> Vec<u8> {
        RkeyRepr {
            mem_type: r.mem_type.code(),
            access: r.access,
            region: id,
            secret: r.secret,
            base: r.base,
            length: r.len,
            ctx_id: self.ctx_id,
            host_id: host_id(),
            pid: pid(),
            table_fd: self.table_fd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1),
            region_fd: r.memfd.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1),
            ipc: r.ipc,
        }
        .pack()
    }

    /// Check an access by a peer against this context's own records; where it lands.
    pub(crate) fn lookup_place(
        &self,
        region: u64,
        secret: u64,
        addr: u64,
        len: u64,
        need: u16,
    ) -> Result<Place> {
        let Some(slot) = table_slot(region) else {
            return Err(Error::msg(
                Status::InvalidKey,
                format!("region {region:#x} does not exist (forged key)"),
            ));
        };
        let rec = match &self.table {
            Some(t) => read_record(t.ptr, slot),
            None => self.lock().private[slot],
        };
        check(&rec, region, secret, addr, len, need)?;
        Ok(Place {
            ptr: addr as *mut u8,
            device: rec.mem_type == MemoryType::Cuda.code() as u64,
        })
    }

    /// `lookup_place` for accesses the CPU makes itself (atomics, signal words): refused
    /// for device memory.
    pub(crate) fn lookup(
        &self,
        region: u64,
        secret: u64,
        addr: u64,
        len: u64,
        need: u16,
    ) -> Result<*mut u8> {
        let p = self.lookup_place(region, secret, addr, len, need)?;
        if p.device {
            return Err(Error::msg(
                Status::Unsupported,
                format!(
                    "region {region:#x} is CUDA device memory: atomics and signal words need host memory"
                ),
            ));
        }
        Ok(p.ptr)
    }

    /// Map a same-host peer's key table (cached per process and context).
    pub(crate) fn peer(&self, key: &RkeyRepr) -> Result<Arc<PeerMaps>> {
        let mut g = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = g.get(&(key.pid, key.ctx_id)) {
            return Ok(p.clone());
        }
        if key.table_fd < 0 {
            return Err(Error::new(
                Status::Unsupported,
                "the owner publishes no key table",
            ));
        }
        let pid = rustix::process::Pid::from_raw(key.pid as i32).ok_or(Status::InvalidKey)?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| {
                Error::msg(Status::Unreachable, format!("pidfd_open({}): {e}", key.pid))
            })?;
        let fd = rustix::process::pidfd_getfd(
            &pidfd,
            key.table_fd,
            rustix::process::PidfdGetfdFlags::empty(),
        )
        .map_err(|e| {
            Error::msg(
                Status::Unreachable,
                format!("pidfd_getfd refused ({e}); the kernel's ptrace policy forbids it"),
            )
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("fstat", e))?;
        let size = st.st_size as usize;
        if size != TABLE_BYTES {
            return Err(Error::new(
                Status::InvalidKey,
                "the key names something that is not a Courier key table",
            ));
        }
        let table = Mapping::map(&fd, TABLE_BYTES)?;
        if word(table.ptr, 0, 0).load(Ordering::Acquire) != TABLE_MAGIC
            || word(table.ptr, 0, 1).load(Ordering::Acquire) != key.ctx_id
        {
            return Err(Error::new(
                Status::InvalidKey,
                "the key's owner is gone (its process id now belongs to something else)",
            ));
        }
        let p = Arc::new(PeerMaps {
            pidfd,
            table,
            table_dev: st.st_dev as u64,
            regions: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
        });
        g.insert((key.pid, key.ctx_id), p.clone());
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_check_unmap() {
        let r = MemRegistry::new();
        let mut buf = vec![0u8; 100];
        let base = buf.as_mut_ptr() as u64;
        let (id, secret) = r
            .add(
                base,
                100,
                access::READ | access::WRITE,
                MemoryType::Host,
                None,
                None,
            )
            .unwrap();
        assert!(r.lookup(id, secret, base + 10, 8, access::WRITE).is_ok());
        assert_eq!(
            r.lookup(id, secret ^ 1, base, 8, access::WRITE)
                .unwrap_err()
                .status(),
            Status::InvalidKey
        );
        assert_eq!(
            r.lookup(id, secret, base + 96, 8, access::WRITE)
                .unwrap_err()
                .status(),
            Status::OutOfRange
        );
        assert_eq!(
            r.lookup(id, secret, base - 1, 1, access::READ)
                .unwrap_err()
                .status(),
            Status::OutOfRange
        );
        assert_eq!(
            r.lookup(id, secret, base, 8, access::ATOMIC)
                .unwrap_err()
                .status(),
            Status::AccessDenied
        );
        assert_eq!(
            r.lookup(id + (1 << 12), secret, base, 8, access::READ)
                .unwrap_err()
                .status(),
            Status::InvalidKey
        );
        r.remove(id);
        assert_eq!(
            r.lookup(id, secret, base, 8, access::READ)
                .unwrap_err()
                .status(),
            Status::InvalidKey
        );
        let key = RkeyRepr::unpack(
            &r.pack(
                r.add(base, 100, access::ALL, MemoryType::Host, None, None)
                    .unwrap()
                    .0,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(key.length, 100);
    }

    /// A key whose segment fd names another region's segment (or anything that is not the
    /// region's own memfd) is refused, and nothing of that other segment is mapped for it.
    #[test]
    fn segment_fd_must_be_the_regions_own() {
        let r = MemRegistry::new();
        if r.table.is_none() {
            return; // no memfd here: no segments (checked by the multi-process tests)
        }
        let (a, _, pa) = r.allocate(4096, access::ALL, MemoryType::Host).unwrap();
        let (b, _, _) = r.allocate(8192, access::ALL, MemoryType::Host).unwrap();
        let ka = RkeyRepr::unpack(&r.pack(a).unwrap()).unwrap();
        let kb = RkeyRepr::unpack(&r.pack(b).unwrap()).unwrap();
        let me = pid();
        let seg = [(pa as u64, 64)];
        // The honest key works.
        assert!(r.shared_view(&ka.pack(), me, &seg).is_ok());
        let refused = |k: &RkeyRepr| match r.shared_view(&k.pack(), me, &seg) {
            Ok(_) => panic!("a forged segment fd was mapped"),
            Err(e) => e,
        };
        // Region a's key naming region b's segment.
        let mut forged = ka.clone();
        forged.region_fd = kb.region_fd;
        let e = refused(&forged);
        assert_eq!(e.status(), Status::InvalidKey, "{e}");
        assert!(e.detail().contains("segment"), "{e}");
        // Naming the key table, or an fd that is no memfd at all.
        forged.region_fd = ka.table_fd;
        assert_eq!(refused(&forged).status(), Status::InvalidKey);
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        forged.region_fd = file.as_raw_fd();
        assert_eq!(refused(&forged).status(), Status::InvalidKey);
        // A registered region has no segment: any fd its key names is refused.
        let mut heap = vec![0u8; 4096];
        let (h, _) = r
            .add(
                heap.as_mut_ptr() as u64,
                4096,
                access::ALL,
                MemoryType::Host,
                None,
                None,
            )
            .unwrap();
        let mut kh = RkeyRepr::unpack(&r.pack(h).unwrap()).unwrap();
        kh.region_fd = kb.region_fd;
        let peer = r.peer(&kh).unwrap();
        let e = match peer.region(h, kh.region_fd, 4096) {
            Ok(_) => panic!("a registered region's key mapped another segment"),
            Err(e) => e,
        };
        assert_eq!(e.status(), Status::InvalidKey, "{e}");
    }

    /// A rendezvous offer's segment key: only allocated regions get one, and a view is
    /// refused for a forged secret, another process, bytes outside the region, a region
    /// with no segment, and after unmap; a good one reads the owner's bytes.
    #[test]
    fn shared_segment_offers() {
        let r = MemRegistry::new();
        if r.table.is_none() {
            return; // no memfd here: nothing is offered (checked by the multi-process tests)
        }
        let (id, _, ptr) = r.allocate(8192, 0, MemoryType::Host).unwrap();
        // SAFETY: a fresh 8 KiB allocation of ours.
        unsafe { std::slice::from_raw_parts_mut(ptr, 8192) }
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        let base = ptr as u64;
        let segs = [(base + 100, 1000), (base + 5000, 3192)];
        let local = segs.map(|(a, n)| (a as usize, n as usize));
        let mut key = b"before".to_vec();
        assert!(
            r.shared_key(&local, &mut key),
            "allocated memory is offered"
        );
        assert_eq!(&key[..6], b"before", "the key is appended");
        key.drain(..6);
        assert_eq!(
            key,
            r.pack(id).unwrap(),
            "the key packed when the region was added"
        );
        let me = pid();
        let (map, there) = r.shared_view(&key, me, &segs).unwrap();
        assert_eq!(there.len(), 2);
        for (&(a, n), &(local, ln)) in segs.iter().zip(&there) {
            assert_eq!(n, ln);
            assert_ne!(local, a, "read through a second mapping, not the original");
            // SAFETY: inside our live view of the segment.
            let got = unsafe { std::slice::from_raw_parts(local as *const u8, n as usize) };
            let off = (a - base) as usize;
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, &b)| b == ((off + i) % 251) as u8)
            );
        }
        drop(map);
        let refused = |k: &[u8], p: u32, s: &[(u64, u64)]| match r.shared_view(k, p, s) {
            Ok(_) => panic!("view granted"),
            Err(e) => e.status(),
        };
        // Beyond the region, or straddling its end.
        assert_eq!(refused(&key, me, &[(base + 8000, 193)]), Status::OutOfRange);
        assert_eq!(refused(&key, me, &[(base - 8, 8)]), Status::OutOfRange);
        // Forged secret.
        let mut forged = RkeyRepr::unpack(&key).unwrap();
        forged.secret ^= 0x10;
        assert_eq!(refused(&forged.pack(), me, &segs), Status::InvalidKey);
        // A key naming another process than the peer the offer came from.
        assert_eq!(refused(&key, me + 1, &segs), Status::InvalidKey);
        // Garbage.
        assert_eq!(refused(&key[..10], me, &segs), Status::InvalidKey);
        // Registered (not allocated) memory has no segment to offer.
        let mut heap = vec![0u8; 64];
        let hb = heap.as_mut_ptr() as u64;
        r.add(hb, 64, 0, MemoryType::Host, None, None).unwrap();
        let mut none = Vec::new();
        assert!(!r.shared_key(&[(hb as usize, 64)], &mut none));
        // Segments that are not all inside one region are not offered.
        assert!(!r.shared_key(&[(base as usize, 10), (hb as usize, 10)], &mut none));
        // After unmap: not offered, and an old key is refused.
        r.remove(id);
        assert!(!r.shared_key(&local, &mut none));
        assert!(none.is_empty());
        assert_eq!(refused(&key, me, &segs), Status::InvalidKey);
    }
}
