//! A Courier connection under an EXS socket: its set-up (each side sends a HELLO with what
//! its receive side offers), the dispatch of the peer's messages, failures, and the close
//! handshake.
//!
//! Close: `exs_close` cancels the sends not started, sends FIN (end of data, in order with
//! the data) and CLOSE; the peer drops every advertisement of ours (it will never write
//! into our buffers again) and answers CLOSE_ACK; only then do our pending receives
//! complete with `ECANCELED`, so a buffer handed back to the program is never written
//! after. A peer that does not answer within the give-up time, or dies, ends it too.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use courier_core::{
    AmFlags, AmMessage, AmRndv, Buf, Callback, Endpoint, Error, Info, MemMapParams, Memory,
    RemoteKey, Status,
};

use super::recv::{self, Rx};
use super::send::{self, Tx};
use super::sock::{Op, State, match_accepts};
use super::wire::{self, Hello, Msg, Prefix};
use super::{Fail, Lib, XResult, fail};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SockType {
    Stream,
    Seqpacket,
}

impl SockType {
    pub fn code(self) -> u16 {
        match self {
            SockType::Stream => libc::SOCK_STREAM as u16,
            SockType::Seqpacket => libc::SOCK_SEQPACKET as u16,
        }
    }
}

/// Names a connection slot (index and the generation it had when made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnRef {
    pub idx: u32,
    pub generation: u32,
}

/// Per-socket tuning (`exs_fcntl`); the connection-shaping ones are fixed at connect/listen.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Opts {
    /// Largest message sent eagerly (no advertisement needed).
    pub small_max: usize,
    /// Sends up to this size are copied at the call.
    pub inline_max: usize,
    /// STREAM: bytes the peer may send us eagerly (our receive buffer).
    pub rcvbuf: usize,
    /// STREAM: no receive buffer: direct placement only.
    pub no_rcvbuf: bool,
    /// Advertisements we may have out at once.
    pub adv: usize,
    /// SEQPACKET: small messages the peer may send us eagerly.
    pub slots: usize,
    /// Sends from this size that fill a whole advertisement go by split placement over
    /// shared memory (`place.rs`); 0: never.
    pub split_min: usize,
}

pub(crate) const SMALL_MAX_LIMIT: usize = 1 << 20;
pub(crate) const INLINE_MAX_LIMIT: usize = 1 << 20;
pub(crate) const RCVBUF_LIMIT: usize = 1 << 30;
pub(crate) const ADV_LIMIT: usize = 1024;
pub(crate) const SLOTS_LIMIT: usize = 1 << 16;
pub(crate) const SPLIT_MIN_LIMIT: usize = 1 << 40;

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            small_max: 8192,
            inline_max: 256,
            rcvbuf: 256 << 10,
            no_rcvbuf: false,
            adv: 64,
            slots: 64,
            split_min: super::place::PLACE_MIN,
        }
    }
}

pub(crate) enum Phase {
    /// Our HELLO is out; the peer's has not come.
    Hello,
    Open,
    /// We sent CLOSE and wait for CLOSE_ACK.
    Closing {
        deadline: Instant,
        op: Option<Op>,
    },
}

/// What the peer's HELLO said, and its signal words' key unpacked here.
pub(crate) struct Peer {
    pub conn: u32,
    pub generation: u32,
    pub words: u64,
    pub words_key: RemoteKey,
    pub slots: usize,
}

pub(crate) struct Conn {
    pub r: ConnRef,
    pub ty: SockType,
    pub ep: Endpoint,
    pub fd: Option<RawFd>,
    /// Server side, before `exs_accept` took it: the listening socket.
    pub listen_fd: Option<RawFd>,
    pub peer_addr: Option<SocketAddr>,
    pub phase: Phase,
    /// Reset: why (every later operation fails with its errno).
    pub err: Option<Fail>,
    /// The peer sent CLOSE: it takes nothing more and writes nothing more.
    pub peer_closed: bool,
    /// Set by `finalize`: `State::with_conn` frees the slot.
    pub dead_slot: bool,
    pub opts: Opts,
    pub peer: Option<Peer>,
    pub connect_op: Option<Op>,
    /// Our signal words, one per advertisement slot, written by the peer.
    pub words: Memory,
    pub tx: Tx,
    pub rx: Rx,
}

