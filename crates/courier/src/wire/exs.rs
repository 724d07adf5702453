//! Extended Sockets (`exs.h`, in `courier-capi`): what two EXS ends send each other, as
//! active-message headers (all little endian). Every message starts with the same 24 bytes: its kind, flags, the connection it is for (the
//! receiver's index and generation, learned from its HELLO), and the sender's credit
//! acknowledgement (how much of the eager credit the receiver of this message spent that
//! the sender of it has freed, cumulative). Data bytes travel as the message's data.
//!
//! ```text
//! 0    1     2      4         8         12        16           24
//! +----+-----+------+---------+---------+---------+------------+
//! |kind|flags| 0    | conn idx| conn gen| 0       | credit ack |
//! +----+-----+------+---------+---------+---------+------------+
//! HELLO   +0: magic "EXS1" u32, version u16, socket type u16, sender's conn idx u32, gen
//!             u32, eager grant u64, largest eager message u32, advertisement slots u32,
//!             signal words' address u64, key length u16, key bytes
//! ADVERT  +0: slot u16, key slot u16, flags u32 (WAITALL), address u64, length u64,
//!             tag u64 (SEQPACKET: message number; STREAM: eager chunks seen)
//! KEY     +0: key slot u16, key length u16, key bytes
//! DATA    +0: chunk u64 (flags: FIN)
//! PLACE   +0: slot u16, 0 u16, 0 u32, signal word value u64; the data by Courier's
//!             rendezvous (shared memory: both processes copy a part, in parallel), into
//!             the whole advertisement `slot` (`exs::recv::on_place`)
//! CREDIT, CLOSE, CLOSE_ACK, SHUT_RD, SHUT_RD_ACK: nothing more
//! (SHUT_RD: the sender of it reads no more (`exs_shutdown` SHUT_RD): its advertisements
//! are void and the receiver of it sends no more; SHUT_RD_ACK answers once nothing more
//! will be written into them.)
//! ```
//! Parsing checks lengths and fields; what a field means against the connection's state
//! (slots in range, chunks in order, credits not overdrawn) is checked by the EXS engine
//! (`courier-capi`'s `exs::send` and `exs::recv`). The signal word (`word`) is peer input
//! too: the sender of a PLACE writes it into the receiver's memory.

/// The active-message id of every EXS message.
pub const AM_ID: u16 = 0x4558;
/// A HELLO's first word.
pub const MAGIC: u32 = u32::from_le_bytes(*b"EXS1");
/// The protocol version a HELLO carries (2: PLACE); a peer of another is refused.
pub const VERSION: u16 = 2;
/// Bytes of the common prefix.
pub const PREFIX: usize = 24;

/// Kind: opens a connection's EXS state (either side).
pub const K_HELLO: u8 = 1;
/// Kind: a posted receive's buffer, offered for direct placement.
pub const K_ADVERT: u8 = 2;
/// Kind: a packed remote key for the advertisements that name its slot.
pub const K_KEY: u8 = 3;
/// Kind: eager data (the message's data), into the receiver's own buffer.
pub const K_DATA: u8 = 4;
/// Kind: a credit acknowledgement alone.
pub const K_CREDIT: u8 = 5;
/// Kind: the sender closed its socket.
pub const K_CLOSE: u8 = 6;
/// Kind: the answer to CLOSE.
pub const K_CLOSE_ACK: u8 = 7;
/// Kind: the sender reads no more.
pub const K_SHUT_RD: u8 = 8;
/// Kind: the answer to SHUT_RD.
pub const K_SHUT_RD_ACK: u8 = 9;
/// Kind: data placed into an advertised buffer by rendezvous.
pub const K_PLACE: u8 = 10;

/// DATA: the sender sends nothing after this chunk number.
pub const F_FIN: u8 = 1;
/// ADVERT: the receive waits for all its bytes (the sender fills it, chunk by chunk).
pub const A_WAITALL: u32 = 1;

/// Connection index meaning "not known yet" (HELLO).
pub const NO_CONN: u32 = u32::MAX;
/// Largest packed remote key carried.
pub const KEY_MAX: usize = 512;

/// The common prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// One of the `K_*` kinds.
    pub kind: u8,
    /// `F_FIN` on DATA; nothing else is defined.
    pub flags: u8,
    /// The receiver's connection index (`NO_CONN` in a first HELLO).
    pub conn: u32,
    /// The generation of that index.
    pub generation: u32,
    /// Eager credit of the receiver of this message freed by its sender, cumulative.
    pub ack: u64,
}

