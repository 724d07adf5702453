//! CUDA device memory between real processes, over shared memory and TCP, against a
//! stand-in driver (`tests/mockcuda/mockcuda.c`, built here with the system C compiler).
//! Its device memory is mapped with no access for the CPU, so any byte Courier moved
//! without the driver (a load, a store, CMA, a socket read straight into it) would crash
//! the test or fail the copy; the bytes are checked on both sides through the driver.
//!
//! With `COURIER_TEST_CUDA=real` the same tests load the machine's own driver
//! (`libcuda.so.1`) and run on its first GPU (`make test-gpu`, on a machine with one). The
//! checks only the stand-in can make (how many copies of each kind the driver made) are
//! skipped then; every content check, path and error runs against the real device.

use std::ffi::CString;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use courier::*;

mod common;
mod mockcuda;

use common::{
    Owner, child_command, dial, keys_from_env, keys_hex, port_from_env, sizes_in, stderr_of,
};

/// Whether the tests run on a real GPU (`COURIER_TEST_CUDA=real`).
fn real() -> bool {
    static REAL: OnceLock<bool> = OnceLock::new();
    *REAL.get_or_init(|| std::env::var("COURIER_TEST_CUDA").is_ok_and(|v| v == "real"))
}

/// The driver Courier loads in these tests: the machine's own on a real GPU, else the
/// stand-in, built once per test binary. Its path.
fn driver_lib() -> &'static str {
    static LIB: OnceLock<String> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Ok(p) = std::env::var("COURIER_TEST_DRIVER") {
            return p; // a child: the parent chose it
        }
        if real() {
            return "libcuda.so.1".into();
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mockcuda");
        mockcuda::build(&dir)
    })
}

/// How many copies of a kind the stand-in driver made in this process (0 host to device,
/// 1 device to host, 2 device to device, 4 opened IPC handles).
fn mock_count(kind: i32) -> u64 {
    mock_fn(c"mockcuda_count")(kind)
}

/// The copies of a kind made on this thread (tests run side by side in one process).
fn thread_count(kind: i32) -> u64 {
    mock_fn(c"mockcuda_thread_count")(kind)
}

fn mock_fn(name: &std::ffi::CStr) -> extern "C" fn(i32) -> u64 {
    assert!(
        !real(),
        "the stand-in's counters exist only in the stand-in"
    );
    let lib = CString::new(driver_lib()).unwrap();
    // SAFETY: dlopen/dlsym of the stand-in library (the copy Courier loads; it stays
    // loaded), whose counters have this type.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "cannot load the stand-in driver");
        let f = libc::dlsym(h, name.as_ptr());
        assert!(!f.is_null());
        std::mem::transmute::<*mut libc::c_void, extern "C" fn(i32) -> u64>(f)
    }
}

fn ctx_with(tls: &str, lib: &str) -> Context {
    let f = Features {
        rma: true,
        atomics: true,
        am: true,
        ..Default::default()
    };
    Context::new(
        ContextParams::default()
            .features(f)
            .config("COURIER_TLS", tls)
            .config("COURIER_CUDA_LIB", lib),
    )
    .unwrap()
}

fn ctx(tls: &str) -> Context {
    ctx_with(tls, driver_lib())
}

/// A context, a worker of it and an endpoint of that worker to itself (the self transport).
fn connected_to_itself() -> (Context, Worker, Endpoint) {
    let c = ctx("all");
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    (c, w, ep)
}

/// `n` bytes that differ with `seed` and repeat nowhere in a message (so a piece copied to
/// the wrong place, or from a reused buffer, shows).
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).wrapping_add(seed))
        .collect()
}

fn device(c: &Context, n: usize) -> Memory {
    c.mem_map(MemMapParams::allocate(n).memory_type(MemoryType::Cuda))
        .unwrap()
}

fn contents(m: &Memory, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    m.read(0, &mut v).unwrap();
    v
}

fn buf(m: &Memory, n: usize) -> Buf {
    Buf::One((m.as_ptr() as usize, n))
}

fn hbuf(v: &[u8]) -> Buf {
    Buf::One((v.as_ptr() as usize, v.len()))
}

/// How long one operation may take before the test gives up (a peer that failed an
/// assertion exits, and a tag receive is not bound to its endpoint).
const LIMIT: Duration = Duration::from_secs(30);

/// Wait for a request started with a raw call, at most `LIMIT`.
fn wait(w: &Worker, s: Started) -> Result<Info> {
    // SAFETY: the callers' buffers outlive this wait.
    let mut r = unsafe { w.request_for(s) };
    let res = r.wait_timeout(LIMIT);
    if res.as_ref().is_err_and(|e| e.status() == Status::Timeout) {
        panic!("an operation did not complete within {LIMIT:?}");
    }
    res
}

/// Send `b` with tag `tag` and wait.
fn send(w: &Worker, ep: &Endpoint, b: Buf, tag: u64) {
    // SAFETY: the buffer outlives the wait below.
    let s = unsafe { ep.tag_send_raw(b, tag, false, Callback::None) }.unwrap();
    wait(w, s).unwrap();
}

/// Receive into `b` with tag `tag` and wait.
fn recv(w: &Worker, b: Buf, tag: u64) -> Result<Info> {
    // SAFETY: the buffer outlives the wait below.
    let s = unsafe { w.tag_recv_raw(b, tag, u64::MAX, Callback::None) }?;
    wait(w, s)
}

const SIZES: [usize; 7] = [1, 100, 8192, 20_000, 65539, 1 << 20, (3 << 20) + 5];

// ----- the owner (parent) -------------------------------------------------------------------

fn owner(tls: &str) -> Owner {
    Owner::on(ctx(tls))
}

