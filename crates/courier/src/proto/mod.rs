//! proto — protocols built on transport capabilities, never on a transport's name:
//! wireup and lane selection, eager and rendezvous, tag matching, active messages, streams,
//! flush and close, peer-failure handling.

pub mod am;
pub(crate) mod core;
pub(crate) mod fdpoll;
pub mod memreg;
pub(crate) mod pieces;
pub(crate) mod place;
pub(crate) mod progress;
pub(crate) mod recv;
pub(crate) mod rma;
pub(crate) mod stage;
pub mod state;
pub(crate) mod stream;
pub mod tag;
pub mod wireup;
