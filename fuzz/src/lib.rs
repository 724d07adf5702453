//! One fuzz target per parser of peer input. Each function takes the bytes a peer could
//! send (or write into shared memory) and runs Courier's own parser over them, asserting
//! what must hold whatever the bytes: no panic, every length checked, and, where the
//! format has an emitter, that what parses emits back to bytes that parse the same (the
//! round trip), so a parser that accepts what it would never write, or loses a field, is
//! found too.
//!
//! `fuzz_targets/` runs each under libFuzzer (`make fuzz`); `tests/corpus.rs` replays the
//! checked-in corpus (`corpus/<target>/`) and random inputs through them in `make test`.

use std::hint::black_box;

use courier::auth::{Key, Role};
use courier::wire::address::WorkerAddress;
use courier::wire::auth::{AuthMsg, is_auth};
use courier::wire::frame::{Frame, Header, Kind, Segments, emit_segments, flags};
use courier::wire::keytable::{self, Entry};
use courier::wire::rkey::{self, RkeyRepr};
use courier::wire::shm::{self, Hello, Reply, SegInfo};

mod seeds;
pub use seeds::seeds;

/// courier-shmem's records, compiled from its own source: linking that crate (a static and
/// dynamic library too) left the core crate uninstrumented in cargo fuzz's builds (no
/// coverage counter in `Frame::parse`; `frame`'s coverage fell from 353 edges to 140).
#[path = "../../crates/courier-shmem/src/record.rs"]
pub mod shmem_record;

/// A fuzz target: the bytes a peer sent.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz_targets/` and `corpus/` name them.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("rndv_segments", rndv_segments),
    ("worker_address", worker_address),
    ("remote_key", remote_key),
    ("auth_handshake", auth_handshake),
    ("conn_setup", conn_setup),
    ("tcp_framing", tcp_framing),
    ("shm_setup", shm_setup),
    ("shm_segment_header", shm_segment_header),
    ("shm_fifo", shm_fifo),
    ("key_table", key_table),
    ("perf_control", perf_control),
    ("exs_message", exs_message),
    ("run_control", run_control),
    ("pmi_text", pmi_text),
    ("shmem_exchange", shmem_exchange),
];

// ----- frames ---------------------------------------------------------------------------

fn segs_flags(segs: &Segments<'_>) -> u8 {
    if segs.shared_key().is_some() {
        flags::SHARED
    } else {
        0
    }
}

fn push_segs(v: &mut Vec<u8>, segs: &Segments<'_>) {
    emit_segments(v, segs.iter());
    if let Some(k) = segs.shared_key() {
        v.extend_from_slice(k);
    }
}

