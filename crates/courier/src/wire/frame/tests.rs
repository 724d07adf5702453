//! Field maps, parsing and the typed headers, against each other and hostile bytes.

use super::*;
use proptest::prelude::*;

fn frame(h: Header, payload: &[u8]) -> Vec<u8> {
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[test]
fn round_trips() {
    let b = frame(Header::new(Kind::TagEager).word(1, 0xdead_beef), b"hello");
    assert_eq!(
        Frame::parse(&b).unwrap(),
        Frame::TagEager {
            tag: 0xdead_beef,
            data: b"hello"
        }
    );

    let b = frame(
        Header::new(Kind::Am)
            .aux16(7)
            .aux32(3)
            .flags(flags::AM_REPLY),
        b"hdrdata",
    );
    assert_eq!(
        Frame::parse(&b).unwrap(),
        Frame::Am {
            id: 7,
            reply: true,
            header: b"hdr",
            data: b"data"
        }
    );

    let mut segs = Vec::new();
    emit_segments(&mut segs, [(0x1000u64, 10u64), (0x2000, 6)].into_iter());
    let b = frame(
        Header::new(Kind::TagRts)
            .word(1, 5)
            .word(2, 9)
            .word(3, 16)
            .aux32(2)
            .flags(flags::SYNC),
        &segs,
    );
    match Frame::parse(&b).unwrap() {
        Frame::TagRts {
            tag: 5,
            sreq: 9,
            len: 16,
            sync: true,
            segs,
        } => {
            assert_eq!(
                segs.iter().collect::<Vec<_>>(),
                vec![(0x1000, 10), (0x2000, 6)]
            );
        }
        f => panic!("{f:?}"),
    }

    let t = RemoteRef {
        region: 0x1001,
        secret: 77 | 88 << 64,
        addr: 0x4000,
    };
    // The secret is two words, low half first.
    let put = Header::new(Kind::PutBegin)
        .word(1, t.region)
        .word(2, 77)
        .word(3, 88)
        .word(4, t.addr)
        .word(5, 1 << 30);
    assert_eq!(
        Frame::parse(put.as_bytes()).unwrap(),
        Frame::PutBegin {
            target: t,
            len: 1 << 30,
            signal: None
        }
    );
    let s = RemoteRef {
        region: 0x2002,
        secret: 5 << 64 | 6,
        addr: 0x8008,
    };
    let b = put
        .flags(flags::SIGNAL)
        .aux16(1)
        .word(6, s.region)
        .word(7, 6)
        .word(8, 5)
        .word(9, s.addr);
    assert_eq!(
        Frame::parse(b.as_bytes()).unwrap(),
        Frame::PutBegin {
            target: t,
            len: 1 << 30,
            signal: Some((s, 1))
        }
    );
}

#[test]
fn rejects_lies() {
    assert_eq!(Frame::parse(&[]), Err(WireError::Empty));
    assert_eq!(Frame::parse(&[200]), Err(WireError::UnknownKind(200)));
    assert!(matches!(
        Frame::parse(&[1, 0, 0]),
        Err(WireError::Truncated { .. })
    ));
    // Header length beyond the frame.
    let b = frame(Header::new(Kind::Am).aux32(100), b"abc");
    assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
    // Segment count that does not match.
    let b = frame(Header::new(Kind::TagRts).word(3, 16).aux32(5), &[0u8; 16]);
    assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
    // Segments that do not add up.
    let mut segs = Vec::new();
    emit_segments(&mut segs, [(0u64, 3u64)].into_iter());
    let b = frame(Header::new(Kind::TagRts).word(3, 16).aux32(1), &segs);
    assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
    // Overflowing segment lengths.
    let mut segs = Vec::new();
    emit_segments(&mut segs, [(0u64, u64::MAX), (0, 2)].into_iter());
    let b = frame(Header::new(Kind::TagRts).word(3, 1).aux32(2), &segs);
    assert!(matches!(Frame::parse(&b), Err(WireError::BadField(_))));
    // An offer flagged shared with no room for its key.
    let mut segs = Vec::new();
    emit_segments(&mut segs, [(64u64, 16u64)].into_iter());
    let shared = Header::new(Kind::TagRts)
        .word(3, 16)
        .aux32(1)
        .flags(flags::SHARED);
    assert!(matches!(
        Frame::parse(&frame(shared, &segs)),
        Err(WireError::BadField(_))
    ));
}

#[test]
fn a_segment_list_is_acted_on_as_read_once_and_checked_again() {
    let mut raw = Vec::new();
    emit_segments(&mut raw, [(4096u64, 10u64), (8192, 6)].into_iter());
    let b = frame(Header::new(Kind::TagRts).word(3, 16).aux32(2), &raw);
    let Ok(Frame::TagRts { segs, .. }) = Frame::parse(&b) else {
        panic!("a well-formed offer")
    };
    let got: Vec<(u64, u64)> = segs.read_once().expect("as parsed");
    assert_eq!(got, vec![(4096, 10), (8192, 6)]);
    // The same bytes rewritten by a peer after `parse` checked them (here: lengths that
    // no longer add up to the 16 bytes the header says, and that overflow) are refused.
    for changed in [[(4096u64, 10u64), (8192, 600)], [(0, u64::MAX), (0, 17)]] {
        let mut raw = Vec::new();
        emit_segments(&mut raw, changed.into_iter());
        let after = Segments { raw: &raw, ..segs };
        let e = after.read_once::<Vec<(u64, u64)>>().unwrap_err();
        assert_eq!(
            e,
            WireError::BadField("segment list changed after it was checked")
        );
    }
}

#[test]
fn shared_offers_carry_their_key_after_the_segments() {
    let key: Vec<u8> = (0..crate::wire::rkey::LEN as u8).collect();
    let mut extra = Vec::new();
    emit_segments(&mut extra, [(64u64, 10u64), (4096, 6)].into_iter());
    extra.extend_from_slice(&key);
    let h = Header::new(Kind::RndvSplit)
        .word(1, 1)
        .word(2, 2)
        .word(3, 0)
        .word(4, 16)
        .aux32(2)
        .flags(flags::SHARED);
    match Frame::parse(&frame(h, &extra)).unwrap() {
        Frame::RndvSplit { segs, len, .. } => {
            assert_eq!(len, 16);
            assert_eq!(segs.iter().collect::<Vec<_>>(), [(64, 10), (4096, 6)]);
            assert_eq!(segs.shared_key(), Some(&key[..]));
        }
        f => panic!("{f:?}"),
    }
    // Unflagged, the same bytes are a segment list of the wrong length.
    let h = Header::new(Kind::RndvSplit).word(4, 16).aux32(2);
    assert!(matches!(
        Frame::parse(&frame(h, &extra)),
        Err(WireError::BadField(_))
    ));
    // An active-message offer: header, segments, key.
    let mut extra = b"hd".to_vec();
    emit_segments(&mut extra, [(8u64, 5u64)].into_iter());
    extra.extend_from_slice(&key);
    let h = Header::new(Kind::AmRts)
        .aux32(2)
        .word(2, 5)
        .word(3, 1)
        .flags(flags::SHARED);
    match Frame::parse(&frame(h, &extra)).unwrap() {
        Frame::AmRts { header, segs, .. } => {
            assert_eq!(header, b"hd");
            assert_eq!(segs.len(), 1);
            assert_eq!(segs.shared_key(), Some(&key[..]));
        }
        f => panic!("{f:?}"),
    }
    // A device region's key carries its IPC trailer; a key of any other length is refused.
    let dkey: Vec<u8> = (0..(crate::wire::rkey::LEN + crate::wire::rkey::IPC_LEN) as u8).collect();
    for (k, ok) in [
        (&dkey[..], true),
        (&dkey[..crate::wire::rkey::LEN + 1], false),
    ] {
        let mut extra = Vec::new();
        emit_segments(&mut extra, [(1u64 << 40, 70_000u64)].into_iter());
        extra.extend_from_slice(k);
        let h = Header::new(Kind::TagRts)
            .word(3, 70_000)
            .aux32(1)
            .flags(flags::SHARED);
        match Frame::parse(&frame(h, &extra)) {
            Ok(Frame::TagRts { segs, .. }) if ok => assert_eq!(segs.shared_key(), Some(k)),
            Err(WireError::BadField(_)) if !ok => {}
            other => panic!("key of {} bytes: {other:?}", k.len()),
        }
    }
}

proptest! {
    #[test]
    fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = Frame::parse(&b);
    }

    #[test]
    fn fast_readers_agree_with_parse(k in prop::sample::select(vec![1u8, 2, 8, 9, 20]),
                                     rest in proptest::collection::vec(any::<u8>(), 0..96)) {
        let mut b = vec![k];
        b.extend(rest);
        match Frame::parse(&b) {
            Ok(Frame::TagEager { tag, data }) => {
                prop_assert_eq!(Frame::as_tag_eager(&b), Some((tag, data)));
            }
            _ => prop_assert_eq!(Frame::as_tag_eager(&b), None),
        }
        match Frame::parse(&b) {
            Ok(Frame::Am { id, reply, header, data }) => {
                prop_assert_eq!(Frame::as_am(&b), Some((id, reply, header, data)));
            }
            _ => prop_assert_eq!(Frame::as_am(&b), None),
        }
    }

    #[test]
    fn parse_never_panics_on_known_kinds(k in prop::sample::select(vec![1u8,2,3,4,5,6,7,8,9,10,11,12,20,21,22,23,30,31,32,33,34,35,36,37,38]),
                                         rest in proptest::collection::vec(any::<u8>(), 0..96)) {
        let mut b = vec![k];
        b.extend(rest);
        let _ = Frame::parse(&b);
    }
}

