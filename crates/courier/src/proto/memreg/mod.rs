//! Memory regions of a context, and the key table that same-host peers check keys against.
//!
//! Every mapped region gets a slot in a shared *key table* (a memfd, 64-byte entries) that
//! holds the owner's record: region id, 128-bit secret, bounds, rights, the identity of the
//! region's shared segment, and a valid word. A peer on the same host maps the table (and,
//! for allocated regions, the region's own memfd) through `pidfd_getfd`, then checks every
//! access against the owner's record before it loads, stores or runs a CPU atomic: forged
//! keys, stale keys (after unmap), accesses out of range or without the right are refused
//! without touching the region, and a segment is mapped only if it is the one the record
//! names (a key's fd number is a claim like the rest). Peers elsewhere send operations to
//! the owner's worker, which checks them against the same records.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::sys::{host_id, pid, random_u64};
use crate::base::{Error, Result, Status};
use crate::transport::shm::memory::{Mapping, memfd};
use crate::wire::rkey::{DeviceHandle, RkeyRepr, Secret, access, secret_eq};

use crate::wire::keytable::{self, entry, header};

const TABLE_SLOTS: usize = keytable::SLOTS;
const TABLE_BYTES: usize = keytable::BYTES;

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

/// The record of one region in a key table, read with atomics (the table is shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(in crate::proto) valid: u64,
    pub(in crate::proto) region: u64,
    pub(in crate::proto) secret: Secret,
    pub(in crate::proto) base: u64,
    pub(in crate::proto) len: u64,
    pub(in crate::proto) access: u64,
    /// `MemoryType::code` of the region.
    pub(in crate::proto) mem_type: u64,
}

#[inline]
fn word(table: *mut u8, slot: usize, w: usize) -> &'static AtomicU64 {
    // SAFETY: slot < TABLE_SLOTS, w < 8: inside the mapping, 8-byte aligned (page-aligned
    // mapping, 64-byte entries). The mapping lives as long as its owner keeps it.
    unsafe { AtomicU64::from_ptr(table.add(keytable::offset(slot, w)) as *mut u64) }
}

/// Where a region starting at `base` lies in its shared segment: a segment starts at the
/// page that holds the region's first byte (allocated regions start one; a range shared in
/// place may start inside it).
#[inline]
pub(crate) fn segment_offset(base: u64) -> u64 {
    base % rustix::param::page_size() as u64
}

/// The word of a record naming the region's shared segment. Read only when a peer maps the
/// segment, so not part of `Record` (which the direct paths read on every access).
const SEGMENT_WORD: usize = entry::SEGMENT;

/// The key-table slot of region id `region` (slot 0 is the table's header).
#[inline]
fn table_slot(region: u64) -> Option<usize> {
    keytable::slot(region)
}

#[inline]
fn read_record(table: *mut u8, slot: usize) -> Record {
    let valid = word(table, slot, entry::VALID).load(Ordering::Acquire);
    let load = |w| word(table, slot, w).load(Ordering::Relaxed);
    let (access, mem_type) = keytable::kind_of(load(entry::KIND));
    Record {
        valid,
        region: load(entry::REGION),
        secret: keytable::secret_of(load(entry::SECRET_LO), load(entry::SECRET_HI)),
        base: load(entry::BASE),
        len: load(entry::LEN),
        access: access as u64,
        mem_type: mem_type as u64,
    }
}

/// Check an access of `len` bytes at `addr` needing `need` rights against a record. The
/// passing case (every direct put, get and atomic) is a few comparisons; the error, with
/// the first reason that applies, is built out of line.
#[inline(always)]
pub(crate) fn check(
    rec: &Record,
    region: u64,
    secret: Secret,
    addr: u64,
    len: u64,
    need: u16,
) -> Result<()> {
    let need64 = need as u64;
    let fits = addr >= rec.base
        && addr
            .checked_add(len)
            .is_some_and(|e| rec.base.checked_add(rec.len).is_some_and(|lim| e <= lim));
    // The secret's 128 bits are compared whole (both halves, no early exit): the time
    // does not depend on which bits differ.
    let secret_ok = secret_eq(rec.secret, secret);
    if rec.valid == 1 && rec.region == region && secret_ok && rec.access & need64 == need64 && fits
    {
        return Ok(());
    }
    Err(refusal(rec, region, secret, addr, len, need))
}

