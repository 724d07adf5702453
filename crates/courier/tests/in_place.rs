//! `MemMapParams::share_in_place`: private pages moved into a shared segment at the same
//! addresses keep their contents, and a same-host peer (here a second context of this
//! process, which maps the owner's segments as any same-host peer does) reaches them
//! directly: loads, stores and CPU atomics through its own mapping, not CMA.

use std::time::Duration;

use courier::*;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Fresh private anonymous pages, as a program's data and bss are.
fn private_pages(n: usize) -> *mut u8 {
    // SAFETY: a new private mapping, owned by the test for its whole run.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n * page(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as *mut u8
}

fn ctx() -> Context {
    let f = Features {
        rma: true,
        atomics: true,
        ..Features::default()
    };
    Context::new(
        ContextParams::default()
            .features(f)
            .config("COURIER_TLS", "all"),
    )
    .unwrap()
}

#[test]
fn shared_in_place_keeps_contents_and_is_reached_directly() {
    let n = 3;
    let base = private_pages(n);
    // Contents in the first and last page; the middle one stays zero (a hole).
    // SAFETY: inside the mapping made above.
    unsafe {
        for i in 0..page() {
            *base.add(i) = (i % 251) as u8;
        }
        *(base.add((n - 1) * page()) as *mut u64) = 0x1234_5678;
    }
    let owner = ctx();
    let mem = owner
        // SAFETY: whole private pages from `private_pages` (or a range mem_map refuses); no other
        // thread touches them.
        .mem_map(unsafe { MemMapParams::share_in_place(base, n * page()) })
        .unwrap();
    assert_eq!(mem.as_ptr(), base);
    // SAFETY: the same addresses, now the shared segment.
    unsafe {
        for i in 0..page() {
            assert_eq!(
                *base.add(i),
                (i % 251) as u8,
                "byte {i} changed by the move"
            );
        }
        assert_eq!(*base.add(page() + 17), 0);
        assert_eq!(*(base.add((n - 1) * page()) as *const u64), 0x1234_5678);
    }

    let peer = ctx();
    let w_owner = Worker::new(&owner, WorkerParams::default()).unwrap();
    let w_peer = Worker::new(&peer, WorkerParams::default()).unwrap();
    let ep = w_peer
        .connect(&w_owner.address().unwrap(), EndpointParams::default())
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ep.is_connected().unwrap() {
        w_owner.progress();
        w_peer.progress();
        assert!(std::time::Instant::now() < deadline, "connect hung");
    }
    let key = ep.rkey_unpack(&mem.pack_rkey().unwrap()).unwrap();
    assert_eq!(
        key.path(),
        "direct",
        "in-place memory must be mapped by a same-host peer"
    );
    let word = base as u64 + (n as u64 - 1) * page() as u64;
    let alias = key
        .direct_ptr(word)
        .expect("a pointer into the peer's own mapping");
    assert_ne!(alias, word as *mut u8, "the peer's mapping is its own");
    // A store through the peer's mapping is seen at the owner's address, and back.
    // SAFETY: both point at the same live, aligned word of the segment.
    unsafe {
        std::ptr::write_volatile(alias as *mut u64, 77);
        assert_eq!(std::ptr::read_volatile(word as *const u64), 77);
    }
    // An atomic from the peer is a CPU atomic: done when the call returns.
    let r = ep.atomic(AtomicOp::Add, 5, 0, word, &key, false).unwrap();
    assert_eq!(r.wait().unwrap().value, 77);
    // SAFETY: as above.
    assert_eq!(unsafe { std::ptr::read_volatile(word as *const u64) }, 82);
    drop(key);
    drop(mem);
    // Unmapped from Courier, the pages stay where they are with what they hold.
    // SAFETY: the pages are still mapped (in-place regions are left in place).
    assert_eq!(unsafe { *(word as *const u64) }, 82);
}

#[test]
fn share_in_place_needs_whole_pages() {
    let owner = ctx();
    let base = private_pages(1);
    for (p, len) in [(base.wrapping_add(8), page() - 8), (base, 100), (base, 0)] {
        let e = owner
            // SAFETY: whole private pages from `private_pages` (or a range mem_map refuses); no
            // other thread touches them.
            .mem_map(unsafe { MemMapParams::share_in_place(p, len) })
            .err()
            .expect("refused");
        assert_eq!(e.status(), Status::InvalidParam, "{e}");
        assert!(e.to_string().contains("whole pages"), "{e}");
    }
}
