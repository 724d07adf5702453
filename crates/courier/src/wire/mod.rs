//! wire — every layout a peer can send, as data.
//!
//! Each frame kind has a field map (byte ranges), explicit little-endian encoding, a
//! checked `parse` that returns an error and never panics, and an `emit` that writes the
//! fixed header into a caller-owned buffer. Transports move whole frames; they never look
//! inside them. Every parser here has a property test and a fuzz target.

pub mod address;
pub mod frame;
pub mod keytable;
pub mod rkey;
pub mod shm;

pub use frame::{Frame, Kind, WireError};