/// A HELLO's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's socket type (`SOCK_STREAM` or `SOCK_SEQPACKET`).
    pub ty: u16,
    /// The sender's connection index.
    pub conn: u32,
    /// Its generation.
    pub generation: u32,
    /// Eager credit the receiver of the HELLO may spend before the sender frees some.
    pub grant: u64,
    /// Largest eager message the sender takes.
    pub eager_max: u32,
    /// Advertisement slots (and signal words) the sender keeps.
    pub slots: u32,
    /// Where the sender's signal words lie (in the region of `key`).
    pub words: u64,
    /// The packed remote key of the signal words.
    pub key: Vec<u8>,
}

/// An ADVERT's fields: a posted receive's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advert {
    /// The advertisement slot (and signal word) it takes.
    pub slot: u16,
    /// The key slot whose KEY covers the buffer.
    pub key: u16,
    /// `A_WAITALL` or 0.
    pub flags: u32,
    /// The buffer's address in the receiver.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// SEQPACKET: the message number it takes; STREAM: eager chunks seen.
    pub tag: u64,
}

/// One EXS message, after the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// `K_HELLO`.
    Hello(Hello),
    /// `K_ADVERT`.
    Advert(Advert),
    /// `K_KEY`: the packed remote key for key slot `slot`.
    Key {
        /// The key slot.
        slot: u16,
        /// The packed key.
        key: Vec<u8>,
    },
    /// `K_DATA`: eager chunk number `chunk` (its bytes are the message's data).
    Data {
        /// The chunk number.
        chunk: u64,
    },
    /// `K_CREDIT`.
    Credit,
    /// `K_CLOSE`.
    Close,
    /// `K_CLOSE_ACK`.
    CloseAck,
    /// `K_SHUT_RD`.
    ShutRd,
    /// `K_SHUT_RD_ACK`.
    ShutRdAck,
    /// Data for advertisement `slot`, by rendezvous; `value`: its signal word's.
    Place {
        /// The advertisement slot.
        slot: u16,
        /// The signal word's value once placed (`word::make`).
        value: u64,
    },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The prefix's bytes (the start of every message).
pub fn prefix(p: Prefix) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.push(p.kind);
    v.push(p.flags);
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&p.conn.to_le_bytes());
    v.extend_from_slice(&p.generation.to_le_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&p.ack.to_le_bytes());
    v
}

/// A whole message header: the prefix, then `m`'s fields.
pub fn encode(p: Prefix, m: &Msg) -> Vec<u8> {
    let mut v = prefix(p);
    match m {
        Msg::Hello(h) => {
            v.extend_from_slice(&MAGIC.to_le_bytes());
            v.extend_from_slice(&VERSION.to_le_bytes());
            v.extend_from_slice(&h.ty.to_le_bytes());
            v.extend_from_slice(&h.conn.to_le_bytes());
            v.extend_from_slice(&h.generation.to_le_bytes());
            v.extend_from_slice(&h.grant.to_le_bytes());
            v.extend_from_slice(&h.eager_max.to_le_bytes());
            v.extend_from_slice(&h.slots.to_le_bytes());
            v.extend_from_slice(&h.words.to_le_bytes());
            v.extend_from_slice(&(h.key.len() as u16).to_le_bytes());
            v.extend_from_slice(&h.key);
        }
        Msg::Advert(a) => {
            v.extend_from_slice(&a.slot.to_le_bytes());
            v.extend_from_slice(&a.key.to_le_bytes());
            v.extend_from_slice(&a.flags.to_le_bytes());
            v.extend_from_slice(&a.addr.to_le_bytes());
            v.extend_from_slice(&a.len.to_le_bytes());
            v.extend_from_slice(&a.tag.to_le_bytes());
        }
        Msg::Key { slot, key } => {
            v.extend_from_slice(&slot.to_le_bytes());
            v.extend_from_slice(&(key.len() as u16).to_le_bytes());
            v.extend_from_slice(key);
        }
        Msg::Data { chunk } => v.extend_from_slice(&chunk.to_le_bytes()),
        Msg::Place { slot, value } => {
            v.extend_from_slice(&slot.to_le_bytes());
            v.extend_from_slice(&[0; 6]);
            v.extend_from_slice(&value.to_le_bytes());
        }
        Msg::Credit | Msg::Close | Msg::CloseAck | Msg::ShutRd | Msg::ShutRdAck => {}
    }
    v
}

/// Why a message header was refused: a sentence for the log and the error event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExsWireError(pub String);

impl std::fmt::Display for ExsWireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExsWireError {}

fn bad(what: impl Into<String>) -> ExsWireError {
    ExsWireError(what.into())
}

