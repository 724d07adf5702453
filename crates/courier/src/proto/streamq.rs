//! Stream bytes that arrived before a receive was posted for them.
//!
//! They wait in a list of blocks. The first grows like a vector up to `BLOCK` bytes (an
//! endpoint holding a few bytes holds a few bytes); each later block is allocated as large
//! as everything queued when it is made, from `BLOCK` up to `MAX_BLOCK`, and filled. Growing
//! never moves bytes already queued: one contiguous buffer doubling to the 16 MiB of
//! `COURIER_MAX_STREAM_EP` copied up to 8 MiB inside one progress call while a peer flooded
//! the endpoint. Blocks all of `BLOCK` bytes were no better: the allocator handed back the
//! freed memory of each failed flood and faulted it in again for the next, 4 KiB at a time.

use std::collections::VecDeque;

use super::buf::Buf;

/// The most the first block grows to, and the least a later block is made with.
pub(crate) const BLOCK: usize = 64 << 10;
/// The most a later block is made with.
pub(crate) const MAX_BLOCK: usize = 2 << 20;

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
    pub(crate) fn extend(&mut self, mut data: &[u8]) {
        if let Some(last) = self.blocks.back_mut() {
            // Only a block made smaller than BLOCK (the first) grows: doubling, up to BLOCK.
            let room = last.capacity().max(BLOCK) - last.len();
            let n = room.min(data.len());
            if n > last.capacity() - last.len() {
                let want = (last.len() + n).max(last.capacity() * 2).min(BLOCK);
                last.reserve_exact(want - last.len());
            }
            last.extend_from_slice(&data[..n]);
            self.len += n;
            data = &data[n..];
        }
        while !data.is_empty() {
            let cap = if self.blocks.is_empty() {
                data.len().min(BLOCK)
            } else {
                self.len.clamp(BLOCK, MAX_BLOCK)
            };
            let n = data.len().min(cap);
            let mut b = Vec::with_capacity(cap);
            b.extend_from_slice(&data[..n]);
            self.blocks.push_back(b);
            self.len += n;
            data = &data[n..];
        }
    }

    /// Move queued bytes into `buf` from byte `off`, as many as fit; returns bytes moved.
    pub(crate) fn drain_into(&mut self, buf: &Buf, mut off: usize) -> usize {
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
                self.blocks.pop_front();
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

    fn take(q: &mut StreamQueue, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        let got = q.drain_into(&Buf::One((v.as_mut_ptr() as usize, n)), 0);
        v.truncate(got);
        v
    }

    #[test]
    fn bytes_come_out_in_order_whatever_the_pieces() {
        let data: Vec<u8> = (0..400_000u32).map(|i| (i % 251) as u8).collect();
        let ins = [1, 7, 4096, 65_536, 70_000, 3, 100_000, 65_535];
        let outs = [5, 65_536, 1, 131_072, 9, 65_537, 1 << 20];
        let mut q = StreamQueue::default();
        let (mut fed, mut out) = (0, Vec::new());
        for k in 0.. {
            if fed < data.len() {
                let n = ins[k % ins.len()].min(data.len() - fed);
                q.extend(&data[fed..fed + n]);
                fed += n;
            }
            // Take out less than was put in at first, then everything.
            if k % 3 == 2 || fed == data.len() {
                out.extend(take(&mut q, outs[k % outs.len()]));
            }
            assert_eq!(q.len(), fed - out.len());
            if out.len() == data.len() {
                break;
            }
        }
        assert_eq!(out, data);
        assert!(q.blocks.is_empty() && q.head == 0);
        assert!(take(&mut q, 10).is_empty());
    }

    #[test]
    fn growing_never_moves_queued_bytes() {
        let mut q = StreamQueue::default();
        q.extend(&[1u8; 100]);
        assert!(
            q.blocks[0].capacity() < 4096,
            "a few bytes took a whole block"
        );
        q.extend(&[2u8; BLOCK - 100]);
        // The first block grew (it may move while it grows) and is full.
        assert_eq!(q.blocks.len(), 1);
        let mut starts = vec![q.blocks[0].as_ptr()];
        for _ in 0..512 {
            q.extend(&[3u8; 32 << 10]);
            if q.blocks.len() > starts.len() {
                starts.push(q.blocks[starts.len()].as_ptr());
            }
        }
        let now: Vec<_> = q.blocks.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(now, starts, "a block was moved");
        // 64 KiB, then blocks of what is queued: 64 KiB, 128 KiB, ... 2 MiB, 2 MiB, ...
        let caps: Vec<_> = q.blocks.iter().map(|b| b.capacity() >> 10).collect();
        assert_eq!(caps[..7], [64, 64, 128, 256, 512, 1024, 2048]);
        assert!(caps[7..].iter().all(|&c| c == 2048), "{caps:?}");
        assert_eq!(q.blocks.len(), 7 + 7);
        assert_eq!(q.len(), BLOCK + 512 * (32 << 10));
        let full: usize = q.blocks.iter().map(|b| b.len()).sum();
        assert_eq!(full, q.len());
    }

    #[test]
    fn drain_fills_from_an_offset() {
        let mut q = StreamQueue::default();
        q.extend(b"hello, world");
        let mut v = *b"XXhello";
        let n = q.drain_into(&Buf::One((v.as_mut_ptr() as usize, v.len())), 2);
        assert_eq!(n, 5);
        assert_eq!(&v, b"XXhello");
        assert_eq!(q.len(), 7);
        assert_eq!(take(&mut q, 100), b", world");
    }
}
