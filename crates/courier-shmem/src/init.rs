//! Library setup and teardown: the job, Courier's context and worker, the symmetric
//! segments and their keys, the environment variables; the world every call starts from.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use courier::{Context, ContextParams, MemMapParams, ThreadMode, Worker, WorkerParams};

use crate::error::{debug, fatal};
use crate::heap::Heap;
use crate::runtime::Runtime;
use crate::symmetric::{self, Local, Peer, Seg};

/// `SHMEM_THREAD_*`.
pub const THREAD_SINGLE: i32 = 0;
/// `SHMEM_THREAD_MULTIPLE`.
pub const THREAD_MULTIPLE: i32 = 3;

/// The heap size when `SHMEM_SYMMETRIC_SIZE` is not set.
pub const DEFAULT_HEAP: usize = 512 << 20;

/// Every PE's heap starts at a multiple of this, so that a block at one offset has the same
/// alignment everywhere (`shmem_align` up to this much; the mapping is this much larger,
/// which costs address space only).
pub const HEAP_ALIGN: usize = 32 << 20;

/// Jobs up to this many PEs connect every pair at `shmem_init`.
pub const EAGER_MAX: usize = 64;

/// How waits behave (`SHMEM_WAIT`, `SHMEM_WAIT_SPIN`).
#[derive(Clone, Copy, Debug)]
pub struct WaitCfg {
    /// Sleep on the worker's event fd once the spin is over (else spin, yielding).
    pub sleep: bool,
    /// How long to spin before the first sleep: `SHMEM_WAIT_SPIN`, else `SPIN`.
    pub spin: Duration,
    /// The longest sleep before looking again (a word written by a plain put wakes no one).
    /// Sleeps start at `FIRST_NAP` and double up to it, so that a wait that outlived the
    /// spin only because its peer lost its CPU for a moment does not pay a whole nap.
    pub nap: Duration,
    /// This machine's PEs outnumber the CPUs they may run on (`cpus`): the PE a wait waits
    /// for is likely waiting for a CPU, so waits give theirs away at every round, as Open
    /// MPI's do when oversubscribed; else only now and then.
    pub oversubscribed: bool,
}

/// How long a wait spins (looking, progressing, yielding) before it sleeps. When every PE
/// on this machine has a CPU of its own, the peer a wait waits for is running, so a wait
/// longer than this means it is busy, not descheduled. When the PEs outnumber their CPUs,
/// the spin yields at every round, which hands the CPU to the PEs that share it; a sleep
/// sooner gained nothing and cost much: a same-host peer's plain store wakes no one, so
/// each wait that slept in a chain of them (a ping-pong on flags, a tree broadcast) paid
/// a nap of 16 us or more. With 50 us here, 4 PEs on 2 CPUs took 5.4 us a hop in a flag
/// ping-pong (0.24 with 1 ms) and the applications' flag variants 10 to 100 times longer.
pub const SPIN: Duration = Duration::from_millis(1);
/// The first sleep of a wait (then doubling up to `WaitCfg::nap`).
pub const FIRST_NAP: Duration = Duration::from_micros(16);

/// Everything a PE has after `shmem_init`.
pub struct World {
    /// The job.
    pub rt: Runtime,
    /// Courier's context (kept for the life of the process, with its mappings).
    #[allow(dead_code)]
    pub ctx: Context,
    /// The worker every operation goes through.
    pub worker: Worker,
    /// This PE.
    pub me: usize,
    /// PEs in the job.
    pub npes: usize,
    /// The symmetric heap.
    pub heap: Local,
    /// The data segment, if the executable has one that could be shared.
    pub data: Option<Local>,
    /// The heap's allocator (user blocks only; the internal area lies before them).
    pub alloc: Mutex<Heap>,
    /// Host id of every PE.
    pub hosts: Vec<[u8; 16]>,
    /// Whether this process may reach same-host peers' memory directly.
    pub shm: bool,
    /// The thread level provided.
    pub thread_level: i32,
    /// Waits.
    pub wait: WaitCfg,
    /// Per PE: whether it is bound to CPUs this PE is never on (`cpus::elsewhere`), so that
    /// while this machine's PEs outnumber its CPUs a wait for it spins instead of yielding.
    pub elsewhere: Vec<bool>,
    /// The peers, connected at their first use.
    peers: Vec<OnceLock<Peer>>,
    peer_lock: Mutex<()>,
    /// Set by `shmem_finalize`.
    pub finalized: AtomicBool,
}

static WORLD: AtomicPtr<World> = AtomicPtr::new(std::ptr::null_mut());
static INIT_LOCK: Mutex<()> = Mutex::new(());
static DEBUG: AtomicBool = AtomicBool::new(false);

