//! `courier::onesided` describes how one-sided operations reach a peer's memory (for
//! `courier info`). Here every operation runs on every route that two contexts of one
//! process can set up — self, shm with and without CMA, tcp — on allocated and registered
//! memory, and must behave as described: a key's `path()` is the described route, an
//! operation on a route the origin carries out itself is done in the call that starts it,
//! and one the owner carries out has not happened until the owner's worker progresses.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use courier::onesided::{Op, Reach, Route, TargetMemory, key_route, op_route};
use courier::*;

const LEN: usize = 4096;
/// Where the signal word of put-with-signal lives in the signal region.
const SIG: u64 = 64;

fn ctx(cfg: &[(&str, &str)]) -> Context {
    let mut p = ContextParams::default();
    for &(k, v) in cfg {
        p = p.config(k, v);
    }
    Context::new(p).expect("context")
}

/// The owner's side: its worker, the memory the origin operates on, and their keys.
struct Owner {
    worker: Worker,
    mem: Memory,
    _buf: Box<[u8]>,
    sig: Memory,
    keys: Vec<Vec<u8>>,
    sig_key: Vec<u8>,
}

fn owner(c: &Context, w: Worker, kind: TargetMemory) -> Owner {
    let mut buf = vec![0u8; LEN].into_boxed_slice();
    let mem = match kind {
        TargetMemory::Allocated => c.mem_map(MemMapParams::allocate(LEN)),
        TargetMemory::Registered => {
            // SAFETY: `buf` is kept in the Owner beside `mem` and outlives it; it is read only once
            // the peers are done.
            c.mem_map(unsafe { MemMapParams::register(buf.as_mut_ptr(), LEN) })
        }
        TargetMemory::Cuda => unreachable!("no device memory in this test"),
    }
    .expect("mem_map");
    let sig = c
        .mem_map(MemMapParams::allocate(LEN))
        .expect("signal region");
    Owner {
        worker: w,
        keys: vec![mem.pack_rkey().expect("pack")],
        sig_key: sig.pack_rkey().expect("pack"),
        mem,
        _buf: buf,
        sig,
    }
}

fn read(m: &Memory, off: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    m.read(off, &mut v).expect("read own region");
    v
}

fn word(m: &Memory, off: usize) -> u64 {
    u64::from_le_bytes(read(m, off, 8).try_into().expect("8 bytes"))
}

/// Progress `ws` until `done` holds. After 10 s the test binary exits: unwinding would
/// drop requests in flight, which waits for them.
fn until(ws: &[&Worker], what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        for w in ws {
            w.progress();
        }
        if Instant::now() > deadline {
            eprintln!("{what}: not done in 10 s");
            std::process::exit(1);
        }
    }
}

/// What one operation did: whether its effect (and its request) was complete when the call
/// returned, and whether it was complete after the origin alone had progressed a while.
struct Seen {
    at_once: bool,
    without_owner: bool,
}

impl Seen {
    /// The operation went as `route` says: done in the call, or only once the owner ran.
    fn check(&self, route: Route, what: &str) {
        if route.in_call() {
            assert!(
                self.at_once,
                "{what}: route {} but not done in the call",
                route.name()
            );
        } else {
            assert_eq!(route, Route::Remote, "{what}");
            assert!(
                !self.without_owner,
                "{what}: route remote but done before the owner's worker ran"
            );
        }
    }
}

