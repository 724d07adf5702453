//! `COURIER_MAX_FRAME` between real processes: a worker that accepts only small frames
//! still gets large messages whole (its peer, told the limit at wireup, cuts them into
//! more, smaller frames), over shared memory and over tcp; and a peer that sends a frame
//! over the limit anyway (a raw authenticated tcp link), or writes its shared-memory FIFO
//! cells by hand (an oversized frame, a corrupt cell, garbage, a truncated header), fails
//! its own endpoint only, with an error that says why.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use common::authed::*;
use common::*;
use courier::wire::frame::{Header, Kind};
use courier::wire::shm::{
    CELL, CELL_HDR, CellHdr, MAGIC, PACKED, SKIP, SegHeader, SegInfo, VALID, pos_tag,
};
use courier::*;

/// The child's limit: 4 KiB.
const SMALL: &str = "4k";
/// Message sizes: under, around and far over the limit (eager and rendezvous).
const SIZES: [usize; 6] = [100, 4000, 4097, 20_000, 300_000, (1 << 20) + 7];

const KEY: &[u8; 32] = b"max-frame test key, 32 bytes....";

// ----- the child: receives messages and says whether each arrived whole ---------------------

/// Prints its address, then answers every message (tag: its pattern's seed) with an `ACK`
/// to the first endpoint made to it (the parent's): the message's length if it arrived
/// whole, `u64::MAX` if not; until `EXIT`.
fn sink() {
    let ctx = Context::new(ContextParams::default()).unwrap();
    let w = Worker::new(&ctx, WorkerParams::default()).unwrap();
    announce(&w);
    let mut eps = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    let mut b = vec![0u8; 2 << 20];
    loop {
        // SAFETY: the request is waited for before its buffer is used again or goes; it is
        // never forgotten.
        let mut r = unsafe { w.tag_recv_nb(&mut b, 0, 0) }.unwrap();
        let info = loop {
            if let Some(res) = r.test() {
                break res.clone().unwrap();
            }
            w.progress();
            while let Some(ep) = w.incoming_endpoint() {
                eps.push(ep);
            }
            assert!(Instant::now() < deadline, "sink: no EXIT in time");
        };
        drop(r);
        if info.tag == EXIT {
            return;
        }
        while let Some(ep) = w.incoming_endpoint() {
            eps.push(ep);
        }
        let ok = b[..info.length] == pattern(info.length, info.tag)[..];
        let v = if ok { info.length as u64 } else { u64::MAX };
        send_u64(&eps[0], ACK, v);
    }
}

#[test]
fn child_entry() {
    run_child(&[("sink", sink)]);
}

// ----- the parent ---------------------------------------------------------------------------

fn parent(net: Net, env: &[(&str, String)]) -> (Context, Worker) {
    let mut p = ContextParams::default();
    for (k, v) in net.env() {
        p = p.config(k, &v);
    }
    for (k, v) in env {
        p = p.config(k, v);
    }
    let c = Context::new(p).unwrap();
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    (c, w)
}

fn send(ep: &Endpoint, data: &[u8], tag: u64) -> Result<Info> {
    // SAFETY: the request is waited for before `data` goes; it is never forgotten.
    let mut r = unsafe { ep.tag_send_nb(data, tag) }.unwrap();
    let res = r.wait_timeout(DEADLINE);
    drop(r);
    res
}

fn stop(w: &Worker, ep: &Endpoint, kid: &mut Kid) -> String {
    send(ep, &[0u8; 8], EXIT).unwrap_or_else(|e| panic!("EXIT to the child: {e}"));
    serve_one(w, kid)
}

