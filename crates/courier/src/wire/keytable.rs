//! The key table: a memory file of 64-byte entries in which a context publishes the record
//! of every region it maps. A same-host peer maps the table and checks each access against
//! the owner's record before it loads, stores or runs a CPU atomic.
//!
//! ```text
//! slot 0        header: MAGIC, the context's id
//! slot n > 0    the region whose id's low 12 bits are n: eight u64 words
//!   word  0       1        2           3           4      5     6              7
//!       valid | region | secret lo | secret hi | base | len | kind | segment
//! kind:   bits 0..16 access rights (`rkey::access`), bits 16..24 memory type code,
//!         the rest 0
//! ```
//!
//! The secret is 128 bits: its low and high halves are two words (`secret_words`,
//! `secret_of`). Access and memory type share one word so that the entry stays one cache
//! line of 64 bytes.
//!
//! Words are native-endian `u64`s, each written and read atomically: the owner writes
//! `valid` 0, then the other words, then `valid` 1 (Release); a reader loads `valid`
//! (Acquire) first. A region's id never names another region (its high bits count the
//! slot's reuses), so a reader also compares `region`.

/// Entries in a table, the header's included.
pub const SLOTS: usize = 4096;
/// Bytes per entry.
pub const ENTRY: usize = 64;
/// Bytes of a table.
pub const BYTES: usize = SLOTS * ENTRY;
/// The header's first word ("COURKTB1").
pub const MAGIC: u64 = 0x434f_5552_4b54_4231;

/// Words of the header (slot 0).
pub mod header {
    /// `MAGIC`.
    pub const MAGIC: usize = 0;
    /// The owning context's id (the `ctx_id` its keys carry).
    pub const CTX_ID: usize = 1;
}

/// Words of a region's entry.
pub mod entry {
    /// 1 while the record describes a mapped region, else 0.
    pub const VALID: usize = 0;
    /// The region's id.
    pub const REGION: usize = 1;
    /// The low 64 bits of the secret its keys must carry.
    pub const SECRET_LO: usize = 2;
    /// The high 64 bits of that secret.
    pub const SECRET_HI: usize = 3;
    /// Start address in the owner's process.
    pub const BASE: usize = 4;
    /// Length in bytes.
    pub const LEN: usize = 5;
    /// Rights peers have (`rkey::access` bits) and the memory type code (`kind`).
    pub const KIND: usize = 6;
    /// The inode of the region's shared segment (a memfd on the table's file system), 0
    /// for a region with none.
    pub const SEGMENT: usize = 7;
}

/// The slot of region id `region` (its low 12 bits), unless that is the header's.
#[inline]
pub fn slot(region: u64) -> Option<usize> {
    let slot = (region & 0xfff) as usize;
    (slot != 0 && slot < SLOTS).then_some(slot)
}

/// Byte offset of word `word` of entry `slot` (both in range: `slot < SLOTS`, `word < 8`).
#[inline(always)]
pub const fn offset(slot: usize, word: usize) -> usize {
    slot * ENTRY + word * 8
}

/// A 128-bit secret as the entry's two words (low, high).
#[inline(always)]
pub const fn secret_words(secret: u128) -> (u64, u64) {
    (secret as u64, (secret >> 64) as u64)
}

/// The secret of an entry's two words (low, high).
#[inline(always)]
pub const fn secret_of(lo: u64, hi: u64) -> u128 {
    (hi as u128) << 64 | lo as u128
}

/// The `KIND` word of an entry: access rights and memory type code.
#[inline(always)]
pub const fn kind_word(access: u16, mem_type: u8) -> u64 {
    access as u64 | (mem_type as u64) << 16
}

/// The access rights and memory type code of a `KIND` word (bits above 24 ignored: an
/// owner never sets them).
#[inline(always)]
pub const fn kind_of(word: u64) -> (u16, u8) {
    (word as u16, (word >> 16) as u8)
}