fn spawn(tls: &str, role: &str, port: u16, keys: &[Vec<u8>], env: &[(&str, &str)]) -> Child {
    let mut cmd = child_command(role);
    cmd.env("COURIER_TLS", tls)
        .env("COURIER_TEST_PORT", port.to_string())
        .env("COURIER_TEST_KEYS", keys_hex(keys))
        .env("COURIER_TEST_DRIVER", driver_lib())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn first_ep(o: &Owner) -> Endpoint {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(ep) = o.eps.lock().unwrap().first() {
            return ep.clone();
        }
        o.w.progress();
        assert!(Instant::now() < deadline, "the child did not connect");
    }
}

fn finish(o: &Owner, mut child: Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        o.w.progress();
        if let Some(st) = child.try_wait().unwrap() {
            let err = stderr_of(&mut child);
            assert!(st.success(), "child failed ({st}):\n{err}");
            return;
        }
        assert!(Instant::now() < deadline, "child did not finish in time");
    }
}

// ----- the children -------------------------------------------------------------------------

#[test]
fn child_entry() {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return;
    };
    let tls = std::env::var("COURIER_TLS").unwrap();
    match role.as_str() {
        "nodriver" => return child_no_driver(),
        "nodevice" => return child_no_device(),
        "staging" => return child_staging(),
        _ => {}
    }
    let port = port_from_env();
    let keys = keys_from_env();
    let c = ctx(&tls);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = dial(&w, port, 1);
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    match role.as_str() {
        "twosided" => child_two_sided(&c, &w, &ep),
        "deferred" => child_deferred(&c, &w, &ep),
        "rma" => child_rma(&c, &w, &ep, &keys),
        other => panic!("unknown role {other}"),
    }
    ep.flush().unwrap();
    std::process::exit(0);
}

/// Whether a device message of `n` bytes on `tls` is read through the sender's IPC handle
/// by a receiver that can open it (else it is a host copy).
fn read_through_ipc(tls: &str, n: usize) -> bool {
    tls != "tcp" && n >= 16 << 10 // COURIER_CUDA_IPC_THRESH's default
}

fn child_two_sided(c: &Context, w: &Worker, ep: &Endpoint) {
    let tls = std::env::var("COURIER_TLS").unwrap();
    // The stand-in can be told to refuse every IPC handle here: the owner then pushes a
    // host copy of what it offered as device memory.
    let can_open = real() || std::env::var_os("MOCKCUDA_NO_IPC_OPEN").is_none();
    for (i, &n) in SIZES.iter().enumerate() {
        let i = i as u64;
        let (a, b) = (pattern(n, i as u8), pattern(n, i as u8 + 50));
        // Device to the owner's device.
        let dev = device(c, n);
        dev.write(0, &a).unwrap();
        send(w, ep, buf(&dev, n), 100 + i);
        // The owner's device to host.
        let mut host = vec![0u8; n];
        let reads = w.rndv_copies().unwrap().device;
        let d2h = (!real()).then(|| thread_count(1));
        let into = Buf::One((host.as_mut_ptr() as usize, n));
        let got = recv(w, into, 200 + i).unwrap();
        assert_eq!(got.length, n);
        assert!(
            host == a,
            "{n} bytes from the owner's device came back different"
        );
        assert_eq!(
            w.rndv_copies().unwrap().device > reads,
            can_open && read_through_ipc(&tls, n),
            "{n} bytes: read through the owner's IPC handle"
        );
        if let Some(d2h) = d2h.filter(|_| can_open && read_through_ipc(&tls, n)) {
            // Into host memory through a page-locked bounce buffer, a megabyte at a time.
            assert_eq!(
                thread_count(1) - d2h,
                n.div_ceil(1 << 20) as u64,
                "{n} bytes"
            );
        }
        host.copy_from_slice(&b);
        // Host to the owner's device.
        send(w, ep, hbuf(&host), 300 + i);
        // The owner's host to device.
        let dev2 = device(c, n);
        let got = recv(w, buf(&dev2, n), 400 + i).unwrap();
        assert_eq!(got.length, n);
        assert!(
            contents(&dev2, n) == b,
            "{n} bytes into device memory differ"
        );
    }
    // Truncated into the owner's small device buffer.
    let dev = device(c, 1000);
    dev.write(0, &pattern(1000, 9)).unwrap();
    send(w, ep, buf(&dev, 1000), 500);
    // Active messages from device memory: eager, and rendezvous.
    let am = device(c, 2 << 20);
    am.write(0, &pattern(2 << 20, 77)).unwrap();
    for n in [100usize, 2 << 20] {
        // SAFETY: the region outlives the wait.
        let s =
            unsafe { ep.am_send_raw(7, b"hdr", buf(&am, n), AmFlags::default(), Callback::None) }
                .unwrap();
        wait(w, s).unwrap();
    }
    // A stream from device memory.
    let st = device(c, 300_000);
    st.write(0, &pattern(300_000, 3)).unwrap();
    // SAFETY: the region outlives the wait.
    let s = unsafe { ep.stream_send_raw(buf(&st, 300_000), Callback::None) }.unwrap();
    wait(w, s).unwrap();
    let mut done = [0u8; 1];
    recv(w, Buf::One((done.as_mut_ptr() as usize, 1)), 999).unwrap();
}

/// Messages a phase of `tag_receives_into_device_memory_take_no_whole_host_copy` sends.
const DEFERRED_K: usize = 6;
/// Their lengths: device to device, host to device (rendezvous), eager host to device.
const DEFERRED_LENS: [usize; 3] = [(2 << 20) + 3, (3 << 20) + 5, 1000];