proptest! {
    /// Every typed header parses back to the values it was built from: the constructors
    /// and `parse` read the same field maps.
    #[test]
    fn typed_headers_parse_back(a in any::<u64>(), b in any::<u64>(), c in any::<u64>(),
                                d in any::<u64>(), op in any::<u16>(), st in any::<i32>(),
                                n in 0u32..4, k in any::<u128>(), k2 in any::<u128>()) {
        let t = RemoteRef { region: a, secret: k, addr: c };
        let s = RemoteRef { region: d, secret: k2, addr: b ^ 2 };
        let check = |h: Header, want: Frame<'static>| -> Result<(), TestCaseError> {
            prop_assert_eq!(Frame::parse(h.as_bytes()), Ok(want));
            Ok(())
        };
        check(Header::tag_eager(a), Frame::TagEager { tag: a, data: &[] })?;
        check(Header::tag_eager_sync(a, b), Frame::TagEagerSync { tag: a, sreq: b, data: &[] })?;
        check(Header::rndv_ats(a, st), Frame::RndvAts { sreq: a, status: st })?;
        check(Header::rndv_rtr(a, b, c), Frame::RndvRtr { sreq: a, rreq: b, len: c })?;
        check(Header::rndv_data(a, b), Frame::RndvData { rreq: a, offset: b, data: &[] })?;
        check(Header::sync_ack(a), Frame::SyncAck { sreq: a })?;
        check(Header::rndv_split_done(a, st), Frame::RndvSplitDone { rreq: a, status: st })?;
        check(Header::am(op, 0, flags::AM_REPLY), Frame::Am { id: op, reply: true, header: &[], data: &[] })?;
        check(Header::conn_req(a), Frame::ConnReq { client_id: a, address: &[] })?;
        check(Header::conn_accept(a), Frame::ConnAccept { conn_id: a, address: &[] })?;
        check(Header::wireup(a, n), Frame::Wireup { conn_id: a, purpose: n, address: &[] })?;
        check(Header::put(&t, d), Frame::Put { target: t, req: d, data: &[] })?;
        check(Header::rma_ack(a, st, b), Frame::RmaAck { req: a, status: st, value: b })?;
        check(Header::get_req(&t, d, a), Frame::GetReq { target: t, req: d, len: a })?;
        check(Header::get_resp(a, b, st), Frame::GetResp { req: a, offset: b, status: st, data: &[] })?;
        for bits32 in [false, true] {
            check(Header::atomic(&t, d, op, bits32, a, b), Frame::Atomic { target: t, req: d, op, bits32, operand: a, compare: b })?;
        }
        check(Header::put_signal(&t, d, &s, op, a), Frame::PutSignal { target: t, req: d, signal: s, op, value: a, data: &[] })?;
        check(Header::flush_req(a), Frame::FlushReq { req: a })?;
        check(Header::flush_ack(a), Frame::FlushAck { req: a })?;
        check(Header::put_begin(&t, d, None), Frame::PutBegin { target: t, len: d, signal: None })?;
        check(Header::put_begin(&t, d, Some((&s, op))), Frame::PutBegin { target: t, len: d, signal: Some((s, op)) })?;
        // The small-message paths' words are the typed headers' bytes.
        let words = tag_eager_words(a);
        let tag = Header::tag_eager(a);
        prop_assert_eq!(words.as_flattened(), tag.as_bytes());
        let word = am_word(op, n == 1, n);
        let am = Header::am(op, n, if n == 1 { flags::AM_REPLY } else { 0 });
        prop_assert_eq!(&word[..], am.as_bytes());
    }
}

