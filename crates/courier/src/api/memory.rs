//! Memory regions, remote keys, one-sided operations, signals and semaphores.
//!
//! `Context::mem_map` registers a buffer or allocates one. Allocated host memory lives in a
//! shared segment, so a peer on the same host reaches it with plain loads, stores and CPU
//! atomics, without the owner's CPU; registered memory is reached with CMA on the same host.
//! Elsewhere (or over tcp) the owner's worker carries operations out as it progresses.
//! Whatever the path, every access is checked against the owner's own record of the region.
//! [`super::onesided`] describes these paths for tools (`courier info`); change both together
//! (`tests/onesided.rs` checks that they agree).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Once, OnceLock};
use std::time::{Duration, Instant};

use super::context::Context;
use super::endpoint::Endpoint;
use super::onesided::Reach;
use super::request::Request;
use super::worker::Worker;
use crate::base::cuda;
use crate::base::sys::{copy_small, host_id, poll_gap};
use crate::base::{Error, Result, Status};
use crate::proto::core::State;
pub use crate::proto::memreg::MemoryType;
use crate::proto::memreg::{Mapping, MemRegistry, PeerMaps, Place, SegmentRefusal, check};
pub use crate::proto::rma::{AtomicOp, SignalOp};
use crate::proto::rma::{do_atomic, do_signal, do_signal_sc};
use crate::proto::stage;
use crate::proto::state::{Buf, Callback, Info};
use crate::proto::tag::Started;
use crate::transport::shm::Doorbell;
use crate::wire::frame::RemoteRef;
use crate::wire::rkey::RkeyRepr;
pub use crate::wire::rkey::access;

/// How to map memory.
#[derive(Clone, Copy, Debug)]
pub struct MemMapParams {
    /// Register this existing buffer (with `length`); `None` with `allocate`.
    pub address: Option<*mut u8>,
    /// Length in bytes.
    pub length: usize,
    /// Allocate the memory (in a shared segment for host memory).
    pub allocate: bool,
    /// Memory type asked for.
    pub memory_type: MemoryType,
    /// Remote rights: `access::READ | WRITE | ATOMIC`.
    pub access: u16,
    /// With `address`: move the pages `[address, address + length)` (page-aligned) into a
    /// shared segment in place, keeping their addresses and contents, so that same-host
    /// peers reach them directly as they reach allocated memory (`share_in_place`).
    pub in_place: bool,
}

impl Default for MemMapParams {
    fn default() -> Self {
        MemMapParams {
            address: None,
            length: 0,
            allocate: false,
            memory_type: MemoryType::Host,
            access: access::ALL,
            in_place: false,
        }
    }
}

impl MemMapParams {
    /// Allocate `length` bytes.
    pub fn allocate(length: usize) -> Self {
        MemMapParams {
            length,
            allocate: true,
            ..Default::default()
        }
    }
    /// Register an existing buffer.
    pub fn register(ptr: *mut u8, length: usize) -> Self {
        MemMapParams {
            address: Some(ptr),
            length,
            ..Default::default()
        }
    }
    /// Share existing pages in place: `[ptr, ptr + length)`, page-aligned host memory that
    /// this process owns privately (a program's data and bss, say), is moved into a shared
    /// segment at the same addresses with the same contents, and registered. Same-host
    /// peers then reach it with loads, stores and CPU atomics, as allocated memory, where
    /// registered memory would be reached only by CMA or through this process. Unmapping
    /// the region leaves the pages where they are, shared with no one.
    ///
    /// The move copies the pages and then maps the segment over them: a store another
    /// thread makes to them meanwhile is lost, so call it before such threads start.
    pub fn share_in_place(ptr: *mut u8, length: usize) -> Self {
        MemMapParams {
            address: Some(ptr),
            length,
            in_place: true,
            ..Default::default()
        }
    }
    /// Set the memory type.
    pub fn memory_type(mut self, t: MemoryType) -> Self {
        self.memory_type = t;
        self
    }
    /// Set the remote rights.
    pub fn access(mut self, a: u16) -> Self {
        self.access = a;
        self
    }
}

/// A mapped region. Unmapped on drop; every remote key made from it stops working.
pub struct Memory {
    reg: Arc<MemRegistry>,
    id: u64,
    ptr: *mut u8,
    len: usize,
    mem_type: MemoryType,
}

// SAFETY: the region is plain memory shared through raw pointers and atomics.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

static NIC_FALLBACK: Once = Once::new();

impl Context {
    /// Register or allocate memory.
    pub fn mem_map(&self, p: MemMapParams) -> Result<Memory> {
        let reg = self.inner.mem.clone();
        let mut mem_type = p.memory_type;
        let mut driver = None;
        match mem_type {
            MemoryType::Cuda => driver = Some(cuda::load(&self.inner.cfg.cuda_lib)?),
            MemoryType::Nic => {
                NIC_FALLBACK.call_once(|| tracing::info!("memory type nic: no RDMA device with on-chip memory here; using host memory"));
                mem_type = MemoryType::Host;
            }
            MemoryType::Host => {}
        }
        if p.access & !access::ALL != 0 {
            return Err(Error::new(Status::InvalidParam, "unknown access bits"));
        }
        if p.in_place {
            let ptr = p.address.ok_or_else(|| {
                Error::new(Status::InvalidParam, "sharing in place needs an address")
            })?;
            if p.allocate || mem_type != MemoryType::Host {
                return Err(Error::new(
                    Status::InvalidParam,
                    "only existing host memory can be shared in place",
                ));
            }
            let id = reg.share_in_place(ptr, p.length, p.access)?;
            return Ok(Memory {
                reg,
                id,
                ptr,
                len: p.length,
                mem_type,
            });
        }
        if p.allocate {
            if p.address.is_some() {
                return Err(Error::new(
                    Status::InvalidParam,
                    "give an address to register, or allocate, not both",
                ));
            }
            let (id, _, ptr) = match driver {
                Some(d) => {
                    let (id, secret, ptr) = reg.allocate_device(d, p.length, p.access)?;
                    offer_ipc(d, &reg, id, ptr as usize);
                    (id, secret, ptr)
                }
                None => reg.allocate(p.length, p.access, mem_type)?,
            };
            return Ok(Memory {
                reg,
                id,
                ptr,
                len: p.length,
                mem_type,
            });
        }
        let ptr = p.address.ok_or_else(|| {
            Error::new(
                Status::InvalidParam,
                "no address to register (or set allocate)",
            )
        })?;
        if ptr.is_null() && p.length > 0 {
            return Err(Error::new(Status::InvalidParam, "null address"));
        }
        match driver {
            Some(d) if p.length > 0 => check_device_range(d, ptr as usize, p.length)?,
            // Device memory registered as host memory is found out, as UCX does.
            None if p.length > 0 && cuda::is_device(ptr as usize) => {
                tracing::debug!("mem_map: {ptr:p} is CUDA device memory");
                mem_type = MemoryType::Cuda;
            }
            _ => {}
        }
        let (id, _) = reg.add(ptr as u64, p.length as u64, p.access, mem_type, None, None)?;
        if mem_type == MemoryType::Cuda && p.length > 0 {
            if let Some(d) = cuda::loaded() {
                offer_ipc(d, &reg, id, ptr as usize);
            }
        }
        Ok(Memory {
            reg,
            id,
            ptr,
            len: p.length,
            mem_type,
        })
    }
}

/// Give device region `id` (at `addr`) the IPC handle of its allocation, so a same-host
/// peer copies with its own driver; without one, peers go through this process.
fn offer_ipc(d: &'static cuda::Driver, reg: &MemRegistry, id: u64, addr: usize) {
    let handle = d
        .allocation_of(addr)
        .and_then(|(base, _)| d.ipc_handle(base).map(|h| (base, h)));
    match handle {
        Ok((base, handle)) => reg.set_ipc(
            id,
            crate::wire::rkey::DeviceHandle {
                handle,
                alloc_base: base as u64,
            },
        ),
        Err(e) => tracing::debug!("no IPC handle for device memory at {addr:#x}: {e}"),
    }
}

