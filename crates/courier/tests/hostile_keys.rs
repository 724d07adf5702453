//! Damaged and forged remote keys, between real processes, over shared memory (the direct
//! path: the owner's key table is checked here) and tcp (the owner checks every frame).
//!
//! The parent owns two regions (allocated memory, which a same-host peer maps, and
//! registered memory) filled with a known pattern; a child (this binary re-run with
//! `COURIER_TEST_ROLE`) gets their packed keys and, for every bit of each key, flips it
//! and tries the key: it must be refused when unpacked, or else a put and an atomic
//! through it must fail. Then, as a forger who knows the layout and recomputes the key's
//! check value, it flips each bit of the region id and of the 128-bit secret: every put
//! and atomic through those keys must be refused. After all of it the child reads the
//! regions back through the honest keys, and the parent checks its memory still holds the
//! pattern byte for byte.

use courier::wire::rkey;
use courier::*;

mod common;
use common::*;

/// A transport selection, given to both sides.
#[derive(Clone, Copy, Debug)]
struct Net {
    tls: &'static str,
}

const SHM: Net = Net { tls: "all" };
const TCP: Net = Net { tls: "tcp" };

impl Transport for Net {
    fn env(self) -> Vec<(&'static str, String)> {
        vec![("COURIER_TLS", self.tls.to_string())]
    }
}

/// Bytes of each region.
const LEN: usize = 4096;
/// Seeds of the two regions' patterns.
const SEEDS: [u64; 2] = [0x5eed_0001, 0x5eed_0002];

#[test]
fn child_entry() {
    run_child(&[("flipper", child_flipper)]);
}

/// The operation must fail: at once, at completion, or (a put the target does not
/// acknowledge) at the next flush; then the endpoint goes on (a second flush is clean).
fn refused(ep: &Endpoint, r: Result<Request<'_>>, what: &str) -> Error {
    let e = match r {
        Err(e) => e,
        Ok(req) => match req.wait() {
            Err(e) => e,
            Ok(_) => match ep.flush() {
                Err(e) => e,
                Ok(()) => panic!("{what}: not refused"),
            },
        },
    };
    if let Err(again) = ep.flush() {
        panic!("{what}: a second error after the refusal ({e}): {again}");
    }
    e
}

fn child_flipper() {
    let tls = std::env::var("COURIER_TLS").unwrap();
    let net = if tls == "tcp" { TCP } else { SHM };
    let a = actor(net);
    let junk = [0xeeu8; 64];
    let mut at_unpack = 0;
    let mut at_op = 0;
    let mut forged = 0;
    for (i, raw) in a.raw.iter().enumerate() {
        let (base, len) = a.rk[i].bounds();
        assert_eq!(len as usize, LEN);
        // The honest key reaches the memory: refusals below are the flips' doing.
        let mut back = vec![0u8; LEN];
        a.ep.get(&mut back, base, &a.rk[i]).unwrap();
        assert_eq!(back, pattern(LEN, SEEDS[i]), "region {i} read honestly");
        // Every single bit of the packed key.
        for bit in 0..raw.len() * 8 {
            let mut k = raw.clone();
            k[bit / 8] ^= 1 << (bit % 8);
            let what = format!("region {i}, key bit {bit} flipped");
            let fk = match a.ep.rkey_unpack(&k) {
                Err(e) => {
                    assert_eq!(e.status(), Status::InvalidKey, "{what}: {e}");
                    at_unpack += 1;
                    continue;
                }
                Ok(fk) => fk,
            };
            let (fb, _) = fk.bounds();
            refused(
                &a.ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { a.ep.put_nb(&junk, fb, &fk) },
                &format!("{what}: put"),
            );
            refused(
                &a.ep,
                a.ep.atomic(AtomicOp::Add, 1, 0, fb, &fk, false),
                &format!("{what}: atomic"),
            );
            at_op += 1;
        }
        // A forger's keys: one bit of the region id or of the secret flipped, the check
        // value recomputed. They unpack (or are refused there); nothing goes through them.
        let fields = [rkey::field::REGION, rkey::field::SECRET];
        for bit in fields.iter().flat_map(|f| f.start * 8..f.end * 8) {
            let mut k = raw.clone();
            k[bit / 8] ^= 1 << (bit % 8);
            rkey::reseal(&mut k);
            let what = format!("region {i}, forged key bit {bit} flipped and resealed");
            let fk = match a.ep.rkey_unpack(&k) {
                Err(e) => {
                    assert_eq!(e.status(), Status::InvalidKey, "{what}: {e}");
                    continue;
                }
                Ok(fk) => fk,
            };
            let e = refused(
                &a.ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { a.ep.put_nb(&junk, base, &fk) },
                &format!("{what}: put"),
            );
            assert_eq!(e.status(), Status::InvalidKey, "{what}: put: {e}");
            let e = refused(
                &a.ep,
                a.ep.atomic(AtomicOp::Swap, 0xdead, 0, base + 8, &fk, false),
                &format!("{what}: atomic"),
            );
            assert_eq!(e.status(), Status::InvalidKey, "{what}: atomic: {e}");
            let mut sink = [0xccu8; 64];
            refused(
                &a.ep,
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                unsafe { a.ep.get_nb(&mut sink, base, &fk) },
                &format!("{what}: get"),
            );
            assert_eq!(sink, [0xcc; 64], "{what}: a refused get wrote");
            forged += 1;
        }
        // And the memory, read through the honest key, is as it was.
        let mut back = vec![0u8; LEN];
        a.ep.get(&mut back, base, &a.rk[i]).unwrap();
        assert_eq!(back, pattern(LEN, SEEDS[i]), "region {i} after the flips");
    }
    a.ep.flush().unwrap();
    println!("FLIPS unpack={at_unpack} op={at_op} forged={forged}");
}

fn flips(net: Net) {
    let o = Owner::new(net);
    let regions = [
        Region::new(&o.c, Mem::Alloc, LEN, rkey::access::ALL),
        Region::new(&o.c, Mem::Reg, LEN, rkey::access::ALL),
    ];
    for (r, seed) in regions.iter().zip(SEEDS) {
        r.write(0, &pattern(LEN, seed));
    }
    let keys: Vec<Vec<u8>> = regions.iter().map(Region::key).collect();
    let mut kid = o.spawn("flipper", net, &keys, &[]);
    serve_one(&o.w, &mut kid);
    let counts = kid.line("FLIPS");
    eprintln!("{net:?}: {counts}");
    let per_key = keys[0].len() * 8;
    let field = |name: &str| -> usize {
        counts
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {counts:?}"))
    };
    assert_eq!(
        field("unpack") + field("op"),
        2 * per_key,
        "every flip was tried"
    );
    // A forged key is tried at least for every secret bit of both regions (a region id
    // flipped may be refused when unpacked, naming a slot out of the table).
    assert!(field("forged") >= 2 * 128, "{counts}");
    for (i, (r, seed)) in regions.iter().zip(SEEDS).enumerate() {
        let want = pattern(LEN, seed);
        assert!(
            r.bytes() == &want[..],
            "region {i} changed: {}",
            first_diff(r.bytes(), &want)
        );
    }
}

#[test]
fn every_single_bit_flip_of_a_key_is_refused_shm() {
    flips(SHM);
}

#[test]
fn every_single_bit_flip_of_a_key_is_refused_tcp() {
    flips(TCP);
}
