//! Stream bytes that arrived before a receive was posted for them.
//!
//! They wait in a list of blocks. The first grows like a vector up to `BLOCK` bytes (an
//! endpoint holding a few bytes holds a few bytes); every later one is a block of `BLOCK`
//! bytes, taken from the worker's spares (`Spares`) and given back there when its bytes
//! are received or dropped. Growing never moves bytes already queued: one contiguous
//! buffer doubling to the 16 MiB of `COURIER_MAX_STREAM_EP` copied up to 8 MiB inside one
//! progress call while a peer flooded the endpoint. The spares keep a flood's blocks for
//! the next one: allocated afresh, each round of a flood faulted its memory in again, 4 KiB
//! at a time, after the allocator had handed it back (a fifth of the victim's CPU).

use std::collections::VecDeque;

use super::buf::Buf;

/// The size of every block but an endpoint's first, and the most the first grows to.
pub(crate) const BLOCK: usize = 64 << 10;
/// The most spare blocks a worker keeps (16 MiB: one endpoint's default budget).
const SPARE_BLOCKS: usize = 256;

/// Blocks of `BLOCK` bytes that no queue uses now, for any endpoint of the worker.
#[derive(Default)]
pub(crate) struct Spares {
    blocks: Vec<Vec<u8>>,
}

impl Spares {
    fn take(&mut self) -> Vec<u8> {
        self.blocks
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BLOCK))
    }

    fn give(&mut self, mut b: Vec<u8>) {
        if b.capacity() == BLOCK && self.blocks.len() < SPARE_BLOCKS {
            b.clear();
            self.blocks.push(b);
        }
    }
}

#[derive(Default)]
pub(crate) struct StreamQueue {
    blocks: VecDeque<Vec<u8>>,
    /// Bytes of the first block already taken.
    head: usize,
    len: usize,
}

impl StreamQueue {
    /// Bytes queued.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Append `data`.
    pub(crate) fn extend(&mut self, mut data: &[u8], spares: &mut Spares) {
        if let Some(last) = self.blocks.back_mut() {
            // Only a first block made smaller than BLOCK grows: doubling, up to BLOCK.
            let n = (BLOCK - last.len().min(BLOCK)).min(data.len());
            if n > last.capacity() - last.len() {
                let want = (last.len() + n).max(last.capacity() * 2).min(BLOCK);
                last.reserve_exact(want - last.len());
            }
            last.extend_from_slice(&data[..n]);
            self.len += n;
            data = &data[n..];
        }
        while !data.is_empty() {
            let n = data.len().min(BLOCK);
            let mut b = if self.blocks.is_empty() && n < BLOCK {
                Vec::with_capacity(n)
            } else {
                spares.take()
            };
            b.extend_from_slice(&data[..n]);
            self.blocks.push_back(b);
            self.len += n;
            data = &data[n..];
        }
    }

    /// Drop every byte queued, its blocks to `spares`.
    pub(crate) fn clear(&mut self, spares: &mut Spares) {
        for b in self.blocks.drain(..) {
            spares.give(b);
        }
        self.head = 0;
        self.len = 0;
    }