/// The world, or a fatal error of `call` before `shmem_init` / after `shmem_finalize`.
#[inline(always)]
pub fn world(call: &'static str) -> &'static World {
    let p = WORLD.load(Ordering::Acquire);
    if p.is_null() {
        not_initialized(call)
    }
    // SAFETY: set once from a leaked Box and never freed.
    let w = unsafe { &*p };
    if w.finalized.load(Ordering::Relaxed) {
        fatal(call, "called after shmem_finalize")
    }
    w
}

/// The world if `shmem_init` ran (finalized or not).
pub fn try_world() -> Option<&'static World> {
    let p = WORLD.load(Ordering::Acquire);
    // SAFETY: as in `world`.
    (!p.is_null()).then(|| unsafe { &*p })
}

#[cold]
#[inline(never)]
fn not_initialized(call: &str) -> ! {
    fatal(call, "called before shmem_init")
}

/// This PE's number, once known (for messages).
pub fn my_pe_or_none() -> Option<usize> {
    try_world().map(|w| w.me)
}

/// Whether `SHMEM_DEBUG` asked for debug lines.
pub fn debug_enabled() -> bool {
    DEBUG.load(Ordering::Relaxed)
}

/// End the whole job (every PE) with `code`.
pub fn abort_job(code: i32, why: &str) -> ! {
    match try_world() {
        Some(w) => w.rt.abort(code, why),
        None => std::process::exit(code),
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| {
            let v = v.trim().to_ascii_lowercase();
            !(v.is_empty() || v == "0" || v == "no" || v == "n" || v == "false" || v == "off")
        })
        .unwrap_or(false)
}

fn heap_size() -> Result<usize, String> {
    match std::env::var("SHMEM_SYMMETRIC_SIZE") {
        Ok(v) => courier::config::parse_size(&v)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                format!(
                    "SHMEM_SYMMETRIC_SIZE={v:?} is not a size (a number of bytes, with k, m or g)"
                )
            }),
        Err(_) => Ok(DEFAULT_HEAP),
    }
}

fn wait_cfg(ctx: &Context) -> Result<WaitCfg, String> {
    let sleep = match std::env::var("SHMEM_WAIT").as_deref() {
        Err(_) | Ok("auto") | Ok("sleep") | Ok("") => true,
        Ok("spin") => false,
        Ok(v) => {
            return Err(format!(
                "SHMEM_WAIT={v:?}: accepted: auto (spin, then sleep), spin"
            ));
        }
    };
    let spin = match std::env::var("SHMEM_WAIT_SPIN") {
        Ok(v) => courier::config::parse_duration(&v)
            .ok_or_else(|| format!("SHMEM_WAIT_SPIN={v:?} is not a duration (like 50us)"))?,
        Err(_) => SPIN,
    };
    let nap = ctx.config().signal_nap.min(Duration::from_millis(1));
    Ok(WaitCfg {
        sleep,
        spin,
        nap,
        // Known once the PEs' hosts and CPUs are (`init`).
        oversubscribed: false,
    })
}

/// The size of the heap's internal area (pairwise sync counters and scratch, then the
/// semaphores), before the first user block.
pub fn internal_len(npes: usize) -> usize {
    let page = rustix::param::page_size();
    (crate::sem::area_offset(npes) + crate::sem::AREA_BYTES + page - 1) & !(page - 1)
}

/// `shmem_init_thread`: set everything up (once; later calls only report the level).
pub fn init(call: &'static str, requested: i32) -> i32 {
    let _g = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(w) = try_world() {
        if w.finalized.load(Ordering::Relaxed) {
            fatal(
                call,
                "the library was finalized; it cannot be initialized again",
            )
        }
        return w.thread_level;
    }
    DEBUG.store(env_flag("SHMEM_DEBUG"), Ordering::Relaxed);
    if !(THREAD_SINGLE..=THREAD_MULTIPLE).contains(&requested) {
        fatal(
            call,
            format_args!(
                "requested={requested}: not a thread level (SHMEM_THREAD_SINGLE..SHMEM_THREAD_MULTIPLE, 0..3)"
            ),
        )
    }
    let world = match setup(requested) {
        Ok(w) => w,
        Err(e) => fatal(call, e),
    };
    let w: &'static World = Box::leak(Box::new(world));
    WORLD.store(w as *const World as *mut World, Ordering::Release);
    crate::team::init_predefined(w);
    // Small jobs connect every pair now, while every PE progresses: a PE that later spins
    // on its memory without calling the library cannot hold up a peer's first access.
    // (`SHMEM_CONNECT=lazy` connects at first use instead; larger jobs always do.)
    let eager = match std::env::var("SHMEM_CONNECT").as_deref() {
        Ok("lazy") => false,
        Ok("eager") => true,
        _ => w.npes <= EAGER_MAX,
    };
    let r = if eager {
        w.rt.connect_all().map(|()| {
            for pe in (0..w.npes).filter(|&p| p != w.me) {
                w.peer(call, pe);
            }
        })
    } else {
        Ok(())
    };
    if let Err(e) = r {
        fatal(call, format_args!("connecting the PEs: {e}"))
    }
    // Everyone has mapped, published (and connected) before anyone returns.
    if let Err(e) = w.rt.barrier_progressing() {
        fatal(call, format_args!("the job's barrier failed: {e}"))
    }
    if w.me == 0 {
        if env_flag("SHMEM_VERSION") {
            println!("{}", crate::ffi::setup::vendor_line());
        }
        if env_flag("SHMEM_INFO") {
            print_info(w);
        }
    }
    w.thread_level
}