fn exact(b: &[u8], n: usize, what: &str) -> Result<(), ExsWireError> {
    if b.len() != n {
        return Err(bad(format!(
            "{what} message of {} header bytes (expected {n})",
            b.len() + PREFIX
        )));
    }
    Ok(())
}

/// Parse one message header (everything but the data).
pub fn decode(b: &[u8]) -> Result<(Prefix, Msg), ExsWireError> {
    if b.len() < PREFIX {
        return Err(bad(format!("EXS message header of {} bytes", b.len())));
    }
    let p = Prefix {
        kind: b[0],
        flags: b[1],
        conn: u32_at(b, 4),
        generation: u32_at(b, 8),
        ack: u64_at(b, 16),
    };
    if b[2] != 0 || b[3] != 0 || u32_at(b, 12) != 0 {
        return Err(bad("reserved bytes of an EXS message are not zero"));
    }
    let known_flags = if p.kind == K_DATA { F_FIN } else { 0 };
    if p.flags & !known_flags != 0 {
        return Err(bad(format!(
            "unknown flags {:#x} on EXS message kind {}",
            p.flags, p.kind
        )));
    }
    let r = &b[PREFIX..];
    let m = match p.kind {
        K_HELLO => {
            if r.len() < 42 {
                return Err(bad("short HELLO"));
            }
            if u32_at(r, 0) != MAGIC {
                return Err(bad("HELLO without the EXS magic"));
            }
            let version = u16_at(r, 4);
            if version != VERSION {
                return Err(bad(format!(
                    "peer speaks EXS protocol version {version}, this library {VERSION}"
                )));
            }
            let klen = u16_at(r, 40) as usize;
            if klen > KEY_MAX {
                return Err(bad(format!("HELLO key of {klen} bytes")));
            }
            exact(r, 42 + klen, "HELLO")?;
            Msg::Hello(Hello {
                ty: u16_at(r, 6),
                conn: u32_at(r, 8),
                generation: u32_at(r, 12),
                grant: u64_at(r, 16),
                eager_max: u32_at(r, 24),
                slots: u32_at(r, 28),
                words: u64_at(r, 32),
                key: r[42..].to_vec(),
            })
        }
        K_ADVERT => {
            exact(r, 32, "ADVERT")?;
            let flags = u32_at(r, 4);
            if flags & !A_WAITALL != 0 {
                return Err(bad(format!("unknown ADVERT flags {flags:#x}")));
            }
            Msg::Advert(Advert {
                slot: u16_at(r, 0),
                key: u16_at(r, 2),
                flags,
                addr: u64_at(r, 8),
                len: u64_at(r, 16),
                tag: u64_at(r, 24),
            })
        }
        K_KEY => {
            if r.len() < 4 {
                return Err(bad("short KEY"));
            }
            let klen = u16_at(r, 2) as usize;
            if klen > KEY_MAX {
                return Err(bad(format!("KEY of {klen} bytes")));
            }
            exact(r, 4 + klen, "KEY")?;
            Msg::Key {
                slot: u16_at(r, 0),
                key: r[4..].to_vec(),
            }
        }
        K_DATA => {
            exact(r, 8, "DATA")?;
            Msg::Data {
                chunk: u64_at(r, 0),
            }
        }
        K_CREDIT => {
            exact(r, 0, "CREDIT")?;
            Msg::Credit
        }
        K_CLOSE => {
            exact(r, 0, "CLOSE")?;
            Msg::Close
        }
        K_CLOSE_ACK => {
            exact(r, 0, "CLOSE_ACK")?;
            Msg::CloseAck
        }
        K_SHUT_RD => {
            exact(r, 0, "SHUT_RD")?;
            Msg::ShutRd
        }
        K_SHUT_RD_ACK => {
            exact(r, 0, "SHUT_RD_ACK")?;
            Msg::ShutRdAck
        }
        K_PLACE => {
            exact(r, 16, "PLACE")?;
            if u16_at(r, 2) != 0 || u32_at(r, 4) != 0 {
                return Err(bad("reserved bytes of a PLACE are not zero"));
            }
            Msg::Place {
                slot: u16_at(r, 0),
                value: u64_at(r, 8),
            }
        }
        k => return Err(bad(format!("unknown EXS message kind {k}"))),
    };
    Ok((p, m))
}

