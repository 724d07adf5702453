//! Inputs every target's corpus starts from: well-formed messages of each format, written
//! by the library's own emitters.

use courier::wire::address::WorkerAddress;
use courier::wire::auth::AuthMsg;
use courier::wire::frame::{Frame, Header, Kind, emit_segments, flags};
use courier::wire::keytable::Entry;
use courier::wire::rkey::{self, RkeyRepr};
use courier::wire::shm::{self, Hello, Reply, SegInfo};

use crate::emit;

/// Inputs every target's corpus starts from: one or more well-formed messages of its
/// format, written by the library's own emitters (`make fuzz-seeds` writes them into
/// `corpus/`).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    use courier::wire::frame::RemoteRef;
    let t = RemoteRef {
        region: 0x1001,
        secret: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        addr: 0x7f00_0000_1000,
    };
    let key = RkeyRepr {
        mem_type: 0,
        access: rkey::access::ALL,
        region: 0x1001,
        secret: t.secret,
        base: 0x7f00_0000_0000,
        length: 1 << 20,
        ctx_id: 77,
        host_id: [5; 16],
        pid: 4242,
        table_fd: 9,
        region_fd: 10,
        ipc: None,
    }
    .pack();
    let address = WorkerAddress {
        worker_id: 0x1122_3344,
        host_id: [5; 16],
        pid: 4242,
        uds_name: b"courier-4242-1".to_vec(),
        tcp: vec![
            "127.0.0.1:5000".parse().expect("address"),
            "[::1]:6000".parse().expect("address"),
        ],
        max_frame_k: 0,
    }
    .pack();
    let mut segs = Vec::new();
    emit_segments(&mut segs, [(0x1000u64, 10u64), (0x2000, 6)].into_iter());
    let mut shared = segs.clone();
    shared.extend_from_slice(&key);
    let frames: Vec<Vec<u8>> = vec![
        emit(&Frame::TagEager {
            tag: 5,
            data: b"hello",
        }),
        emit(&Frame::TagEagerSync {
            tag: 5,
            sreq: 9,
            data: b"sync",
        }),
        [Header::tag_rts(5, 9, 16, 2, flags::SYNC).as_bytes(), &segs].concat(),
        [
            Header::tag_rts(5, 9, 16, 2, flags::SHARED).as_bytes(),
            &shared,
        ]
        .concat(),
        emit(&Frame::RndvAts {
            sreq: 9,
            status: -3,
        }),
        emit(&Frame::RndvRtr {
            sreq: 9,
            rreq: 4,
            len: 1 << 20,
        }),
        emit(&Frame::RndvData {
            rreq: 4,
            offset: 64,
            data: b"chunk",
        }),
        emit(&Frame::SyncAck { sreq: 9 }),
        [
            Header::rndv_split(9, 4, 0, 16, 2, flags::SHARED).as_bytes(),
            &shared,
        ]
        .concat(),
        emit(&Frame::RndvSplitDone { rreq: 4, status: 0 }),
        emit(&Frame::Am {
            id: 3,
            reply: true,
            header: b"hd",
            data: b"data",
        }),
        [
            Header::am_rts(3, 2, flags::AM_REPLY, 9, 16, 2).as_bytes(),
            b"hd",
            &segs,
        ]
        .concat(),
        emit(&Frame::Stream { data: b"bytes" }),
        emit(&Frame::Close),
        emit(&Frame::Keepalive { ping: true }),
        emit(&Frame::ConnReq {
            client_id: 1,
            address: &address,
        }),
        emit(&Frame::ConnAccept {
            conn_id: 2,
            address: &address,
        }),
        emit(&Frame::ConnReject),
        emit(&Frame::Wireup {
            conn_id: 2,
            purpose: 1,
            address: &address,
        }),
        emit(&Frame::Put {
            target: t,
            req: 6,
            data: b"put",
        }),
        emit(&Frame::RmaAck {
            req: 6,
            status: 0,
            value: 42,
        }),
        emit(&Frame::GetReq {
            target: t,
            req: 6,
            len: 64,
        }),
        emit(&Frame::GetResp {
            req: 6,
            offset: 0,
            status: 0,
            data: b"got",
        }),
        emit(&Frame::Atomic {
            target: t,
            req: 6,
            op: 1,
            bits32: true,
            operand: 1,
            compare: 0,
        }),
        emit(&Frame::FlushReq { req: 6 }),
        emit(&Frame::FlushAck { req: 6 }),
        emit(&Frame::PutSignal {
            target: t,
            req: 6,
            signal: t,
            op: 1,
            value: 1,
            data: b"ps",
        }),
        emit(&Frame::PutBegin {
            target: t,
            len: 1 << 20,
            signal: Some((t, 1)),
        }),
    ];
    let auth = vec![
        AuthMsg::Hello { nonce: [1; 32] }.emit(),
        AuthMsg::Challenge {
            nonce: [2; 32],
            proof: [3; 32],
        }
        .emit(),
        AuthMsg::Response { proof: [4; 32] }.emit(),
        AuthMsg::Reject {
            code: 1,
            text: b"bad proof",
        }
        .emit(),
    ];
    let cell = |seq: u64, len: u32, ncells: u32, body: &[u8]| {
        let mut c = vec![0u8; shm::CELL];
        c[..8].copy_from_slice(&seq.to_ne_bytes());
        c[8..12].copy_from_slice(&len.to_ne_bytes());
        c[12..16].copy_from_slice(&ncells.to_ne_bytes());
        c[16..16 + body.len()].copy_from_slice(body);
        c
    };
    let word = |kind: u64, len: u64| (kind | shm::pos_tag(0) | len).to_ne_bytes();
    let packed = [
        &word(shm::VALID, 5)[..],
        b"abcde\0\0\0",
        &word(shm::PAD, 0),
        &[0; 24],
        &word(shm::VALID, 3),
        b"xyz\0\0\0\0\0",
        &word(shm::CLOSE, 0),
    ]
    .concat();
    match target {
        "frame" => frames,
        "rndv_segments" => vec![
            [&[0u8, flags::SYNC, 2, 0][..], &16u64.to_le_bytes(), &[0], &segs].concat(),
            [&[1u8, flags::SHARED, 2, 0][..], &16u64.to_le_bytes(), &[0], &shared].concat(),
            [&[2u8, flags::SHARED, 2, 0][..], &16u64.to_le_bytes(), &[2], b"hd", &shared].concat(),
        ],
        "worker_address" => vec![address],
        "remote_key" => vec![key],
        "auth_handshake" => auth,
        "conn_setup" => {
            let mut v = auth;
            v.extend(frames.into_iter().filter(|f| {
                [Kind::ConnReq, Kind::ConnAccept, Kind::ConnReject, Kind::Wireup]
                    .iter()
                    .any(|k| f[0] == *k as u8)
            }));
            v
        }
        "tcp_framing" => {
            let mut wire = courier::fuzzing::PREAMBLE.to_vec();
            for f in frames.iter().take(6) {
                wire.extend_from_slice(&(f.len() as u32).to_le_bytes());
                wire.extend_from_slice(f);
            }
            vec![wire]
        }
        "shm_setup" => vec![
            Hello { version: shm::VERSION, policy: 1, ncells: 1024, cell: shm::CELL as u32, size: 1 << 20 }.emit().to_vec(),
            Reply::Ok { flags: 4, pid: 42 }.emit().to_vec(),
            Reply::No { pid: 42, reason: 1 }.emit().to_vec(),
            shm::emit_confirm(shm::confirm::CMA).to_vec(),
        ],
        "shm_segment_header" => {
            let s = SegInfo {
                magic: shm::MAGIC,
                version: shm::VERSION,
                cell_size: shm::CELL as u32,
                ncells: 1024,
                seg_size: 1 << 20,
                layout: shm::LAYOUT,
            };
            vec![[&s.emit()[..], &1024u32.to_le_bytes(), &(1u64 << 20).to_le_bytes()].concat()]
        }
        "shm_fifo" => vec![
            [
                cell(1, 10, 1, b"0123456789"),
                cell(2, 300, 2, &[7; 240]),
                vec![7; shm::CELL],
                cell(4, 5, 1, b"tail!"),
                cell(u64::MAX, 0, 0, &[]),
            ]
            .concat(),
            [cell(1, 0, 1 | shm::PACKED, &packed), cell(u64::MAX, 0, 0, &[])].concat(),
            [cell(1, shm::SKIP, 16, &[])].concat(),
        ],
        "key_table" => vec![
            Entry {
                valid: 1,
                region: 0x1001,
                secret: t.secret,
                base: 0x7f00_0000_0000,
                len: 4096,
                access: rkey::access::ALL,
                mem_type: 0,
                segment: 1234,
            }
            .emit()
            .to_vec(),
        ],
        "perf_control" => vec![
            br#"{"op":"test","test":"tag_lat","sizes":[8,65536],"iters":1000,"warmup":10,"window":32,"check":true,"mem":["host","host"]}"#.to_vec(),
            br#"{"op":"test","test":"ucp_put_bw","sizes":[4096],"iters":100,"warmup":1,"window":1,"check":false}"#.to_vec(),
        ],
        "exs_message" => exs_seeds(&key),
        "run_control" => run_seeds(),
        "shmem_exchange" => shmem_seeds(&key),
        "pmi_text" => [
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
            "cmd=get_result rc=0 value=2:AAECAwQ\n",
            "cmd=fullinit-response;pmi-version=2;rank=1;size=4;rc=0;",
            "3:AAECAwQFBgcICQ",
            "AAECAwQFBgcICQ",
            "(vector,(0,2,2))",
            "(vector,(0,1,3),(1,2,1))",
        ]
        .iter()
        .map(|t| [&4u16.to_le_bytes()[..], t.as_bytes()].concat())
        .collect(),
        _ => Vec::new(),
    }
}