/// A buffer registered as CUDA memory must lie inside one device allocation.
fn check_device_range(d: &cuda::Driver, addr: usize, len: usize) -> Result<()> {
    if !d.is_device(addr) {
        return Err(Error::msg(
            Status::InvalidParam,
            format!("{addr:#x} is not CUDA device memory"),
        ));
    }
    let (base, size) = d.allocation_of(addr)?;
    if addr.checked_add(len).is_none_or(|end| end > base + size) {
        return Err(Error::msg(
            Status::OutOfRange,
            format!(
                "[{addr:#x}, +{len}) runs past the end of its device allocation [{base:#x}, +{size})"
            ),
        ));
    }
    Ok(())
}

/// What `Memory::query` tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemAttr {
    /// Start address.
    pub address: usize,
    /// Length.
    pub length: usize,
    /// Memory type actually given.
    pub memory_type: MemoryType,
}

/// Comparison for signal waits (OpenSHMEM's `SHMEM_CMP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// ==
    Eq,
    /// !=
    Ne,
    /// >
    Gt,
    /// >=
    Ge,
    /// <
    Lt,
    /// <=
    Le,
}

impl Cmp {
    fn holds(self, a: u64, b: u64) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
        }
    }
}

impl Memory {
    /// Address, length and the memory type actually given.
    pub fn query(&self) -> MemAttr {
        MemAttr {
            address: self.ptr as usize,
            length: self.len,
            memory_type: self.mem_type,
        }
    }
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes to send to peers so they can reach this region.
    pub fn pack_rkey(&self) -> Result<Vec<u8>> {
        self.reg.pack(self.id)
    }
    /// Unmap now (also done on drop).
    pub fn unmap(self) {}

