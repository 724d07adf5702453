//! The authentication handshake's messages: the first frames on every new link between two
//! workers when they authenticate (`proto::wireup::auth` runs it), before any frame of the
//! protocol layer.
//!
//! ```text
//! 0       1      2         4            8
//! +-------+------+---------+------------+------------------------------------------+
//! | 0xA5  | type | version | code (u32) | body                                     |
//! +-------+------+---------+------------+------------------------------------------+
//! ```
//!
//! | type | body | length |
//! | --- | --- | --- |
//! | `HELLO` (initiator) | the initiator's nonce (32) | 40 |
//! | `CHALLENGE` (acceptor) | the acceptor's nonce (32), then its proof (32) | 72 |
//! | `RESPONSE` (initiator) | its proof (32) | 40 |
//! | `REJECT` (either) | why, UTF-8 text of at most `MAX_REASON` bytes; `code` a reason | 8 + text |
//!
//! The first byte is no frame kind of the protocol layer (`wire::frame::Kind`), so a
//! worker tells a handshake from a peer that skips it by one byte. All integers are
//! little-endian; every length is exact, so a truncated or padded message is refused.

use crate::base::auth::{NONCE_LEN, PROOF_LEN};

/// The first byte of every handshake message.
pub const MAGIC: u8 = 0xA5;
/// The layout version.
pub const VERSION: u16 = 1;
/// Bytes before the body.
pub const HEAD: usize = 8;
/// The longest reason text a `REJECT` carries.
pub const MAX_REASON: usize = 400;

/// Message types.
pub mod kind {
    /// The initiator's nonce.
    pub const HELLO: u8 = 1;
    /// The acceptor's nonce and proof.
    pub const CHALLENGE: u8 = 2;
    /// The initiator's proof.
    pub const RESPONSE: u8 = 3;
    /// The sender refuses the link, and says why.
    pub const REJECT: u8 = 4;
}

/// Reason codes of a `REJECT`.
pub mod reason {
    /// The peer's proof did not verify (another key).
    pub const BAD_PROOF: u32 = 1;
    /// The sender needs the peer to authenticate, and it did not.
    pub const AUTH_REQUIRED: u32 = 2;
    /// The sender has no key, so it cannot answer a handshake.
    pub const NO_KEY: u32 = 3;
    /// The message was malformed or out of order.
    pub const PROTOCOL: u32 = 4;
}

/// A decoded handshake message, borrowing the frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthMsg<'a> {
    /// The initiator's nonce.
    Hello {
        /// Nonce.
        nonce: [u8; NONCE_LEN],
    },
    /// The acceptor's nonce and proof.
    Challenge {
        /// Nonce.
        nonce: [u8; NONCE_LEN],
        /// Proof.
        proof: [u8; PROOF_LEN],
    },
    /// The initiator's proof.
    Response {
        /// Proof.
        proof: [u8; PROOF_LEN],
    },
    /// A refusal.
    Reject {
        /// Reason code (`reason`).
        code: u32,
        /// Why, as the peer wrote it (untrusted: print it escaped).
        text: &'a [u8],
    },
}

/// Why a handshake message was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthWireError {
    /// Not a handshake message at all (another first byte).
    #[error("not an authentication message (first byte {0:#04x})")]
    NotAuth(u8),
    /// Empty frame.
    #[error("empty frame")]
    Empty,
    /// A version this side does not speak.
    #[error("authentication version {0}, this side speaks {VERSION}")]
    Version(u16),
    /// An unknown type.
    #[error("unknown authentication message type {0}")]
    Type(u8),
    /// A length other than the type's.
    #[error("authentication message type {kind} is {len} bytes, must be {need}")]
    Length {
        /// Type.
        kind: u8,
        /// Bytes present.
        len: usize,
        /// Bytes it must have (the longest, for `REJECT`).
        need: usize,
    },
}

/// Whether `frame` is a handshake message (by its first byte).
pub fn is_auth(frame: &[u8]) -> bool {
    frame.first() == Some(&MAGIC)
}

fn head(kind: u8, code: u32) -> [u8; HEAD] {
    let mut h = [0u8; HEAD];
    h[0] = MAGIC;
    h[1] = kind;
    h[2..4].copy_from_slice(&VERSION.to_le_bytes());
    h[4..8].copy_from_slice(&code.to_le_bytes());
    h
}

