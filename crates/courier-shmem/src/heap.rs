//! The symmetric heap's allocator: offsets into the heap segment.
//!
//! Every PE runs the same sequence of collective allocations, so a deterministic allocator
//! hands out the same offsets everywhere: a block's address on PE `p` is `p`'s heap base
//! plus the offset. First fit over a free list sorted by offset, with neighbours merged on
//! free; no state depends on anything but the calls.

use std::collections::{BTreeMap, HashMap};

/// The smallest alignment of a block (a cache line: no two blocks share one).
pub const MIN_ALIGN: usize = 64;

/// Blocks of one heap, by offset.
pub struct Heap {
    /// Free ranges: offset → length.
    free: BTreeMap<usize, usize>,
    /// Allocated blocks: offset → length (rounded up).
    used: HashMap<usize, usize>,
    start: usize,
    end: usize,
}

/// Why an allocation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocError {
    /// No free range is large enough; the largest free one has this many bytes.
    Exhausted { largest: usize },
    /// The alignment is not a power of two, or larger than the heap's own (`HEAP_ALIGN`).
    BadAlign,
}

impl Heap {
    /// A heap over offsets `[start, end)`.
    pub fn new(start: usize, end: usize) -> Heap {
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Heap {
            free,
            used: HashMap::new(),
            start,
            end,
        }
    }

    /// Bytes the heap manages.
    pub fn capacity(&self) -> usize {
        self.end - self.start
    }

    /// The length of the largest free range.
    pub fn largest_free(&self) -> usize {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Allocate `len` bytes (at least one) at a multiple of `align`.
    pub fn alloc(&mut self, len: usize, align: usize) -> Result<usize, AllocError> {
        if !align.is_power_of_two() || align > crate::init::HEAP_ALIGN {
            return Err(AllocError::BadAlign);
        }
        let align = align.max(MIN_ALIGN);
        let len = round_up(len.max(1), MIN_ALIGN).ok_or(AllocError::Exhausted {
            largest: self.largest_free(),
        })?;
        let found = self.free.iter().find_map(|(&off, &flen)| {
            let at = round_up(off, align)?;
            let end = at.checked_add(len)?;
            (end <= off + flen).then_some((off, flen, at))
        });
        let Some((off, flen, at)) = found else {
            return Err(AllocError::Exhausted {
                largest: self.largest_free(),
            });
        };
        self.free.remove(&off);
        if at > off {
            self.free.insert(off, at - off);
        }
        let end = at + len;
        if end < off + flen {
            self.free.insert(end, off + flen - end);
        }
        self.used.insert(at, len);
        Ok(at)
    }

    /// The length of the block at `off`, if one starts there.
    pub fn block_len(&self, off: usize) -> Option<usize> {
        self.used.get(&off).copied()
    }

    /// Free the block at `off`; false if no block starts there.
    pub fn free(&mut self, off: usize) -> bool {
        let Some(len) = self.used.remove(&off) else {
            return false;
        };
        let (mut start, mut end) = (off, off + len);
        if let Some((&p, &plen)) = self.free.range(..off).next_back() {
            if p + plen == start {
                self.free.remove(&p);
                start = p;
            }
        }
        if let Some(&nlen) = self.free.get(&end) {
            self.free.remove(&end);
            end += nlen;
        }
        self.free.insert(start, end - start);
        true
    }

    /// Grow or shrink the block at `off` to `len` where it stands, if the range after it
    /// allows; returns whether it did.
    pub fn resize_in_place(&mut self, off: usize, len: usize) -> bool {
        let Some(cur) = self.used.get(&off).copied() else {
            return false;
        };
        let Some(want) = round_up(len.max(1), MIN_ALIGN) else {
            return false;
        };
        if want <= cur {
            if want < cur {
                self.used.insert(off, want);
                // Give the tail back, merged with a free range after it.
                let tail = off + want;
                let mut tlen = cur - want;
                if let Some(&n) = self.free.get(&(off + cur)) {
                    self.free.remove(&(off + cur));
                    tlen += n;
                }
                self.free.insert(tail, tlen);
            }
            return true;
        }
        let next = off + cur;
        match self.free.get(&next).copied() {
            Some(nlen) if cur + nlen >= want => {
                self.free.remove(&next);
                let rest = cur + nlen - want;
                if rest > 0 {
                    self.free.insert(off + want, rest);
                }
                self.used.insert(off, want);
                true
            }
            _ => false,
        }
    }
}

fn round_up(v: usize, align: usize) -> Option<usize> {
    Some(v.checked_add(align - 1)? & !(align - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_calls_same_offsets_and_merging() {
        let mut a = Heap::new(4096, 4096 + (1 << 20));
        let mut b = Heap::new(4096, 4096 + (1 << 20));
        let mut offs = vec![];
        for (i, n) in [10usize, 4000, 1, 65536, 3].iter().enumerate() {
            let x = a.alloc(*n, 1 << (i % 4 + 3)).unwrap();
            assert_eq!(x, b.alloc(*n, 1 << (i % 4 + 3)).unwrap());
            assert_eq!(x % MIN_ALIGN, 0);
            offs.push(x);
        }
        // Blocks never overlap.
        let mut spans: Vec<_> = offs.iter().map(|&o| (o, a.block_len(o).unwrap())).collect();
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0);
        }
        for o in &offs {
            assert!(a.free(*o));
        }
        assert!(!a.free(offs[0]), "double free is refused");
        assert_eq!(a.largest_free(), a.capacity(), "all merged back");
    }

    #[test]
    fn alignment_exhaustion_and_resize() {
        let mut h = Heap::new(0, 1 << 16);
        assert_eq!(h.alloc(8, 3), Err(AllocError::BadAlign));
        let x = h.alloc(100, 4096).unwrap();
        assert_eq!(x % 4096, 0);
        assert!(matches!(
            h.alloc(1 << 17, 8),
            Err(AllocError::Exhausted { largest }) if largest < 1 << 16
        ));
        assert!(h.resize_in_place(x, 5000));
        assert_eq!(h.block_len(x), Some(5056));
        let y = h.alloc(64, 64).unwrap();
        assert!(y >= x + 5056);
        assert!(h.resize_in_place(x, 10), "shrinking always works");
        assert!(h.free(x) && h.free(y));
        assert_eq!(h.largest_free(), 1 << 16);
    }
}
