//! The send queue's copied bytes: a first-in first-out byte queue kept in fixed-size
//! blocks. Bytes are copied in once, at the back, and leave from the front as the kernel
//! takes them; a block whose last byte left is recycled or freed. Nothing is ever moved,
//! so the cost per queued byte does not grow with the queue (a single buffer compacted by
//! moving its unwritten rest to the front cost up to half the queue per call: 26 ms of one
//! call under a get flood), and the memory held is the queued bytes plus at most two
//! partly used blocks and `SPARE` spare ones (a doubling vector held up to three times
//! what was queued).

use std::collections::VecDeque;

/// Bytes per block: the coalescing threshold, so a burst of small frames spans one or two
/// blocks, and a `sendmsg` of `FLUSH_IOV` pieces can still carry megabytes.
pub(super) const BLOCK: usize = 64 << 10;
/// Emptied blocks kept for reuse while the queue is in use (so a queue that fills and
/// drains at every flush does not go to the allocator each time); one is kept once it is
/// empty.
const SPARE: usize = 4;

/// Queued bytes: `blocks[0][head..]`, then every later block whole (each but the last is
/// full). Every block has capacity `BLOCK` and is never grown past it.
#[derive(Default)]
pub(super) struct Chunks {
    blocks: VecDeque<Vec<u8>>,
    head: usize,
    len: usize,
    spare: Vec<Vec<u8>>,
}

/// A position in a `Chunks`, for reading its bytes in order without consuming them.
pub(super) struct Cursor {
    blk: usize,
    off: usize,
}

impl Chunks {
    /// Bytes queued.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of memory held, spare blocks included.
    #[cfg(test)]
    pub(super) fn allocated(&self) -> usize {
        self.blocks
            .iter()
            .chain(self.spare.iter())
            .map(|b| b.capacity())
            .sum()
    }

    /// Queue a copy of `b` at the back.
    #[inline]
    pub(super) fn push(&mut self, b: &[u8]) {
        if let Some(last) = self.blocks.back_mut()
            && BLOCK - last.len() >= b.len()
        {
            // The common case: it fits the last block (within the capacity reserved).
            last.extend_from_slice(b);
            self.len += b.len();
            return;
        }
        self.push_across(b);
    }