/// Post `DEFERRED_K` receives of `n` bytes each into `dst`, tags `base + i`, for those `i`
/// that `which` keeps; their requests.
fn post_into(
    w: &Worker,
    dst: &Memory,
    n: usize,
    base: u64,
    which: impl Fn(usize) -> bool,
) -> Vec<Started> {
    (0..DEFERRED_K)
        .filter(|&i| which(i))
        .map(|i| {
            let b = Buf::One((dst.as_ptr() as usize + i * n, n));
            // SAFETY: `dst` outlives the waits of the caller.
            unsafe { w.tag_recv_raw(b, base + i as u64, u64::MAX, Callback::None) }.unwrap()
        })
        .collect()
}

fn child_deferred(c: &Context, w: &Worker, ep: &Endpoint) {
    let check = |dst: &Memory, n: usize, seed: u8, what: &str| {
        for i in 0..DEFERRED_K {
            let mut got = vec![0u8; n];
            dst.read(i * n, &mut got).unwrap();
            assert!(
                got == pattern(n, seed + i as u8),
                "{what}: message {i} of {n} bytes differs"
            );
        }
    };
    let counts = || (!real()).then(|| [mock_count(5), thread_count(0), thread_count(2)]);
    let ready = |phase: u64| send(w, ep, hbuf(&[phase as u8]), 900 + phase);

    // Phase `p`: receives of `n` bytes posted before the owner is told to send, waited
    // for and checked; what the driver did meanwhile (page-locked allocations,
    // host-to-device and device-to-device copies), where it can be counted.
    let phase = |p: u64, n: usize, what: &str| {
        let dst = device(c, DEFERRED_K * n);
        let before = counts();
        let reqs = post_into(w, &dst, n, p * 100, |_| true);
        ready(p);
        for r in reqs {
            assert_eq!(wait(w, r).unwrap().length, n);
        }
        let after = counts();
        check(&dst, n, 10 * p as u8, what);
        before
            .zip(after)
            .map(|(b, a)| [a[0] - b[0], a[1] - b[1], a[2] - b[2]])
    };

    // 1. From the owner's device memory, through its IPC handle: device to device.
    if let Some(d) = phase(1, DEFERRED_LENS[0], "device to device") {
        let k = DEFERRED_K as u64;
        assert_eq!(
            d,
            [0, 0, k],
            "page-locked allocations, copies to and on the device"
        );
    }

    // 2. From the owner's host memory: into a page-locked host copy of each message while
    // the pool has room; with no room (COURIER_CUDA_STAGING=2m keeps only what the two
    // bounce buffers need, which host copies leave free), read a megabyte at a time into
    // two page-locked bounce buffers, reused, and copied to the device from there.
    let bounced = std::env::var("COURIER_CUDA_STAGING").is_ok_and(|v| v == "2m");
    let n = DEFERRED_LENS[1];
    match phase(2, n, "host to device") {
        Some(d) if bounced => {
            assert!(
                d[0] <= 2,
                "{} page-locked buffers for {DEFERRED_K} messages (two bounce buffers, reused)",
                d[0]
            );
            let pieces = (DEFERRED_K * n.div_ceil(1 << 20)) as u64;
            assert!(
                d[1] >= pieces,
                "{} host-to-device copies, at least {pieces} pieces expected",
                d[1]
            );
        }
        Some(d) => {
            assert!(
                (1..=DEFERRED_K as u64).contains(&d[0]),
                "{} page-locked host copies for {DEFERRED_K} messages",
                d[0]
            );
            assert_eq!(
                d[1], DEFERRED_K as u64,
                "one host-to-device copy a message, from its host copy"
            );
        }
        None => {}
    }

    // 3. Eager messages, straight from the frame to the device: half of them matched as
    // they arrive, half found waiting when their receives are posted.
    let n = DEFERRED_LENS[2];
    let dst = device(c, DEFERRED_K * n);
    let before = counts();
    let half = DEFERRED_K / 2;
    let mut reqs = post_into(w, &dst, n, 300, |i| i >= half);
    ready(3);
    let deadline = Instant::now() + LIMIT;
    while w
        .tag_probe(300 + half as u64 - 1, u64::MAX)
        .unwrap()
        .is_none()
    {
        w.progress();
        assert!(
            Instant::now() < deadline,
            "the eager messages did not arrive"
        );
    }
    reqs.extend(post_into(w, &dst, n, 300, |i| i < half));
    for r in reqs {
        assert_eq!(wait(w, r).unwrap().length, n);
    }
    let after = counts();
    check(&dst, n, 30, "eager");
    if let (Some(b), Some(a)) = (before, after) {
        assert_eq!(a[0] - b[0], 0, "page-locked host copies for eager receives");
        assert_eq!(
            a[1] - b[1],
            DEFERRED_K as u64,
            "one host-to-device copy a message"
        );
    }
    ready(4);
}

