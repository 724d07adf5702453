//! CUDA device memory mapped, queried and reached with one-sided operations, between real
//! processes and within one, over shared memory and TCP; the application's own CUDA
//! contexts left alone; page-locked staging; a missing driver or device. Against the
//! stand-in driver or a real GPU as tests/common/cuda.rs says; tests/cuda.rs has the
//! two-sided operations.

use std::ffi::CString;
use std::time::Instant;

use courier::*;

mod common;

use common::cuda::*;
use common::{sizes_in, stderr_of};

// ----- the children -------------------------------------------------------------------------

#[test]
fn child_entry() {
    child_main(
        &[
            ("nodriver", child_no_driver),
            ("nodevice", child_no_device),
            ("staging", child_staging),
        ],
        &[("rma", child_rma)],
    );
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
    let found = c
        // SAFETY: inside a live allocation of the test that outlives the region, or an address
        // mem_map refuses (the test checks), so no region is made of it.
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
        .mem_map(
            // SAFETY: inside a live allocation of the test that outlives the region, or an address
            // mem_map refuses (the test checks), so no region is made of it.
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