    /// Copy `data` into the region at `offset` (through the CUDA driver for device memory).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let p = self.range(offset, data.len())?;
        // SAFETY: inside the region, which outlives the call.
        unsafe {
            copy_local(
                &Buf::One((data.as_ptr() as usize, data.len())),
                p,
                Dir::ToRegion,
            )
        }
    }

    /// Copy bytes of the region at `offset` into `out` (through the CUDA driver for device
    /// memory).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let p = self.range(offset, out.len())?;
        // SAFETY: inside the region, which outlives the call; `out` is writable.
        unsafe {
            copy_local(
                &Buf::One((out.as_mut_ptr() as usize, out.len())),
                p,
                Dir::FromRegion,
            )
        }
    }

    fn range(&self, offset: usize, len: usize) -> Result<Place> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::msg(
                Status::OutOfRange,
                format!(
                    "[{offset}, +{len}) is outside the region's {} bytes",
                    self.len
                ),
            ));
        }
        Ok(Place {
            ptr: self.ptr.wrapping_add(offset),
            device: self.mem_type == MemoryType::Cuda,
        })
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64> {
        if self.mem_type == MemoryType::Cuda {
            return Err(Error::new(
                Status::Unsupported,
                "signal words need host memory; this region is CUDA device memory",
            ));
        }
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|e| e > self.len) {
            return Err(Error::msg(
                Status::OutOfRange,
                format!(
                    "signal offset {offset} is not an aligned word inside {} bytes",
                    self.len
                ),
            ));
        }
        // SAFETY: inside the region, aligned; the region outlives the borrow.
        Ok(unsafe { AtomicU64::from_ptr(self.ptr.add(offset) as *mut u64) })
    }

    /// Read a signal word (OpenSHMEM `shmem_signal_fetch`).
    pub fn signal_fetch(&self, offset: usize) -> Result<u64> {
        Ok(self.word(offset)?.load(Ordering::Acquire))
    }

    /// Wait until the signal word at `offset` satisfies `cmp value`, progressing `worker`
    /// meanwhile; returns the value that met the condition.
    ///
    /// Without `sleep` it spins. With `sleep` it spins briefly, then sleeps on the worker's
    /// event fd. A peer's put-with-signal through an endpoint connected to this worker
    /// wakes it at once, whichever way it comes: as a frame (tcp, shared-memory frames) or
    /// written straight into the region by a same-host peer, which then rings the worker's
    /// shared-memory link. A word written any other way (another thread, a peer's atomic,
    /// an endpoint connected to another worker) wakes no one, so each sleep lasts at most
    /// `COURIER_SIGNAL_NAP` (1 ms by default) before the word is looked at again. A context
    /// without the wakeup feature cannot sleep on the fd: then `sleep` spins, yielding the
    /// CPU between checks.
    pub fn signal_wait_until(
        &self,
        worker: &Worker,
        offset: usize,
        cmp: Cmp,
        value: u64,
        sleep: bool,
    ) -> Result<u64> {
        self.signal_wait_until_timeout(Some(worker), offset, cmp, value, sleep, None)
    }

    /// `signal_wait_until` with a time limit (`Timeout` when it passes; `None`: none) and
    /// an optional worker (`None`: only watch the word, for a peer that writes it directly
    /// or a worker that another thread progresses; `sleep` then yields the CPU between
    /// checks).
    pub fn signal_wait_until_timeout(
        &self,
        worker: Option<&Worker>,
        offset: usize,
        cmp: Cmp,
        value: u64,
        sleep: bool,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let w = self.word(offset)?;
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // Whom to sleep on: without the wakeup feature `arm` is refused, and the wait
        // yields instead.
        let sleeper = worker.filter(|wk| sleep && wk.context().features().wakeup);
        let mut spin_since: Option<Instant> = None;
        let mut idle = 0u32;
        loop {
            // Look at the word several times per progress call: a same-host peer writes
            // it directly, and an idle progress costs more than a load, so checking only
            // between progress calls would notice the change late.
            for _ in 0..SIGNAL_LOADS_PER_PROGRESS {
                let v = w.load(Ordering::Acquire);
                if cmp.holds(v, value) {
                    return Ok(v);
                }
                // Spaced looks: the writer's store lands sooner (see `poll_gap`).
                poll_gap();
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::new(
                    Status::Timeout,
                    "signal word did not meet the condition in time",
                ));
            }
            if worker.is_some_and(|wk| wk.progress() > 0) {
                continue;
            }
            idle = idle.wrapping_add(1);
            if !sleep {
                if worker.is_none() && idle.is_multiple_of(SIGNAL_YIELD_EVERY) {
                    // Only watching: the writer may be a thread that needs this CPU.
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            // A short spin first (once per wait, not after every sleep): a signal that
            // comes soon is seen without a system call.
            let now = Instant::now();
            if now.duration_since(*spin_since.get_or_insert(now)) < SIGNAL_SPIN {
                std::hint::spin_loop();
                continue;
            }
            let Some(wk) = sleeper else {
                std::thread::yield_now();
                continue;
            };
            // Armed, the worker's fd wakes on any frame from now on, so a signal carried
            // by a frame cannot slip in between the look below and the sleep. `false`:
            // something is already waiting; progress handles it.
            if !wk.arm()? {
                continue;
            }
            let v = w.load(Ordering::Acquire);
            if cmp.holds(v, value) {
                return Ok(v);
            }
            // `inf` (Duration::MAX) sleeps until something wakes the worker.
            let nap = wk.context().inner.cfg.signal_nap;
            let nap = match deadline {
                Some(d) => Some(nap.min(d.saturating_duration_since(Instant::now()))),
                None => (nap != Duration::MAX).then_some(nap),
            };
            wk.sleep_armed(nap)?;
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        self.reg.remove(self.id);
    }
}

/// Update a signal word written directly, and ring `bell` (the owner's worker) if it may
/// sleep: a sleeping `signal_wait_until` on it then returns at once, not at its next look.
/// Where the owner cannot sleep, or nobody is to be woken (`None`: this context's own
/// memory), the update is a plain one, with no ordering cost.
///
/// # Safety
/// `sig` must be an aligned, valid, host-memory word.
#[inline]
unsafe fn signal_with(bell: Option<&Doorbell>, sig: *mut u8, op: SignalOp, value: u64) {
    match bell.filter(|b| b.may_sleep()) {
        Some(b) => {
            // SAFETY: forwarded contract.
            unsafe { do_signal_sc(sig, op, value) };
            b.ring();
        }
        // SAFETY: forwarded contract.
        None => unsafe { do_signal(sig, op, value) },
    }
}

/// Loads of a signal word between two progress calls in `signal_wait_until`.
const SIGNAL_LOADS_PER_PROGRESS: usize = 16;
/// How long a sleeping `signal_wait_until` spins before its first sleep.
const SIGNAL_SPIN: Duration = Duration::from_micros(50);
/// A spinning wait without a worker yields the CPU once per this many idle rounds.
const SIGNAL_YIELD_EVERY: u32 = 1024;

enum Path {
    /// The region belongs to this very context.
    Local(Arc<MemRegistry>),
    /// Same host: the owner's key table is mapped here; allocated regions are mapped too.
    Direct {
        peer: Arc<PeerMaps>,
        seg: Option<Arc<Mapping>>,
        cma: bool,
    },
    /// Same host, device memory: the owner's allocation opened here through its IPC
    /// handle (copies with this process's driver), checked against the owner's key table.
    DeviceIpc {
        peer: Arc<PeerMaps>,
        map: Arc<cuda::IpcMapping>,
        alloc_base: u64,
    },
    /// Through the owner's progress.
    Remote,
}

/// What the direct paths need of a same-host peer's host region mapped here, taken from
/// the owner's record when the key is unpacked and checked against the key then. For one
/// region id the record's other fields never change, so an access re-reads only its first
/// two words (`valid`, `region`), which change when the owner unmaps the region or gives
/// the slot to another: two loads from one line at a fixed address, where a full check
/// reads seven words, and none of them waits on another.
struct DirectView {
    /// Address of the owner's record's `valid` word (its `region` word follows), in the
    /// owner's key table that the key's `Path::Direct` keeps mapped here.
    head: usize,
    region: u64,
    /// The region's start in the owner's process, and its address here (in the segment
    /// mapping that `Path::Direct` holds).
    base: u64,
    ptr: usize,
    /// Bytes from `base` that the key, the record and our mapping all cover.
    span: u64,
    /// Rights that both the key and the record grant.
    access: u16,
    /// The endpoint's "failed or closed" flag (`RemoteKey::gone`, which keeps it alive).
    /// (An address, as `head` and `ptr` are, so that keys stay `Send` and `Sync`.)
    gone: usize,
}

impl DirectView {
    /// The view of `key`'s region through `m`, if the owner's record describes it as the
    /// key does (a live host region at the key's base, with the key's secret).
    fn new(peer: &PeerMaps, m: &Mapping, key: &RkeyRepr) -> Option<DirectView> {
        let rec = peer.record(key.region)?;
        let host = MemoryType::Host.code() as u64;
        let matches = rec.valid == 1
            && rec.region == key.region
            && rec.secret == key.secret
            && rec.base == key.base
            && rec.mem_type == host
            && key.mem_type as u64 == host;
        if !matches {
            return None;
        }
        Some(DirectView {
            head: peer.record_head(key.region)? as usize,
            region: key.region,
            base: key.base,
            ptr: m.ptr as usize,
            span: key.length.min(rec.len).min(m.len as u64),
            access: key.access & (rec.access & 0xffff) as u16,
            gone: 0,
        })
    }
}

/// A peer's remote key, unpacked on an endpoint.
pub struct RemoteKey {
    key: RkeyRepr,
    path: Path,
    /// Set for a same-host peer's host region mapped here (`Path::Direct` with a segment).
    view: Option<DirectView>,
    ep: Endpoint,
    /// The endpoint's "failed or closed" flag, for keys with a path that bypasses the
    /// worker (`EpSlot::gone`).
    gone: Option<Arc<AtomicBool>>,
    /// Wakes the owner's worker after a direct signal update: found on the endpoint's
    /// shared-memory link once it has one (it may still run on tcp when the key is
    /// unpacked).
    bell: OnceLock<Doorbell>,
}

impl RemoteKey {
    /// The region's start and length in the owner's process.
    pub fn bounds(&self) -> (u64, u64) {
        (self.key.base, self.key.length)
    }
    /// A pointer valid in this process for `addr` in the owner's process, when the region
    /// is mapped here (same host, allocated memory, or the same context) and `addr` lies
    /// in it; `None` otherwise (`local_ptr` says why).
    pub fn direct_ptr(&self, addr: u64) -> Option<*mut u8> {
        self.local_ptr(addr).ok()
    }

    /// `direct_ptr` with the reason when there is none: `addr` outside the key's region
    /// (`OutOfRange`), a region its owner no longer maps or a key that does not match its
    /// record (`InvalidKey`), or a region not mapped in this process (`Unsupported`).
    pub fn local_ptr(&self, addr: u64) -> Result<*mut u8> {
        match self.place(addr, 1, 0)? {
            Some(p) => Ok(p.ptr),
            None => Err(Error::new(
                Status::Unsupported,
                "the region is not mapped in this process",
            )),
        }
    }
    /// How operations reach the region: `local`, `direct`, `cma`, `cuda_ipc` or `remote`.
    pub fn path(&self) -> &'static str {
        match &self.path {
            Path::Local(_) => "local",
            Path::DeviceIpc { .. } => "cuda_ipc",
            Path::Direct { seg: Some(_), .. } => "direct",
            Path::Direct { cma: true, .. } => "cma",
            _ => "remote",
        }
    }

    /// The local address of `[addr, addr + len)` when the region is mapped here and the
    /// owner's record allows `need` on that range for this key, used on `ep`; `None` for
    /// anything else (other paths, refusals), which the general path then handles and
    /// reports. The fast path of small puts, gets, atomics and puts-with-signal: the same
    /// checks as `resolve`, against the record as it was at unpack (`DirectView`) and its
    /// two words that say whether it still is.
    #[inline(always)]
    fn direct(&self, ep: &Endpoint, addr: u64, len: u64, need: u16) -> Option<*mut u8> {
        let v = self.view.as_ref()?;
        let off = addr.wrapping_sub(v.base);
        if v.access & need != need
            || off > v.span
            || len > v.span - off
            || !self.ep.same_as(ep)
            // SAFETY: set from `self.gone`, which keeps the flag alive.
            || unsafe { (*(v.gone as *const AtomicBool)).load(Ordering::Relaxed) }
        {
            return None;
        }
        let head = v.head as *const AtomicU64;
        // SAFETY: `head` and the word after it lie in the owner's key table, which `path`
        // keeps mapped as long as this key lives; the table is only read atomically.
        let (valid, region) = unsafe {
            (
                (*head).load(Ordering::Acquire),
                (*head.add(1)).load(Ordering::Relaxed),
            )
        };
        (valid == 1 && region == v.region).then(|| (v.ptr as *mut u8).wrapping_add(off as usize))
    }

    /// The doorbell of the owner's worker behind this key's endpoint, once that endpoint
    /// runs on shared memory.
    #[inline]
    fn doorbell(&self) -> Option<&Doorbell> {
        match self.bell.get() {
            Some(b) => Some(b),
            None => self.doorbell_lookup(),
        }
    }

    /// `doorbell` before it is known: taken from the endpoint's link (under the worker's
    /// lock) once that is shared memory.
    #[cold]
    #[inline(never)]
    fn doorbell_lookup(&self) -> Option<&Doorbell> {
        if !matches!(self.path, Path::Direct { .. }) {
            return None;
        }
        let b = self
            .ep
            .with_state(|st, e| Ok(st.ep(e).and_then(|ep| ep.tx.as_ref()?.doorbell())))
            .ok()
            .flatten()?;
        Some(self.bell.get_or_init(|| b))
    }

    /// Whether a signal word behind this key may be updated directly now: in this
    /// context's own memory always; in a same-host peer's once the endpoint runs on shared
    /// memory, whose link wakes the owner's worker after the update. Until then (the
    /// endpoint still on the tcp link it started on) the update goes through the owner,
    /// as a frame that wakes it.
    fn signal_direct_ready(&self) -> bool {
        !matches!(self.path, Path::Direct { .. }) || self.doorbell().is_some()
    }

    /// Update the signal word at `sig` (mapped here through this key) for a direct
    /// put-with-signal, and wake the owner's worker if it sleeps there (`signal_with`).
    ///
    /// # Safety
    /// `sig` must be an aligned, valid, host-memory word.
    unsafe fn signal_direct(&self, sig: *mut u8, op: SignalOp, value: u64) {
        // SAFETY: forwarded contract.
        unsafe { signal_with(self.doorbell(), sig, op, value) }
    }

    /// Whether the key itself grants `need` on `[addr, addr + len)`: checked on every path
    /// before anything is touched or sent, so an operation the key does not cover is refused
    /// whole, at once (the owner's record is checked as well, by this process where it can
    /// read it, else by the owner).
    #[inline]
    fn claims(&self, addr: u64, len: u64, need: u16) -> Result<()> {
        let k = &self.key;
        let inside = addr >= k.base
            && addr
                .checked_add(len)
                .is_some_and(|end| k.base.checked_add(k.length).is_some_and(|lim| end <= lim));
        if inside && k.access & need == need {
            return Ok(());
        }
        Err(self.claim_refusal(addr, len, need))
    }

    #[cold]
    #[inline(never)]
    fn claim_refusal(&self, addr: u64, len: u64, need: u16) -> Error {
        let k = &self.key;
        if k.access & need != need {
            let what = match need {
                access::READ => "remote read",
                access::WRITE => "remote write",
                _ => "remote atomic",
            };
            return Error::msg(
                Status::AccessDenied,
                format!("the key of region {:#x} grants no {what} access", k.region),
            );
        }
        Error::msg(
            Status::OutOfRange,
            format!(
                "access [{addr:#x}, +{len}) outside the key's region [{:#x}, +{})",
                k.base, k.length
            ),
        )
    }

    /// Check an access against the owner's record; where it lands if mapped here.
    fn resolve(&self, addr: u64, len: u64, need: u16) -> Result<Option<Place>> {
        let place = self.place(addr, len, need)?;
        if need == access::ATOMIC && place.is_some_and(|p| p.device) {
            return Err(Error::new(
                Status::Unsupported,
                "atomics on CUDA device memory are not supported (the CPU cannot reach it)",
            ));
        }
        Ok(place)
    }

    fn place(&self, addr: u64, len: u64, need: u16) -> Result<Option<Place>> {
        self.claims(addr, len, need)?;
        let direct_record = |peer: &PeerMaps| {
            let rec = peer.record(self.key.region).ok_or_else(|| {
                Error::new(Status::InvalidKey, "region id out of range (forged key)")
            })?;
            check(&rec, self.key.region, self.key.secret, addr, len, need)?;
            if rec.mem_type != self.key.mem_type as u64 {
                // Honest keys say what their memory is: device memory goes through its
                // IPC handle or its owner, host memory never through a device handle.
                return Err(Error::new(
                    Status::InvalidKey,
                    "the key's memory type is not the owner's",
                ));
            }
            Ok(rec)
        };
        match &self.path {
            Path::Local(reg) => reg
                .lookup_place(self.key.region, self.key.secret, addr, len, need)
                .map(Some),
            Path::Direct { peer, seg, .. } => {
                let rec = direct_record(peer)?;
                // The owner's record said where the region is; the range must also lie in
                // what we mapped of its segment (the key's length), whatever the record says.
                Ok(seg.as_ref().and_then(|m| {
                    let off = addr - rec.base;
                    let inside = rec.base == self.key.base
                        && off.checked_add(len).is_some_and(|end| end <= m.len as u64);
                    inside.then(|| Place {
                        ptr: m.ptr.wrapping_add(off as usize),
                        device: false,
                    })
                }))
            }
            Path::DeviceIpc {
                peer,
                map,
                alloc_base,
            } => {
                let rec = direct_record(peer)?;
                if rec.base != self.key.base {
                    return Ok(None);
                }
                // Inside the opened allocation, whatever the key claims about it
                // (`addr >= rec.base >= alloc_base`: checked above and at unpack).
                let off = addr - alloc_base;
                if off.checked_add(len).is_none_or(|end| end > map.len as u64) {
                    return Ok(None);
                }
                Ok(Some(Place {
                    ptr: (map.ptr + off as usize) as *mut u8,
                    device: true,
                }))
            }
            Path::Remote => Ok(None),
        }
    }
}