fn setup(requested: i32) -> Result<World, String> {
    let size = heap_size()?;
    let rt = Runtime::init().map_err(|e| format!("joining the job: {e}"))?;
    let (me, npes) = (rt.rank(), rt.size());
    let ctx = Context::new(
        ContextParams::default()
            .features(crate::PE_FEATURES)
            .name(&format!("shmem-pe{me}")),
    )
    .map_err(|e| format!("creating the Courier context: {e}"))?;
    let mut wait = wait_cfg(&ctx)?;
    // Before any thread of ours exists: moving the data segment loses concurrent stores.
    let data = symmetric::share_data(&ctx);
    let internal = internal_len(npes);
    if size <= internal {
        return Err(format!(
            "SHMEM_SYMMETRIC_SIZE={size} is too small: {npes} PEs need {internal} bytes of the heap for the library"
        ));
    }
    let heap_mem = ctx
        .mem_map(MemMapParams::allocate(size + HEAP_ALIGN))
        .map_err(|e| {
            format!("mapping a symmetric heap of {size} bytes (SHMEM_SYMMETRIC_SIZE): {e}")
        })?;
    let heap = Local {
        base: (heap_mem.as_ptr() as usize).next_multiple_of(HEAP_ALIGN),
        len: size,
        mem: heap_mem,
    };
    let worker = Worker::new(
        &ctx,
        WorkerParams {
            thread_mode: ThreadMode::Multi,
        },
    )
    .map_err(|e| format!("creating the Courier worker: {e}"))?;
    rt.attach(&worker)?;
    let blob = symmetric::publish(&heap, data.as_ref())?;
    rt.put("shmem-seg", &blob)?;
    rt.put("shmem-cpus", &crate::cpus::published())?;
    rt.exchange().map_err(|e| format!("exchanging keys: {e}"))?;
    let mut hosts = Vec::with_capacity(npes);
    for pe in 0..npes {
        let b = rt.get(pe, "shmem-seg")?;
        hosts.push(
            symmetric::parse(&b)
                .map_err(|e| format!("PE {pe} published {e}"))?
                .host,
        );
    }
    // The PEs of this machine share its CPUs, also those in another network namespace,
    // which the transport counts as another host (`cpus.rs`).
    let published = (0..npes)
        .map(|p| rt.get(p, "shmem-cpus"))
        .collect::<Result<Vec<_>, _>>()?;
    let (local, cpus) = crate::cpus::shared(me, &published)?;
    let elsewhere = crate::cpus::elsewhere(me, &published);
    wait.oversubscribed = local > cpus;
    debug(format_args!(
        "{local} PEs on this machine, {cpus} CPUs among them: waits yield {}, spin {:?}",
        if wait.oversubscribed {
            "at every round"
        } else {
            "now and then"
        },
        wait.spin
    ));
    let shm = ctx.config().tls.allows("shm");
    debug(format_args!(
        "heap [{:#x}, +{size}), data {:?}, {npes} PEs, shm {shm}",
        heap.base,
        data.as_ref().map(|d| (d.base, d.len))
    ));
    Ok(World {
        rt,
        ctx,
        worker,
        me,
        npes,
        alloc: Mutex::new(Heap::new(internal, size)),
        heap,
        data,
        hosts,
        shm,
        thread_level: requested.clamp(THREAD_SINGLE, THREAD_MULTIPLE),
        wait,
        elsewhere,
        peers: (0..npes).map(|_| OnceLock::new()).collect(),
        peer_lock: Mutex::new(()),
        finalized: AtomicBool::new(false),
    })
}

