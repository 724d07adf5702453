//! Two-sided operations (tag messages, active messages, streams) on CUDA device memory
//! between real processes, over shared memory and TCP, against the stand-in driver or a
//! real GPU as tests/common/cuda.rs says; tests/cuda_memory.rs has the rest.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::*;

mod common;

use common::cuda::*;
use common::stderr_of;

// ----- the children -------------------------------------------------------------------------

#[test]
fn child_entry() {
    child_main(
        &[],
        &[
            ("twosided", |c, w, ep, _| child_two_sided(c, w, ep)),
            ("deferred", |c, w, ep, _| child_deferred(c, w, ep)),
        ],
    );
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