/// Which way a one-sided copy goes.
#[derive(Clone, Copy)]
enum Dir {
    /// From the caller's buffer into the region (put).
    ToRegion,
    /// From the region into the caller's buffer (get).
    FromRegion,
}

fn done(len: usize) -> Started {
    Started::Done(Info {
        len,
        ..Info::default()
    })
}

/// Copy between the caller's segments and a region mapped here, in order: plain copies
/// between host memory, the CUDA driver's copies wherever either side is device memory.
///
/// # Safety
/// `region` must be valid for `buf.len()` bytes and the segments for their lengths.
#[inline]
unsafe fn copy_local(buf: &Buf, region: Place, dir: Dir) -> Result<()> {
    if let Buf::One((a, l)) = *buf {
        if !region.device && !cuda::is_device(a) {
            // The one-segment case without a memcpy call: a peer may be polling the
            // region, and a word-sized put lands as one store.
            // SAFETY: per the function's contract.
            unsafe {
                match dir {
                    Dir::ToRegion => copy_small(a as *const u8, region.ptr, l),
                    Dir::FromRegion => copy_small(region.ptr, a as *mut u8, l),
                }
            }
            return Ok(());
        }
    }
    let mut off = 0;
    for &(a, l) in buf.segs() {
        if l == 0 {
            continue;
        }
        let r = region.ptr.wrapping_add(off);
        let (src, dst) = match dir {
            Dir::ToRegion => ((a, cuda::is_device(a)), (r as usize, region.device)),
            Dir::FromRegion => ((r as usize, region.device), (a, cuda::is_device(a))),
        };
        // SAFETY: per the function's contract.
        unsafe { stage::copy(dst, src, l)? };
        off += l;
    }
    Ok(())
}

/// Copy between the caller's segments and process `pid`'s memory at `raddr` with CMA.
///
/// # Safety
/// The segments must be valid for their lengths (writable for `FromRegion`).
unsafe fn copy_cma(pid: u32, buf: &Buf, raddr: u64, dir: Dir) -> Result<()> {
    let mut off = 0u64;
    for &(a, l) in buf.segs() {
        match dir {
            Dir::ToRegion => crate::transport::shm::cma_write(pid, a, l, raddr + off)?,
            // SAFETY: per the function's contract.
            Dir::FromRegion => unsafe { crate::transport::shm::cma_read(pid, a, l, raddr + off)? },
        }
        off += l as u64;
    }
    Ok(())
}