/// The child accepts frames of 4 KiB: the parent (default limit) learns it at wireup and
/// sends every size whole, in frames no larger.
fn large_messages_to_a_small_limit(net: Net) {
    let mut kid = Kid::spawn("sink", net, &[("COURIER_MAX_FRAME", SMALL.to_string())]);
    let addr = unhex(&kid.line("ADDR"));
    let (_c, w) = parent(net, &[]);
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        let seed = i as u64 + 1;
        send(&ep, &pattern(n, seed), seed).unwrap_or_else(|e| panic!("{n} bytes: {e}"));
        assert_eq!(recv_u64(&w, &mut kid, ACK), n as u64, "{net:?}: {n} bytes");
    }
    // The endpoint's frames follow the child's limit, not only the transport's.
    let eager = ep.am_eager_max(0).unwrap();
    assert!(
        eager <= 4096 - Kind::Am.header_len(),
        "{net:?}: active messages of {eager} bytes go in one frame to a 4k peer"
    );
    let log = stop(&w, &ep, &mut kid);
    assert!(!log.contains("COURIER_MAX_FRAME"), "child's log:\n{log}");
}

common::matrix! {
    large_messages_reach_a_small_frame_limit_shm: large_messages_to_a_small_limit(Net::Shm);
    large_messages_reach_a_small_frame_limit_tcp: large_messages_to_a_small_limit(Net::Tcp);
}

/// A tag frame of `n` bytes in all (header and data): tag `seed`, the data `pattern(n - 16,
/// seed)`, as the sink checks it.
fn tag_frame(n: usize, seed: u64) -> Vec<u8> {
    let mut v = Header::tag_eager(seed).as_bytes().to_vec();
    v.extend(pattern(n - v.len(), seed));
    v
}

// ----- a peer that ignores the limit --------------------------------------------------------

/// An authenticated peer that sends a frame larger than the child's `COURIER_MAX_FRAME`
/// (after a wireup that says nothing of its own limit, as an older build's) has its
/// connection failed with an error naming the limit; a frame at the limit passes, and an
/// endpoint made before goes on.
#[test]
fn an_oversized_frame_fails_only_its_endpoint() {
    let k = KeyFile::new("oversized", KEY, 0o600);
    let mut kid = Kid::spawn(
        "sink",
        Net::Tcp,
        &[k.env(), ("COURIER_MAX_FRAME", SMALL.to_string())],
    );
    let addr = unhex(&kid.line("ADDR"));
    let to: SocketAddr = kid.line("TCP").parse().unwrap();
    let (_c, w) = parent(Net::Tcp, &[k.env()]);
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    send(&ep, &pattern(100, 1), 1).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 100);

    let wireup = fake_wireup(77);
    let mut s = raw_authenticated(to, KEY);
    s.write_all(&frame(&wireup)).unwrap();
    // At the limit: taken.
    s.write_all(&frame(&tag_frame(4096, 2))).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 4096 - 16);
    // Over it: the link fails.
    s.write_all(&frame(&tag_frame(4097, 3))).unwrap();
    assert!(
        closed(&mut s),
        "an oversized frame left the connection open"
    );

    // The endpoint made first still works.
    send(&ep, &pattern(5000, 4), 4).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 5000);
    let log = stop(&w, &ep, &mut kid);
    assert!(
        log.contains("4097 bytes") && log.contains("COURIER_MAX_FRAME=4k"),
        "child's log:\n{log}"
    );
}

// ----- a same-host peer that writes its FIFO cells by hand ----------------------------------

/// The hostile side's FIFO size: no other link of the parent's has it, so its segment is
/// the one among the parent's mappings with this many cells.
const HOSTILE_CELLS: usize = 512;

/// The FIFO this process sends to the child through, as a hostile peer sees it: FIFO 0
/// (connector to acceptor) of the segment it made for the link, found in its own mappings,
/// and the position of its next cell. It writes cells as it likes, bypassing the library
/// that made them (which sends nothing meanwhile: its worker is not progressed).
struct Scribbler {
    cells: *mut u8,
    n: usize,
    next: u64,
}