impl AuthMsg<'_> {
    /// Parse one message; every length is exact.
    pub fn parse(b: &[u8]) -> Result<AuthMsg<'_>, AuthWireError> {
        let first = *b.first().ok_or(AuthWireError::Empty)?;
        if first != MAGIC {
            return Err(AuthWireError::NotAuth(first));
        }
        if b.len() < HEAD {
            return Err(AuthWireError::Length {
                kind: b.get(1).copied().unwrap_or(0),
                len: b.len(),
                need: HEAD,
            });
        }
        let kind = b[1];
        let version = u16::from_le_bytes([b[2], b[3]]);
        if version != VERSION {
            return Err(AuthWireError::Version(version));
        }
        let code = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let body = &b[HEAD..];
        let exact = |need: usize| {
            if b.len() == need {
                Ok(())
            } else {
                Err(AuthWireError::Length {
                    kind,
                    len: b.len(),
                    need,
                })
            }
        };
        let arr = |s: &[u8]| {
            let mut a = [0u8; 32];
            a.copy_from_slice(s);
            a
        };
        match kind {
            kind::HELLO => {
                exact(HEAD + NONCE_LEN)?;
                Ok(AuthMsg::Hello { nonce: arr(body) })
            }
            kind::CHALLENGE => {
                exact(HEAD + NONCE_LEN + PROOF_LEN)?;
                Ok(AuthMsg::Challenge {
                    nonce: arr(&body[..NONCE_LEN]),
                    proof: arr(&body[NONCE_LEN..]),
                })
            }
            kind::RESPONSE => {
                exact(HEAD + PROOF_LEN)?;
                Ok(AuthMsg::Response { proof: arr(body) })
            }
            kind::REJECT => {
                if body.len() > MAX_REASON {
                    return Err(AuthWireError::Length {
                        kind,
                        len: b.len(),
                        need: HEAD + MAX_REASON,
                    });
                }
                Ok(AuthMsg::Reject { code, text: body })
            }
            other => Err(AuthWireError::Type(other)),
        }
    }

    /// The message's bytes.
    pub fn emit(&self) -> Vec<u8> {
        match self {
            AuthMsg::Hello { nonce } => [&head(kind::HELLO, 0)[..], nonce].concat(),
            AuthMsg::Challenge { nonce, proof } => {
                [&head(kind::CHALLENGE, 0)[..], nonce, proof].concat()
            }
            AuthMsg::Response { proof } => [&head(kind::RESPONSE, 0)[..], proof].concat(),
            AuthMsg::Reject { code, text } => {
                let n = text.len().min(MAX_REASON);
                [&head(kind::REJECT, *code)[..], &text[..n]].concat()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_msg() -> impl Strategy<Value = (u8, [u8; 32], [u8; 32], u32, Vec<u8>)> {
        (
            1u8..=4,
            any::<[u8; 32]>(),
            any::<[u8; 32]>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..MAX_REASON),
        )
    }

    proptest! {
        #[test]
        fn emit_then_parse_is_identity((k, a, b, code, text) in any_msg()) {
            let m = match k {
                kind::HELLO => AuthMsg::Hello { nonce: a },
                kind::CHALLENGE => AuthMsg::Challenge { nonce: a, proof: b },
                kind::RESPONSE => AuthMsg::Response { proof: b },
                _ => AuthMsg::Reject { code, text: &text },
            };
            let bytes = m.emit();
            prop_assert!(is_auth(&bytes));
            prop_assert_eq!(AuthMsg::parse(&bytes).unwrap(), m);
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = AuthMsg::parse(&b);
        }

        #[test]
        fn truncated_and_padded_are_refused((k, a, b) in (1u8..=3, any::<[u8; 32]>(), any::<[u8; 32]>()), cut in 1usize..40) {
            let m = match k {
                kind::HELLO => AuthMsg::Hello { nonce: a },
                kind::CHALLENGE => AuthMsg::Challenge { nonce: a, proof: b },
                _ => AuthMsg::Response { proof: b },
            };
            let bytes = m.emit();
            let short = &bytes[..bytes.len().saturating_sub(cut)];
            prop_assert!(AuthMsg::parse(short).is_err());
            let mut long = bytes.clone();
            long.push(0);
            prop_assert!(AuthMsg::parse(&long).is_err());
        }
    }

    #[test]
    fn not_a_frame_kind() {
        assert!(
            crate::wire::frame::Frame::parse(&AuthMsg::Hello { nonce: [0; 32] }.emit()).is_err()
        );
        assert_eq!(
            AuthMsg::parse(&[23, 0, 0, 0]),
            Err(AuthWireError::NotAuth(23))
        );
        let mut v = AuthMsg::Response { proof: [0; 32] }.emit();
        v[2] = 9;
        assert_eq!(AuthMsg::parse(&v), Err(AuthWireError::Version(9)));
    }
}