/// A region's entry, decoded from its eight words (`from_words`) or written as them
/// (`words`): what the owner publishes and a same-host peer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// 1 while the entry describes a mapped region.
    pub valid: u64,
    /// The region's id.
    pub region: u64,
    /// Its secret.
    pub secret: u128,
    /// Start address in the owner's process.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Rights peers have.
    pub access: u16,
    /// Memory type code.
    pub mem_type: u8,
    /// The inode of the region's shared segment, or 0.
    pub segment: u64,
}

impl Entry {
    /// The entry's words, in `entry` order.
    pub fn words(&self) -> [u64; 8] {
        let (lo, hi) = secret_words(self.secret);
        let mut w = [0u64; 8];
        w[entry::VALID] = self.valid;
        w[entry::REGION] = self.region;
        w[entry::SECRET_LO] = lo;
        w[entry::SECRET_HI] = hi;
        w[entry::BASE] = self.base;
        w[entry::LEN] = self.len;
        w[entry::KIND] = kind_word(self.access, self.mem_type);
        w[entry::SEGMENT] = self.segment;
        w
    }

    /// The entry of eight words (a peer reads each atomically; bits of the `KIND` word
    /// that no field uses are ignored).
    pub fn from_words(w: &[u64; 8]) -> Entry {
        let (access, mem_type) = kind_of(w[entry::KIND]);
        Entry {
            valid: w[entry::VALID],
            region: w[entry::REGION],
            secret: secret_of(w[entry::SECRET_LO], w[entry::SECRET_HI]),
            base: w[entry::BASE],
            len: w[entry::LEN],
            access,
            mem_type,
            segment: w[entry::SEGMENT],
        }
    }

    /// The entry in an `ENTRY`-byte copy of the table (native-endian words); `None` when
    /// `b` is not one entry long.
    pub fn parse(b: &[u8]) -> Option<Entry> {
        let b: &[u8; ENTRY] = b.try_into().ok()?;
        let mut w = [0u64; 8];
        for (w, c) in w.iter_mut().zip(b.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            *w = u64::from_ne_bytes(a);
        }
        Some(Entry::from_words(&w))
    }

    /// The entry's bytes, as `parse` reads them.
    pub fn emit(&self) -> [u8; ENTRY] {
        let mut b = [0u8; ENTRY];
        for (c, w) in b.chunks_exact_mut(8).zip(self.words()) {
            c.copy_from_slice(&w.to_ne_bytes());
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A record's packed words give back what was packed.
        #[test]
        fn words_round_trip(s in any::<u128>(), a in any::<u16>(), m in any::<u8>()) {
            let (lo, hi) = secret_words(s);
            prop_assert_eq!(secret_of(lo, hi), s);
            prop_assert_eq!(kind_of(kind_word(a, m)), (a, m));
        }

        /// Emit then parse is the identity; parse then emit keeps every used bit.
        #[test]
        fn entries_round_trip(w in any::<[u64; 8]>()) {
            let e = Entry::from_words(&w);
            prop_assert_eq!(Entry::from_words(&e.words()), e);
            prop_assert_eq!(Entry::parse(&e.emit()), Some(e));
            let mut used = w;
            used[entry::KIND] &= 0xff_ffff;
            prop_assert_eq!(e.words(), used);
        }
    }

    #[test]
    fn an_entry_is_one_line_of_eight_words() {
        let last = [
            entry::VALID,
            entry::REGION,
            entry::SECRET_LO,
            entry::SECRET_HI,
            entry::BASE,
            entry::LEN,
            entry::KIND,
            entry::SEGMENT,
        ];
        for (i, w) in last.iter().enumerate() {
            assert_eq!(*w, i);
        }
        assert_eq!(offset(1, entry::SEGMENT) + 8, 2 * ENTRY);
        assert_eq!(slot(0), None);
        assert_eq!(slot(0x1001), Some(1));
    }
}