impl Scribbler {
    /// The FIFO of this process's one segment of `HOSTILE_CELLS` cells, after the frames
    /// the library wrote into it (the child's position is not published until a producer
    /// needs it, so the cells tell).
    fn find() -> Scribbler {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let me = std::process::id();
        let found: Vec<usize> = maps
            .lines()
            .filter(|l| l.contains("/memfd:courier-shm"))
            .filter_map(|l| usize::from_str_radix(l.split('-').next()?, 16).ok())
            .filter(|&base| {
                // SAFETY: `base` starts a live shared mapping of at least a page (a
                // segment's header page), and a SegHeader is atomics only.
                let h = unsafe { &*(base as *const SegHeader) };
                let info = SegInfo::read(h);
                info.magic == MAGIC
                    && info.ncells as usize == HOSTILE_CELLS
                    && h.pid[0].load(Relaxed) == me
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "segments of {HOSTILE_CELLS} cells made here"
        );
        let fifo = found[0] + courier::wire::shm::fifo_offset(HOSTILE_CELLS, 0);
        let mut s = Scribbler {
            cells: (fifo + courier::wire::shm::CTL_SIZE) as *mut u8,
            n: HOSTILE_CELLS,
            next: 0,
        };
        // Every frame the library wrote is published (the child answered the last one);
        // the cells after them are free, as the FIFO has not gone round yet.
        s.next = s.after_last();
        assert!(
            (1..HOSTILE_CELLS as u64 / 2).contains(&s.next),
            "the library's frames end at {}, not in the FIFO's first half",
            s.next
        );
        s
    }

    fn hdr(&self, idx: usize) -> &CellHdr {
        assert!(idx < self.n);
        // SAFETY: a cell's header is 16 bytes of atomics at the start of the cell, in the
        // live mapping (idx < n).
        unsafe { &*self.cells.add(idx * CELL).cast::<CellHdr>() }
    }

    /// The position after the last frame the library published: the newest first cell's
    /// position (its `seq` - 1; every cell not first of a frame has a `seq` of 0 once
    /// read) plus its cell count.
    fn after_last(&self) -> u64 {
        (0..self.n)
            .filter_map(|i| {
                let h = self.hdr(i);
                let seq = h.seq.load(Acquire);
                (seq > 0 && (seq - 1) as usize % self.n == i)
                    .then(|| seq - 1 + (h.ncells.load(Relaxed) & !PACKED) as u64)
            })
            .max()
            .unwrap_or(0)
    }

    /// Publish a cell at the next position with header `len` and `ncells`, and `payload`
    /// after its header.
    fn cell(&mut self, len: u32, ncells: u32, payload: &[u8]) {
        let idx = self.next as usize % self.n;
        assert!(
            idx * CELL + CELL_HDR + payload.len() <= self.n * CELL,
            "the test's frame does not fit before the FIFO's end"
        );
        // SAFETY: the bytes lie inside the cell array (checked above), in cells no frame
        // of this lap uses, which the consumer does not look at until `seq` is published.
        unsafe {
            std::ptr::copy_nonoverlapping(
                payload.as_ptr(),
                self.cells.add(idx * CELL + CELL_HDR),
                payload.len(),
            )
        };
        let h = self.hdr(idx);
        h.len.store(len, Relaxed);
        h.ncells.store(ncells, Relaxed);
        h.seq.store(self.next + 1, Release);
        self.next += (CELL_HDR + payload.len()).div_ceil(CELL) as u64;
    }

    /// Publish `f` as a well-formed frame of the FIFO.
    fn frame(&mut self, f: &[u8]) {
        let k = (f.len() + CELL_HDR).div_ceil(CELL);
        self.cell(f.len() as u32, k as u32, f);
    }
}

/// What a hostile same-host peer writes into its FIFO to the child, and what the child's
/// log then says.
struct Scribble {
    what: &'static str,
    write: fn(&mut Scribbler),
    logged: &'static [&'static str],
}

