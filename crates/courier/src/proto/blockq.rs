//! A first-in first-out queue kept in blocks of at most `BLOCK` items: what an endpoint's
//! frames waiting to be sent (`EpSlot::pending`) live in.
//!
//! A peer decides how long that queue grows: a peer that asks for gets and does not read
//! the answers has one entry queued per get, up to `COURIER_MAX_REPLY_QUEUE` of them. In
//! one `VecDeque`, the push that outgrew its capacity copied the whole queue into a buffer
//! twice the size: 8 MiB copied and 16 MiB of new pages touched in one progress call
//! (7-16 ms of the victim's worker, once per run of the get flood in `bench/hostile.sh`),
//! and the capacity stayed at its largest for the endpoint's life. Here a push costs the
//! same however long the queue is (a block of its own grows to `BLOCK` items and no
//! further), and a block whose last item left is freed, but for one kept for reuse.

use std::collections::VecDeque;

/// Items per block: small enough that filling one costs little, large enough that the
/// blocks' own list stays short.
const BLOCK: usize = 64;

/// The items in order: `head`, then the blocks of `rest`. No block holds more than
/// `BLOCK` items; pushes fill the last block and then start a new one (`retain` may leave
/// blocks part full). Only `head` may be empty, and only when the whole queue is. The
/// usual short queue is `head` alone, one `VecDeque`, so looking at and taking the first
/// item costs what it costs in a `VecDeque`.
pub(crate) struct BlockQueue<T> {
    head: VecDeque<T>,
    rest: VecDeque<VecDeque<T>>,
    len: usize,
    /// An emptied full-sized block, so a queue that fills and drains over and over does
    /// not go to the allocator each time.
    spare: Option<VecDeque<T>>,
}

impl<T> Default for BlockQueue<T> {
    fn default() -> Self {
        Self {
            head: VecDeque::new(),
            rest: VecDeque::new(),
            len: 0,
            spare: None,
        }
    }
}

impl<T> BlockQueue<T> {
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn front(&self) -> Option<&T> {
        self.head.front()
    }

    #[inline]
    pub(crate) fn back_mut(&mut self) -> Option<&mut T> {
        match self.rest.back_mut() {
            Some(b) => b.back_mut(),
            None => self.head.back_mut(),
        }
    }

    #[inline]
    pub(crate) fn push_back(&mut self, item: T) {
        self.len += 1;
        if self.rest.is_empty() && self.head.len() < BLOCK {
            self.head.push_back(item);
            return;
        }
        self.push_to_rest(item);
    }