fn child_rma(c: &Context, w: &Worker, ep: &Endpoint, keys: &[Vec<u8>]) {
    // keys[0]: the owner's device region; keys[1]: its host region for signals.
    let rk = ep.rkey_unpack(&keys[0]).unwrap();
    let sk = ep.rkey_unpack(&keys[1]).unwrap();
    // On this host the owner's device memory is opened here through its IPC handle; over
    // tcp it is reached through the owner.
    let tcp = std::env::var("COURIER_TLS").unwrap() == "tcp";
    assert_eq!(rk.path(), if tcp { "remote" } else { "cuda_ipc" });
    // keys[2]: a second region in the same allocation, reached the same way.
    let sub = ep.rkey_unpack(&keys[2]).unwrap();
    assert_eq!(sub.path(), rk.path(), "a second region of the allocation");
    let (sub_base, _) = sub.bounds();
    ep.put(&pattern(8192, 77), sub_base, &sub).unwrap();
    let mut back = vec![0u8; 8192];
    ep.get(&mut back, sub_base, &sub).unwrap();
    assert!(back == pattern(8192, 77), "the second region's bytes");
    if !real() {
        assert_eq!(mock_count(4), u64::from(!tcp), "IPC handles opened");
    }
    let (base, len) = rk.bounds();
    let dev = device(c, len as usize);
    for (i, n, off) in sizes_in(len) {
        let data = pattern(n, i as u8);
        // Host to the owner's device, and back into host memory.
        ep.put(&data, base + off, &rk).unwrap();
        let mut back = vec![0u8; n];
        ep.get(&mut back, base + off, &rk).unwrap();
        assert!(back == data, "{n} bytes put and got back differ");
        // Device to device, both ways.
        let data = pattern(n, i as u8 + 100);
        dev.write(0, &data).unwrap();
        // SAFETY: the region outlives the waits.
        let s = unsafe { ep.put_raw(buf(&dev, n), base + off, &rk, Callback::None) }.unwrap();
        wait(w, s).unwrap();
        dev.write(0, &vec![0u8; n]).unwrap();
        // SAFETY: as above.
        let s = unsafe { ep.get_raw(buf(&dev, n), base + off, &rk, Callback::None) }.unwrap();
        wait(w, s).unwrap();
        assert!(
            contents(&dev, n) == data,
            "{n} device bytes put and got back differ"
        );
    }
    ep.flush().unwrap();
    // Atomics on device memory are refused (here, or by the owner, which goes on serving).
    let e = ep
        .atomic(AtomicOp::Add, 1, 0, base, &rk, false)
        .and_then(|r| r.wait())
        .expect_err("atomic on device memory");
    assert_eq!(e.status(), Status::Unsupported, "{e}");
    // A forged secret is refused before a byte moves, on either path.
    let mut forged = keys[0].clone();
    forged[courier::wire::rkey::field::SECRET.start] ^= 0x40;
    courier::wire::rkey::reseal(&mut forged);
    let fk = ep.rkey_unpack(&forged).unwrap();
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ep.put_nb(&[9u8; 64], base, &fk) }
        .and_then(|r| r.wait())
        .and_then(|_| ep.flush())
        .expect_err("forged key");
    assert_eq!(e.status(), Status::InvalidKey, "{e}");
    ep.flush().unwrap();
    // A signaling put: device data into device memory, the signal into host memory.
    let sig_data = pattern(len as usize, 200);
    dev.write(0, &sig_data).unwrap();
    let (sbase, _) = sk.bounds();
    // SAFETY: the region outlives the wait.
    let s = unsafe {
        ep.put_signal_raw(
            buf(&dev, len as usize),
            base,
            &rk,
            sbase,
            &sk,
            1234,
            SignalOp::Set,
            Callback::None,
        )
    }
    .unwrap();
    wait(w, s).unwrap();
    ep.flush().unwrap();
    let mut done = [0u8; 1];
    recv(w, Buf::One((done.as_mut_ptr() as usize, 1)), 999).unwrap();
}

fn child_staging() {
    // A worker connected to itself: each message is gathered from device memory into a
    // host copy and delivered through one into device memory.
    let (c, w, ep) = connected_to_itself();
    for n in [100usize, 70_000, 1 << 20] {
        let (src, dst) = (device(&c, n), device(&c, n));
        for i in 0..40u8 {
            src.write(0, &pattern(n, i)).unwrap();
            // SAFETY: both regions outlive the waits.
            let r = unsafe { w.tag_recv_raw(buf(&dst, n), 1, u64::MAX, Callback::None) }.unwrap();
            // SAFETY: as above.
            let s = unsafe { ep.tag_send_raw(buf(&src, n), 1, false, Callback::None) }.unwrap();
            wait(&w, s).unwrap();
            wait(&w, r).unwrap();
            assert!(contents(&dst, n) == pattern(n, i), "{n} bytes, round {i}");
        }
    }
    if !real() {
        // Two host copies at a time (the send's and the receive's) per size: 120
        // transfers of three sizes take six page-locked buffers, reused.
        let made = mock_count(5);
        assert!(
            (3..=6).contains(&made),
            "{made} page-locked allocations for 120 staged transfers"
        );
    }
    std::process::exit(0);
}

fn child_no_driver() {
    let c = ctx_with("all", "/nonexistent/libcuda.so.1");
    let e = c
        .mem_map(MemMapParams::allocate(64).memory_type(MemoryType::Cuda))
        .err()
        .expect("no driver");
    assert_eq!(e.status(), Status::NoDevice, "{e}");
    assert!(e.detail().contains("could not be loaded"), "{e}");
    // Host memory goes on working.
    let m = c.mem_map(MemMapParams::allocate(64)).unwrap();
    m.write(0, b"host").unwrap();
    std::process::exit(0);
}

fn child_no_device() {
    let c = ctx("all");
    let e = c
        .mem_map(MemMapParams::allocate(64).memory_type(MemoryType::Cuda))
        .err()
        .expect("no device");
    assert_eq!(e.status(), Status::NoDevice, "{e}");
    assert!(e.detail().contains("CUDA_ERROR_NO_DEVICE"), "{e}");
    std::process::exit(0);
}

// ----- the tests ----------------------------------------------------------------------------

/// An active message as its handler saw it: eager data, or the rendezvous descriptor.
type Arrived = (Vec<u8>, Option<AmRndv>);

