//! Memory regions (`Memory`, mapped by `Context::mem_map`), and waiting on signal words in
//! them.
//!
//! `Context::mem_map` registers a buffer or allocates one. Allocated host memory lives in a
//! shared segment, so a peer on the same host reaches it with plain loads, stores and CPU
//! atomics, without the owner's CPU; registered memory is reached with CMA on the same host.
//! Elsewhere (or over tcp) the owner's worker carries operations out as it progresses.
//! Whatever the path, every access is checked against the owner's own record of the region
//! (`proto::onesided`; `courier::onesided` describes the paths for tools).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use super::context::Context;
use super::worker::Worker;
use crate::base::cuda;
use crate::base::sys::poll_gap;
use crate::base::{Error, Result, Status};
use crate::proto::buf::Buf;
pub use crate::proto::memreg::MemoryType;
use crate::proto::memreg::{MemRegistry, Place};
pub use crate::proto::onesided::{AtomicOp, SignalOp};
use crate::proto::onesided::{Dir, copy_local};
pub use crate::wire::rkey::access;

/// How to map memory: [`MemMapParams::allocate`], or (unsafe: the caller vouches for the
/// memory) [`MemMapParams::register`] and [`MemMapParams::share_in_place`]; then the
/// memory type and the remote rights.
///
/// The address and length are private: safe code cannot point a region at memory it does
/// not own, because the region is read and written by peers and by `Memory::read`/`write`
/// with no borrow to check.
#[derive(Clone, Copy, Debug)]
pub struct MemMapParams {
    /// Register this existing buffer (with `length`); `None` with `allocate`.
    address: Option<*mut u8>,
    /// Length in bytes.
    length: usize,
    /// Allocate the memory (in a shared segment for host memory).
    allocate: bool,
    /// Memory type asked for.
    pub memory_type: MemoryType,
    /// Remote rights: `access::READ | WRITE | ATOMIC`.
    pub access: u16,
    /// With `address`: move the pages that hold `[address, address + length)` into a
    /// shared segment in place, keeping their addresses and contents, so that same-host
    /// peers reach them directly as they reach allocated memory (`share_in_place`).
    in_place: bool,
}

