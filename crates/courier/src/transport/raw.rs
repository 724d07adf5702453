//! A received frame as a link hands it up, and the one way the protocol layer looks at it:
//! `split`, which gives the parser private bytes only.
//!
//! A shared-memory link hands up frames in place, in a FIFO cell that the peer's process
//! maps writable: a same-user peer (buggy or hostile) can rewrite the cell while this
//! process reads it. Parsing such bytes in place would read each field from memory that
//! may change between two reads (a length checked, then a different length used), and a
//! plain read racing with a write is a data race, undefined behaviour in Rust's model.
//! So, for a frame marked `shared`:
//!
//! - its fixed header, and for the kinds whose body is structured (rendezvous offers with
//!   their segment lists and keys, connection requests with their worker addresses), the
//!   body too, are copied into private memory with atomic loads (`copy_from_shared`),
//!   each byte once; the parser sees only that copy, so every field it checks is the field
//!   it uses, and no structured byte is read twice;
//! - the payload of the other kinds (message data, put data, an active message's user
//!   header and data) is not copied here: it stays a view of the cell, and the protocol
//!   moves it with a single raw copy into its destination (the user's buffer, an
//!   unexpected-message buffer, the target memory of a put) or hands it to the user's
//!   handler as bytes. The protocol never reads it to decide anything, so a rewrite only
//!   changes which bytes arrive, which the peer could do anyway by sending others; a
//!   second copy of every payload would cost the small-message path for no protection.

use std::mem::MaybeUninit;

use crate::base::sys::{copy_from_shared, load_shared_word};
use crate::wire::frame::{Kind, MAX_HEADER_LEN};

/// A received frame in the transport's own buffer, valid until `consume`.
#[derive(Copy, Clone, Debug)]
pub struct RawFrame {
    /// Start.
    pub ptr: *const u8,
    /// Length.
    pub len: usize,
    /// The bytes lie in memory another process can write while we read (a shared-memory
    /// cell): they are read only through `split` (or `private`).
    pub shared: bool,
}

/// A frame as the parser may see it (`RawFrame::split`).
#[derive(Copy, Clone, Debug)]
pub struct Split<'a> {
    /// The fixed header of the frame's kind (fewer bytes if the frame is shorter, the
    /// first byte only if its kind is unknown): private bytes.
    pub head: &'a [u8],
    /// The rest of the frame: private bytes when the kind's rest is structured
    /// (`Kind::rest_is_opaque` false) or the frame is not shared; otherwise `rest_in_link`.
    pub rest: &'a [u8],
    /// The rest of the frame where the link holds it (for a shared frame, in the cell):
    /// opaque bytes, to be copied once and not interpreted.
    pub rest_in_link: &'a [u8],
}

/// Room for a frame's fixed header, filled by `RawFrame::split` (left uninitialised
/// until then: zeroing it would cost the small-message path).
pub struct HeadBuf(MaybeUninit<[u64; MAX_HEADER_LEN / 8]>);

impl HeadBuf {
    /// An empty one.
    #[inline(always)]
    pub fn new() -> HeadBuf {
        HeadBuf(MaybeUninit::uninit())
    }

    #[inline(always)]
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

impl Default for HeadBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl RawFrame {
    /// A frame in this process's own memory.
    #[inline(always)]
    pub fn private(ptr: *const u8, len: usize) -> RawFrame {
        RawFrame {
            ptr,
            len,
            shared: false,
        }
    }