/// Why `check` refused an access.
#[cold]
#[inline(never)]
fn refusal(rec: &Record, region: u64, secret: Secret, addr: u64, len: u64, need: u16) -> Error {
    if rec.valid != 1 || rec.region != region {
        return Error::msg(
            Status::InvalidKey,
            format!("region {region:#x} is not mapped (stale key, or unmapped)"),
        );
    }
    if !secret_eq(rec.secret, secret) {
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
    secret: Secret,
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
    pub(crate) ptr: *mut u8,
    /// CUDA device memory: only the driver may copy to and from it.
    pub(crate) device: bool,
}

/// A peer's shared segment mapped here, and where the asked-for segments lie in it.
pub(crate) type SharedView = (Arc<Mapping>, super::buf::Segs<u64>);
/// A same-host peer's device allocation opened here, and segments translated into it.
pub(crate) type DeviceView = (Arc<crate::base::cuda::IpcMapping>, super::buf::Segs<u64>);

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
) -> Result<super::buf::Segs<u64>> {
    let mut out = super::buf::Segs::new();
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
                word(m.ptr, 0, header::MAGIC).store(keytable::MAGIC, Ordering::Relaxed);
                word(m.ptr, 0, header::CTX_ID).store(ctx_id, Ordering::Release);
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
        if let Some(t) = &self.table {
            word(t.ptr, slot, entry::VALID).store(0, Ordering::Release);
            let words = keytable::Entry {
                valid: rec.valid,
                region: rec.region,
                secret: rec.secret,
                base: rec.base,
                len: rec.len,
                access: rec.access as u16,
                mem_type: rec.mem_type as u8,
                segment,
            }
            .words();
            for (w, v) in words.iter().enumerate().skip(entry::VALID + 1) {
                word(t.ptr, slot, w).store(*v, Ordering::Relaxed);
            }
            word(t.ptr, slot, entry::VALID).store(rec.valid, Ordering::Release);
        }
        // The owner checks peers' operations against this copy: the shared table is
        // memory a peer can map writable (it can take the table's descriptor).
        g.private[slot] = rec;
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
    ) -> Result<(u64, Secret)> {
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
        // From the kernel's random source only: if it fails, so does the mapping (a
        // guessable secret would let any connected peer forge keys).
        let mut sb = [0u8; 16];
        crate::base::auth::fill_random(&mut sb, "a memory region's secret")?;
        let secret = Secret::from_le_bytes(sb);
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
    ) -> Result<(u64, Secret, *mut u8)> {
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

    /// Move the private pages that hold `[ptr, ptr + len)` into a shared segment at the
    /// same addresses, contents kept, and record the range like allocated memory (peers
    /// map the segment, which starts at the page holding `ptr`: `segment_offset`). The
    /// pages stay mapped when the region is removed.
    pub(crate) fn share_in_place(&self, ptr: *mut u8, len: usize, acc: u16) -> Result<u64> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        let page = rustix::param::page_size();
        let first = (ptr as usize) & !(page - 1);
        let end = (ptr as usize)
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(page));
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "sharing in place needs a non-empty range inside the address space: [{ptr:p}, +{len})"
                ),
            ));
        };
        let span = end - first;
        let start = first as *mut u8;
        let fd = memfd("courier-in-place", span)?;
        // Copy what is there; pages of zeros stay holes of the segment (a large bss costs
        // nothing until it is written).
        for off in (0..span).step_by(page) {
            // SAFETY: the caller's pages, readable (they are about to be shared); read as
            // bytes through a raw slice that lives only for this copy.
            let bytes = unsafe { std::slice::from_raw_parts(start.add(off), page) };
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
                start.cast(),
                span,
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
    ) -> Result<(u64, Secret, *mut u8)> {
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
        let at = rec.base - segment_offset(rec.base);
        let out = translate(&rec, &key, segs, at, map.ptr as usize, map.len)?;
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

    /// Check an access by a peer against this context's own private records (never the
    /// key table peers map); where it lands.
    #[inline]
    pub(crate) fn lookup_place(
        &self,
        region: u64,
        secret: Secret,
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
        // This process's own record, never the shared table (which a peer can write).
        let rec = self.lock().private[slot];
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
        secret: Secret,
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
}

mod peer;
#[cfg(test)]
mod tests;

pub(crate) use peer::{PeerMaps, SegmentRefusal};
