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
    let (_w_owner, _w_peer, ep, key) = reach_directly(&owner, &peer, &mem);
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

/// A worker of `peer` connected to one of `owner`: the peer's endpoint and both workers.
fn connect(owner: &Context, peer: &Context) -> (Worker, Worker, Endpoint) {
    let w_owner = Worker::new(owner, WorkerParams::default()).unwrap();
    let w_peer = Worker::new(peer, WorkerParams::default()).unwrap();
    let ep = w_peer
        .connect(&w_owner.address().unwrap(), EndpointParams::default())
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ep.is_connected().unwrap() {
        w_owner.progress();
        w_peer.progress();
        assert!(std::time::Instant::now() < deadline, "connect hung");
    }
    (w_owner, w_peer, ep)
}

/// `connect`, and `mem`'s key unpacked by the peer, which must map its segment.
fn reach_directly(
    owner: &Context,
    peer: &Context,
    mem: &Memory,
) -> (Worker, Worker, Endpoint, RemoteKey) {
    let (w_owner, w_peer, ep) = connect(owner, peer);
    let key = ep.rkey_unpack(&mem.pack_rkey().unwrap()).unwrap();
    assert_eq!(
        key.path(),
        "direct",
        "in-place memory must be mapped by a same-host peer"
    );
    (w_owner, w_peer, ep, key)
}

#[test]
fn share_in_place_takes_any_range_and_keys_cover_only_it() {
    let owner = ctx();
    let n = 3;
    let base = private_pages(n);
    let pattern = |i: usize| (i % 241) as u8 + 1;
    // SAFETY: inside the mapping made above.
    unsafe {
        for i in 0..n * page() {
            *base.add(i) = pattern(i);
        }
    }
    // Starts 100 bytes into the first page, ends 100 bytes into the last.
    let (skip, len) = (100, 2 * page());
    let start = base.wrapping_add(skip);
    let mem = owner
        // SAFETY: private pages from `private_pages`, no other thread touches them.
        .mem_map(unsafe { MemMapParams::share_in_place(start, len) })
        .unwrap();
    assert_eq!(mem.as_ptr(), start);
    let byte = |i: usize| -> u8 {
        // SAFETY: inside the (now shared) mapping of `n` pages.
        unsafe { std::ptr::read_volatile(base.add(i)) }
    };
    for i in 0..n * page() {
        assert_eq!(
            byte(i),
            pattern(i),
            "byte {i} of the pages changed by the move"
        );
    }

    let peer = ctx();
    let (_w_owner, _w_peer, ep, key) = reach_directly(&owner, &peer, &mem);
    // The range's first and last bytes, through the peer's own mapping of the segment
    // (which starts at the first page, `skip` bytes before the region).
    let (first, last) = (start as u64, start as u64 + len as u64 - 2);
    ep.put(b"AB", first, &key).unwrap();
    ep.put(b"YZ", last, &key).unwrap();
    ep.flush().unwrap();
    assert_eq!((byte(skip), byte(skip + 1)), (b'A', b'B'));
    assert_eq!((byte(skip + len - 2), byte(skip + len - 1)), (b'Y', b'Z'));
    let alias = key
        .direct_ptr(first + 8)
        .expect("a pointer into the peer's mapping");
    // SAFETY: a live byte of the segment, as mapped by the peer.
    unsafe { std::ptr::write_volatile(alias, 0xee) };
    assert_eq!(
        byte(skip + 8),
        0xee,
        "the peer's pointer is not the owner's byte"
    );
    // The rest of the first and last pages is shared too, but no key reaches it.
    for (addr, what) in [(first - 1, "before"), (first + len as u64, "after")] {
        let e = ep.put(b"!", addr, &key).err();
        assert!(e.is_some(), "a put {what} the range was let through");
        assert!(key.direct_ptr(addr).is_none(), "a pointer {what} the range");
    }
    ep.flush().ok();
    assert_eq!(byte(skip - 1), pattern(skip - 1));
    assert_eq!(byte(skip + len), pattern(skip + len));
}

#[test]
fn share_in_place_refuses_an_empty_range() {
    let owner = ctx();
    let base = private_pages(1);
    let e = owner
        // SAFETY: a private page from `private_pages`; mem_map refuses the range.
        .mem_map(unsafe { MemMapParams::share_in_place(base, 0) })
        .err()
        .expect("refused");
    assert_eq!(e.status(), Status::InvalidParam, "{e}");
    assert!(e.to_string().contains("non-empty"), "{e}");
}