    /// The bytes of a frame in private memory (not `shared`).
    ///
    /// # Safety
    /// Only between the `peek` that returned this frame and the next `consume` on that link,
    /// and only while the link is alive; and only for a frame that is not `shared`.
    #[inline]
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        debug_assert!(!self.shared, "a shared frame read as private bytes");
        // SAFETY: the caller upholds the validity window stated above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The whole frame in private memory: the frame itself if it is, else a copy in
    /// `copy` (for the connection-setup paths, which are not per message).
    ///
    /// # Safety
    /// As `bytes`, shared frames included.
    pub unsafe fn private_bytes<'a>(&self, copy: &'a mut Vec<u8>) -> &'a [u8] {
        if !self.shared {
            // SAFETY: per the caller's contract; the frame is private.
            return unsafe { self.bytes() };
        }
        copy.clear();
        copy.resize(self.len, 0);
        // SAFETY: the frame's `len` bytes are readable (caller's contract); `copy` holds
        // as many.
        unsafe { copy_from_shared(self.ptr, copy.as_mut_ptr(), self.len) };
        copy
    }

    /// A private copy of the whole frame (tests, fuzzing).
    ///
    /// # Safety
    /// As `private_bytes`.
    #[cfg(any(test, feature = "fuzzing"))]
    pub unsafe fn copy_whole(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // SAFETY: forwarded contract.
        unsafe { self.private_bytes(&mut v) }.to_vec()
    }

    /// The frame cut at its kind's fixed header, for the parser (`Frame::parse_parts`):
    /// see the module's text. Private frames are cut in place; a shared frame's header
    /// is copied into `head`, and its structured rest into `copy`.
    ///
    /// # Safety
    /// As `bytes`, shared frames included; the returned `rest_in_link` (and `rest`, where
    /// it is that) only within the same window.
    #[inline(always)]
    pub unsafe fn split<'a>(&self, head: &'a mut HeadBuf, copy: &'a mut Vec<u8>) -> Split<'a> {
        if !self.shared {
            // SAFETY: per the caller's contract; the frame is private.
            let b: &'a [u8] = unsafe { self.bytes() };
            let need = b
                .first()
                .and_then(|&k| Kind::from_byte(k))
                .map_or(b.len().min(1), |k| k.header_len().min(b.len()));
            let (h, rest) = b.split_at(need);
            return Split {
                head: h,
                rest,
                rest_in_link: rest,
            };
        }
        let dst = head.ptr();
        // The common 8 bytes (with the kind) first, then the rest of the kind's header:
        // each byte is read once. A shared-memory link's frames are 8-aligned (cells and
        // packed sub-frames are): the eager tag message, the small-message case, takes two
        // word loads here.
        let first = self.len.min(8);
        let aligned = (self.ptr as usize).is_multiple_of(8);
        let kb = if first == 8 && aligned {
            // SAFETY: 8-aligned, 8 bytes of the frame.
            let w = unsafe { load_shared_word(self.ptr) };
            // SAFETY: `dst` holds MAX_HEADER_LEN >= 8 bytes, 8-aligned.
            unsafe { dst.cast::<u64>().write(w) };
            let kb = w.to_ne_bytes()[0];
            if kb == Kind::TagEager as u8 && self.len >= 16 {
                // SAFETY: 8-aligned, bytes 8..16 of the frame; `dst` holds 16 and more.
                unsafe {
                    dst.add(8)
                        .cast::<u64>()
                        .write(load_shared_word(self.ptr.add(8)))
                };
                #[cfg(test)]
                crate::base::sys::shared_reads::add(16);
                // SAFETY: the header was written just above; the rest lies in the link
                // for the caller's window.
                let (head, rest) = unsafe {
                    (
                        std::slice::from_raw_parts(dst, 16),
                        std::slice::from_raw_parts(self.ptr.add(16), self.len - 16),
                    )
                };
                return Split {
                    head,
                    rest,
                    rest_in_link: rest,
                };
            }
            #[cfg(test)]
            crate::base::sys::shared_reads::add(8);
            kb
        } else {
            // SAFETY: `first <= len`: inside the frame; `dst` holds MAX_HEADER_LEN >= 8.
            unsafe { copy_from_shared(self.ptr, dst, first) };
            // SAFETY: written just above when `first > 0`.
            if first > 0 { unsafe { *dst } } else { 0 }
        };
        let kind = if first > 0 { Kind::from_byte(kb) } else { None };
        let need = kind.map_or(first.min(1), |k| k.header_len().min(self.len));
        if need > first {
            // SAFETY: `first < need <= len`, and `need <= MAX_HEADER_LEN`.
            unsafe { copy_from_shared(self.ptr.add(first), dst.add(first), need - first) };
        }
        // An unknown kind is refused on its first byte; the rest is never looked at.
        let at = need.max(first);
        // SAFETY: `at <= len`: the rest of the frame, inside the link's buffer for the
        // caller's window.
        let rest_in_link: &'a [u8] =
            unsafe { std::slice::from_raw_parts(self.ptr.add(at), self.len - at) };
        let rest = match kind {
            Some(k) if !k.rest_is_opaque() => {
                copy.clear();
                copy.resize(rest_in_link.len(), 0);
                // SAFETY: the rest's bytes, as above; `copy` holds as many.
                unsafe { copy_from_shared(rest_in_link.as_ptr(), copy.as_mut_ptr(), copy.len()) };
                &copy[..]
            }
            _ => rest_in_link,
        };
        // SAFETY: the first `need` bytes of `head` were written above (`need <= first`
        // when no second copy was made).
        let head: &'a [u8] = unsafe { std::slice::from_raw_parts(dst, need) };
        Split {
            head,
            rest,
            rest_in_link,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::sys::shared_reads;
    use crate::wire::frame::{Frame, Header, emit_segments, flags};
    use proptest::prelude::*;

    /// An 8-aligned buffer, as a FIFO cell's frame is.
    #[repr(C, align(8))]
    struct Cell([u8; 512]);

    fn cell_with(bytes: &[u8]) -> Box<Cell> {
        let mut c = Box::new(Cell([0; 512]));
        c.0[..bytes.len()].copy_from_slice(bytes);
        c
    }

    fn frame(h: Header, rest: &[u8]) -> Vec<u8> {
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(rest);
        v
    }

    /// A rendezvous offer: a header and a structured rest (two segments).
    fn offer() -> Vec<u8> {
        let mut segs = Vec::new();
        emit_segments(&mut segs, [(0x1000u64, 10u64), (0x2000, 6)].into_iter());
        frame(Header::tag_rts(5, 9, 16, 2, flags::SYNC), &segs)
    }

    /// Split a shared frame in a cell, then let the "peer" rewrite the cell, then parse:
    /// the parse must be that of the bytes as they were at the copy. A parser that read a
    /// header or structured byte from the cell again would see the rewrite. The rewrite
    /// covers every byte the receive path copied (the header, and a structured rest); an
    /// opaque payload, which stays a view of the cell, is left as it was, so that the test
    /// reads it only as the receive path may (and stays sound under Miri). `check` gets the
    /// parse and where the rest lies in the cell.
    fn parse_then_rewritten(bytes: &[u8], check: impl FnOnce(Frame<'_>, *const u8)) {
        let mut c = cell_with(bytes);
        // Every access to the cell below goes through this pointer, as a peer's would.
        let base = c.0.as_mut_ptr();
        let raw = RawFrame {
            ptr: base,
            len: bytes.len(),
            shared: true,
        };
        let (mut head, mut copy) = (HeadBuf::new(), Vec::new());
        let before = shared_reads::count();
        // SAFETY: the cell outlives every use of the split below.
        let f = unsafe { raw.split(&mut head, &mut copy) };
        let read = shared_reads::count() - before;
        let kind = Kind::from_byte(bytes[0]).unwrap();
        let copied = if kind.rest_is_opaque() {
            kind.header_len()
        } else {
            bytes.len()
        };
        assert_eq!(read, copied, "{kind:?}: bytes read from the cell");
        // SAFETY: inside the cell; this stands for the peer's concurrent rewrite.
        unsafe { std::ptr::write_bytes(base, 0xa5, copied) };
        let parsed = Frame::parse_parts(f.head, f.rest).expect("the copy parses");
        assert_eq!(
            shared_reads::count() - before,
            read,
            "parsing read the cell again"
        );
        check(parsed, f.rest_in_link.as_ptr());
        drop(c);
    }

    #[test]
    fn a_shared_offer_is_parsed_from_its_copy() {
        let b = offer();
        let want = Frame::parse(&b).unwrap();
        parse_then_rewritten(&b, |got, _| {
            assert_eq!(got, want);
            let Frame::TagRts { segs, .. } = got else {
                panic!("not an offer: {got:?}")
            };
            assert_eq!(
                segs.read_once::<Vec<_>>().unwrap(),
                vec![(0x1000, 10), (0x2000, 6)]
            );
        });
    }

    #[test]
    fn a_shared_header_is_copied_and_the_payload_left_in_place() {
        let b = frame(Header::tag_eager(0xfeed), b"payload bytes");
        parse_then_rewritten(&b, |got, in_link| {
            let Frame::TagEager { tag, data } = got else {
                panic!("not a tag message: {got:?}")
            };
            // The tag came from the copy (the cell's header is rewritten by now); the data
            // is where it lies in the cell.
            assert_eq!(tag, 0xfeed);
            assert_eq!(data.as_ptr(), in_link);
            assert_eq!(data, b"payload bytes");
        });
    }

    #[test]
    fn short_and_unknown_shared_frames_are_refused_from_the_copy() {
        for b in [
            vec![],
            vec![250u8, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            offer()[..20].to_vec(),
        ] {
            let mut c = cell_with(&b);
            let raw = RawFrame {
                ptr: c.0.as_mut_ptr(),
                len: b.len(),
                shared: true,
            };
            let (mut head, mut copy) = (HeadBuf::new(), Vec::new());
            // SAFETY: `c` outlives the split.
            let f = unsafe { raw.split(&mut head, &mut copy) };
            assert_eq!(
                Frame::parse_parts(f.head, f.rest),
                Frame::parse(&b),
                "{b:?}"
            );
            assert!(Frame::parse(&b).is_err());
        }
    }

    proptest! {
        /// Any bytes: the shared split parses as the whole frame does in private memory,
        /// and so does the private split.
        #[test]
        fn split_agrees_with_parse(b in proptest::collection::vec(any::<u8>(), 0..300),
                                   kind in prop::sample::select(vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 20, 21, 22, 23, 30, 31, 32, 33, 34, 35, 36, 37, 38, 99])) {
            let mut b = b;
            if let Some(k) = b.first_mut() {
                *k = kind;
            }
            let mut c = cell_with(&b);
            let base = c.0.as_mut_ptr();
            let want = Frame::parse(&b);
            for shared in [true, false] {
                let raw = RawFrame { ptr: base, len: b.len(), shared };
                let (mut head, mut copy) = (HeadBuf::new(), Vec::new());
                // SAFETY: `c` outlives the split.
                let f = unsafe { raw.split(&mut head, &mut copy) };
                prop_assert_eq!(Frame::parse_parts(f.head, f.rest), want.clone());
                prop_assert_eq!(f.rest.len(), f.rest_in_link.len());
            }
        }
    }
}