/// Header of a message to the peer (which must have said HELLO).
pub(crate) fn prefix(c: &mut Conn, kind: u8, flags: u8) -> Prefix {
    let (conn, generation) = c
        .peer
        .as_ref()
        .map_or((wire::NO_CONN, 0), |p| (p.conn, p.generation));
    c.rx.told = c.rx.freed;
    Prefix {
        kind,
        flags,
        conn,
        generation,
        ack: c.rx.freed,
    }
}

fn noop(_: usize, _: Result<Info, Error>, _: Info) {}

/// Send a control message (no data).
pub(crate) fn send_ctl(c: &mut Conn, kind: u8, m: &Msg) -> XResult<()> {
    let p = prefix(c, kind, 0);
    let hdr = wire::encode(p, m);
    // SAFETY: no data buffer; the header is copied by Courier during the call.
    unsafe {
        c.ep.am_send_raw(
            wire::AM_ID,
            &hdr,
            Buf::One((0, 0)),
            AmFlags::default(),
            Callback::Raw(noop, 0),
        )
    }
    .map_err(link_fail)?;
    Ok(())
}

/// A send to the peer failed: a link that broke under it (the peer died or reset it) is
/// the connection reset, as the peer's failure reported by Courier is (`ECONNRESET` on
/// what was pending), whichever of the two this process saw first.
fn link_fail(e: Error) -> Fail {
    let status = e.status();
    let mut f = Fail::from(e);
    let gone =
        matches!(status, Status::PeerFailure | Status::EndpointClosed) || f.errno == libc::EPIPE;
    if gone {
        f.errno = libc::ECONNRESET;
    }
    f
}

/// Make the connection of slot `r` on endpoint `ep` and send our HELLO.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    st: &mut State,
    l: &Lib,
    r: ConnRef,
    ep: Endpoint,
    ty: SockType,
    opts: Opts,
    connect: Option<(Op, RawFd)>,
    listen_fd: Option<RawFd>,
    peer_addr: Option<SocketAddr>,
) {
    let words = match l.ctx.mem_map(MemMapParams::allocate(opts.adv * 8)) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("EXS connection: signal words: {e}");
            if let Some((op, _)) = connect {
                st.fail_op(op, super::errno_of(&e));
            }
            if let Some(fd) = listen_fd {
                listen_done(st, fd, None);
            }
            ep.close_force();
            st.conn_free(r);
            return;
        }
    };
    let (connect_op, fd) = match connect {
        Some((op, fd)) => (Some(op), Some(fd)),
        None => (None, None),
    };
    let mut c = Box::new(Conn {
        r,
        ty,
        ep,
        fd,
        listen_fd,
        peer_addr,
        phase: Phase::Hello,
        err: None,
        peer_closed: false,
        dead_slot: false,
        opts,
        peer: None,
        connect_op,
        tx: Tx::default(),
        rx: Rx::new(ty, &opts),
        words,
    });
    let key = c.words.pack_rkey();
    let hello = key.map(|key| {
        Msg::Hello(Hello {
            ty: ty.code(),
            conn: r.idx,
            generation: r.generation,
            grant: c.rx.grant,
            eager_max: opts.small_max as u32,
            slots: opts.adv as u32,
            words: c.words.as_ptr() as u64,
            key,
        })
    });
    let sent = hello
        .map_err(Fail::from)
        .and_then(|m| send_ctl(&mut c, wire::K_HELLO, &m));
    st.conn_put(r, c);
    if let Err(e) = sent {
        st.with_conn(r, |st, c| reset(st, c, e));
    }
}

/// A listening socket's connection finished its handshake (`Some`) or failed (`None`).
fn listen_done(st: &mut State, fd: RawFd, ready: Option<ConnRef>) {
    if let Some(super::sock::SockState::Listening(ls)) = st.socks.get_mut(&fd).map(|s| &mut s.state)
    {
        ls.handshaking = ls.handshaking.saturating_sub(1);
        if let Some(r) = ready {
            ls.ready.push_back(r);
        }
    }
}

/// What to do once the connection is back in its slot.
enum After {
    Nothing,
    Ready(RawFd),
}