const SCRIBBLES: [Scribble; 6] = [
    Scribble {
        what: "a frame over the child's COURIER_MAX_FRAME",
        write: |s| s.frame(&tag_frame(4097, 3)),
        logged: &["4097 bytes", "COURIER_MAX_FRAME=4k"],
    },
    Scribble {
        what: "a cell whose length runs past the FIFO's frame limit",
        write: |s| s.cell(100_000, 392, &[0x5a; 64]),
        logged: &["corrupt FIFO cell", "frame length 100000 exceeds max_frame"],
    },
    Scribble {
        what: "a skip marker short of the FIFO's end",
        write: |s| s.cell(SKIP, 3, &[]),
        logged: &[
            "skip marker of 3 cells at index",
            "does not reach the end of 512 cells",
        ],
    },
    Scribble {
        what: "a packed cell whose sub-frame runs past it",
        write: |s| {
            s.cell(
                0,
                1 | PACKED,
                &(VALID | pos_tag(s.next) | 300).to_ne_bytes(),
            )
        },
        logged: &["sub-frame of 300 bytes at offset 0 runs past its packed cell"],
    },
    Scribble {
        what: "a frame of garbage",
        write: |s| s.frame(b"\xa5\x07garbage that is no message"),
        logged: &["unknown frame kind 165"],
    },
    Scribble {
        what: "a truncated header",
        write: |s| s.frame(&Header::tag_eager(9).as_bytes()[..10]),
        logged: &["truncated TagEager frame: 10 bytes, need 16"],
    },
];

/// A same-user peer on shared memory that writes its FIFO cells itself, after an
/// authenticated setup: a frame at the child's limit is taken; an oversized frame, corrupt
/// cells (a length, a skip marker, a packed cell), garbage and a truncated header each fail
/// that peer's endpoint (its link is closed) with a log line that says why, and an
/// endpoint made before goes on.
#[test]
fn hand_written_shm_cells_fail_only_their_endpoint() {
    let mut kid = Kid::spawn(
        "sink",
        Net::Shm,
        &[("COURIER_MAX_FRAME", SMALL.to_string())],
    );
    let addr = unhex(&kid.line("ADDR"));
    let (_c, w) = parent(Net::Shm, &[]);
    let ep = w.connect(&addr, EndpointParams::default()).unwrap();
    send(&ep, &pattern(100, 1), 1).unwrap();
    assert_eq!(recv_u64(&w, &mut kid, ACK), 100);

    for (i, sc) in SCRIBBLES.iter().enumerate() {
        let seed = 10 + i as u64;
        let fifo_cells = HOSTILE_CELLS.to_string();
        let (_hc, hw) = parent(Net::Shm, &[("COURIER_SHM_FIFO_SIZE", fifo_cells)]);
        let hep = hw.connect(&addr, EndpointParams::default()).unwrap();
        // Messages of the library's own. The second is sent after the worker progressed
        // (waiting for the first), so it is no burst: it takes cells of its own, and it
        // closes any packed cell the setup's frames left open. The cells after it are free.
        for len in [50, 51] {
            send(&hep, &pattern(len, seed), seed).unwrap();
            assert_eq!(recv_u64(&w, &mut kid, ACK), len as u64, "{}", sc.what);
        }
        let mut s = Scribbler::find();
        // At the limit: taken (the hand-written cells are where the child reads).
        s.frame(&tag_frame(4096, seed + 100));
        assert_eq!(recv_u64(&w, &mut kid, ACK), 4096 - 16, "{}", sc.what);
        (sc.write)(&mut s);
        // The child closes the link: the hostile endpoint fails.
        let deadline = Instant::now() + DEADLINE;
        while hep.is_connected().is_ok() {
            hw.progress();
            w.progress();
            if Instant::now() > deadline {
                let log = stop(&w, &ep, &mut kid);
                panic!("{}: the link stayed up; log:\n{log}", sc.what);
            }
            assert!(kid.poll().is_none(), "{}: the child exited", sc.what);
            std::thread::sleep(Duration::from_millis(1));
        }
        // The endpoint made first still works.
        send(&ep, &pattern(5000, seed), seed).unwrap();
        assert_eq!(recv_u64(&w, &mut kid, ACK), 5000, "after {}", sc.what);
        hep.close_force();
    }
    let log = stop(&w, &ep, &mut kid);
    for sc in &SCRIBBLES {
        for l in sc.logged {
            assert!(
                log.contains(l),
                "{}: no {l:?} in the child's log:\n{log}",
                sc.what
            );
        }
    }
    let dropped = log.matches("dropping connection to").count();
    assert_eq!(
        dropped,
        SCRIBBLES.len(),
        "links dropped; the child's log:\n{log}"
    );
}