fn two_sided(tls: &str, child_env: &[(&str, &str)]) {
    let o = owner(tls);
    let got_am: Arc<Mutex<Vec<Arrived>>> = Arc::default();
    let g2 = got_am.clone();
    o.w.am_set_handler(7, move |m| {
        assert_eq!(m.header(), b"hdr");
        let d = m.data().to_vec();
        let r = m.take_rndv();
        g2.lock().unwrap().push((d, r));
    })
    .unwrap();
    let child = spawn(tls, "twosided", o.port, &[], child_env);
    let ep = first_ep(&o);
    let counts = || (!real()).then(|| (thread_count(0), thread_count(1)));
    let before = counts();
    for (i, &n) in SIZES.iter().enumerate() {
        let i = i as u64;
        let (a, b) = (pattern(n, i as u8), pattern(n, i as u8 + 50));
        let dev = device(&o.c, n);
        let reads = o.w.rndv_copies().unwrap().device;
        let d2d = (!real()).then(|| thread_count(2));
        let got = recv(&o.w, buf(&dev, n), 100 + i).unwrap();
        assert_eq!(got.length, n);
        assert!(contents(&dev, n) == a, "{n} device-to-device bytes differ");
        assert_eq!(
            o.w.rndv_copies().unwrap().device > reads,
            read_through_ipc(tls, n),
            "{n} bytes: read through the child's IPC handle"
        );
        if let Some(d2d) = d2d {
            // Read through the handle, the bytes went device to device, not through the
            // receive's host copy, in one copy (not in pieces, as CPU copies are).
            assert_eq!(
                thread_count(2) - d2d,
                u64::from(read_through_ipc(tls, n)),
                "{n} bytes: device-to-device copies"
            );
        }
        send(&o.w, &ep, buf(&dev, n), 200 + i);
        let dev2 = device(&o.c, n);
        recv(&o.w, buf(&dev2, n), 300 + i).unwrap();
        assert!(contents(&dev2, n) == b, "{n} host-to-device bytes differ");
        send(&o.w, &ep, hbuf(&b), 400 + i);
    }
    if let (Some((htod, dtoh)), Some((htod2, dtoh2))) = (before, counts()) {
        assert!(
            htod2 > htod && dtoh2 > dtoh,
            "copies went through the driver"
        );
    }
    // Truncation: the first 100 bytes land, the real length is reported.
    let small = device(&o.c, 100);
    let e = recv(&o.w, buf(&small, 100), 500).expect_err("truncated");
    assert_eq!(e.status(), Status::MessageTruncated, "{e}");
    assert!(contents(&small, 100) == pattern(1000, 9)[..100]);
    // Active messages: the eager one's data arrives in host memory for the handler; the
    // rendezvous one is received into device memory.
    let deadline = Instant::now() + Duration::from_secs(30);
    while got_am.lock().unwrap().len() < 2 {
        o.w.progress();
        assert!(Instant::now() < deadline, "active messages did not arrive");
    }
    let mut msgs = std::mem::take(&mut *got_am.lock().unwrap());
    let (eager, none) = msgs.remove(0);
    assert!(none.is_none() && eager == pattern(2 << 20, 77)[..100]);
    let (_, rndv) = msgs.remove(0);
    let rndv = rndv.expect("a 2 MiB active message is a rendezvous");
    let amdev = device(&o.c, 2 << 20);
    // SAFETY: the region outlives the wait; Courier copies into it with the driver only.
    let slot = unsafe { std::slice::from_raw_parts_mut(amdev.as_ptr(), 2 << 20) };
    o.w.am_recv_data(rndv, slot).unwrap();
    assert!(
        contents(&amdev, 2 << 20) == pattern(2 << 20, 77),
        "rendezvous AM into device memory"
    );
    // The stream, exactly, into device memory.
    let sdev = device(&o.c, 300_000);
    // SAFETY: the region outlives the wait.
    let s = unsafe { ep.stream_recv_raw(buf(&sdev, 300_000), true, Callback::None) }.unwrap();
    let got = wait(&o.w, s).unwrap();
    assert_eq!(got.length, 300_000);
    assert!(
        contents(&sdev, 300_000) == pattern(300_000, 3),
        "stream into device memory"
    );
    send(&o.w, &ep, hbuf(&[1]), 999);
    finish(&o, child);
}

#[test]
fn tag_am_stream_with_device_buffers_shm() {
    two_sided("all", &[]);
}

#[test]
fn tag_am_stream_with_device_buffers_tcp() {
    two_sided("tcp", &[]);
}

/// The child cannot open the owner's IPC handles: the owner's device messages it was
/// offered as device memory reach it as host copies the owner pushes.
#[test]
fn tag_from_device_memory_a_peer_cannot_open() {
    two_sided("all", &[("MOCKCUDA_NO_IPC_OPEN", "1")]);
}

/// A tag receive into device memory makes no host copy of the whole message when the
/// bytes need not pass through one: a same-host peer's device memory is read device to
/// device, and an eager message goes from its frame to the device. A peer's host memory
/// goes into a page-locked host copy while the pool has room, else through two reused
/// page-locked pieces: the child runs twice, with the default pool and with one too small
/// for a host copy. (Children of their own, to count the driver's work there.)
#[test]
fn tag_receives_into_device_memory_take_no_whole_host_copy() {
    deferred_receives(&[]);
    deferred_receives(&[("COURIER_CUDA_STAGING", "2m")]);
}