    /// `push` when `b` needs a new block.
    #[inline(never)]
    fn push_across(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let room = self.blocks.back().map_or(0, |l| BLOCK - l.len());
            if room == 0 {
                let blk = self
                    .spare
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(BLOCK));
                self.blocks.push_back(blk);
                continue;
            }
            let k = room.min(b.len());
            if let Some(last) = self.blocks.back_mut() {
                // Within the capacity reserved: no reallocation.
                last.extend_from_slice(&b[..k]);
            }
            self.len += k;
            b = &b[k..];
        }
    }

    /// Drop `n` bytes (at most `len()`) from the front; blocks emptied are recycled.
    pub(super) fn consume(&mut self, mut n: usize) {
        debug_assert!(n <= self.len, "consume {n} of {}", self.len);
        n = n.min(self.len);
        self.len -= n;
        while n > 0 {
            let Some(front) = self.blocks.front() else {
                break;
            };
            let k = (front.len() - self.head).min(n);
            self.head += k;
            n -= k;
            if self.head == front.len() {
                self.head = 0;
                if let Some(blk) = self.blocks.pop_front() {
                    self.recycle(blk);
                }
            }
        }
        if self.len == 0 {
            self.clear();
        }
    }

    /// Forget every queued byte; keep one block for the next use.
    pub(super) fn clear(&mut self) {
        while let Some(blk) = self.blocks.pop_front() {
            self.recycle(blk);
        }
        self.head = 0;
        self.len = 0;
        self.spare.truncate(1);
    }

    fn recycle(&mut self, mut blk: Vec<u8>) {
        if self.spare.len() < SPARE {
            blk.clear();
            self.spare.push(blk);
        }
    }

    /// A cursor at the front.
    #[inline]
    pub(super) fn cursor(&self) -> Cursor {
        Cursor {
            blk: 0,
            off: self.head,
        }
    }

    /// The next at most `max` bytes at `cur` that lie together in one block (empty at the
    /// end of the queue); `cur` moves past them.
    #[inline]
    pub(super) fn next_piece(&self, cur: &mut Cursor, max: usize) -> &[u8] {
        let Some(b) = self.blocks.get(cur.blk) else {
            return &[];
        };
        let k = (b.len() - cur.off).min(max);
        let piece = &b[cur.off..cur.off + k];
        cur.off += k;
        if cur.off == b.len() {
            cur.blk += 1;
            cur.off = 0;
        }
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(c: &Chunks) -> Vec<u8> {
        let mut cur = c.cursor();
        let mut out = Vec::new();
        loop {
            let p = c.next_piece(&mut cur, usize::MAX);
            if p.is_empty() {
                return out;
            }
            out.extend_from_slice(p);
        }
    }

    #[test]
    fn bytes_leave_in_the_order_they_came_across_blocks() {
        let mut c = Chunks::default();
        let mut model = std::collections::VecDeque::new();
        let mut x = 7u32;
        let rounds = if cfg!(miri) { 30 } else { 400 };
        for round in 0..rounds {
            // Pushes of 1 byte to 3 blocks, consumes of any size, interleaved.
            let n = match round % 5 {
                0 => 1,
                1 => BLOCK - 1,
                2 => 3 * BLOCK + 5,
                3 => 100,
                _ => BLOCK,
            };
            let b: Vec<u8> = (0..n)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (x >> 16) as u8
                })
                .collect();
            c.push(&b);
            model.extend(b);
            let take = (x as usize) % (c.len() + 1);
            c.consume(take);
            model.drain(..take);
            assert_eq!(c.len(), model.len());
            if round % 37 == 0 {
                assert!(bytes(&c) == model.iter().copied().collect::<Vec<u8>>());
            }
        }
        assert!(bytes(&c) == model.iter().copied().collect::<Vec<u8>>());
    }

    #[test]
    fn pieces_never_cross_a_block_and_respect_the_limit() {
        let mut c = Chunks::default();
        c.push(&vec![1u8; BLOCK - 10]);
        c.push(&[2u8; 30]);
        let mut cur = c.cursor();
        assert_eq!(c.next_piece(&mut cur, 5).len(), 5);
        // The first block's rest: the ones and the first ten twos.
        let rest = c.next_piece(&mut cur, usize::MAX);
        assert_eq!(rest.len(), BLOCK - 5);
        assert_eq!(&rest[BLOCK - 15..], &[2u8; 10][..]);
        assert_eq!(c.next_piece(&mut cur, usize::MAX), &[2u8; 20][..]);
        assert!(c.next_piece(&mut cur, usize::MAX).is_empty());
    }

    #[test]
    #[cfg_attr(miri, ignore = "32 MiB of copies: minutes under Miri")]
    fn a_queue_that_grew_big_gives_its_memory_back_as_it_drains() {
        let mut c = Chunks::default();
        let big = vec![9u8; 32 << 20];
        c.push(&big);
        assert_eq!(c.len(), 32 << 20);
        let held = c.allocated();
        // No doubling slack: the bytes, rounded up to a block.
        assert!(held <= (32 << 20) + BLOCK, "{held} bytes held for 32 MiB");
        c.consume(16 << 20);
        assert!(c.allocated() <= (16 << 20) + (SPARE + 1) * BLOCK);
        c.consume(16 << 20);
        assert_eq!(c.len(), 0);
        assert!(
            c.allocated() <= BLOCK,
            "{} bytes held when empty",
            c.allocated()
        );
        // And it is usable again.
        c.push(b"abc");
        assert_eq!(bytes(&c), b"abc");
    }
}