/// The bytes of a frame, written with the typed header constructors the library uses.
pub fn emit(f: &Frame<'_>) -> Vec<u8> {
    let with = |h: Header, parts: &[&[u8]]| {
        let mut v = h.as_bytes().to_vec();
        for p in parts {
            v.extend_from_slice(p);
        }
        v
    };
    match *f {
        Frame::TagEager { tag, data } => with(Header::tag_eager(tag), &[data]),
        Frame::TagEagerSync { tag, sreq, data } => with(Header::tag_eager_sync(tag, sreq), &[data]),
        Frame::TagRts {
            tag,
            sreq,
            len,
            sync,
            segs,
        } => {
            let fl = segs_flags(&segs) | if sync { flags::SYNC } else { 0 };
            let mut v = with(Header::tag_rts(tag, sreq, len, segs.len() as u32, fl), &[]);
            push_segs(&mut v, &segs);
            v
        }
        Frame::RndvAts { sreq, status } => with(Header::rndv_ats(sreq, status), &[]),
        Frame::RndvRtr { sreq, rreq, len } => with(Header::rndv_rtr(sreq, rreq, len), &[]),
        Frame::RndvSplit {
            sreq,
            rreq,
            offset,
            len,
            segs,
        } => {
            let h = Header::rndv_split(
                sreq,
                rreq,
                offset,
                len,
                segs.len() as u32,
                segs_flags(&segs),
            );
            let mut v = with(h, &[]);
            push_segs(&mut v, &segs);
            v
        }
        Frame::RndvSplitDone { rreq, status } => with(Header::rndv_split_done(rreq, status), &[]),
        Frame::RndvData { rreq, offset, data } => with(Header::rndv_data(rreq, offset), &[data]),
        Frame::SyncAck { sreq } => with(Header::sync_ack(sreq), &[]),
        Frame::Am {
            id,
            reply,
            header,
            data,
        } => {
            let fl = if reply { flags::AM_REPLY } else { 0 };
            with(Header::am(id, header.len() as u32, fl), &[header, data])
        }
        Frame::AmRts {
            id,
            reply,
            sreq,
            len,
            header,
            segs,
        } => {
            let fl = segs_flags(&segs) | if reply { flags::AM_REPLY } else { 0 };
            let h = Header::am_rts(id, header.len() as u32, fl, sreq, len, segs.len() as u64);
            let mut v = with(h, &[header]);
            push_segs(&mut v, &segs);
            v
        }
        Frame::Stream { data } => with(Header::bare(Kind::Stream), &[data]),
        Frame::Close => with(Header::bare(Kind::Close), &[]),
        Frame::Keepalive { ping } => with(Header::keepalive(ping), &[]),
        Frame::ConnReq { client_id, address } => with(Header::conn_req(client_id), &[address]),
        Frame::ConnAccept { conn_id, address } => with(Header::conn_accept(conn_id), &[address]),
        Frame::ConnReject => with(Header::bare(Kind::ConnReject), &[]),
        Frame::Wireup {
            conn_id,
            purpose,
            address,
        } => with(Header::wireup(conn_id, purpose), &[address]),
        Frame::Put { target, req, data } => with(Header::put(&target, req), &[data]),
        Frame::RmaAck { req, status, value } => with(Header::rma_ack(req, status, value), &[]),
        Frame::GetReq { target, req, len } => with(Header::get_req(&target, req, len), &[]),
        Frame::GetResp {
            req,
            offset,
            status,
            data,
        } => with(Header::get_resp(req, offset, status), &[data]),
        Frame::Atomic {
            target,
            req,
            op,
            bits32,
            operand,
            compare,
        } => with(
            Header::atomic(&target, req, op, bits32, operand, compare),
            &[],
        ),
        Frame::FlushReq { req } => with(Header::flush_req(req), &[]),
        Frame::FlushAck { req } => with(Header::flush_ack(req), &[]),
        Frame::PutSignal {
            target,
            req,
            signal,
            op,
            value,
            data,
        } => with(
            Header::put_signal(&target, req, &signal, op, value),
            &[data],
        ),
        Frame::PutBegin {
            target,
            len,
            signal,
        } => with(
            Header::put_begin(&target, len, signal.as_ref().map(|(s, op)| (s, *op))),
            &[],
        ),
    }
}

/// Check a parsed frame: its segments add up, and it emits back to bytes that parse to
/// the same frame.
fn check_frame(f: &Frame<'_>) {
    let segs = match f {
        Frame::TagRts { segs, len, .. }
        | Frame::RndvSplit { segs, len, .. }
        | Frame::AmRts { segs, len, .. } => Some((segs, *len)),
        _ => None,
    };
    if let Some((segs, len)) = segs {
        let sum = segs
            .iter()
            .try_fold(0u64, |s, (_, n)| s.checked_add(n))
            .expect("segment lengths that overflow were accepted");
        assert!(segs.is_empty() || sum == len, "segments do not add up");
        if let Some(k) = segs.shared_key() {
            remote_key(k);
        }
    }
    let bytes = emit(f);
    assert_eq!(
        Frame::parse(&bytes).as_ref(),
        Ok(f),
        "a frame does not parse back to itself"
    );
}

/// Every frame kind (`wire::frame::Frame::parse`), and the receive fast paths' readers,
/// which must agree with it.
pub fn frame(data: &[u8]) {
    let parsed = Frame::parse(data);
    match &parsed {
        Ok(Frame::TagEager { tag, data: d }) => {
            assert_eq!(Frame::as_tag_eager(data), Some((*tag, *d)))
        }
        _ => assert_eq!(Frame::as_tag_eager(data), None),
    }
    match &parsed {
        Ok(Frame::Am {
            id,
            reply,
            header,
            data: d,
        }) => assert_eq!(Frame::as_am(data), Some((*id, *reply, *header, *d))),
        _ => assert_eq!(Frame::as_am(data), None),
    }
    if let Ok(f) = parsed {
        check_frame(&f);
    }
}

fn u64_from(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(a)
}