fn deferred_receives(child_env: &[(&str, &str)]) {
    let o = owner("all");
    let child = std::cell::RefCell::new(spawn("all", "deferred", o.port, &[], child_env));
    let ep = first_ep(&o);
    // The child's word that it is ready for the next phase; a child that failed instead
    // (its receives are not bound to the endpoint, so nothing else would end the wait) is
    // reported with what it printed.
    let ready = |phase: u64| {
        let mut b = [0u8; 1];
        // SAFETY: `b` outlives the wait below.
        let s = unsafe {
            o.w.tag_recv_raw(
                Buf::One((b.as_mut_ptr() as usize, 1)),
                900 + phase,
                u64::MAX,
                Callback::None,
            )
        }
        .unwrap();
        // SAFETY: as above.
        let mut r = unsafe { o.w.request_for(s) };
        let deadline = Instant::now() + LIMIT;
        while !r.is_done() {
            o.w.progress();
            let mut c = child.borrow_mut();
            if let Some(st) = c.try_wait().unwrap() {
                // The child may have sent its word and ended before this side read it
                // (its last word is sent just before it exits): read what is in flight.
                let drain = Instant::now() + LIMIT;
                while !r.is_done() && Instant::now() < drain {
                    o.w.progress();
                }
                if r.is_done() {
                    break;
                }
                panic!(
                    "the child ended ({st}) before phase {phase}:\n{}",
                    stderr_of(&mut c)
                );
            }
            assert!(
                Instant::now() < deadline,
                "the child was not ready for phase {phase}"
            );
        }
        r.wait().unwrap();
    };
    let send_all = |data: &[Buf], base: u64| {
        let reqs: Vec<Started> = data
            .iter()
            .enumerate()
            // SAFETY: the buffers outlive the waits below.
            .map(|(i, b)| {
                unsafe { ep.tag_send_raw(b.clone(), base + i as u64, false, Callback::None) }
                    .unwrap()
            })
            .collect();
        for r in reqs {
            wait(&o.w, r).unwrap();
        }
    };
    let n = DEFERRED_LENS[0];
    let src = device(&o.c, DEFERRED_K * n);
    for i in 0..DEFERRED_K {
        src.write(i * n, &pattern(n, 10 + i as u8)).unwrap();
    }
    let bufs: Vec<Buf> = (0..DEFERRED_K)
        .map(|i| Buf::One((src.as_ptr() as usize + i * n, n)))
        .collect();
    ready(1);
    send_all(&bufs, 100);
    for (phase, seed) in [(2u64, 20u8), (3, 30)] {
        let n = DEFERRED_LENS[phase as usize - 1];
        let host: Vec<Vec<u8>> = (0..DEFERRED_K)
            .map(|i| pattern(n, seed + i as u8))
            .collect();
        let bufs: Vec<Buf> = host.iter().map(|h| hbuf(h)).collect();
        ready(phase);
        send_all(&bufs, phase * 100);
    }
    ready(4);
    finish(&o, child.into_inner());
}

fn rma(tls: &str) {
    let o = owner(tls);
    let len = (4 << 20) + 64;
    let region = device(&o.c, len);
    region.write(0, &vec![0u8; len]).unwrap();
    let owner_copies = (!real()).then(|| thread_count(0));
    let sig = o.c.mem_map(MemMapParams::allocate(64)).unwrap();
    // A second region inside the same device allocation: the peer opens the allocation's
    // IPC handle once for both (a driver refuses to open a handle twice).
    let sub =
        o.c.mem_map(
            // SAFETY: inside a live allocation of the test that outlives the region, or an address
            // mem_map refuses (the test checks), so no region is made of it.
            unsafe { MemMapParams::register(region.as_ptr().wrapping_add(4096), 8192) }
                .memory_type(MemoryType::Cuda),
        )
        .unwrap();
    let child = spawn(
        tls,
        "rma",
        o.port,
        &[
            region.pack_rkey().unwrap(),
            sig.pack_rkey().unwrap(),
            sub.pack_rkey().unwrap(),
        ],
        &[],
    );
    let mut child = child;
    let ep = first_ep(&o);
    let deadline = Instant::now() + LIMIT;
    while sig.signal_fetch(0).unwrap() != 1234 {
        o.w.progress();
        if let Some(st) = child.try_wait().unwrap() {
            let err = stderr_of(&mut child);
            panic!("the child exited ({st}) before it signalled:\n{err}");
        }
        assert!(Instant::now() < deadline, "no signal");
    }
    assert!(
        contents(&region, len) == pattern(len, 200),
        "signal seen before the device data was in place"
    );
    // Over tcp this process copied every put into its device memory; on this host the
    // child did, through the IPC handle, with its own driver.
    if let Some(before) = owner_copies {
        assert_eq!(thread_count(0) > before, tls == "tcp");
    }
    // SAFETY: the buffer outlives the wait below.
    let s = unsafe { ep.tag_send_raw(hbuf(&[1]), 999, false, Callback::None) }
        .and_then(|s| wait(&o.w, s));
    if let Err(e) = s {
        let st = child.wait();
        let err = stderr_of(&mut child);
        panic!("the last message to the child failed ({e}); the child: {st:?}\n{err}");
    }
    finish(&o, child);
}

#[test]
fn put_get_signal_into_device_memory_shm() {
    rma("all");
}

#[test]
fn put_get_signal_into_device_memory_tcp() {
    rma("tcp");
}

