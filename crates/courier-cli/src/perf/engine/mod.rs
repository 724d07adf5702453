//! The test loops, client and server side, and the control exchange between them.
//!
//! Control: the client sends each test's parameters as a tag message (`TAG_CTRL`, JSON);
//! the server answers `TAG_ACK` ("ok" or an error sentence), both run the test, and a
//! `{"op":"done"}` ends the session. `{"op":"info"}` asks where the server runs (answered
//! "ok" and a JSON object). One-way tests end with the server's `TAG_FIN`, so the
//! client's clock covers every message's arrival.
//!
//! One file per concern: `link` (a connected endpoint, waits that end when the peer fails
//! or stalls, the heartbeat), `session` (the control exchange, the server), `twosided`
//! (message buffers and the ping-pong tests), `streaming` (the one-way and windowed
//! bandwidth tests). The one-sided tests are `super::rma`, the sweeps `super::sweep`.

mod link;
mod session;
mod streaming;
mod twosided;

pub(super) use link::{BEAT, Beat, Idle};
pub use link::{Failure, Link, MIN_STALL, accept, connect};
pub use session::{
    MAX_THREADS, ServeOpts, add_sides, client_finish, client_start, client_threads, serve, sides,
};
pub use twosided::run_client;
pub(super) use twosided::{buffers_what, pattern, try_ring, try_vec, verify};

const TAG_CTRL: u64 = 0xC0DE_0000_0000_0001;
const TAG_ACK: u64 = 0xC0DE_0000_0000_0002;
pub(in crate::perf) const TAG_FIN: u64 = 0xC0DE_0000_0000_0003;
const TAG_PING: u64 = 0x1000;
const TAG_PONG: u64 = 0x1001;
const AM_PING: u16 = 1;
const AM_PONG: u16 = 2;
/// The client's proof of life during one-sided tests (no payload; the server's handler
/// ignores it, its arrival is the point).
const AM_ALIVE: u16 = 3;
const CTRL_MAX: usize = 64 << 10;
