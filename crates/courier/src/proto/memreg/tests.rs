//! The registry's records and checks, and what a same-host peer is refused.

use super::*;

#[test]
#[cfg_attr(
    miri,
    ignore = "memfd and shared mappings: system calls Miri does not model"
)]
fn register_check_unmap() {
    let r = MemRegistry::new();
    let mut buf = vec![0u8; 100];
    let base = buf.as_mut_ptr() as u64;
    let (id, secret) = r
        .add(
            base,
            100,
            access::READ | access::WRITE,
            MemoryType::Host,
            None,
            None,
        )
        .unwrap();
    assert!(r.lookup(id, secret, base + 10, 8, access::WRITE).is_ok());
    assert_eq!(
        r.lookup(id, secret ^ 1, base, 8, access::WRITE)
            .unwrap_err()
            .status(),
        Status::InvalidKey
    );
    assert_eq!(
        r.lookup(id, secret, base + 96, 8, access::WRITE)
            .unwrap_err()
            .status(),
        Status::OutOfRange
    );
    assert_eq!(
        r.lookup(id, secret, base - 1, 1, access::READ)
            .unwrap_err()
            .status(),
        Status::OutOfRange
    );
    assert_eq!(
        r.lookup(id, secret, base, 8, access::ATOMIC)
            .unwrap_err()
            .status(),
        Status::AccessDenied
    );
    assert_eq!(
        r.lookup(id + (1 << 12), secret, base, 8, access::READ)
            .unwrap_err()
            .status(),
        Status::InvalidKey
    );
    r.remove(id);
    assert_eq!(
        r.lookup(id, secret, base, 8, access::READ)
            .unwrap_err()
            .status(),
        Status::InvalidKey
    );
    let key = RkeyRepr::unpack(
        &r.pack(
            r.add(base, 100, access::ALL, MemoryType::Host, None, None)
                .unwrap()
                .0,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(key.length, 100);
}

/// A key whose segment fd names another region's segment (or anything that is not the
/// region's own memfd) is refused, and nothing of that other segment is mapped for it.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd and shared mappings: system calls Miri does not model"
)]
fn segment_fd_must_be_the_regions_own() {
    let r = MemRegistry::new();
    if r.table.is_none() {
        return; // no memfd here: no segments (checked by the multi-process tests)
    }
    let (a, _, pa) = r.allocate(4096, access::ALL, MemoryType::Host).unwrap();
    let (b, _, _) = r.allocate(8192, access::ALL, MemoryType::Host).unwrap();
    let ka = RkeyRepr::unpack(&r.pack(a).unwrap()).unwrap();
    let kb = RkeyRepr::unpack(&r.pack(b).unwrap()).unwrap();
    let me = pid();
    let seg = [(pa as u64, 64)];
    // The honest key works.
    assert!(r.shared_view(&ka.pack(), me, &seg).is_ok());
    let refused = |k: &RkeyRepr| match r.shared_view(&k.pack(), me, &seg) {
        Ok(_) => panic!("a forged segment fd was mapped"),
        Err(e) => e,
    };
    // Region a's key naming region b's segment.
    let mut forged = ka.clone();
    forged.region_fd = kb.region_fd;
    let e = refused(&forged);
    assert_eq!(e.status(), Status::InvalidKey, "{e}");
    assert!(e.detail().contains("segment"), "{e}");
    // Naming the key table, or an fd that is no memfd at all.
    forged.region_fd = ka.table_fd;
    assert_eq!(refused(&forged).status(), Status::InvalidKey);
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    forged.region_fd = file.as_raw_fd();
    assert_eq!(refused(&forged).status(), Status::InvalidKey);
    // A registered region has no segment: any fd its key names is refused.
    let mut heap = vec![0u8; 4096];
    let (h, _) = r
        .add(
            heap.as_mut_ptr() as u64,
            4096,
            access::ALL,
            MemoryType::Host,
            None,
            None,
        )
        .unwrap();
    let mut kh = RkeyRepr::unpack(&r.pack(h).unwrap()).unwrap();
    kh.region_fd = kb.region_fd;
    let peer = r.peer(&kh).unwrap();
    let e = match peer.region(h, kh.region_fd, 4096) {
        Ok(_) => panic!("a registered region's key mapped another segment"),
        Err(e) => e,
    };
    assert_eq!(e.status(), Status::InvalidKey, "{e}");
}