fn exs_seeds(key: &[u8]) -> Vec<Vec<u8>> {
    use courier::wire::exs::{self, Advert, Msg, Prefix, word};
    let p = |kind: u8, flags: u8| Prefix {
        kind,
        flags,
        conn: 3,
        generation: 1,
        ack: 4096,
    };
    let hello = Msg::Hello(exs::Hello {
        ty: 5,
        conn: 7,
        generation: 1,
        grant: 1 << 20,
        eager_max: 8192,
        slots: 64,
        words: 0x7f00_0000_2000,
        key: key.to_vec(),
    });
    let advert = Msg::Advert(Advert {
        slot: 3,
        key: 1,
        flags: exs::A_WAITALL,
        addr: 0x7f00_0000_4000,
        len: 65536,
        tag: 12,
    });
    let place = Msg::Place {
        slot: 3,
        value: word::make(12, 4096, false),
    };
    vec![
        exs::encode(p(exs::K_HELLO, 0), &hello),
        exs::encode(p(exs::K_ADVERT, 0), &advert),
        exs::encode(
            p(exs::K_KEY, 0),
            &Msg::Key {
                slot: 1,
                key: key.to_vec(),
            },
        ),
        exs::encode(p(exs::K_DATA, exs::F_FIN), &Msg::Data { chunk: 12 }),
        exs::encode(p(exs::K_CREDIT, 0), &Msg::Credit),
        exs::encode(p(exs::K_CLOSE, 0), &Msg::Close),
        exs::encode(p(exs::K_SHUT_RD_ACK, 0), &Msg::ShutRdAck),
        exs::encode(p(exs::K_PLACE, 0), &place),
    ]
}