/// Rendezvous offers' segment lists (and the shared segment's key after them): a header
/// of `TagRts`, `RndvSplit` or `AmRts` built from the first bytes (kind, flags, segment
/// count, message length, user-header length), the rest as its payload.
pub fn rndv_segments(data: &[u8]) {
    if data.len() < 13 {
        return;
    }
    let (head, payload) = data.split_at(13);
    let fl = head[1] & (flags::SHARED | flags::SYNC | flags::AM_REPLY);
    let count = u16::from_le_bytes([head[2], head[3]]);
    let len = u64_from(&head[4..12]);
    let hlen = (head[12] as usize).min(payload.len());
    let h = match head[0] % 3 {
        0 => Header::tag_rts(7, 8, len, count.into(), fl),
        1 => Header::rndv_split(7, 8, 9, len, count.into(), fl),
        _ => Header::am_rts(3, hlen as u32, fl, 8, len, count.into()),
    };
    let mut bytes = h.as_bytes().to_vec();
    bytes.extend_from_slice(payload);
    if let Ok(f) = Frame::parse(&bytes) {
        check_frame(&f);
    }
}

// ----- addresses, keys, the handshake -----------------------------------------------------

/// Worker addresses (`WorkerAddress::unpack`): what unpacks packs back to the same address.
pub fn worker_address(data: &[u8]) {
    if let Ok(a) = WorkerAddress::unpack(data) {
        assert_eq!(
            WorkerAddress::unpack(&a.pack()).as_ref(),
            Ok(&a),
            "an address does not unpack back to itself"
        );
    }
}

/// Remote keys (`RkeyRepr::unpack`), as sent and with their check value recomputed (so
/// that the fuzzer reaches the field checks): what unpacks packs back to the same bytes.
pub fn remote_key(data: &[u8]) {
    if let Ok(k) = RkeyRepr::unpack(data) {
        assert_eq!(k.pack(), data, "a key does not pack back to its bytes");
    }
    let mut v = data.to_vec();
    rkey::reseal(&mut v);
    if let Ok(k) = RkeyRepr::unpack(&v) {
        assert_eq!(k.pack(), v, "a key does not pack back to its bytes");
    }
}

/// The authentication handshake's messages (`AuthMsg::parse`), and the proofs in them
/// checked against a key as the handshake does: what parses emits back to a message that
/// parses the same, and a proof made of the peer's bytes never passes.
pub fn auth_handshake(data: &[u8]) {
    let Ok(m) = AuthMsg::parse(data) else {
        return;
    };
    assert!(is_auth(data));
    assert_eq!(
        AuthMsg::parse(&m.emit()).as_ref(),
        Ok(&m),
        "a handshake message does not parse back to itself"
    );
    let key = match Key::new(&[0x42; 32], "the fuzzer") {
        Ok(k) => k,
        Err(e) => panic!("a 32-byte key refused: {e}"),
    };
    let ours = [7u8; 32];
    match m {
        AuthMsg::Challenge { nonce, proof } => {
            black_box(key.verify(Role::Acceptor, &ours, &nonce, &proof));
        }
        AuthMsg::Response { proof } => {
            black_box(key.verify(Role::Initiator, &ours, &ours, &proof));
        }
        AuthMsg::Hello { nonce } => {
            black_box(key.proof(Role::Acceptor, &nonce, &ours));
        }
        AuthMsg::Reject { code, text } => {
            black_box((code, String::from_utf8_lossy(text).escape_debug().count()));
        }
    }
}

/// Connection setup as the accepting side reads it: the handshake's messages first, then
/// a `ConnReq` or `Wireup` frame (and, on the connecting side, `ConnAccept` or
/// `ConnReject`) carrying the peer's worker address.
pub fn conn_setup(data: &[u8]) {
    if is_auth(data) {
        return auth_handshake(data);
    }
    let Ok(f) = Frame::parse(data) else {
        return;
    };
    let address = match f {
        Frame::ConnReq { address, .. }
        | Frame::ConnAccept { address, .. }
        | Frame::Wireup { address, .. } => address,
        _ => return,
    };
    check_frame(&f);
    worker_address(address);
}

// ----- transports' framing and shared memory ----------------------------------------------

/// A tcp connection's bytes split into frames (the preamble, then length-prefixed frames):
/// under the limit of a connection in setup (small) and of one set up; each frame is then
/// parsed as the protocol layer would.
pub fn tcp_framing(data: &[u8]) {
    let setup_limit = 4096;
    if let Ok(frames) = courier::fuzzing::fuzz_framing(data, setup_limit) {
        for f in &frames {
            assert!(!f.is_empty() && f.len() <= setup_limit);
        }
    }
    if let Ok(frames) = courier::fuzzing::fuzz_framing(data, courier::fuzzing::MAX_FRAME) {
        for f in frames {
            frame(f);
        }
    }
}