/// Every kind's field map lies inside its header, without overlaps, and its header ends
/// where its last field does: the header-length table and the field maps agree.
#[test]
fn field_maps_fill_their_headers() {
    use field::*;
    let r = |f: &RefFields| vec![f.region.clone(), f.secret.clone(), f.addr.clone()];
    let common = |v: Vec<Field>| {
        let mut all = vec![KIND..KIND + 1, FLAGS..FLAGS + 1];
        all.extend(v);
        all
    };
    let kinds: Vec<(Kind, Vec<Field>)> = vec![
        (Kind::TagEager, vec![tag_eager::TAG]),
        (
            Kind::TagEagerSync,
            vec![tag_eager_sync::TAG, tag_eager_sync::SREQ],
        ),
        (
            Kind::TagRts,
            vec![tag_rts::TAG, tag_rts::SREQ, tag_rts::LEN, tag_rts::COUNT],
        ),
        (Kind::RndvAts, vec![rndv_ats::SREQ, rndv_ats::STATUS]),
        (
            Kind::RndvRtr,
            vec![rndv_rtr::SREQ, rndv_rtr::RREQ, rndv_rtr::LEN],
        ),
        (Kind::RndvData, vec![rndv_data::RREQ, rndv_data::OFFSET]),
        (Kind::SyncAck, vec![sync_ack::SREQ]),
        (
            Kind::RndvSplit,
            vec![
                rndv_split::SREQ,
                rndv_split::RREQ,
                rndv_split::OFFSET,
                rndv_split::LEN,
                rndv_split::COUNT,
            ],
        ),
        (
            Kind::RndvSplitDone,
            vec![rndv_split_done::RREQ, rndv_split_done::STATUS],
        ),
        (Kind::Am, vec![am::ID, am::HEADER_LEN]),
        (
            Kind::AmRts,
            vec![
                am_rts::ID,
                am_rts::HEADER_LEN,
                am_rts::SREQ,
                am_rts::LEN,
                am_rts::COUNT,
            ],
        ),
        (Kind::ConnReq, vec![conn_req::CLIENT_ID]),
        (Kind::ConnAccept, vec![conn_accept::CONN_ID]),
        (Kind::Wireup, vec![wireup::CONN_ID, wireup::PURPOSE]),
        (Kind::Put, [r(&put::TARGET), vec![put::REQ]].concat()),
        (
            Kind::RmaAck,
            vec![rma_ack::REQ, rma_ack::STATUS, rma_ack::VALUE],
        ),
        (
            Kind::GetReq,
            [r(&get_req::TARGET), vec![get_req::REQ, get_req::LEN]].concat(),
        ),
        (
            Kind::GetResp,
            vec![get_resp::REQ, get_resp::OFFSET, get_resp::STATUS],
        ),
        (
            Kind::Atomic,
            [
                r(&atomic::TARGET),
                vec![atomic::OP, atomic::REQ, atomic::OPERAND, atomic::COMPARE],
            ]
            .concat(),
        ),
        (
            Kind::PutSignal,
            [
                r(&put_signal::TARGET),
                r(&put_signal::SIGNAL),
                vec![put_signal::OP, put_signal::REQ, put_signal::VALUE],
            ]
            .concat(),
        ),
        (Kind::FlushReq, vec![flush_req::REQ]),
        (Kind::FlushAck, vec![flush_ack::REQ]),
        (
            Kind::PutBegin,
            [
                r(&put_begin::TARGET),
                r(&put_begin::SIGNAL),
                vec![put_begin::LEN, put_begin::OP],
            ]
            .concat(),
        ),
        (Kind::Stream, vec![]),
        (Kind::Close, vec![]),
        (Kind::Keepalive, vec![]),
        (Kind::ConnReject, vec![]),
    ];
    for (kind, fields) in kinds {
        let mut fields = common(fields);
        fields.sort_by_key(|f| f.start);
        for w in fields.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "{kind:?}: {:?} overlaps {:?}",
                w[0],
                w[1]
            );
        }
        let end = fields.iter().map(|f| f.end).max().unwrap_or(0).max(8);
        assert_eq!(
            kind.header_len(),
            end,
            "{kind:?}: header length vs field map"
        );
        assert!(kind.header_len() <= MAX_HEADER_LEN, "{kind:?}");
        assert_eq!(Kind::from_u8(kind as u8), Some(kind));
    }
    for f in [
        put::TARGET,
        get_req::TARGET,
        atomic::TARGET,
        put_signal::TARGET,
        put_signal::SIGNAL,
        put_begin::TARGET,
        put_begin::SIGNAL,
    ] {
        assert_eq!(f.secret.len(), 16, "a secret is 128 bits");
    }
}