fn rref(k: &RemoteKey, addr: u64) -> RemoteRef {
    RemoteRef {
        region: k.key.region,
        secret: k.key.secret,
        addr,
    }
}

impl Endpoint {
    /// Unpack a peer's remote key for use on this endpoint.
    pub fn rkey_unpack(&self, bytes: &[u8]) -> Result<RemoteKey> {
        let key =
            RkeyRepr::unpack(bytes).map_err(|e| Error::msg(Status::InvalidKey, e.to_string()))?;
        let reg = self.worker().context().inner.mem.clone();
        let same_host = key.host_id == host_id();
        let cfg = self.worker().context().inner.cfg.clone();
        // A peer on this host is reached directly whenever shared memory may be used, also
        // while the endpoint still runs on the tcp link it started on (its shm upgrade may
        // land after this key is unpacked). `onesided` describes these choices for tools.
        let reach = Reach::find(
            self.link_caps().as_ref(),
            key.pid == std::process::id() && key.ctx_id == reg.ctx_id,
            same_host,
            cfg.tls.allows("shm"),
            cfg.shm_cma,
            || crate::transport::shm::cma_probe(key.pid, key.base),
        );
        let path = if reach == Reach::SameContext {
            Path::Local(reg)
        } else if reach != Reach::Elsewhere && key.mem_type == MemoryType::Cuda.code() {
            // Device memory: opened here through its IPC handle (used as it is when another
            // context of this process owns it), or through the owner.
            let open = || -> Result<Path> {
                let ipc = key.ipc.ok_or_else(|| {
                    Error::new(Status::Unsupported, "the key carries no IPC handle")
                })?;
                let driver = cuda::load(&cfg.cuda_lib)?;
                let peer = reg.peer(&key)?;
                let own = key.pid == std::process::id();
                let map = peer.device_region(driver, key.region, &ipc, own)?;
                Ok(Path::DeviceIpc {
                    peer,
                    map,
                    alloc_base: ipc.alloc_base,
                })
            };
            open().unwrap_or_else(|e| {
                tracing::info!(
                    "device memory of pid {}: {e}; operations go through the owner",
                    key.pid
                );
                Path::Remote
            })
        } else if let Reach::SameHost { cma } = reach {
            match reg.peer(&key) {
                Ok(peer) => {
                    let seg = if key.region_fd >= 0 {
                        match peer.segment(key.region, key.region_fd, key.length as usize) {
                            Ok(m) => Some(m),
                            // A key naming another of the owner's descriptors is a lie.
                            Err(SegmentRefusal::Forged(e)) => return Err(e),
                            // Stale, or not to be mapped here: the record decides at each
                            // operation, which takes another way.
                            Err(SegmentRefusal::Unavailable(e)) => {
                                tracing::debug!(
                                    "segment of region {:#x} of pid {}: {e}",
                                    key.region,
                                    key.pid
                                );
                                None
                            }
                        }
                    } else {
                        None
                    };
                    Path::Direct { peer, seg, cma }
                }
                Err(e) => {
                    tracing::info!(
                        "remote key of pid {}: {e}; operations go through the owner",
                        key.pid
                    );
                    Path::Remote
                }
            }
        } else {
            Path::Remote
        };
        let direct = match &path {
            Path::Local(_) | Path::DeviceIpc { .. } => true,
            Path::Direct { seg, cma, .. } => seg.is_some() || *cma,
            Path::Remote => false,
        };
        let gone = if direct {
            // A fence on this endpoint must now order operations through the owner.
            self.with_state(|st, e| {
                Ok(st.ep(e).map(|ep| {
                    ep.rma_direct_keys = true;
                    ep.gone.clone()
                }))
            })?
        } else {
            None
        };
        let view = match (&path, &gone) {
            (
                Path::Direct {
                    peer, seg: Some(m), ..
                },
                Some(g),
            ) => DirectView::new(peer, m, &key).map(|v| DirectView {
                gone: Arc::as_ptr(g) as usize,
                ..v
            }),
            _ => None,
        };
        Ok(RemoteKey {
            key,
            path,
            view,
            ep: self.clone(),
            gone,
            bell: OnceLock::new(),
        })
    }

    fn check_key(&self, k: &RemoteKey) -> Result<()> {
        if !k.ep.same_as(self) {
            return Err(Error::new(
                Status::InvalidParam,
                "remote key was unpacked on another endpoint",
            ));
        }
        if k.gone.as_ref().is_some_and(|g| g.load(Ordering::Acquire)) {
            // Paths that bypass the worker must not go on writing into a failed peer's
            // memory as if nothing happened: the endpoint's error, as its sends get.
            return Err(self
                .with_state(|st, e| Ok(st.ep(e).and_then(|ep| ep.dead_error())))?
                .unwrap_or_else(|| Error::new(Status::EndpointClosed, "endpoint was closed")));
        }
        Ok(())
    }

