//! The key table: a memory file of 64-byte entries in which a context publishes the record
//! of every region it maps. A same-host peer maps the table and checks each access against
//! the owner's record before it loads, stores or runs a CPU atomic.
//!
//! ```text
//! slot 0        header: MAGIC, the context's id
//! slot n > 0    the region whose id's low 12 bits are n: eight u64 words
//!               valid | region | secret | base | len | access | mem_type | segment
//! ```
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
    /// The secret its keys must carry.
    pub const SECRET: usize = 2;
    /// Start address in the owner's process.
    pub const BASE: usize = 3;
    /// Length in bytes.
    pub const LEN: usize = 4;
    /// Rights peers have (`rkey::access` bits).
    pub const ACCESS: usize = 5;
    /// Memory type code (`rkey` `mem_type`).
    pub const MEM_TYPE: usize = 6;
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