/// The value a sender sets in a receive's signal word when it has written into the
/// advertised buffer: bit 63 truncated (SEQPACKET), bit 62 always set, bits 40..62 the low
/// 22 bits of the last chunk number written there, bits 0..40 the bytes written there in
/// all (one chunk, or several for a WAITALL receive filled chunk by chunk).
pub mod word {
    /// SEQPACKET: the message was longer than the buffer.
    pub const TRUNC: u64 = 1 << 63;
    /// Always set in a written word (a zero word means nothing written).
    pub const VALID: u64 = 1 << 62;
    /// Bits of the chunk number kept.
    pub const CHUNK_BITS: u32 = 22;
    /// Mask of `CHUNK_BITS`.
    pub const CHUNK_MASK: u64 = (1 << CHUNK_BITS) - 1;
    /// Bits of the byte count.
    pub const LEN_BITS: u32 = 40;
    /// Largest byte count.
    pub const LEN_MAX: u64 = (1 << LEN_BITS) - 1;

    /// The word for `filled` bytes of which the last chunk written is `chunk`.
    pub fn make(chunk: u64, filled: u64, trunc: bool) -> u64 {
        VALID
            | if trunc { TRUNC } else { 0 }
            | (chunk & CHUNK_MASK) << LEN_BITS
            | (filled & LEN_MAX)
    }

    /// (chunk low bits, bytes, truncated), or `None` for a word with the valid bit clear.
    pub fn parse(v: u64) -> Option<(u64, u64, bool)> {
        if v & VALID == 0 {
            return None;
        }
        Some(((v >> LEN_BITS) & CHUNK_MASK, v & LEN_MAX, v & TRUNC != 0))
    }

    /// How far `low` (22 bits) is past the chunk number `next`: the count of chunks from
    /// `next` to it, inclusive, if it lies within half the window.
    pub fn chunks_through(next: u64, low: u64) -> Option<u64> {
        let d = low.wrapping_sub(next) & CHUNK_MASK;
        (d < (1 << (CHUNK_BITS - 1))).then_some(d + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kind: u8) -> Prefix {
        Prefix {
            kind,
            flags: 0,
            conn: 3,
            generation: 9,
            ack: 77,
        }
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Msg::Hello(Hello {
                ty: 5,
                conn: 1,
                generation: 2,
                grant: 1 << 20,
                eager_max: 8192,
                slots: 64,
                words: 0xdead_0000,
                key: vec![7; 76],
            }),
            Msg::Advert(Advert {
                slot: 3,
                key: 4,
                flags: A_WAITALL,
                addr: 0x1000,
                len: 4096,
                tag: 99,
            }),
            Msg::Key {
                slot: 2,
                key: vec![1; 76],
            },
            Msg::Data { chunk: 12345 },
            Msg::Credit,
            Msg::Close,
            Msg::CloseAck,
            Msg::ShutRd,
            Msg::ShutRdAck,
            Msg::Place {
                slot: 5,
                value: word::make(7, 1 << 19, false),
            },
        ];
        for m in msgs {
            let kind = match &m {
                Msg::Hello(_) => K_HELLO,
                Msg::Advert(_) => K_ADVERT,
                Msg::Key { .. } => K_KEY,
                Msg::Data { .. } => K_DATA,
                Msg::Credit => K_CREDIT,
                Msg::Close => K_CLOSE,
                Msg::CloseAck => K_CLOSE_ACK,
                Msg::ShutRd => K_SHUT_RD,
                Msg::ShutRdAck => K_SHUT_RD_ACK,
                Msg::Place { .. } => K_PLACE,
            };
            let b = encode(p(kind), &m);
            assert_eq!(decode(&b).expect("decode"), (p(kind), m));
        }
    }

