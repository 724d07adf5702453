//! wire — every layout a peer can read or write, as data: frames (`frame`), worker
//! addresses (`address`), the authentication handshake (`auth`), remote keys (`rkey`), the key table same-host peers read
//! (`keytable`), the shared-memory transport's setup messages, segment and FIFO cells
//! (`shm`), and the messages of Extended Sockets' ends (`exs`).
//!
//! Each layout has a field map (byte ranges or word indices), explicit encoding (little
//! endian on the network; native where both ends share a host), a checked `parse` that
//! returns an error and never panics, and an `emit` (or typed constructor) that writes it.
//! Transports move whole frames; they never look inside them. Every parser of peer input
//! has a property test here and a fuzz target (`fuzz/`). The module is public so that
//! fuzz targets and tests that play a hostile peer can build and parse these bytes.

pub mod address;
pub mod auth;
pub mod exs;
pub mod frame;
pub mod keytable;
pub mod rkey;
pub mod shm;

pub use frame::{Frame, Kind, WireError};