/// A rendezvous offer's segment key: only allocated regions get one, and a view is
/// refused for a forged secret, another process, bytes outside the region, a region
/// with no segment, and after unmap; a good one reads the owner's bytes.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd and shared mappings: system calls Miri does not model"
)]
fn shared_segment_offers() {
    let r = MemRegistry::new();
    if r.table.is_none() {
        return; // no memfd here: nothing is offered (checked by the multi-process tests)
    }
    let (id, _, ptr) = r.allocate(8192, 0, MemoryType::Host).unwrap();
    // SAFETY: a fresh 8 KiB allocation of ours.
    unsafe { std::slice::from_raw_parts_mut(ptr, 8192) }
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = (i % 251) as u8);
    let base = ptr as u64;
    let segs = [(base + 100, 1000), (base + 5000, 3192)];
    let local = segs.map(|(a, n)| (a as usize, n as usize));
    let mut key = b"before".to_vec();
    assert!(
        r.shared_key(&local, &mut key),
        "allocated memory is offered"
    );
    assert_eq!(&key[..6], b"before", "the key is appended");
    key.drain(..6);
    assert_eq!(
        key,
        r.pack(id).unwrap(),
        "the key packed when the region was added"
    );
    let me = pid();
    let (map, there) = r.shared_view(&key, me, &segs).unwrap();
    assert_eq!(there.len(), 2);
    for (&(a, n), &(local, ln)) in segs.iter().zip(&there) {
        assert_eq!(n, ln);
        assert_ne!(local, a, "read through a second mapping, not the original");
        // SAFETY: inside our live view of the segment.
        let got = unsafe { std::slice::from_raw_parts(local as *const u8, n as usize) };
        let off = (a - base) as usize;
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &b)| b == ((off + i) % 251) as u8)
        );
    }
    drop(map);
    let refused = |k: &[u8], p: u32, s: &[(u64, u64)]| match r.shared_view(k, p, s) {
        Ok(_) => panic!("view granted"),
        Err(e) => e.status(),
    };
    // Beyond the region, or straddling its end.
    assert_eq!(refused(&key, me, &[(base + 8000, 193)]), Status::OutOfRange);
    assert_eq!(refused(&key, me, &[(base - 8, 8)]), Status::OutOfRange);
    // Forged secret.
    let mut forged = RkeyRepr::unpack(&key).unwrap();
    forged.secret ^= 0x10;
    assert_eq!(refused(&forged.pack(), me, &segs), Status::InvalidKey);
    // A key naming another process than the peer the offer came from.
    assert_eq!(refused(&key, me + 1, &segs), Status::InvalidKey);
    // Garbage.
    assert_eq!(refused(&key[..10], me, &segs), Status::InvalidKey);
    // Registered (not allocated) memory has no segment to offer.
    let mut heap = vec![0u8; 64];
    let hb = heap.as_mut_ptr() as u64;
    r.add(hb, 64, 0, MemoryType::Host, None, None).unwrap();
    let mut none = Vec::new();
    assert!(!r.shared_key(&[(hb as usize, 64)], &mut none));
    // Segments that are not all inside one region are not offered.
    assert!(!r.shared_key(&[(base as usize, 10), (hb as usize, 10)], &mut none));
    // After unmap: not offered, and an old key is refused.
    r.remove(id);
    assert!(!r.shared_key(&local, &mut none));
    assert!(none.is_empty());
    assert_eq!(refused(&key, me, &segs), Status::InvalidKey);
}

/// A region's secret is 128 bits, published whole in the key table, and a key whose
/// secret differs in any one bit of either half is refused.
#[test]
#[cfg_attr(
    miri,
    ignore = "memfd and shared mappings: system calls Miri does not model"
)]
fn secrets_are_128_bits_checked_whole() {
    let r = MemRegistry::new();
    let mut buf = vec![0u8; 64];
    let base = buf.as_mut_ptr() as u64;
    let (id, secret) = r
        .add(base, 64, access::ALL, MemoryType::Host, None, None)
        .unwrap();
    let (_, other) = r
        .add(base, 64, access::ALL, MemoryType::Host, None, None)
        .unwrap();
    // Both halves random (each is 0, or equal to another region's, with chance 2^-64).
    assert_ne!(secret as u64, 0);
    assert_ne!((secret >> 64) as u64, 0);
    assert_ne!(secret as u64, other as u64);
    assert_ne!((secret >> 64) as u64, (other >> 64) as u64);
    assert!(r.lookup(id, secret, base, 8, access::ATOMIC).is_ok());
    for bit in 0..128 {
        let e = r
            .lookup(id, secret ^ (1u128 << bit), base, 8, access::ATOMIC)
            .unwrap_err();
        assert_eq!(e.status(), Status::InvalidKey, "bit {bit}: {e}");
    }
    let key = RkeyRepr::unpack(&r.pack(id).unwrap()).unwrap();
    assert_eq!(key.secret, secret);
    if let Some(t) = &r.table {
        let rec = read_record(t.ptr, table_slot(id).unwrap());
        assert_eq!(rec.secret, secret);
        assert_eq!(rec.access, access::ALL as u64);
        assert_eq!(rec.mem_type, MemoryType::Host.code() as u64);
        assert_eq!(rec, r.lock().private[table_slot(id).unwrap()]);
    }
}