fn run_seeds() -> Vec<Vec<u8>> {
    use courier::job::runwire::{self, Reply, Request, Welcome};
    let requests = [
        Request::Put {
            key: "addr".into(),
            value: vec![1, 2, 3, 4],
        },
        Request::Commit,
        Request::Fence { timeout_ms: 5000 },
        Request::Get {
            rank: 1,
            key: "addr".into(),
            timeout_ms: 5000,
        },
        Request::Abort {
            code: 3,
            message: "bad input".into(),
        },
        Request::Finalize,
    ];
    let replies = [
        Reply::Welcome(Welcome {
            rank: 1,
            size: 4,
            local_rank: 1,
            local_size: 4,
            host: 0,
            auth_key: [9; 32],
            jobid: "job-1".into(),
        }),
        Reply::Done,
        Reply::Value(vec![5; 16]),
        Reply::Fail {
            status: -2,
            message: "rank 3 exited".into(),
        },
    ];
    let mut v = vec![runwire::hello(2).to_vec()];
    for r in requests {
        if let Ok(f) = r.encode() {
            v.push([&[0u8][..], &f[4..]].concat());
        }
    }
    for r in replies {
        v.push([&[1u8][..], &r.encode()[4..]].concat());
    }
    v
}

fn shmem_seeds(key: &[u8]) -> Vec<Vec<u8>> {
    use crate::shmem_record::{Published, SET_BYTES, emit};
    let heap = (0x7f00_0000_0000, 1 << 26, key);
    let data = (0x5555_0000_0000, 1 << 16, key);
    let cpus = |machine: u8, set: u8| {
        let mut v = vec![machine; 16];
        v.extend(std::iter::once(set).chain(std::iter::repeat_n(0, SET_BYTES - 1)));
        v
    };
    vec![
        emit(&Published {
            host: [5; 16],
            segs: [heap, data],
        }),
        emit(&Published {
            host: [5; 16],
            segs: [heap, (0, 0, &[][..])],
        }),
        [&[1u8][..], &cpus(1, 0b11), &cpus(1, 0b10), &cpus(2, 0b01)].concat(),
    ]
}