    /// Write `data` at `raddr` in the peer's region. Completes when `data` may be reused:
    /// at once when the region is mapped here or reached by CMA (the data is then in
    /// place); when the owner carries the put out (tcp, or registered memory reached
    /// without CMA), once the data has left this process. `flush` says when every earlier
    /// put is in place, and reports one the owner refused.
    pub fn put<'a>(&self, data: &'a [u8], raddr: u64, key: &RemoteKey) -> Result<Request<'a>> {
        // SAFETY: the request borrows `data` for its lifetime.
        let s = unsafe {
            self.put_raw(
                Buf::One((data.as_ptr() as usize, data.len())),
                raddr,
                key,
                Callback::None,
            )?
        };
        Ok(Request::new(self.worker(), s))
    }

    /// Read into `buf` from `raddr` in the peer's region.
    pub fn get<'a>(&self, buf: &'a mut [u8], raddr: u64, key: &RemoteKey) -> Result<Request<'a>> {
        // SAFETY: the request borrows `buf` for its lifetime.
        let s = unsafe {
            self.get_raw(
                Buf::One((buf.as_mut_ptr() as usize, buf.len())),
                raddr,
                key,
                Callback::None,
            )?
        };
        Ok(Request::new(self.worker(), s))
    }

    /// Write the buffers of `iov`, one after another, starting at `raddr`.
    pub fn put_iov<'a>(
        &self,
        iov: &[&'a [u8]],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'a>> {
        let segs = iov.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        // SAFETY: the request borrows the buffers for its lifetime.
        let s = unsafe { self.put_raw(Buf::Many(segs), raddr, key, Callback::None)? };
        Ok(Request::new(self.worker(), s))
    }

    /// Read consecutive bytes from `raddr` into the buffers of `iov`, filling each in turn.
    pub fn get_iov<'a>(
        &self,
        iov: &mut [&'a mut [u8]],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'a>> {
        let segs = iov
            .iter_mut()
            .map(|b| (b.as_mut_ptr() as usize, b.len()))
            .collect();
        // SAFETY: the request borrows the buffers for its lifetime.
        let s = unsafe { self.get_raw(Buf::Many(segs), raddr, key, Callback::None)? };
        Ok(Request::new(self.worker(), s))
    }

    /// Put with a raw buffer and a callback.
    ///
    /// # Safety
    /// `data` must stay valid until completion.
    #[inline(always)]
    pub unsafe fn put_raw(
        &self,
        data: Buf,
        raddr: u64,
        key: &RemoteKey,
        cb: Callback,
    ) -> Result<Started> {
        if let Some(((a, l), dst)) = self.direct_one(&data, raddr, key, access::WRITE) {
            // SAFETY: the owner's record and our mapping cover [raddr, raddr + l); the
            // source is the caller's host buffer.
            unsafe { copy_small(a as *const u8, dst, l) };
            return Ok(done(l));
        }
        // SAFETY: forwarded contract.
        unsafe { self.put_general(data, raddr, key, cb) }
    }

    /// The fast path of puts and gets: the caller's buffer, when it is one segment of host
    /// memory, and where `[raddr, raddr + its length)` lies here (`RemoteKey::direct`).
    #[inline(always)]
    fn direct_one(
        &self,
        buf: &Buf,
        raddr: u64,
        key: &RemoteKey,
        need: u16,
    ) -> Option<((usize, usize), *mut u8)> {
        let &Buf::One((a, l)) = buf else { return None };
        if cuda::is_device(a) {
            return None;
        }
        Some(((a, l), key.direct(self, raddr, l as u64, need)?))
    }

    /// `put_raw` for every case but a contiguous host-memory put into a region mapped here.
    ///
    /// # Safety
    /// As `put_raw`.
    #[inline(never)]
    unsafe fn put_general(
        &self,
        data: Buf,
        raddr: u64,
        key: &RemoteKey,
        cb: Callback,
    ) -> Result<Started> {
        self.check_key(key)?;
        let len = data.len();
        if let Some(dst) = key.resolve(raddr, len as u64, access::WRITE)? {
            // SAFETY: the owner's record covers [raddr, raddr+len); source is the caller's.
            unsafe { copy_local(&data, dst, Dir::ToRegion)? };
            return Ok(done(len));
        }
        // Neither CMA nor a link can read device memory: a host copy goes instead, kept
        // with the request when the owner's path has one.
        let host = stage::gather(&data)?;
        let src = match &host {
            Some(h) => Buf::One((h.as_ptr() as usize, h.len())),
            None => data,
        };
        if matches!(key.path, Path::Direct { cma: true, .. }) {
            // SAFETY: the segments are the caller's buffer (or our host copy).
            unsafe { copy_cma(key.key.pid, &src, raddr, Dir::ToRegion)? };
            return Ok(done(len));
        }
        let target = rref(key, raddr);
        self.with_state(|st, e| match host {
            Some(h) => st.staged_send(h, |st, b| st.rma_put(e, b, target, cb)),
            None => st.rma_put(e, src, target, cb),
        })
    }

    /// Get with a raw buffer and a callback.
    ///
    /// # Safety
    /// `buf` must stay valid until completion.
    #[inline(always)]
    pub unsafe fn get_raw(
        &self,
        buf: Buf,
        raddr: u64,
        key: &RemoteKey,
        cb: Callback,
    ) -> Result<Started> {
        if let Some(((a, l), src)) = self.direct_one(&buf, raddr, key, access::READ) {
            // SAFETY: the owner's record and our mapping cover [raddr, raddr + l); the
            // destination is the caller's writable host buffer.
            unsafe { copy_small(src, a as *mut u8, l) };
            return Ok(done(l));
        }
        // SAFETY: forwarded contract.
        unsafe { self.get_general(buf, raddr, key, cb) }
    }

    /// `get_raw` for every case but a contiguous host-memory get from a region mapped here.
    ///
    /// # Safety
    /// As `get_raw`.
    #[inline(never)]
    unsafe fn get_general(
        &self,
        buf: Buf,
        raddr: u64,
        key: &RemoteKey,
        cb: Callback,
    ) -> Result<Started> {
        self.check_key(key)?;
        let len = buf.len();
        if let Some(src) = key.resolve(raddr, len as u64, access::READ)? {
            // SAFETY: the record covers the source range; destination is the caller's.
            unsafe { copy_local(&buf, src, Dir::FromRegion)? };
            return Ok(done(len));
        }
        let cma = matches!(key.path, Path::Direct { cma: true, .. });
        let (pid, target) = (key.key.pid, rref(key, raddr));
        let get = move |st: &mut State, e: u32, b: Buf| {
            if cma {
                // SAFETY: `b` is the caller's writable buffer (or a host copy of it).
                unsafe { copy_cma(pid, &b, raddr, Dir::FromRegion)? };
                Ok(done(len))
            } else {
                st.rma_get(e, b, target, cb)
            }
        };
        if stage::has_device(&buf) {
            // Into host memory first; the device buffer is written on completion.
            return self.with_state(|st, e| st.staged_recv(buf, |st, b| get(st, e, b)));
        }
        self.with_state(|st, e| get(st, e, buf))
    }

    /// An atomic on a 64-bit (or, with `bits32`, 32-bit) word at `raddr`; the old value is
    /// in the completion's `Info::value`. `compare` is used by `Cswap` only.
    pub fn atomic(
        &self,
        op: AtomicOp,
        value: u64,
        compare: u64,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
    ) -> Result<Request<'static>> {
        let s = self.atomic_raw(op, value, compare, raddr, key, bits32, Callback::None)?;
        Ok(Request::new(self.worker(), s))
    }

    /// Atomic with a callback.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn atomic_raw(
        &self,
        op: AtomicOp,
        value: u64,
        compare: u64,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
        cb: Callback,
    ) -> Result<Started> {
        match self.atomic_target(raddr, key, bits32)? {
            (width, Some(p)) => Ok(Started::Done(Info {
                len: width as usize,
                tag: 0,
                // SAFETY: checked in range and aligned, in host memory (`atomic_target`);
                // shared memory is touched only atomically.
                value: unsafe { do_atomic(p, op, bits32, value, compare) },
            })),
            (_, None) => self.with_state(|st, e| {
                st.rma_atomic(e, op, bits32, value, compare, rref(key, raddr), cb)
            }),
        }
    }

    /// A posted (non-fetching) atomic: `op` with `value` on the 64-bit (or, with `bits32`,
    /// 32-bit) word at `raddr`, returning nothing (`ucp_atomic_post`, OpenSHMEM's
    /// `shmem_atomic_add` and kin). `op` is `Add`, `And`, `Or` or `Xor`; `Swap` and `Cswap`
    /// exist for their old value, so they are refused (`InvalidParam`): use `atomic`.
    ///
    /// On a region mapped here it is carried out before this returns. Otherwise it goes to
    /// the owner, which answers only if it refuses it: `flush` waits until the owner has
    /// carried it out and reports a refusal (`fence` orders it like a put). What the key
    /// itself shows to be wrong (alignment, range, rights) is refused at once, before
    /// anything is sent.
    pub fn atomic_post(
        &self,
        op: AtomicOp,
        value: u64,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
    ) -> Result<()> {
        if matches!(op, AtomicOp::Swap | AtomicOp::Cswap) {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "a posted atomic cannot be {op:?}: it returns no old value (use a fetching atomic)"
                ),
            ));
        }
        match self.atomic_target(raddr, key, bits32)? {
            (_, Some(p)) => {
                // SAFETY: as in `atomic_raw`.
                unsafe { do_atomic(p, op, bits32, value, 0) };
                Ok(())
            }
            (_, None) => {
                self.with_state(|st, e| st.rma_atomic_post(e, op, bits32, value, rref(key, raddr)))
            }
        }
    }

    /// Where an atomic goes: the word's width, and its address when it lies in host memory
    /// mapped here (`None`: through the owner). The usual case, an aligned word of a host
    /// region mapped here that grants atomics (`RemoteKey::direct`), in line; the checks
    /// and their errors out of line.
    #[inline(always)]
    fn atomic_target(
        &self,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
    ) -> Result<(u64, Option<*mut u8>)> {
        let width = if bits32 { 4 } else { 8 };
        if raddr.is_multiple_of(width)
            && let Some(p) = key.direct(self, raddr, width, access::ATOMIC)
        {
            return Ok((width, Some(p)));
        }
        self.atomic_checked(raddr, key, width)
    }

    /// The checks every atomic passes before it is carried out or sent: the key is this
    /// endpoint's, the word aligned, and within what the key (and, where this process can
    /// read it, the owner's record) grants for atomics. Where it is when mapped here.
    #[inline(never)]
    fn atomic_checked(
        &self,
        raddr: u64,
        key: &RemoteKey,
        width: u64,
    ) -> Result<(u64, Option<*mut u8>)> {
        self.check_key(key)?;
        if !raddr.is_multiple_of(width) {
            return Err(Error::msg(
                Status::InvalidParam,
                format!("atomic address {raddr:#x} is not {width}-byte aligned"),
            ));
        }
        // Host memory only: `resolve` refuses atomics on device memory.
        Ok((
            width,
            key.resolve(raddr, width, access::ATOMIC)?.map(|p| p.ptr),
        ))
    }

    /// Write `data` at `raddr` and then update the signal word at `sig_addr` (`Set` or
    /// `Add` `value`) as one operation: whoever sees the signal change sees the data.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal<'a>(
        &self,
        data: &'a [u8],
        raddr: u64,
        key: &RemoteKey,
        sig_addr: u64,
        sig_key: &RemoteKey,
        value: u64,
        op: SignalOp,
    ) -> Result<Request<'a>> {
        // SAFETY: the request borrows `data`.
        let s = unsafe {
            self.put_signal_raw(
                Buf::One((data.as_ptr() as usize, data.len())),
                raddr,
                key,
                sig_addr,
                sig_key,
                value,
                op,
                Callback::None,
            )?
        };
        Ok(Request::new(self.worker(), s))
    }

    /// Put-with-signal with a raw buffer and a callback.
    ///
    /// # Safety
    /// `data` must stay valid until completion.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub unsafe fn put_signal_raw(
        &self,
        data: Buf,
        raddr: u64,
        key: &RemoteKey,
        sig_addr: u64,
        sig_key: &RemoteKey,
        value: u64,
        op: SignalOp,
        cb: Callback,
    ) -> Result<Started> {
        // A same-host peer's region, mapped here, with the endpoint on shared memory (whose
        // link wakes the owner): contiguous host data and the signal written directly.
        if let Buf::One((a, l)) = data
            && sig_addr.is_multiple_of(8)
            && let Some(bell) = sig_key.doorbell()
            && !cuda::is_device(a)
            && let Some((dst, sig)) = self.direct_pair(key, raddr, l as u64, sig_key, sig_addr)
        {
            // SAFETY: both ranges checked against the owner's record and our mapping; the
            // signal word is aligned (the owner's address is, and regions start on pages);
            // the source is the caller's buffer.
            unsafe {
                copy_small(a as *const u8, dst, l);
                fence(Ordering::Release);
                signal_with(Some(bell), sig, op, value);
            }
            return Ok(done(l));
        }
        let sig = SignalTarget {
            addr: sig_addr,
            key: sig_key,
            value,
            op,
        };
        // SAFETY: forwarded contract.
        unsafe { self.put_signal_general(data, raddr, key, sig, cb) }
    }

    /// For the direct put-with-signal: where the data and the signal word are mapped here,
    /// both checked for writing (with one check of the key's view of the owner's record when
    /// both lie in the region of one key, as they usually do).
    #[inline]
    fn direct_pair(
        &self,
        key: &RemoteKey,
        raddr: u64,
        len: u64,
        sig_key: &RemoteKey,
        sig_addr: u64,
    ) -> Option<(*mut u8, *mut u8)> {
        let w = access::WRITE;
        if std::ptr::eq(key, sig_key) {
            // One region, one set of rights: both ranges lie in it exactly when the span
            // from the lower start to the higher end does.
            let lo = raddr.min(sig_addr);
            let hi = raddr.checked_add(len)?.max(sig_addr.checked_add(8)?);
            let at = key.direct(self, lo, hi - lo, w)?;
            Some((
                at.wrapping_add((raddr - lo) as usize),
                at.wrapping_add((sig_addr - lo) as usize),
            ))
        } else {
            Some((
                key.direct(self, raddr, len, w)?,
                sig_key.direct(self, sig_addr, 8, w)?,
            ))
        }
    }

    /// `put_signal_raw` for every case but the direct one.
    ///
    /// # Safety
    /// As `put_signal_raw`.
    #[inline(never)]
    unsafe fn put_signal_general(
        &self,
        data: Buf,
        raddr: u64,
        key: &RemoteKey,
        sig: SignalTarget<'_>,
        cb: Callback,
    ) -> Result<Started> {
        let SignalTarget {
            addr: sig_addr,
            key: sig_key,
            value,
            op,
        } = sig;
        self.check_key(key)?;
        self.check_key(sig_key)?;
        if !sig_addr.is_multiple_of(8) {
            return Err(Error::new(
                Status::InvalidParam,
                "signal address is not 8-byte aligned",
            ));
        }
        let len = data.len();
        let dst = key.resolve(raddr, len as u64, access::WRITE)?;
        let sig = sig_key
            .resolve(sig_addr, 8, access::WRITE)?
            .filter(|s| s.device || sig_key.signal_direct_ready());
        // Unless both are mapped here, the data goes through the owner: a host copy of
        // device memory, then.
        let host = match (dst, sig) {
            (Some(_), Some(_)) => None,
            _ => stage::gather(&data)?,
        };
        let data = match &host {
            Some(h) => Buf::One((h.as_ptr() as usize, h.len())),
            None => data,
        };
        match (dst, sig) {
            (_, Some(sig)) if sig.device => Err(Error::new(
                Status::Unsupported,
                "the signal word is in CUDA device memory; signal words need host memory",
            )),
            (Some(dst), Some(sig)) => {
                // SAFETY: both ranges checked against the owner's records; a device copy
                // has finished when it returns.
                unsafe { copy_local(&data, dst, Dir::ToRegion)? };
                fence(Ordering::Release);
                // SAFETY: checked, aligned, host memory.
                unsafe { sig_key.signal_direct(sig.ptr, op, value) };
                Ok(done(len))
            }
            _ => {
                let (t, s) = (rref(key, raddr), rref(sig_key, sig_addr));
                self.with_state(|st, e| match host {
                    Some(h) => {
                        st.staged_send(h, |st, b| st.rma_put_signal(e, b, t, s, op, value, cb))
                    }
                    None => st.rma_put_signal(e, data, t, s, op, value, cb),
                })
            }
        }
    }

    /// Order: operations issued after the fence are carried out after those before it.
    pub fn fence(&self) -> Result<()> {
        // Operations through the owner run in order on one link, and direct ones are done
        // when issued; but a direct one issued after the fence would overtake one still on
        // its way to the owner. So when this endpoint has both, the fence waits until the
        // owner has carried out everything sent before it. A full fence orders this
        // process's own loads and stores.
        if let Some(id) = self.with_state(|st, e| st.rma_fence_start(e))? {
            Request::new(self.worker(), Started::Pending(id)).wait()?;
        }
        fence(Ordering::SeqCst);
        Ok(())
    }
}

