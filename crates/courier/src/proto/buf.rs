//! Buffers as the protocol layer sees them: (address, length) segments in this process
//! (`Buf`), and short lists of local or remote segments held inline (`Segs`).

/// A buffer as address/length segments in this process.
#[derive(Clone, Debug)]
pub enum Buf {
    /// One contiguous segment: (address, length).
    One((usize, usize)),
    /// Scattered segments.
    Many(Vec<(usize, usize)>),
}

impl Buf {
    pub(crate) const EMPTY: Buf = Buf::One((0, 0));

    pub(crate) fn segs(&self) -> &[(usize, usize)] {
        match self {
            Buf::One(p) => std::slice::from_ref(p),
            Buf::Many(v) => v,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Buf::One((_, l)) => *l,
            Buf::Many(v) => v.iter().map(|s| s.1).sum(),
        }
    }

    /// Copy `src` into this buffer starting at byte `offset`; returns bytes copied.
    ///
    /// # Safety
    /// The segments must be valid for writes.
    pub(crate) unsafe fn write_at(&self, mut offset: usize, src: &[u8]) -> usize {
        let mut done = 0;
        for &(addr, len) in self.segs() {
            if done == src.len() {
                break;
            }
            if len == 0 {
                continue;
            }
            if offset >= len {
                offset -= len;
                continue;
            }
            let n = (len - offset).min(src.len() - done);
            // SAFETY: within the segment by construction; caller guarantees validity.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(done), (addr + offset) as *mut u8, n)
            };
            done += n;
            offset = 0;
        }
        done
    }

    /// Sub-range [off, off+len) as segments.
    pub(crate) fn slice(&self, off: usize, len: usize) -> Segs<usize> {
        seg_range(self.segs(), off, len)
    }

    /// Sub-range [off, off+len) as a buffer of its own (`Buf::One` when it is one segment).
    pub(crate) fn part(&self, off: usize, len: usize) -> Buf {
        Buf::from(self.slice(off, len))
    }
}

/// A list of (address, length) segments, local (`usize`) or a peer's (`u64`), held inline
/// up to two: the buffers a rendezvous moves nearly always have one or two, and the lists
/// each message's copy is described with then cost no allocation. A plain struct, not an
/// enum: an enum of these two shapes is moved in odd-sized pieces (a word loaded from byte
/// 2), and a load that straddles the stores which just built the list stalls; that stall
/// was 2-3% of a 1 MiB rendezvous receiver's time.
#[derive(Clone, Debug)]
pub(crate) struct Segs<T> {
    /// How many segments; more than two: all of them are in `spill`.
    len: usize,
    inline: [(T, T); 2],
    spill: Vec<(T, T)>,
}

impl<T: Copy + Default> Segs<T> {
    pub(crate) fn new() -> Self {
        Segs {
            len: 0,
            inline: [(T::default(), T::default()); 2],
            spill: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, s: (T, T)) {
        let n = self.len;
        if n < self.inline.len() {
            self.inline[n] = s;
        } else {
            if n == self.inline.len() {
                self.spill.reserve(n * 2);
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(s);
        }
        self.len = n + 1;
    }
}

impl<T: Copy + Default> Default for Segs<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::ops::Deref for Segs<T> {
    type Target = [(T, T)];

    fn deref(&self) -> &[(T, T)] {
        if self.len <= self.inline.len() {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }
}

impl<'a, T> IntoIterator for &'a Segs<T> {
    type Item = &'a (T, T);
    type IntoIter = std::slice::Iter<'a, (T, T)>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Copy + Default> FromIterator<(T, T)> for Segs<T> {
    fn from_iter<I: IntoIterator<Item = (T, T)>>(it: I) -> Self {
        let mut out = Segs::new();
        for s in it {
            out.push(s);
        }
        out
    }
}

impl<T: Copy> From<Segs<T>> for Vec<(T, T)> {
    fn from(s: Segs<T>) -> Self {
        if s.len <= s.inline.len() {
            s.inline[..s.len].to_vec()
        } else {
            s.spill
        }
    }
}

impl From<Segs<usize>> for Buf {
    /// One segment as `Buf::One`, without an allocation.
    fn from(s: Segs<usize>) -> Self {
        if s.len == 1 {
            Buf::One(s.inline[0])
        } else {
            Buf::Many(s.into())
        }
    }
}

/// Bytes `[off, off + len)` of a list of (address, length) segments, as segments: local
/// (`usize`) or a peer's (`u64`).
pub(crate) fn seg_range<T>(segs: &[(T, T)], mut off: T, mut len: T) -> Segs<T>
where
    T: Copy + Ord + Default + std::ops::Add<Output = T> + std::ops::Sub<Output = T>,
{
    let zero = T::default();
    let mut out = Segs::new();
    for &(a, l) in segs {
        if len == zero {
            break;
        }
        if off >= l {
            off = off - l;
            continue;
        }
        let n = (l - off).min(len);
        out.push((a + off, n));
        len = len - n;
        off = zero;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_lists_hold_two_inline_and_grow_past_them() {
        let mut s: Segs<u64> = Segs::new();
        assert!(s.is_empty());
        s.push((0x1000, 10));
        s.push((0x2000, 20));
        assert!(
            s.spill.is_empty() && s.spill.capacity() == 0,
            "two stay inline"
        );
        assert_eq!(&*s, &[(0x1000, 10), (0x2000, 20)]);
        s.push((0x3000, 30));
        s.push((0x4000, 40));
        assert_eq!(s.spill.len(), 4, "past two, all of them spill");
        assert_eq!(
            &*s,
            &[(0x1000, 10), (0x2000, 20), (0x3000, 30), (0x4000, 40)]
        );
        let v: Vec<(u64, u64)> = s.into();
        assert_eq!(v.len(), 4);
        let two: Segs<u64> = [(1, 2), (3, 4)].into_iter().collect();
        assert_eq!(Vec::from(two), vec![(1, 2), (3, 4)]);
        // One segment becomes `Buf::One`, more `Buf::Many`, in order.
        let one: Segs<usize> = [(0x10, 4)].into_iter().collect();
        assert!(matches!(Buf::from(one), Buf::One((0x10, 4))));
        let two: Segs<usize> = [(0x10, 4), (0x20, 8)].into_iter().collect();
        assert_eq!(Buf::from(two).segs(), &[(0x10, 4), (0x20, 8)]);
    }

    #[test]
    fn ranges_of_segment_lists() {
        let segs = [(100u64, 10u64), (200, 10), (300, 10)];
        // Within one segment, across two, across all three, and past the end.
        assert_eq!(&*seg_range(&segs, 2, 5), &[(102, 5)]);
        assert_eq!(&*seg_range(&segs, 8, 4), &[(108, 2), (200, 2)]);
        assert_eq!(&*seg_range(&segs, 5, 20), &[(105, 5), (200, 10), (300, 5)]);
        assert_eq!(&*seg_range(&segs, 25, 100), &[(305, 5)]);
        assert!(seg_range(&segs, 30, 4).is_empty());
    }
}