#[test]
fn map_query_copy_and_refusals() {
    let c = ctx("all");
    let m = device(&c, 1 << 20);
    assert_eq!(m.query().memory_type, MemoryType::Cuda);
    let p = pattern(1 << 20, 5);
    m.write(0, &p).unwrap();
    assert!(contents(&m, 1 << 20) == p);
    let mut out = [0u8; 16];
    assert_eq!(
        m.read((1 << 20) - 8, &mut out).unwrap_err().status(),
        Status::OutOfRange
    );
    // Signal words must be host memory.
    assert_eq!(m.signal_fetch(0).unwrap_err().status(), Status::Unsupported);
    // Registering device memory: inside its allocation, found out when registered as host,
    // refused past its end or for host memory claimed as device memory.
    let sub = c
        .mem_map(
            // SAFETY: inside a live allocation of the test that outlives the region, or an address
            // mem_map refuses (the test checks), so no region is made of it.
            unsafe { MemMapParams::register(m.as_ptr().wrapping_add(4096), 8192) }
                .memory_type(MemoryType::Cuda),
        )
        .unwrap();
    assert_eq!(sub.query().memory_type, MemoryType::Cuda);
    // SAFETY: inside a live allocation of the test that outlives the region, or an address mem_map
    // refuses (the test checks), so no region is made of it.
    let found = c
        .mem_map(unsafe { MemMapParams::register(m.as_ptr(), 64) })
        .unwrap();
    assert_eq!(found.query().memory_type, MemoryType::Cuda);
    let e = c
        .mem_map(
            // SAFETY: inside a live allocation of the test that outlives the region, or an address
            // mem_map refuses (the test checks), so no region is made of it.
            unsafe { MemMapParams::register(m.as_ptr().wrapping_add(4096), 1 << 20) }
                .memory_type(MemoryType::Cuda),
        )
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::OutOfRange, "{e}");
    let mut host = vec![0u8; 64];
    let e = c
        // SAFETY: inside a live allocation of the test that outlives the region, or an address
        // mem_map refuses (the test checks), so no region is made of it.
        .mem_map(
            unsafe { MemMapParams::register(host.as_mut_ptr(), 64) }.memory_type(MemoryType::Cuda),
        )
        .err()
        .unwrap();
    assert_eq!(e.status(), Status::InvalidParam, "{e}");
    let gone = m.as_ptr();
    drop((sub, found, m));
    // Unmapping freed the allocation: the driver no longer knows the address.
    let e = c
        // SAFETY: inside a live allocation of the test that outlives the region, or an address
        // mem_map refuses (the test checks), so no region is made of it.
        .mem_map(unsafe { MemMapParams::register(gone, 64) }.memory_type(MemoryType::Cuda))
        .err()
        .expect("freed device memory");
    assert_eq!(e.status(), Status::InvalidParam, "{e}");
}

#[test]
fn same_worker_device_to_device() {
    // The self transport and a key of this very context (copied here, with the driver).
    let (c, w, ep) = connected_to_itself();
    let n = 70_000;
    let (src, dst) = (device(&c, n), device(&c, n));
    src.write(0, &pattern(n, 1)).unwrap();
    // SAFETY: both regions outlive the waits.
    let r = unsafe { w.tag_recv_raw(buf(&dst, n), 5, u64::MAX, Callback::None) }.unwrap();
    // SAFETY: as above.
    let s = unsafe { ep.tag_send_raw(buf(&src, n), 5, false, Callback::None) }.unwrap();
    wait(&w, s).unwrap();
    wait(&w, r).unwrap();
    assert!(contents(&dst, n) == pattern(n, 1));
    let rk = ep.rkey_unpack(&dst.pack_rkey().unwrap()).unwrap();
    assert_eq!(rk.path(), "local");
    let (base, _) = rk.bounds();
    ep.put(&pattern(100, 2), base + 10, &rk).unwrap();
    let mut back = [0u8; 100];
    ep.get(&mut back, base + 10, &rk).unwrap();
    assert!(back[..] == pattern(100, 2)[..]);
    let e = ep
        .atomic(AtomicOp::Add, 1, 0, base, &rk, false)
        .err()
        .expect("atomics need host memory");
    assert_eq!(e.status(), Status::Unsupported);
}

/// Another context of this very process owns device memory: its key is used through the
/// allocation itself (a process cannot open its own IPC handles), so puts and gets are
/// device copies made by the caller, with no help from the owner's worker.
#[test]
fn another_context_of_this_process_reaches_device_memory_directly() {
    let (c1, c2) = (ctx("all"), ctx("all"));
    let (w1, w2) = (
        Worker::new(&c1, WorkerParams::default()).unwrap(),
        Worker::new(&c2, WorkerParams::default()).unwrap(),
    );
    let ep = w2
        .connect(&w1.address().unwrap(), EndpointParams::default())
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    while !ep.is_connected().unwrap() {
        w1.progress();
        w2.progress();
        assert!(Instant::now() < deadline, "no connection");
    }
    let n = 300_000;
    let region = device(&c1, n + 64);
    region.write(0, &vec![0u8; n + 64]).unwrap();
    let rk = ep.rkey_unpack(&region.pack_rkey().unwrap()).unwrap();
    assert_eq!(rk.path(), "cuda_ipc");
    let (base, len) = rk.bounds();
    let d2d_before = (!real()).then(|| thread_count(2));
    // From host memory, then from this context's device memory; back both ways. Only w2
    // progresses from here on: an operation that needed the owner would not complete.
    let data = pattern(n, 31);
    // SAFETY: the buffer outlives the wait.
    let s = unsafe { ep.put_raw(hbuf(&data), base + 64, &rk, Callback::None) }.unwrap();
    wait(&w2, s).unwrap();
    assert!(contents(&region, n + 64)[64..] == data[..]);
    let mine = device(&c2, n);
    mine.write(0, &pattern(n, 32)).unwrap();
    // SAFETY: the regions outlive the waits.
    let s = unsafe { ep.put_raw(buf(&mine, n), base, &rk, Callback::None) }.unwrap();
    wait(&w2, s).unwrap();
    let mut back = vec![0u8; n];
    let into = Buf::One((back.as_mut_ptr() as usize, n));
    // SAFETY: as above.
    let s = unsafe { ep.get_raw(into, base, &rk, Callback::None) }.unwrap();
    wait(&w2, s).unwrap();
    assert!(back == pattern(n, 32), "device put, host get");
    mine.write(0, &vec![0u8; n]).unwrap();
    // SAFETY: as above.
    let s = unsafe { ep.get_raw(buf(&mine, n), base, &rk, Callback::None) }.unwrap();
    wait(&w2, s).unwrap();
    assert!(contents(&mine, n) == pattern(n, 32), "device get");
    if let Some(before) = d2d_before {
        assert!(
            thread_count(2) >= before + 2,
            "device-to-device copies here"
        );
    }
    // Past the region's end: refused, nothing written.
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let e = unsafe { ep.put_nb(&[1u8; 128], base + len - 64, &rk) }
        .and_then(|r| r.wait())
        .expect_err("past the end");
    assert_eq!(e.status(), Status::OutOfRange, "{e}");
}