/// The shared-memory transport's setup messages (hello, reply, confirmation) from the
/// first bytes of the input: what parses emits back to a message that parses the same.
pub fn shm_setup(data: &[u8]) {
    if let Some(b) = data.first_chunk::<{ shm::hello::LEN }>()
        && let Some(h) = Hello::parse(b)
    {
        assert_eq!(h.emit(), *b, "a hello does not emit back to its bytes");
    }
    if let Some(b) = data.first_chunk::<{ shm::reply::LEN }>()
        && let Some(r) = Reply::parse(b)
    {
        assert_eq!(Reply::parse(&r.emit()), Some(r));
    }
    if let Some(b) = data.first_chunk::<{ shm::confirm::LEN }>()
        && let Some(c) = shm::parse_confirm(b)
    {
        assert_eq!(shm::parse_confirm(&shm::emit_confirm(c)), Some(c));
    }
}

/// The shared segment's header as the acceptor checks it, against the cell count and size
/// a hello announced (the input's last 12 bytes).
pub fn shm_segment_header(data: &[u8]) {
    let Some(split) = data.len().checked_sub(12) else {
        return;
    };
    let (head, hello) = data.split_at(split);
    let ncells = u32::from_le_bytes([hello[0], hello[1], hello[2], hello[3]]) as usize;
    let size = u64_from(&hello[4..]);
    if let Some(s) = SegInfo::parse(head) {
        assert_eq!(SegInfo::parse(&s.emit()), Some(s));
        if s.check(ncells, size).is_ok() {
            assert_eq!(s.magic, shm::MAGIC);
            assert_eq!(s.ncells as usize, ncells);
            assert_eq!(s.seg_size, size);
        }
    }
}

/// A shared-memory FIFO's cells and packed words, read by the link's consumer.
pub fn shm_fifo(data: &[u8]) {
    black_box(courier::fuzzing::fuzz_consumer(data));
}

/// Key-table records a same-host peer reads: what decodes encodes back to words that
/// decode the same, and the secret reads whole.
pub fn key_table(data: &[u8]) {
    for chunk in data.chunks(keytable::ENTRY) {
        let Some(e) = Entry::parse(chunk) else {
            continue;
        };
        assert_eq!(Entry::parse(&e.emit()), Some(e));
        let w = e.words();
        assert_eq!(
            keytable::secret_of(w[keytable::entry::SECRET_LO], w[keytable::entry::SECRET_HI]),
            e.secret
        );
        if let Some(slot) = keytable::slot(e.region) {
            assert!(slot > 0 && slot < keytable::SLOTS);
            assert!(keytable::offset(slot, keytable::entry::SEGMENT) + 8 <= keytable::BYTES);
        }
    }
}

// ----- courier perf ---------------------------------------------------------------------

/// `courier perf`'s control message (a client's test parameters, JSON), as the server
/// decodes it: what decodes encodes back to a message that decodes the same.
pub fn perf_control(data: &[u8]) {
    use courier_cli::perf_params::Params;
    if let Ok(p) = Params::decode(data) {
        match Params::decode(&p.encode()) {
            Ok(q) => assert_eq!(q, p, "test parameters do not decode back to themselves"),
            Err(e) => panic!("test parameters it wrote are refused: {}", e.msg),
        }
    }
}

// ----- Extended Sockets -----------------------------------------------------------------

/// An EXS message header (`courier::wire::exs`), as the other end of an EXS connection
/// sent it: what decodes encodes back to exactly these bytes (every field is read, none
/// dropped), and the signal word a PLACE carries (its first 8 bytes, as a word) is made
/// again from what parsing reads out of it.
pub fn exs_message(data: &[u8]) {
    use courier::wire::exs::{self, word};
    if let Ok((p, m)) = exs::decode(data) {
        assert_eq!(
            exs::encode(p, &m),
            data,
            "a decoded EXS message re-encodes differently"
        );
        assert!(data.len() >= exs::PREFIX);
        if let exs::Msg::Hello(exs::Hello { key, .. }) | exs::Msg::Key { key, .. } = &m {
            assert!(key.len() <= exs::KEY_MAX);
        }
    }
    if data.len() >= 16 {
        let v = u64_from(&data[..8]);
        match word::parse(v) {
            Some((chunk, filled, trunc)) => {
                assert!(chunk <= word::CHUNK_MASK && filled <= word::LEN_MAX);
                assert_eq!(word::make(chunk, filled, trunc), v);
                let next = u64_from(&data[8..16]);
                if let Some(n) = word::chunks_through(next, chunk) {
                    assert!((1..=1 << (word::CHUNK_BITS - 1)).contains(&n));
                }
            }
            None => assert_eq!(v & word::VALID, 0),
        }
    }
}