/// Run each operation once on `ep` against `o`'s region and check it behaves as `op_route`
/// says. `origin` is the endpoint's worker; `o.worker` is progressed only after the
/// operation was looked at (a self endpoint's owner is the origin). Every request completes
/// before anything is asserted.
fn check_ops(origin: &Worker, ep: &Endpoint, o: &Owner, reach: Reach, kind: TargetMemory) {
    let key = ep.rkey_unpack(&o.keys[0]).expect("unpack");
    let sig_key = ep.rkey_unpack(&o.sig_key).expect("unpack signal key");
    let what = |op: Op| format!("{reach:?} {} {}", kind.name(), op.name());
    assert_eq!(
        key.path(),
        key_route(reach, kind).name(),
        "{reach:?} {}: path",
        kind.name()
    );
    let (base, _) = key.bounds();
    let (sig_base, _) = sig_key.bounds();
    let both = [origin, &o.worker];
    // Look at an operation in flight: `done` now, and after the origin alone progressed.
    let look = |done: &mut dyn FnMut() -> bool| {
        let at_once = done();
        for _ in 0..200 {
            origin.progress();
        }
        Seen {
            at_once,
            without_owner: done(),
        }
    };

    // put
    let data = [0x5au8; 100];
    let landed = || read(&o.mem, 8, 100) == data;
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { ep.put_nb(&data, base + 8, &key) }.expect("put");
    let seen = look(&mut || landed() && r.is_done());
    until(&both, &what(Op::Put), || landed() && r.is_done());
    r.wait().expect("put");
    seen.check(op_route(reach, kind, Op::Put), &what(Op::Put));

    // get
    o.mem.write(200, &[0x33u8; 50]).expect("write own region");
    let mut back = [0u8; 50];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { ep.get_nb(&mut back, base + 200, &key) }.expect("get");
    let seen = look(&mut || r.is_done());
    until(&both, &what(Op::Get), || r.is_done());
    r.wait().expect("get");
    assert_eq!(back, [0x33u8; 50], "{}", what(Op::Get));
    seen.check(op_route(reach, kind, Op::Get), &what(Op::Get));

    // atomics: a 64-bit add, then a 32-bit swap
    o.mem
        .write(0, &40u64.to_le_bytes())
        .expect("write own region");
    let mut r = ep
        .atomic(AtomicOp::Add, 2, 0, base, &key, false)
        .expect("atomic");
    let seen = look(&mut || word(&o.mem, 0) == 42 && r.is_done());
    until(&both, &what(Op::Atomic), || r.is_done());
    let old = r.wait().expect("atomic").value;
    assert_eq!((old, word(&o.mem, 0)), (40, 42), "{}", what(Op::Atomic));
    seen.check(op_route(reach, kind, Op::Atomic), &what(Op::Atomic));
    let mut r = ep
        .atomic(AtomicOp::Swap, 7, 0, base + 112, &key, true)
        .expect("atomic32");
    let seen = look(&mut || r.is_done());
    until(&both, &what(Op::Atomic), || r.is_done());
    assert_eq!(r.wait().expect("atomic32").value, 0);
    assert_eq!(read(&o.mem, 112, 4), 7u32.to_le_bytes());
    seen.check(op_route(reach, kind, Op::Atomic), &what(Op::Atomic));

    // put with signal (the signal word in allocated memory)
    let data = [0x77u8; 300];
    let signalled = || o.sig.signal_fetch(SIG as usize).ok() == Some(5);
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe {
        ep.put_signal_nb(
            &data,
            base + 1024,
            &key,
            sig_base + SIG,
            &sig_key,
            5,
            SignalOp::Set,
        )
    }
    .expect("put_signal");
    let seen = look(&mut || signalled() && r.is_done());
    until(&both, &what(Op::PutSignal), || signalled() && r.is_done());
    r.wait().expect("put_signal");
    assert_eq!(read(&o.mem, 1024, 300), data, "{}", what(Op::PutSignal));
    seen.check(op_route(reach, kind, Op::PutSignal), &what(Op::PutSignal));
}

/// Two contexts of this process, connected from `origin` to `owner` by their worker
/// addresses. The owner's worker is progressed by a thread while the connection is made
/// (a shm connect waits for the acceptor's reply), then only by the caller.
fn connect(cfg: &[(&str, &str)], transport: &str) -> (Context, Worker, Endpoint, Context, Worker) {
    let (ca, co) = (ctx(cfg), ctx(cfg));
    let wa = Worker::new(&ca, WorkerParams::default()).expect("worker");
    let multi = WorkerParams {
        thread_mode: ThreadMode::Multi,
    };
    let wo = Worker::new(&co, multi).expect("worker");
    let stop = Arc::new(AtomicBool::new(false));
    let (w2, s2) = (wo.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        let mut incoming = None;
        while incoming.is_none() && !s2.load(Ordering::Relaxed) {
            w2.progress();
            incoming = w2.incoming_endpoint();
        }
        incoming
    });
    let ep = wa
        .connect(&wo.address().expect("address"), EndpointParams::default())
        .expect("connect");
    until(&[&wa], "connect", || {
        ep.transport().is_some() && t.is_finished()
    });
    stop.store(true, Ordering::Relaxed);
    let incoming = t.join().expect("owner thread");
    assert!(incoming.is_some(), "no incoming endpoint");
    assert_eq!(ep.transport(), Some(transport));
    (ca, wa, ep, co, wo)
}

#[test]
fn self_endpoints_reach_memory_in_this_process() {
    let c = ctx(&[("COURIER_TLS", "self")]);
    let w = Worker::new(&c, WorkerParams::default()).expect("worker");
    let ep = w
        .connect(&w.address().expect("address"), EndpointParams::default())
        .expect("connect");
    assert_eq!(ep.transport(), Some("self"));
    for kind in [TargetMemory::Allocated, TargetMemory::Registered] {
        let o = owner(&c, w.clone(), kind);
        check_ops(&w, &ep, &o, Reach::SameContext, kind);
    }
}

#[test]
fn shm_endpoints_map_allocated_memory_and_use_cma_for_registered() {
    for (cfg, want_cma) in [
        (&[("COURIER_TLS", "shm")][..], true),
        (
            &[("COURIER_TLS", "shm"), ("COURIER_SHM_CMA", "no")][..],
            false,
        ),
    ] {
        let (_ca, wa, ep, co, wo) = connect(cfg, "shm");
        // CMA within one process works unless the policy forbids it.
        let reach = Reach::SameHost { cma: want_cma };
        for kind in [TargetMemory::Allocated, TargetMemory::Registered] {
            let o = owner(&co, wo.clone(), kind);
            check_ops(&wa, &ep, &o, reach, kind);
        }
    }
}

#[test]
fn tcp_endpoints_without_shared_memory_go_through_the_owner() {
    let (_ca, wa, ep, co, wo) = connect(&[("COURIER_TLS", "tcp")], "tcp");
    for kind in [TargetMemory::Allocated, TargetMemory::Registered] {
        let o = owner(&co, wo.clone(), kind);
        check_ops(&wa, &ep, &o, Reach::Elsewhere, kind);
    }
}
