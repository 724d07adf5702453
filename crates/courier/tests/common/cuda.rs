//! CUDA device memory for tests/cuda.rs and cuda_memory.rs: the driver, contexts, device
//! buffers, and children (the test binary re-run with `COURIER_TEST_ROLE`).
//!

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
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use courier::*;

use super::{Owner, child_command, dial, keys_from_env, keys_hex, port_from_env, stderr_of};

#[path = "../mockcuda/mod.rs"]
mod mockcuda;

/// Whether the tests run on a real GPU (`COURIER_TEST_CUDA=real`).
pub fn real() -> bool {
    static REAL: OnceLock<bool> = OnceLock::new();
    *REAL.get_or_init(|| std::env::var("COURIER_TEST_CUDA").is_ok_and(|v| v == "real"))
}

/// The driver Courier loads in these tests: the machine's own on a real GPU, else the
/// stand-in, built once per test binary. Its path.
pub fn driver_lib() -> &'static str {
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
pub fn mock_count(kind: i32) -> u64 {
    mock_fn(c"mockcuda_count")(kind)
}

/// The copies of a kind made on this thread (tests run side by side in one process).
pub fn thread_count(kind: i32) -> u64 {
    mock_fn(c"mockcuda_thread_count")(kind)
}

pub fn mock_fn(name: &std::ffi::CStr) -> extern "C" fn(i32) -> u64 {
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

pub fn ctx_with(tls: &str, lib: &str) -> Context {
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

pub fn ctx(tls: &str) -> Context {
    ctx_with(tls, driver_lib())
}

/// A context, a worker of it and an endpoint of that worker to itself (the self transport).
pub fn connected_to_itself() -> (Context, Worker, Endpoint) {
    let c = ctx("all");
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    (c, w, ep)
}

/// `n` bytes that differ with `seed` and repeat nowhere in a message (so a piece copied to
/// the wrong place, or from a reused buffer, shows).
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).wrapping_add(seed))
        .collect()
}

pub fn device(c: &Context, n: usize) -> Memory {
    c.mem_map(MemMapParams::allocate(n).memory_type(MemoryType::Cuda))
        .unwrap()
}

pub fn contents(m: &Memory, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    m.read(0, &mut v).unwrap();
    v
}

pub fn buf(m: &Memory, n: usize) -> Buf {
    Buf::One((m.as_ptr() as usize, n))
}

pub fn hbuf(v: &[u8]) -> Buf {
    Buf::One((v.as_ptr() as usize, v.len()))
}

/// How long one operation may take before the test gives up (a peer that failed an
/// assertion exits, and a tag receive is not bound to its endpoint).
pub const LIMIT: Duration = Duration::from_secs(30);

/// Wait for a request started with a raw call, at most `LIMIT`.
pub fn wait(w: &Worker, s: Started) -> Result<Info> {
    // SAFETY: the callers' buffers outlive this wait.
    let mut r = unsafe { w.request_for(s) };
    let res = r.wait_timeout(LIMIT);
    if res.as_ref().is_err_and(|e| e.status() == Status::Timeout) {
        panic!("an operation did not complete within {LIMIT:?}");
    }
    res
}

/// Send `b` with tag `tag` and wait.
pub fn send(w: &Worker, ep: &Endpoint, b: Buf, tag: u64) {
    // SAFETY: the buffer outlives the wait below.
    let s = unsafe { ep.tag_send_raw(b, tag, false, Callback::None) }.unwrap();
    wait(w, s).unwrap();
}

/// Receive into `b` with tag `tag` and wait.
pub fn recv(w: &Worker, b: Buf, tag: u64) -> Result<Info> {
    // SAFETY: the buffer outlives the wait below.
    let s = unsafe { w.tag_recv_raw(b, tag, u64::MAX, Callback::None) }?;
    wait(w, s)
}

pub const SIZES: [usize; 7] = [1, 100, 8192, 20_000, 65539, 1 << 20, (3 << 20) + 5];

// ----- the owner (parent) -------------------------------------------------------------------

pub fn owner(tls: &str) -> Owner {
    Owner::on(ctx(tls))
}

pub fn spawn(tls: &str, role: &str, port: u16, keys: &[Vec<u8>], env: &[(&str, &str)]) -> Child {
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

pub fn first_ep(o: &Owner) -> Endpoint {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(ep) = o.eps.lock().unwrap().first() {
            return ep.clone();
        }
        o.w.progress();
        assert!(Instant::now() < deadline, "the child did not connect");
    }
}

pub fn finish(o: &Owner, mut child: Child) {
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

/// A child's role that works over a connection to the parent: its context, worker and
/// endpoint, and the keys the parent passed.
pub type Connected = fn(&Context, &Worker, &Endpoint, &[Vec<u8>]);

/// The body of a test file's `child_entry` test. In a child, a role of `alone` runs as it
/// is (it makes its own contexts); one of `connected` runs connected to the parent, then
/// the endpoint is flushed and the child exits 0 (a failed assertion fails it). In the
/// parent (no role), nothing.
pub fn child_main(alone: &[(&str, fn())], connected: &[(&str, Connected)]) {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return;
    };
    let tls = std::env::var("COURIER_TLS").unwrap();
    if let Some((_, f)) = alone.iter().find(|(name, _)| *name == role) {
        return f();
    }
    let port = port_from_env();
    let keys = keys_from_env();
    let c = ctx(&tls);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = dial(&w, port, 1);
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    match connected.iter().find(|(name, _)| *name == role) {
        Some((_, f)) => f(&c, &w, &ep, &keys),
        None => panic!("unknown role {role}"),
    }
    ep.flush().unwrap();
    std::process::exit(0);
}