// ----- jobs -------------------------------------------------------------------------------

/// `courier run`'s exchange (`courier::job::runwire`): a rank's hello and frames as the
/// launcher reads them, and the launcher's replies as a rank reads them. What decodes
/// encodes back to a frame of the announced length that decodes the same.
pub fn run_control(data: &[u8]) {
    use courier::job::runwire::{self, Reply, Request};
    if let Some(h) = data.first_chunk::<8>()
        && let Some(rank) = runwire::parse_hello(h)
    {
        assert_eq!(&runwire::hello(rank), h);
    }
    let body = data.get(1..).unwrap_or_default();
    if data.first().is_some_and(|b| b & 1 == 0) {
        if let Ok(r) = Request::decode(body) {
            let f = match r.encode() {
                Ok(f) => f,
                Err(e) => panic!("a request it decoded is refused by its encoder: {e}"),
            };
            check_run_frame(&f);
            match Request::decode(&f[4..]) {
                Ok(q) => assert_eq!(q, r, "a request does not decode back to itself"),
                Err(e) => panic!("a request it wrote is refused: {e}"),
            }
        }
    } else if let Ok(r) = Reply::decode(body) {
        let f = r.encode();
        check_run_frame(&f);
        match Reply::decode(&f[4..]) {
            Ok(q) => assert_eq!(q, r, "a reply does not decode back to itself"),
            Err(e) => panic!("a reply it wrote is refused: {e}"),
        }
    }
}

fn check_run_frame(f: &[u8]) {
    use courier::job::runwire;
    let n = runwire::frame_len([f[0], f[1], f[2], f[3]]);
    assert_eq!(
        n.ok(),
        Some(f.len() - 4),
        "a frame's length is not what it holds"
    );
}

/// What a rank reads from a PMI-1 or PMI-2 server (mpirun's, Slurm's) as text: a command
/// line's `key=value` pairs, a job value's chunk count and base64 (what decodes encodes back
/// to the same text), and the node layout (`PMI_process_mapping`) for a job whose size comes
/// from the input's first two bytes.
pub fn pmi_text(data: &[u8]) {
    use courier::job::text;
    let Some((size, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let Ok(line) = std::str::from_utf8(rest) else {
        return;
    };
    for sep in [' ', ';'] {
        if let Ok(pairs) = text::pairs(line, sep) {
            for (k, v) in pairs {
                assert!(!k.is_empty() && !k.contains(sep) && !v.contains(sep));
            }
        }
    }
    if let Ok((n, first)) = text::head(line) {
        assert!((1..=text::MAX_CHUNKS).contains(&n));
        if let Ok(b) = text::decode(first) {
            assert_eq!(
                text::encode(&b),
                first,
                "base64 that decodes encodes differently"
            );
        }
    }
    if let Ok(b) = text::decode(line) {
        assert_eq!(
            text::encode(&b),
            line,
            "base64 that decodes encodes differently"
        );
    }
    // Up to 1,023 ranks: the layout's work is linear in them, and more add no new paths.
    let size = u16::from_le_bytes(*size) as u32 % 1024;
    if let Ok(nodes) = text::process_mapping(line, size) {
        assert_eq!(nodes.len(), size as usize);
        // A few ranks: locality is linear in the job's size, and so is the layout.
        for r in [0, size / 2, size.saturating_sub(1)]
            .into_iter()
            .filter(|&r| r < size)
        {
            let (host, local_rank, local_size) = text::locality(&nodes, r);
            assert_eq!(host, nodes[r as usize]);
            assert!(local_rank < local_size);
        }
    }
}

// ----- OpenSHMEM --------------------------------------------------------------------------

/// What an OpenSHMEM PE reads of another's published records: its segments' record (what
/// parses emits back to the same bytes), and, split at the input's first byte, every PE's
/// machine and CPU set (the count of CPUs never exceeds the set's bits).
pub fn shmem_exchange(data: &[u8]) {
    use shmem_record::{SET_BYTES, emit, parse, shared};
    if let Ok(p) = parse(data) {
        assert_eq!(emit(&p), data, "a segment record re-emits differently");
    }
    let Some((&me, rest)) = data.split_first() else {
        return;
    };
    let all: Vec<Vec<u8>> = rest.chunks(16 + SET_BYTES).map(<[u8]>::to_vec).collect();
    if let Ok((local, cpus)) = shared(me as usize, &all) {
        assert!((1..=all.len()).contains(&local));
        assert!(cpus <= SET_BYTES * 8);
    }
}