fn print_info(w: &World) {
    println!("{}", crate::ffi::setup::vendor_line());
    println!("Environment variables (OpenSHMEM and Courier's):");
    for (name, what) in [
        (
            "SHMEM_SYMMETRIC_SIZE",
            "bytes of symmetric heap per PE (k, m, g suffixes); default 512m",
        ),
        ("SHMEM_VERSION", "print the library version at start-up"),
        ("SHMEM_INFO", "print this list at start-up"),
        ("SHMEM_DEBUG", "print debugging lines on stderr"),
        (
            "SHMEM_WAIT",
            "auto: waits spin, then sleep on the worker's event fd; spin: never sleep",
        ),
        (
            "SHMEM_WAIT_SPIN",
            "how long a wait spins before it sleeps; default 1ms",
        ),
        (
            "SHMEM_CONNECT",
            "eager: connect every pair at init (default up to 64 PEs); lazy: at first use",
        ),
    ] {
        let v = std::env::var(name).unwrap_or_else(|_| "(not set)".into());
        println!("  {name:22} = {v:12} {what}");
    }
    println!(
        "  heap {} bytes at {:#x}; data segment {}",
        w.heap.len,
        w.heap.base,
        match &w.data {
            Some(d) => format!("{} bytes at {:#x}", d.len, d.base),
            None => "not shared".into(),
        }
    );
}

/// `shmem_finalize`: complete everything, wait for every PE, leave the job.
pub fn finalize(call: &'static str) {
    let Some(w) = try_world() else {
        fatal(call, "called before shmem_init")
    };
    if w.finalized.load(Ordering::Relaxed) {
        return;
    }
    crate::rma::quiet_all(w, call);
    crate::coll::barrier_world(w, call);
    w.finalized.store(true, Ordering::Relaxed);
    if let Err(e) = w.rt.finalize() {
        crate::error::warn(call, format_args!("leaving the job: {e}"));
    }
}

impl World {
    /// Where `[addr, addr + len)` lies: the segment and offset, if symmetric.
    #[inline(always)]
    pub fn locate(&self, addr: usize, len: usize) -> Option<(Seg, usize)> {
        if let Some(off) = self.heap.offset(addr, len) {
            return Some((Seg::Heap, off));
        }
        let d = self.data.as_ref()?;
        d.offset(addr, len).map(|off| (Seg::Data, off))
    }

    /// Peer `pe` (not this PE), connected at its first use.
    #[inline(always)]
    pub fn peer(&self, call: &'static str, pe: usize) -> &Peer {
        match self.peers[pe].get() {
            Some(p) => p,
            None => self.connect(call, pe),
        }
    }

    #[cold]
    #[inline(never)]
    fn connect(&self, call: &'static str, pe: usize) -> &Peer {
        let _g = self.peer_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = self.peers[pe].get() {
            return p;
        }
        let made = (|| -> Result<Peer, String> {
            let ep = self.rt.endpoint(&self.worker, pe)?;
            let blob = self.rt.get(pe, "shmem-seg")?;
            symmetric::connect(ep, &blob)
        })();
        match made {
            Ok(p) => {
                debug(format_args!(
                    "PE {pe}: heap {}, data {}",
                    p.parts[0].as_ref().map_or("none", |x| x.key.path()),
                    p.parts[1].as_ref().map_or("none", |x| x.key.path())
                ));
                let _ = self.peers[pe].set(p);
                self.peers[pe]
                    .get()
                    .unwrap_or_else(|| fatal(call, "peer table"))
            }
            Err(e) => fatal(call, format_args!("reaching PE {pe}: {e}")),
        }
    }

    /// The peers connected so far.
    pub fn connected(&self) -> impl Iterator<Item = &Peer> {
        self.peers.iter().filter_map(|p| p.get())
    }

    /// A PE number from the C side, checked.
    #[inline(always)]
    pub fn check_pe(&self, call: &'static str, pe: i32) -> usize {
        if pe < 0 || pe as usize >= self.npes {
            bad_pe(call, pe, self.npes)
        }
        pe as usize
    }

    /// Whether PE `pe` is on this host and its memory reachable directly.
    pub fn same_host(&self, pe: usize) -> bool {
        pe == self.me || (self.shm && self.hosts[pe] == self.hosts[self.me])
    }
}

#[cold]
#[inline(never)]
fn bad_pe(call: &'static str, pe: i32, npes: usize) -> ! {
    fatal(
        call,
        format_args!(
            "pe={pe}: out of range (the job has {npes} PEs, 0..{})",
            npes.saturating_sub(1)
        ),
    )
}
