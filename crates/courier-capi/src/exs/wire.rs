//! What two EXS ends send each other: the layout is `courier::wire::exs` (with the other
//! layouts a peer can write, and fuzzed with them); here its refusals become `EPROTO`.

pub(crate) use courier_core::wire::exs::*;

use super::{XResult, fail};

/// Parse one message header (everything but the data); a malformed one is `EPROTO`.
pub(crate) fn decode(b: &[u8]) -> XResult<(Prefix, Msg)> {
    courier_core::wire::exs::decode(b).map_err(|e| fail(libc::EPROTO, e.0))
}