impl Default for MemMapParams {
    /// Nothing to map yet: `mem_map` refuses it until an address or `allocate` is given.
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
    /// Register an existing buffer `[ptr, ptr + length)`.
    ///
    /// ```compile_fail,E0133
    /// // Registering a raw pointer is unsafe: safe code cannot hand peers memory it does
    /// // not own.
    /// let mut buf = vec![0u8; 64];
    /// let _ = courier::MemMapParams::register(buf.as_mut_ptr(), buf.len());
    /// ```
    ///
    /// # Safety
    /// For every [`Memory`] mapped from these parameters (they are `Copy`), until that
    /// `Memory` is dropped:
    /// - `[ptr, ptr + length)` is one allocation (host memory, or with
    ///   `memory_type(Cuda)` device memory) that stays allocated, valid for reads and
    ///   writes of `length` bytes;
    /// - peers (and `Memory::read`/`write`, signal words, atomics) may read and write it
    ///   at any time without synchronising with Rust's borrows, so it must not be accessed
    ///   through Rust references (`&`/`&mut` to it, a `Vec` or slice over it) while an
    ///   access may be in flight: touch it through raw pointers, atomics or the `Memory`
    ///   methods, or only once every peer's access is known to be over (after a flush or
    ///   a barrier the application runs);
    /// - if the remote rights allow writes, nothing else relies on its contents staying
    ///   unchanged (it is not a `&[u8]` or a string literal cast to `*mut`).
    pub unsafe fn register(ptr: *mut u8, length: usize) -> Self {
        MemMapParams {
            address: Some(ptr),
            length,
            ..Default::default()
        }
    }
    /// Share existing pages in place: the pages that hold `[ptr, ptr + length)`, host
    /// memory that this process owns privately (a program's data and bss, a large buffer
    /// of its own), are moved into a shared segment at the same addresses with the same
    /// contents, and the range is registered. Same-host peers then reach it with loads,
    /// stores and CPU atomics, as allocated memory, where registered memory would be
    /// reached only by CMA or through this process. Keys cover the range only, not the
    /// rest of its first and last pages. Unmapping the region leaves the pages where they
    /// are, shared with no one.
    ///
    /// ```compile_fail,E0133
    /// let mut pages = vec![0u8; 1 << 16];
    /// let _ = courier::MemMapParams::share_in_place(pages.as_mut_ptr(), pages.len());
    /// ```
    ///
    /// # Safety
    /// Everything [`MemMapParams::register`] requires, and also: the pages holding the
    /// range are this process's private host memory; and no other thread reads or writes
    /// them (the range's first and last pages whole, bytes outside the range included)
    /// while `mem_map` runs: the move copies the pages and then maps the segment over
    /// them, so a store made meanwhile is lost and a load may see a page mid-move. After
    /// `fork`, a child shares those pages with this process instead of copying them.
    pub unsafe fn share_in_place(ptr: *mut u8, length: usize) -> Self {
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

/// The inverse of [`MemMapParams::share_in_place`]: make the pages `[ptr, ptr + len)`
/// private anonymous memory again at the same addresses, contents kept. Their bytes go
/// to a temporary private mapping, a private anonymous mapping replaces the pages in one
/// step (`MAP_FIXED`), and the bytes come back. It allocates nothing and takes no lock,
/// so a child process may call it right after `fork` (to stop sharing pages with its
/// parent).
///
/// # Safety
/// `[ptr, ptr + len)` is whole pages of this process's mapped memory, readable and
/// writable, that no other thread touches while this runs and that no Rust reference
/// points into. Peers still writing the shared segment these pages were (a region not
/// unmapped yet, or the parent of a forked child) write where this process no longer
/// looks.
pub unsafe fn unshare_in_place(ptr: *mut u8, len: usize) -> std::io::Result<()> {
    let start = ptr.cast::<libc::c_void>();
    // SAFETY: a fresh mapping of our own, then the caller's pages as the contract says.
    unsafe {
        let tmp = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if tmp == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        std::ptr::copy_nonoverlapping(ptr as *const u8, tmp as *mut u8, len);
        let p = libc::mmap(
            start,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        let r = if p == libc::MAP_FAILED {
            Err(std::io::Error::last_os_error())
        } else {
            std::ptr::copy_nonoverlapping(tmp as *const u8, ptr, len);
            Ok(())
        };
        libc::munmap(tmp, len);
        r
    }
}

/// A mapped region. Unmapped on drop; every remote key made from it stops working.
///
/// The owner maps it ([`Context::mem_map`](crate::Context::mem_map)) and sends its packed
/// key and address; a peer unpacks the key on its endpoint and puts, gets and atomics
/// into it.
///
/// ```
/// use courier::{Context, ContextParams, EndpointParams, Features, MemMapParams, Worker, WorkerParams};
///
/// let features = Features { rma: true, atomics: true, ..Features::default() };
/// let ctx = Context::new(ContextParams::default().features(features))?;
/// let worker = Worker::new(&ctx, WorkerParams::default())?;
/// let mem = ctx.mem_map(MemMapParams::allocate(4096))?;
/// let (key, base) = (mem.pack_rkey()?, mem.query().address as u64); // to the peer
///
/// // The peer (here: an endpoint to the same worker).
/// let ep = worker.connect(&worker.address()?, EndpointParams::default())?;
/// let rkey = ep.rkey_unpack(&key)?;
/// ep.put(b"one-sided", base + 8, &rkey)?;
/// ep.flush()?; // every earlier put is in place
///
/// let mut out = [0u8; 9];
/// mem.read(8, &mut out)?;
/// assert_eq!(&out, b"one-sided");
/// # Ok::<(), courier::Error>(())
/// ```
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
    pub(super) fn holds(self, a: u64, b: u64) -> bool {
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

    #[inline]
    pub(super) fn word(&self, offset: usize) -> Result<&AtomicU64> {
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

/// Loads of a signal word between two progress calls in `signal_wait_until`.
const SIGNAL_LOADS_PER_PROGRESS: usize = 16;
/// How long a sleeping `signal_wait_until` spins before its first sleep.
const SIGNAL_SPIN: Duration = Duration::from_micros(50);
/// A spinning wait without a worker yields the CPU once per this many idle rounds.
const SIGNAL_YIELD_EVERY: u32 = 1024;