/// The signal half of a put-with-signal: the word, its key, and the update.
struct SignalTarget<'k> {
    addr: u64,
    key: &'k RemoteKey,
    value: u64,
    op: SignalOp,
}

/// A Berkeley UPC-style semaphore living in this process's memory.
pub struct Semaphore {
    mem: Memory,
    flags: u32,
}

/// Semaphore flags (`bupc_sem_alloc`).
pub mod sem_flags {
    /// Value is 0 or 1.
    pub const BOOLEAN: u32 = 1;
    /// Value counts up to 65535.
    pub const INTEGER: u32 = 2;
    /// One producer.
    pub const SPRODUCER: u32 = 4;
    /// Many producers.
    pub const MPRODUCER: u32 = 8;
    /// One consumer.
    pub const SCONSUMER: u32 = 16;
    /// Many consumers.
    pub const MCONSUMER: u32 = 32;
}

/// The largest value a semaphore holds.
pub const SEM_MAX: u64 = 65535;

impl Semaphore {
    /// Allocate a semaphore at 0 (flags 0 = INTEGER | MPRODUCER | MCONSUMER).
    pub fn new(ctx: &Context, flags: u32) -> Result<Semaphore> {
        use sem_flags::*;
        let flags = if flags == 0 {
            INTEGER | MPRODUCER | MCONSUMER
        } else {
            flags
        };
        if flags & !(BOOLEAN | INTEGER | SPRODUCER | MPRODUCER | SCONSUMER | MCONSUMER) != 0
            || (flags & BOOLEAN != 0) == (flags & INTEGER != 0)
            || flags & (SPRODUCER | MPRODUCER) == (SPRODUCER | MPRODUCER)
            || flags & (SCONSUMER | MCONSUMER) == (SCONSUMER | MCONSUMER)
        {
            return Err(Error::new(
                Status::InvalidParam,
                "semaphore flags: exactly one of BOOLEAN/INTEGER, at most one of each producer and consumer kind",
            ));
        }
        let mem = ctx.mem_map(MemMapParams::allocate(64))?;
        Ok(Semaphore { mem, flags })
    }