/// A driver entry point by name, from the library Courier loaded (already in memory).
fn driver_fn(name: &std::ffi::CStr) -> *mut std::ffi::c_void {
    let lib = CString::new(driver_lib()).unwrap();
    // SAFETY: dlopen/dlsym of the library Courier loaded; the reference taken is dropped
    // at once, and Courier's own keeps it loaded.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null(), "cannot load {}", driver_lib());
        let f = libc::dlsym(h, name.as_ptr());
        assert!(!f.is_null(), "{name:?} missing");
        libc::dlclose(h);
        f
    }
}

type CtxFn = extern "C" fn(*mut std::ffi::c_void) -> i32;

/// The context current on this thread (`cuCtxGetCurrent`).
fn current_ctx() -> *mut std::ffi::c_void {
    // SAFETY: cuCtxGetCurrent(CUcontext *) in both drivers.
    let f: CtxFn = unsafe { std::mem::transmute(driver_fn(c"cuCtxGetCurrent")) };
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    assert_eq!(f((&mut out as *mut *mut std::ffi::c_void).cast()), 0);
    out
}

/// Make a context of the application's own current on this thread: on a real GPU a new
/// one (`cuCtxCreate`, which Courier never uses), with the stand-in a made-up handle.
fn applications_ctx() -> *mut std::ffi::c_void {
    if real() {
        type Create = extern "C" fn(*mut *mut std::ffi::c_void, u32, i32) -> i32;
        // SAFETY: cuCtxCreate_v2(CUcontext *, unsigned flags, CUdevice).
        let f: Create = unsafe { std::mem::transmute(driver_fn(c"cuCtxCreate_v2")) };
        let mut c: *mut std::ffi::c_void = std::ptr::null_mut();
        assert_eq!(f(&mut c, 0, 0), 0, "cuCtxCreate");
        c
    } else {
        let theirs = 0x1234usize as *mut std::ffi::c_void;
        // SAFETY: cuCtxSetCurrent(CUcontext) of the stand-in, which takes any handle.
        let f: CtxFn = unsafe { std::mem::transmute(driver_fn(c"cuCtxSetCurrent")) };
        assert_eq!(f(theirs), 0);
        theirs
    }
}

#[test]
fn the_applications_own_context_is_left_current() {
    // A thread where the application made another context current: Courier's copies run
    // in its own context (a stream is refused in any other: the stand-in checks it, and
    // so does a real driver) and the application's is current again afterwards.
    let c = ctx("all");
    let m = device(&c, 4096);
    std::thread::spawn(move || {
        let theirs = applications_ctx();
        assert_eq!(current_ctx(), theirs);
        m.write(0, &pattern(4096, 8)).unwrap();
        assert!(contents(&m, 4096) == pattern(4096, 8));
        assert_eq!(current_ctx(), theirs);
    })
    .join()
    .unwrap();
}

/// A thread that never touched CUDA (no context current) moves device memory: the
/// driver is asked about the buffers and copies them in Courier's context.
#[test]
fn a_thread_with_no_context_moves_device_memory() {
    let c = ctx("all");
    let n = 100_000;
    let (src, dst) = (device(&c, n), device(&c, n));
    src.write(0, &pattern(n, 4)).unwrap();
    std::thread::spawn(move || {
        if real() {
            assert!(current_ctx().is_null(), "a new thread has no context");
        }
        let w = Worker::new(&c, WorkerParams::default()).unwrap();
        let ep = w
            .connect(&w.address().unwrap(), EndpointParams::default())
            .unwrap();
        // SAFETY: both regions outlive the waits.
        let r = unsafe { w.tag_recv_raw(buf(&dst, n), 6, u64::MAX, Callback::None) }.unwrap();
        // SAFETY: as above.
        let s = unsafe { ep.tag_send_raw(buf(&src, n), 6, false, Callback::None) }.unwrap();
        wait(&w, s).unwrap();
        wait(&w, r).unwrap();
        assert!(contents(&dst, n) == pattern(n, 4));
    })
    .join()
    .unwrap();
}

/// Host copies of device memory are page-locked buffers from the driver, reused from one
/// operation to the next (a process of its own, to count the driver's allocations).
#[test]
fn staging_buffers_are_page_locked_and_reused() {
    let mut child = spawn("all", "staging", 0, &[], &[]);
    let st = child.wait().unwrap();
    let err = stderr_of(&mut child);
    assert!(st.success(), "{err}");
}

#[test]
fn no_driver_or_no_device_is_a_clear_error() {
    for (role, env) in [
        ("nodriver", vec![]),
        // The stand-in's switch, and the real driver's: either way it sees no device.
        (
            "nodevice",
            vec![("MOCKCUDA_DEVICES", "0"), ("CUDA_VISIBLE_DEVICES", "")],
        ),
    ] {
        let mut child = spawn("all", role, 0, &[], &env);
        let st = child.wait().unwrap();
        let err = stderr_of(&mut child);
        assert!(st.success(), "{role}: {err}");
    }
}