/// An EXS active message (inside progress).
pub(crate) fn on_am(m: &mut AmMessage<'_>) {
    let Some(l) = super::lib_opt() else { return };
    let ep = m.endpoint();
    let decoded = wire::decode(m.header());
    let mut st = l.st();
    let (p, msg) = match decoded {
        Ok(x) => x,
        Err(e) => {
            if let Some(r) = find_by_ep(&st, &ep, false) {
                st.with_conn(r, |st, c| reset(st, c, e));
            }
            return;
        }
    };
    let r = match &msg {
        Msg::Hello(_) => match find_by_ep(&st, &ep, true) {
            Some(r) => r,
            None => {
                tracing::debug!("EXS HELLO on an endpoint with no connection waiting for one");
                return;
            }
        },
        _ => ConnRef {
            idx: p.conn,
            generation: p.generation,
        },
    };
    let mut rndv = if p.kind == wire::K_PLACE {
        m.take_rndv()
    } else {
        None
    };
    let data = m.data();
    let after = st.with_conn(r, |st, c| {
        if !c.ep.same_as(&ep) {
            // Names a connection of another peer: a lie, or a message for a slot reused
            // since. Dropped; the peer's own connection is not touched.
            tracing::debug!("EXS message for a connection of another endpoint; dropped");
            return After::Nothing;
        }
        match handle(st, c, p, msg, data, &mut rndv) {
            Ok(a) => a,
            Err(e) => {
                reset(st, c, e);
                After::Nothing
            }
        }
    });
    if let Some(desc) = rndv {
        // A PLACE refused before it was looked at: its data stays at the sender.
        let _ = l.worker.am_decline(desc);
    }
    if let Some(After::Ready(fd)) = after {
        listen_done(&mut st, fd, Some(r));
        match_accepts(&mut st, fd);
    }
}

/// The connection of endpoint `ep` (`hello`: one waiting for the peer's HELLO).
fn find_by_ep(st: &State, ep: &Endpoint, hello: bool) -> Option<ConnRef> {
    st.conns.iter().find_map(|s| {
        let c = s.conn.as_ref()?;
        let waiting = matches!(c.phase, Phase::Hello);
        (c.ep.same_as(ep) && (!hello || waiting)).then_some(c.r)
    })
}

fn handle(
    st: &mut State,
    c: &mut Conn,
    p: Prefix,
    msg: Msg,
    data: &[u8],
    rndv: &mut Option<AmRndv>,
) -> XResult<After> {
    if c.dead_slot || c.err.is_some() {
        return Ok(After::Nothing);
    }
    if let Msg::Hello(h) = msg {
        if !matches!(c.phase, Phase::Hello) {
            return Err(fail(libc::EPROTO, "a second HELLO"));
        }
        return on_hello(st, c, h);
    }
    if matches!(c.phase, Phase::Hello) {
        return Err(fail(libc::EPROTO, "EXS message before the peer's HELLO"));
    }
    if !data.is_empty() && p.kind != wire::K_DATA {
        return Err(fail(libc::EPROTO, "data on an EXS control message"));
    }
    send::on_ack(c, p.ack)?;
    match msg {
        Msg::Hello(_) => return Err(fail(libc::EPROTO, "a second HELLO")),
        Msg::Advert(a) => send::on_advert(c, a)?,
        Msg::Key { slot, key } => send::on_key(c, slot, &key)?,
        Msg::Data { chunk } => recv::on_data(st, c, chunk, p.flags & wire::F_FIN != 0, data)?,
        Msg::Credit => {}
        Msg::Close => on_close(st, c)?,
        Msg::ShutRd => send::on_peer_shut_rd(st, c)?,
        Msg::ShutRdAck => recv::on_shut_rd_ack(st, c)?,
        Msg::Place { slot, value } => {
            let desc = rndv
                .take()
                .ok_or_else(|| fail(libc::EPROTO, "a PLACE whose data came eagerly"))?;
            super::place::on_place(st, c, slot, value, desc)?
        }
        Msg::CloseAck => {
            if matches!(c.phase, Phase::Closing { .. }) {
                finalize(st, c);
                return Ok(After::Nothing);
            }
            return Err(fail(libc::EPROTO, "CLOSE_ACK without a CLOSE"));
        }
    }
    send::pump(st, c);
    Ok(After::Nothing)
}