    fn limit(&self) -> u64 {
        if self.flags & sem_flags::BOOLEAN != 0 {
            1
        } else {
            SEM_MAX
        }
    }

    /// Key and address for peers that post to it remotely (atomic add or put-with-signal
    /// with `SignalOp::Add`; a boolean one also with `Set` 1 or a posted `Or` 1). The owner
    /// cannot bound a peer's add, so a boolean semaphore saturates instead: any value
    /// above 0 reads as 1, and a wait takes all of it.
    pub fn remote(&self) -> Result<(Vec<u8>, u64)> {
        Ok((self.mem.pack_rkey()?, self.mem.as_ptr() as u64))
    }

    fn boolean(&self) -> bool {
        self.flags & sem_flags::BOOLEAN != 0
    }

    /// The current value (for a boolean semaphore, 0 or 1).
    pub fn value(&self) -> u64 {
        let v = self.mem.signal_fetch(0).unwrap_or(0);
        if self.boolean() { v.min(1) } else { v }
    }

    /// Add `n`; fails if that would pass the maximum.
    pub fn post(&self, n: u64) -> Result<()> {
        let w = self.mem.word(0)?;
        let lim = self.limit();
        w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            v.checked_add(n).filter(|x| *x <= lim)
        })
        .map(|_| ())
        .map_err(|v| {
            Error::msg(
                Status::InvalidParam,
                format!("semaphore at {v} cannot rise by {n} past {lim}"),
            )
        })
    }

    /// Take `n` if available now. A boolean semaphore holds at most 1: taking 1 empties
    /// it (also when peers' adds took the word past 1), and more than 1 is never there.
    pub fn try_wait(&self, n: u64) -> bool {
        let boolean = self.boolean();
        if boolean && n > 1 {
            return false;
        }
        self.mem
            .word(0)
            .map(|w| {
                w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    if boolean && n == 1 {
                        (v >= 1).then_some(0)
                    } else {
                        v.checked_sub(n)
                    }
                })
                .is_ok()
            })
            .unwrap_or(false)
    }

    /// Wait until at least `n` is there, then take it (progressing `worker`, spinning;
    /// `bupc_sem_wait`). See `wait_timeout`.
    pub fn wait(&self, worker: &Worker, n: u64) -> Result<()> {
        self.wait_timeout(worker, n, false, None)
    }

    /// `wait`, sleeping when asked and with a time limit (`Timeout` when it passes; `None`:
    /// none). With `sleep` it waits as `Memory::signal_wait_until` does: a short spin, then
    /// sleeps on the worker's event fd, from which a peer's signalling put to this worker
    /// wakes it (framed, or written directly by a same-host peer). Waiting for more than a
    /// boolean semaphore can hold is refused.
    pub fn wait_timeout(
        &self,
        worker: &Worker,
        n: u64,
        sleep: bool,
        timeout: Option<Duration>,
    ) -> Result<()> {
        if n > self.limit() {
            return Err(Error::msg(
                Status::InvalidParam,
                format!(
                    "a wait for {n} on a semaphore that holds at most {}",
                    self.limit()
                ),
            ));
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // A boolean one reads as 1 whatever peers' adds took its word to.
        let want = n.min(self.limit());
        loop {
            if self.try_wait(n) {
                return Ok(());
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) => Some(l),
                    None => {
                        return Err(Error::msg(
                            Status::Timeout,
                            format!(
                                "semaphore: {n} not available within {:?}",
                                timeout.unwrap_or_default()
                            ),
                        ));
                    }
                },
                None => None,
            };
            // Until the word holds enough; another consumer may take it first, and then
            // this waits again.
            match self
                .mem
                .signal_wait_until_timeout(Some(worker), 0, Cmp::Ge, want, sleep, left)
            {
                Ok(_) => {}
                Err(e) if e.status() == Status::Timeout => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::context::ContextParams;

    /// A boolean semaphore stays boolean when peers' adds take its word past 1: it reads
    /// as 1, one wait empties it, and a wait for 2 is never satisfied.
    #[test]
    fn boolean_semaphore_saturates_under_remote_adds() {
        let ctx = Context::new(ContextParams::default()).expect("context");
        let sem = Semaphore::new(&ctx, sem_flags::BOOLEAN).expect("semaphore");
        let w = sem.mem.word(0).expect("word");
        w.fetch_add(3, Ordering::AcqRel); // three peers' atomic adds of 1
        assert_eq!(sem.value(), 1);
        assert!(!sem.try_wait(2));
        assert!(sem.try_wait(1));
        assert_eq!(sem.value(), 0);
        assert_eq!(w.load(Ordering::Acquire), 0, "one wait takes all of it");
        assert!(!sem.try_wait(1));
        sem.post(1).expect("post");
        assert!(sem.post(1).is_err(), "a local post past 1 is refused");
        assert!(sem.try_wait(1));
        // An integer semaphore counts.
        let int = Semaphore::new(&ctx, sem_flags::INTEGER).expect("semaphore");
        int.mem
            .word(0)
            .expect("word")
            .fetch_add(3, Ordering::AcqRel);
        assert_eq!(int.value(), 3);
        assert!(int.try_wait(2));
        assert_eq!(int.value(), 1);
    }

    /// A semaphore wait with a limit: refused beyond what it can hold, a timeout when
    /// nothing comes, the value taken when it is there; a sleeping wait as well.
    #[test]
    fn semaphore_waits_with_limits() {
        let ctx = Context::new(ContextParams::default()).expect("context");
        let w = Worker::new(&ctx, Default::default()).expect("worker");
        let boolean = Semaphore::new(&ctx, sem_flags::BOOLEAN).expect("semaphore");
        let e = boolean
            .wait(&w, 2)
            .expect_err("a boolean one never holds 2");
        assert_eq!(e.status(), Status::InvalidParam);
        let int = Semaphore::new(&ctx, 0).expect("semaphore");
        for sleep in [false, true] {
            let short = Some(Duration::from_millis(20));
            let e = int
                .wait_timeout(&w, 1, sleep, short)
                .expect_err("nothing posted");
            assert_eq!(e.status(), Status::Timeout, "{e}");
            int.post(3).expect("post");
            int.wait_timeout(&w, 2, sleep, short).expect("3 are there");
            assert_eq!(int.value(), 1);
            assert!(int.try_wait(1));
        }
        // Another thread posts while this one sleeps.
        let sem = Arc::new(int);
        let poster = {
            let s = sem.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                s.post(2)
            })
        };
        sem.wait_timeout(&w, 2, true, Some(Duration::from_secs(20)))
            .expect("posted by the other thread");
        poster.join().expect("poster").expect("post");
        assert_eq!(sem.value(), 0);
    }
}