    /// `push_back` past the head block: into the last block, or a new one (the spare if
    /// there is one) when that is full.
    fn push_to_rest(&mut self, item: T) {
        if let Some(b) = self.rest.back_mut()
            && b.len() < BLOCK
        {
            b.push_back(item);
            return;
        }
        let mut b = self
            .spare
            .take()
            .unwrap_or_else(|| VecDeque::with_capacity(BLOCK));
        b.push_back(item);
        self.rest.push_back(b);
    }

    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        let item = self.head.pop_front()?;
        self.len -= 1;
        if self.head.is_empty() && !self.rest.is_empty() {
            self.next_block();
        }
        Some(item)
    }

    /// The head block is empty: the next block becomes the head, and the emptied one the
    /// spare (or is freed).
    fn next_block(&mut self) {
        if let Some(b) = self.rest.pop_front() {
            let old = std::mem::replace(&mut self.head, b);
            if old.capacity() >= BLOCK && self.spare.is_none() {
                self.spare = Some(old);
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.head.iter().chain(self.rest.iter().flatten())
    }

    /// Keep only the items `keep` is true for, in order: in place, block by block, so a
    /// long queue is not copied (the blocks it leaves part full stay so).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.head.retain(&mut keep);
        for b in &mut self.rest {
            b.retain(&mut keep);
        }
        self.rest.retain(|b| !b.is_empty());
        if self.head.is_empty() {
            self.next_block();
        }
        self.len = self.head.len() + self.rest.iter().map(VecDeque::len).sum::<usize>();
    }

    /// Put `item` at position `at` (the end if past it), in the block that holds that
    /// position: a full block is split there first, so no block grows past `BLOCK`.
    pub(crate) fn insert(&mut self, at: usize, item: T) {
        if at >= self.len {
            self.push_back(item);
            return;
        }
        self.len += 1;
        if at < self.head.len() {
            if self.head.len() < BLOCK {
                self.head.insert(at, item);
            } else {
                let tail = self.head.split_off(at);
                self.head.push_back(item);
                self.rest.push_front(tail);
            }
            return;
        }
        let mut at = at - self.head.len();
        for i in 0..self.rest.len() {
            let b = &mut self.rest[i];
            if at < b.len() {
                if b.len() < BLOCK {
                    b.insert(at, item);
                } else {
                    let tail = b.split_off(at);
                    b.push_back(item);
                    self.rest.insert(i + 1, tail);
                }
                return;
            }
            at -= b.len();
        }
    }

    /// Blocks held, the head and the spare included (for tests of what a drained queue
    /// keeps).
    #[cfg(test)]
    fn blocks_held(&self) -> usize {
        1 + self.rest.len() + usize::from(self.spare.is_some())
    }

    /// The most any block can hold (for tests: no block grows past `BLOCK`).
    #[cfg(test)]
    fn largest_block(&self) -> usize {
        self.rest
            .iter()
            .chain(std::iter::once(&self.head))
            .map(|b| b.capacity())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(q: &BlockQueue<u32>) -> Vec<u32> {
        q.iter().copied().collect()
    }

    #[test]
    fn items_leave_in_the_order_they_came_across_blocks() {
        let mut q = BlockQueue::default();
        let mut model = VecDeque::new();
        // Interleaved pushes and pops that cross block boundaries both ways.
        let mut next = 0u32;
        for round in 0..40usize {
            for _ in 0..(round * 7) % 150 + 1 {
                q.push_back(next);
                model.push_back(next);
                next += 1;
            }
            for _ in 0..(round * 5) % 130 {
                assert_eq!(q.pop_front(), model.pop_front());
            }
            if round % 7 == 3 {
                // Blocks left part full (or empty, dropped) in the middle of the queue.
                let m = 2 + round as u32 % 3;
                q.retain(|x| x % m != 0);
                model.retain(|x| x % m != 0);
            }
            if round == 20 {
                q.retain(|_| false);
                model.clear();
            }
            if round % 5 == 1 && !model.is_empty() {
                // Into the head, a middle block and the last, full or not.
                for at in [0, model.len() / 2, model.len() - 1] {
                    q.insert(at, 1_000_000 + round as u32);
                    model.insert(at, 1_000_000 + round as u32);
                }
            }
            assert!(q.largest_block() <= BLOCK);
            assert_eq!(q.len(), model.len());
            assert_eq!(q.is_empty(), model.is_empty());
            assert_eq!(q.front(), model.front());
            assert_eq!(items(&q), model.iter().copied().collect::<Vec<_>>());
        }
        while let Some(x) = model.pop_front() {
            assert_eq!(q.pop_front(), Some(x));
        }
        assert_eq!(q.pop_front(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn a_drained_queue_keeps_at_most_two_blocks() {
        let mut q = BlockQueue::default();
        for i in 0..100 * BLOCK as u32 {
            q.push_back(i);
        }
        assert_eq!(q.blocks_held(), 100);
        // A block never grows past BLOCK (the head grows to it by doubling).
        assert!(
            q.largest_block() <= BLOCK,
            "a block of {}",
            q.largest_block()
        );
        for i in 0..100 * BLOCK as u32 {
            assert_eq!(q.pop_front(), Some(i));
        }
        // The head (empty, in place) and one spare: a queue that once held a flood does
        // not keep its memory.
        assert_eq!(q.blocks_held(), 2);
    }

    #[test]
    fn retain_insert_and_back_mut_keep_the_order() {
        let mut q = BlockQueue::default();
        for i in 0..300u32 {
            q.push_back(i);
        }
        q.retain(|x| x % 3 != 0);
        let want: Vec<u32> = (0..300).filter(|x| x % 3 != 0).collect();
        assert_eq!(items(&q), want);
        assert_eq!(q.len(), want.len());
        q.insert(5, 1000);
        assert_eq!(items(&q)[4..7], [7, 1000, 8]);
        q.insert(usize::MAX, 2000);
        *q.back_mut().unwrap() += 1;
        assert_eq!(items(&q).last(), Some(&2001));
        let len = q.len();
        let all: Vec<u32> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(all.len(), len);
        assert!(q.is_empty());
        assert_eq!(q.front(), None);
        assert_eq!(q.pop_front(), None);
        q.push_back(9);
        assert_eq!(q.front(), Some(&9));
    }
}