fn on_hello(st: &mut State, c: &mut Conn, h: Hello) -> XResult<After> {
    if h.ty != c.ty.code() {
        return Err(fail(
            libc::EPROTOTYPE,
            format!(
                "the peer's socket type is {} and ours {}",
                h.ty,
                c.ty.code()
            ),
        ));
    }
    let slots = h.slots as usize;
    if slots == 0 || slots > ADV_LIMIT || h.eager_max as usize > SMALL_MAX_LIMIT {
        return Err(fail(
            libc::EPROTO,
            format!(
                "HELLO with {slots} advertisement slots and eager maximum {}",
                h.eager_max
            ),
        ));
    }
    let grant_limit = match c.ty {
        SockType::Stream => RCVBUF_LIMIT as u64,
        SockType::Seqpacket => SLOTS_LIMIT as u64,
    };
    if h.grant > grant_limit {
        return Err(fail(
            libc::EPROTO,
            format!("HELLO granting {} eager credits", h.grant),
        ));
    }
    let words_key =
        c.ep.rkey_unpack(&h.key)
            .map_err(|e| fail(libc::EPROTO, format!("the peer's signal-word key: {e}")))?;
    let (base, len) = words_key.bounds();
    let end = h.words.checked_add(slots as u64 * 8);
    if h.words < base
        || end.is_none_or(|e| e > base.saturating_add(len))
        || !h.words.is_multiple_of(8)
    {
        return Err(fail(
            libc::EPROTO,
            "the peer's signal words lie outside their key",
        ));
    }
    let frame_max = c.ep.am_eager_max(wire::PREFIX + 8)?;
    c.tx.setup(
        c.ty,
        h.grant,
        (h.eager_max as usize).min(c.opts.small_max).min(frame_max),
        slots,
    );
    c.peer = Some(Peer {
        conn: h.conn,
        generation: h.generation,
        words: h.words,
        words_key,
        slots,
    });
    c.phase = Phase::Open;
    if let Some(op) = c.connect_op.take() {
        st.finish(op, 0, 0);
    }
    send::pump(st, c);
    Ok(match c.listen_fd {
        Some(fd) => After::Ready(fd),
        None => After::Nothing,
    })
}

/// The peer closes: it drops our advertisements' data path and answers.
fn on_close(st: &mut State, c: &mut Conn) -> XResult<()> {
    c.peer_closed = true;
    // Deliver what it wrote before it said so (everything it wrote is in place now).
    recv::process(st, c);
    send::peer_gone(st, c, libc::EPIPE);
    send_ctl(c, wire::K_CLOSE_ACK, &Msg::CloseAck)
}

/// Courier reports the endpoint failed (inside progress).
pub(crate) fn on_ep_error(st: &mut State, r: ConnRef, e: &Error) {
    let e = e.clone();
    st.with_conn(r, |st, c| {
        if matches!(c.phase, Phase::Closing { .. }) {
            finalize(st, c);
            return;
        }
        if c.peer_closed {
            // The peer closed its side after CLOSE: expected.
            return;
        }
        let mut f = Fail::from(e.clone());
        if matches!(
            e.status(),
            Status::PeerFailure | Status::EndpointClosed | Status::IoError
        ) {
            f.errno = if matches!(c.phase, Phase::Hello) && c.connect_op.is_some() {
                libc::ECONNREFUSED
            } else {
                libc::ECONNRESET
            };
        }
        reset(st, c, f);
    });
}

/// The connection is broken (`f`): every pending operation fails with its errno, the
/// endpoint is closed, and later calls fail the same way.
pub(crate) fn reset(st: &mut State, c: &mut Conn, f: Fail) {
    if c.err.is_some() || c.dead_slot {
        return;
    }
    tracing::info!("EXS connection to {}: {}", c.ep.peer(), f.detail);
    let errno = f.errno;
    c.err = Some(f);
    if let Some(op) = c.connect_op.take() {
        st.fail_op(op, errno);
    }
    recv::fail_all(st, c, errno);
    super::place::close_ep(st, c.r, c.ep.clone());
    if let Phase::Closing { op, .. } = &mut c.phase {
        if let Some(op) = op.take() {
            st.finish(op, 0, 0);
        }
        c.dead_slot = true;
        return;
    }
    if c.fd.is_none() {
        // Not handed to the program (server side before exs_accept): gone for good.
        if let Some(fd) = c.listen_fd {
            if matches!(c.phase, Phase::Hello) {
                listen_done(st, fd, None);
            } else if let Some(super::sock::SockState::Listening(ls)) =
                st.socks.get_mut(&fd).map(|s| &mut s.state)
            {
                ls.ready.retain(|&x| x != c.r);
            }
        }
        c.dead_slot = true;
    }
}