    /// Move queued bytes into `buf` from byte `off`, as many as fit; returns bytes moved.
    pub(crate) fn drain_into(&mut self, buf: &Buf, mut off: usize, spares: &mut Spares) -> usize {
        let start = off;
        while off < buf.len() {
            let Some(front) = self.blocks.front() else {
                break;
            };
            let avail = &front[self.head..];
            let n = avail.len().min(buf.len() - off);
            // SAFETY: the caller's buffer is valid for writes of its length, and
            // `off + n <= buf.len()`.
            unsafe { buf.write_at(off, &avail[..n]) };
            off += n;
            self.head += n;
            if self.head == front.len() {
                if let Some(b) = self.blocks.pop_front() {
                    spares.give(b);
                }
                self.head = 0;
            }
        }
        self.len -= off - start;
        off - start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(q: &mut StreamQueue, n: usize, spares: &mut Spares) -> Vec<u8> {
        let mut v = vec![0u8; n];
        let got = q.drain_into(&Buf::One((v.as_mut_ptr() as usize, n)), 0, spares);
        v.truncate(got);
        v
    }

    #[test]
    fn bytes_come_out_in_order_whatever_the_pieces() {
        let data: Vec<u8> = (0..400_000u32).map(|i| (i % 251) as u8).collect();
        let ins = [1, 7, 4096, 65_536, 70_000, 3, 100_000, 65_535];
        let outs = [5, 65_536, 1, 131_072, 9, 65_537, 1 << 20];
        let (mut q, mut sp) = (StreamQueue::default(), Spares::default());
        let (mut fed, mut out) = (0, Vec::new());
        for k in 0.. {
            if fed < data.len() {
                let n = ins[k % ins.len()].min(data.len() - fed);
                q.extend(&data[fed..fed + n], &mut sp);
                fed += n;
            }
            // Take out less than was put in at first, then everything.
            if k % 3 == 2 || fed == data.len() {
                out.extend(take(&mut q, outs[k % outs.len()], &mut sp));
            }
            assert_eq!(q.len(), fed - out.len());
            if out.len() == data.len() {
                break;
            }
        }
        assert_eq!(out, data);
        assert!(q.blocks.is_empty() && q.head == 0);
        assert!(take(&mut q, 10, &mut sp).is_empty());
    }

    #[test]
    fn growing_never_moves_queued_bytes() {
        let (mut q, mut sp) = (StreamQueue::default(), Spares::default());
        q.extend(&[1u8; 100], &mut sp);
        assert!(
            q.blocks[0].capacity() < 4096,
            "a few bytes took a whole block"
        );
        q.extend(&[2u8; BLOCK - 100], &mut sp);
        // The first block grew (it may move while it grows) and is full.
        assert_eq!(q.blocks.len(), 1);
        let mut starts = vec![q.blocks[0].as_ptr()];
        for _ in 0..512 {
            q.extend(&[3u8; 32 << 10], &mut sp);
            if q.blocks.len() > starts.len() {
                starts.push(q.blocks[starts.len()].as_ptr());
            }
        }
        let now: Vec<_> = q.blocks.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(now, starts, "a block was moved");
        assert!(
            q.blocks
                .iter()
                .all(|b| b.capacity() == BLOCK && b.len() == BLOCK)
        );
        assert_eq!(q.blocks.len(), 1 + 256);
        assert_eq!(q.len(), BLOCK + 512 * (32 << 10));
    }

    /// A dropped or received queue's blocks serve the next one (a flood's next round
    /// touches no fresh memory), up to SPARE_BLOCKS of them.
    #[test]
    fn blocks_are_reused_and_spares_bounded() {
        let (mut q, mut sp) = (StreamQueue::default(), Spares::default());
        let chunk = vec![5u8; 32 << 10];
        for _ in 0..2 * (SPARE_BLOCKS + 10) {
            q.extend(&chunk, &mut sp);
        }
        let first: std::collections::HashSet<_> = q.blocks.iter().map(|b| b.as_ptr()).collect();
        q.clear(&mut sp);
        assert_eq!((q.len(), q.blocks.len()), (0, 0));
        assert_eq!(sp.blocks.len(), SPARE_BLOCKS, "spares past their bound");
        for _ in 0..2 * SPARE_BLOCKS {
            q.extend(&chunk, &mut sp);
        }
        // The first block is the endpoint's own (it starts small); the others are spares.
        assert_eq!(sp.blocks.len(), 1);
        assert!(
            q.blocks.iter().skip(1).all(|b| first.contains(&b.as_ptr())),
            "a fresh block"
        );
        // Received bytes give their blocks back too.
        let got = take(&mut q, 3 * BLOCK, &mut sp);
        assert!(got.iter().all(|&b| b == 5) && got.len() == 3 * BLOCK);
        assert_eq!(sp.blocks.len(), 4);
        assert!(
            sp.blocks
                .iter()
                .all(|b| b.is_empty() && b.capacity() == BLOCK)
        );
    }

    #[test]
    fn drain_fills_from_an_offset() {
        let (mut q, mut sp) = (StreamQueue::default(), Spares::default());
        q.extend(b"hello, world", &mut sp);
        let mut v = *b"XXhello";
        let n = q.drain_into(&Buf::One((v.as_mut_ptr() as usize, v.len())), 2, &mut sp);
        assert_eq!(n, 5);
        assert_eq!(&v, b"XXhello");
        assert_eq!(q.len(), 7);
        assert_eq!(take(&mut q, 100, &mut sp), b", world");
    }
}