    #[test]
    fn malformed_messages_are_refused() {
        let good = encode(p(K_DATA), &Msg::Data { chunk: 1 });
        // Every truncation and every extension is refused.
        for n in 0..good.len() {
            assert!(decode(&good[..n]).is_err(), "{n} bytes");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        // Unknown kind, flags, reserved bytes.
        let mut b = good.clone();
        b[0] = 99;
        assert!(decode(&b).is_err());
        let mut b = good.clone();
        b[1] = 0x80;
        assert!(decode(&b).is_err());
        let mut b = good.clone();
        b[2] = 1;
        assert!(decode(&b).is_err());
        let mut b = encode(p(K_CREDIT), &Msg::Credit);
        b[1] = F_FIN;
        assert!(decode(&b).is_err(), "FIN only on DATA");
        // A HELLO whose key length lies, or without the magic.
        let h = encode(
            p(K_HELLO),
            &Msg::Hello(Hello {
                ty: 1,
                conn: 0,
                generation: 0,
                grant: 0,
                eager_max: 0,
                slots: 1,
                words: 0,
                key: vec![0; 10],
            }),
        );
        let mut b = h.clone();
        b[PREFIX + 40] = 11;
        assert!(decode(&b).is_err());
        let mut b = h.clone();
        b[PREFIX] ^= 1;
        assert!(decode(&b).is_err());
        let mut b = h;
        b[PREFIX + 4] = VERSION as u8 + 1;
        assert!(decode(&b).is_err(), "other protocol version");
        // Unknown advertisement flags.
        let mut a = encode(
            p(K_ADVERT),
            &Msg::Advert(Advert {
                slot: 0,
                key: 0,
                flags: 0,
                addr: 0,
                len: 0,
                tag: 0,
            }),
        );
        a[PREFIX + 4] = 2;
        assert!(decode(&a).is_err());
    }

    #[test]
    fn signal_words() {
        let v = word::make(0x0001_2345_6789, 4096, true);
        let (c, n, t) = word::parse(v).expect("valid");
        assert_eq!((c, n, t), (0x0001_2345_6789 & word::CHUNK_MASK, 4096, true));
        assert_eq!(word::parse(0), None);
        // A zero-length message into chunk 0 is still a valid word.
        assert!(word::parse(word::make(0, 0, false)).is_some());
        assert_eq!(word::chunks_through(10, 10), Some(1));
        assert_eq!(word::chunks_through(10, 12), Some(3));
        assert_eq!(word::chunks_through(10, 9), None, "behind");
        let wrap = word::CHUNK_MASK;
        assert_eq!(word::chunks_through(wrap, 0), Some(2), "across the wrap");
    }

    use proptest::prelude::*;

    fn any_msg() -> impl Strategy<Value = (u8, Msg)> {
        let key = || proptest::collection::vec(any::<u8>(), 0..=KEY_MAX);
        prop_oneof![
            (any::<(u16, u32, u32, u64, u32, u32, u64)>(), key()).prop_map(
                |((ty, conn, generation, grant, eager_max, slots, words), key)| {
                    (
                        K_HELLO,
                        Msg::Hello(Hello {
                            ty,
                            conn,
                            generation,
                            grant,
                            eager_max,
                            slots,
                            words,
                            key,
                        }),
                    )
                }
            ),
            (any::<(u16, u16, bool, u64, u64, u64)>()).prop_map(
                |(slot, key, waitall, addr, len, tag)| {
                    let flags = if waitall { A_WAITALL } else { 0 };
                    let a = Advert {
                        slot,
                        key,
                        flags,
                        addr,
                        len,
                        tag,
                    };
                    (K_ADVERT, Msg::Advert(a))
                }
            ),
            (any::<u16>(), key()).prop_map(|(slot, key)| (K_KEY, Msg::Key { slot, key })),
            any::<u64>().prop_map(|chunk| (K_DATA, Msg::Data { chunk })),
            Just((K_CREDIT, Msg::Credit)),
            Just((K_CLOSE, Msg::Close)),
            Just((K_CLOSE_ACK, Msg::CloseAck)),
            Just((K_SHUT_RD, Msg::ShutRd)),
            Just((K_SHUT_RD_ACK, Msg::ShutRdAck)),
            any::<(u16, u64)>().prop_map(|(slot, value)| (K_PLACE, Msg::Place { slot, value })),
        ]
    }

    proptest! {
        /// Encode then decode is the identity, for every message with any field values.
        #[test]
        fn messages_round_trip(
            (kind, m) in any_msg(),
            conn in any::<u32>(),
            generation in any::<u32>(),
            ack in any::<u64>(),
            fin in any::<bool>(),
        ) {
            let flags = if fin && kind == K_DATA { F_FIN } else { 0 };
            let p = Prefix { kind, flags, conn, generation, ack };
            let b = encode(p, &m);
            prop_assert_eq!(decode(&b).map_err(|e| e.0), Ok((p, m)));
        }

        /// A message with one byte changed either is refused or decodes to a message that
        /// is encoded back to exactly those bytes (no field is dropped or misread).
        #[test]
        fn what_decodes_encodes_to_itself(
            (kind, m) in any_msg(),
            at in any::<usize>(),
            x in any::<u8>(),
        ) {
            let p = Prefix { kind, flags: 0, conn: 1, generation: 2, ack: 3 };
            let mut b = encode(p, &m);
            let i = at % b.len();
            b[i] = x;
            if let Ok((p, m)) = decode(&b) {
                prop_assert_eq!(encode(p, &m), b);
            }
        }

        /// A valid signal word is made again from what `parse` reads out of it.
        #[test]
        fn signal_words_round_trip(v in any::<u64>()) {
            match word::parse(v) {
                Some((chunk, filled, trunc)) => prop_assert_eq!(word::make(chunk, filled, trunc), v),
                None => prop_assert_eq!(v & word::VALID, 0),
            }
        }
    }
}