/// `exs_shutdown` on a connection: SHUT_RD, SHUT_WR or both (checked by the caller).
pub(crate) fn shutdown(st: &mut State, c: &mut Conn, how: i32) -> XResult<()> {
    if c.err.is_some() || !matches!(c.phase, Phase::Open) {
        return Err(fail(
            libc::ENOTCONN,
            "exs_shutdown: the connection is not set up, or it broke",
        ));
    }
    if how != libc::SHUT_WR
        && let Err(e) = recv::shutdown_rd(st, c)
    {
        let errno = e.errno;
        reset(st, c, e.clone());
        return Err(fail(errno, e.detail));
    }
    if how != libc::SHUT_RD {
        send::shutdown_wr(st, c);
    }
    Ok(())
}

/// `exs_close` on a connection (or a listener dropping one not accepted).
pub(crate) fn close(st: &mut State, c: &mut Conn, op: Option<Op>) {
    c.fd = None;
    let gone = c.err.is_some() || c.peer_closed || matches!(c.phase, Phase::Hello);
    if gone {
        if let Some(o) = c.connect_op.take() {
            st.fail_op(o, libc::ECANCELED);
        }
        c.phase = Phase::Closing {
            deadline: Instant::now(),
            op,
        };
        finalize(st, c);
        return;
    }
    send::cancel_sends(st, c);
    let fin = send::send_fin(c);
    let closed = fin.and_then(|()| send_ctl(c, wire::K_CLOSE, &Msg::Close));
    let limit = crate::exs::lib_opt()
        .map(|l| l.ctx.config().give_up_after())
        .unwrap_or(Duration::from_secs(5));
    c.phase = Phase::Closing {
        deadline: Instant::now() + limit,
        op,
    };
    if closed.is_err() {
        finalize(st, c);
        return;
    }
    st.closing.push(c.r);
}

/// The end: receives still pending complete with `ECANCELED` (the peer writes into them no
/// more), the CLOSE event is posted, the endpoint closed, the slot freed.
pub(crate) fn finalize(st: &mut State, c: &mut Conn) {
    recv::fail_all(st, c, libc::ECANCELED);
    if let Phase::Closing { op, .. } = &mut c.phase
        && let Some(op) = op.take()
    {
        st.finish(op, 0, 0);
    }
    if c.err.is_none() {
        super::place::close_ep(st, c.r, c.ep.clone());
    }
    c.dead_slot = true;
}

/// Connections whose peer never answered our CLOSE, past their deadline (and endpoints
/// whose placements never ended: `place::close_ep`).
pub(crate) fn expire_closing(st: &mut State) {
    let now = Instant::now();
    super::place::expire(st, now);
    let due: Vec<ConnRef> = st
        .closing
        .iter()
        .copied()
        .filter(|&r| {
            st.conns
                .get(r.idx as usize)
                .and_then(|s| s.conn.as_ref().filter(|_| s.generation == r.generation))
                .is_some_and(
                    |c| matches!(c.phase, Phase::Closing { deadline, .. } if deadline <= now),
                )
        })
        .collect();
    for r in due {
        st.with_conn(r, |st, c| {
            tracing::info!(
                "EXS close: {} did not answer in time; closing anyway",
                c.ep.peer()
            );
            finalize(st, c);
        });
    }
}

impl Conn {
    /// Why an operation cannot start on this connection now, if it cannot.
    pub fn usable(&self, sending: bool) -> XResult<()> {
        if let Some(e) = &self.err {
            return Err(fail(e.errno, e.detail.clone()));
        }
        match self.phase {
            Phase::Hello => Err(fail(libc::ENOTCONN, "the connection is not set up yet")),
            Phase::Closing { .. } => Err(fail(libc::EBADF, "the socket is closing")),
            Phase::Open if sending && (self.tx.shut || self.tx.fin) => Err(fail(
                libc::EPIPE,
                "the socket was shut down for writing (exs_shutdown)",
            )),
            Phase::Open if sending && self.tx.peer_rd_shut => Err(fail(
                libc::EPIPE,
                "the peer shut its socket down for reading",
            )),
            Phase::Open if sending && self.peer_closed => {
                Err(fail(libc::EPIPE, "the peer closed the connection"))
            }
            Phase::Open => Ok(()),
        }
    }
}
