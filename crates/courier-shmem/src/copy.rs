//! The copy behind a put or get that lands in mapped memory (this PE's own, or a same-host
//! peer's segment).
//!
//! Why not plain `memmove` for everything: glibc (2.36, on a CPU with fast short
//! `rep movsb`) copies from 2112 bytes up with `rep movsb`, and on the Xeon this was
//! measured on that is slow when the destination and the source sit at different offsets
//! within a 64-byte line (a malloc'd buffer 16 bytes into its page against a page-aligned
//! symmetric block, the common case): 4 KiB took 150-230 ns when the source pages had
//! never been written (still the shared zero page, as a freshly allocated heap block is)
//! against 26-45 ns aligned. A loop of unaligned 64-byte loads (AVX-512; 32-byte ones with
//! AVX2 where that is all there is) and stores aligned to the destination's 64-byte lines
//! copies those in 40-60 ns, and written sources in 0.72-0.84 of `rep movsb`'s time.
//! Where the two offsets agree `rep movsb` is kept, as is glibc's own vector code below
//! [`WIDE_MIN`], and `memmove` for overlapping ranges (a put or get on this PE's own
//! memory). From [`STREAM_MIN`] up, aligned or not, the loop makes non-temporal stores,
//! unless the destination is one of the last few this thread copied that much into: a
//! buffer written again and again (a halo, a result read back soon) stays in the cache
//! with plain stores, where streaming it would send every copy to memory (on an EPYC
//! with a 32 MiB L3, a 4 MiB put into the same block took 120 us streamed against 67 us
//! plain, while 4 MiB puts cycling through 64 blocks ran at 19 GB/s streamed against 16
//! plain).
//!
//! `crates/courier-shmem/examples/copy_bench.rs` measures the old and the new side by side
//! across sizes and offsets.

/// The smallest copy that may take the wide loop: glibc's `rep movsb` threshold on CPUs
/// with fast short `rep movsb` (its vector code below that is as fast as this loop).
pub const WIDE_MIN: usize = 2112;

/// The smallest copy made with non-temporal stores (past the cache, straight to memory):
/// the size of this Xeon's per-core L2 cache, which a larger copy would flush anyway. A
/// bandwidth test of 4 MiB puts into another PE (`bench/shmem`, 64 distinct targets) ran
/// 1.3x OSHMEM's with them against 1.1x without, in the same run.
pub const STREAM_MIN: usize = 2 << 20;

/// How many of the last large destinations (copies of [`STREAM_MIN`] or more) a thread
/// remembers: one met again is written with plain stores.
const RECENT: usize = 4;

thread_local! {
    /// This thread's last large destinations (start addresses), newest first.
    static LAST_DESTS: std::cell::Cell<[usize; RECENT]> = const { std::cell::Cell::new([0; RECENT]) };
}

/// Whether a copy of `len` bytes into `dst` should stream past the cache: large, and not
/// a destination this thread wrote lately (which is then remembered).
fn stream_into(dst: usize, len: usize) -> bool {
    if len < STREAM_MIN {
        return false;
    }
    LAST_DESTS.with(|c| {
        let mut last = c.get();
        let seen = last.contains(&dst);
        if !seen {
            last.rotate_right(1);
            last[0] = dst;
            c.set(last);
        }
        !seen
    })
}

/// Copy `len` bytes from `src` to `dst`; the ranges may overlap.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes.
#[inline(always)]
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    let (d, s) = (dst as usize, src as usize);
    let apart = d.abs_diff(s) >= len;
    let misaligned = (d ^ s) & 63 != 0;
    if len < WIDE_MIN || !apart || (!misaligned && len < STREAM_MIN) {
        // SAFETY: the caller's contract; memmove handles any overlap.
        unsafe { std::ptr::copy(src, dst, len) };
        return;
    }
    // SAFETY: the caller's contract, and the ranges do not overlap.
    unsafe { wide(dst, src, len) }
}

/// A copy of at least [`WIDE_MIN`] bytes between disjoint ranges (out of line:
/// `copy` is inlined into every put and get entry point).
#[inline(never)]
unsafe fn wide(dst: *mut u8, src: *const u8, len: usize) {
    let stream = stream_into(dst as usize, len);
    if !stream && len >= STREAM_MIN && (dst as usize ^ src as usize) & 63 == 0 {
        // Aligned and kept in the cache: memmove, as below STREAM_MIN.
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present; the caller's contract covers the ranges, and
        // `len >= WIDE_MIN >= 512`.
        unsafe {
            if stream {
                x86::copy_avx512::<true>(dst, src, len)
            } else {
                x86::copy_avx512::<false>(dst, src, len)
            }
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the caller's contract covers the ranges, and
        // `len >= WIDE_MIN >= 256`.
        unsafe {
            if stream {
                x86::copy_avx2::<true>(dst, src, len)
            } else {
                x86::copy_avx2::<false>(dst, src, len)
            }
        };
        return;
    }
    // SAFETY: the caller's contract; the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::{
        __m256i, __m512i, _mm_sfence, _mm256_loadu_si256 as load, _mm256_store_si256,
        _mm256_storeu_si256 as store, _mm256_stream_si256, _mm512_loadu_si512, _mm512_store_si512,
        _mm512_storeu_si512, _mm512_stream_si512,
    };

    /// Bytes moved by one round of the loop: four 32-byte vectors, loaded before any is
    /// stored, so a load does not wait on the store just before it when the destination
    /// lies a few bytes past the source modulo 4 KiB (the CPU's store-to-load check
    /// compares only the low 12 address bits).
    const ROUND: usize = 128;

    /// Forward copy: the first 64 and the last 128 bytes with unaligned vectors (loaded
    /// before anything is stored), the rest in rounds whose stores start on the
    /// destination's first 64-byte boundary after `dst` and stay aligned; with `STREAM`
    /// those are non-temporal, and an `sfence` makes them globally visible, in order with
    /// later stores, before the function returns.
    ///
    /// # Safety
    /// AVX2 must be available; `src` valid for reads and `dst` for writes of `len` bytes,
    /// the two ranges disjoint; `len >= 256`.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn copy_avx2<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
        let store_aligned = |p: *mut __m256i, v: __m256i| {
            // SAFETY: the caller's (below): `p` is 32-byte aligned and inside `dst`'s range.
            unsafe {
                if STREAM {
                    _mm256_stream_si256(p, v)
                } else {
                    _mm256_store_si256(p, v)
                }
            }
        };
        debug_assert!(len >= 2 * ROUND);
        let at = |i: usize| src.wrapping_add(i) as *const __m256i;
        let to = |i: usize| dst.wrapping_add(i) as *mut __m256i;
        // SAFETY (all loads and stores below): every offset `i` used lies in
        // `[0, len - 32]`, so each 32-byte access stays inside the caller's ranges; the
        // aligned stores are at `dst + i` with `dst + i` a multiple of 64.
        unsafe {
            let (h0, h1) = (load(at(0)), load(at(32)));
            let t = [
                load(at(len - 128)),
                load(at(len - 96)),
                load(at(len - 64)),
                load(at(len - 32)),
            ];
            let mut i = 64 - (dst as usize & 63);
            let end = len - ROUND;
            while i < end {
                let a = load(at(i));
                let b = load(at(i + 32));
                let c = load(at(i + 64));
                let d = load(at(i + 96));
                store_aligned(to(i), a);
                store_aligned(to(i + 32), b);
                store_aligned(to(i + 64), c);
                store_aligned(to(i + 96), d);
                i += ROUND;
            }
            if STREAM {
                _mm_sfence();
            }
            store(to(0), h0);
            store(to(32), h1);
            store(to(len - 128), t[0]);
            store(to(len - 96), t[1]);
            store(to(len - 64), t[2]);
            store(to(len - 32), t[3]);
        }
    }

    /// As `copy_avx2`, with 64-byte vectors: a round is four of them (256 bytes), the
    /// head one and the tail four. On the Xeon measured, where glibc's own memmove uses
    /// AVX-512 too, this copied 4 KiB at mismatched offsets in 0.72-0.84 of `rep movsb`'s
    /// time from a written source where the 32-byte loop took 1.1-1.2.
    ///
    /// # Safety
    /// AVX-512F must be available; `src` valid for reads and `dst` for writes of `len`
    /// bytes, the two ranges disjoint; `len >= 512`.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn copy_avx512<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
        const ROUND: usize = 256;
        debug_assert!(len >= 2 * ROUND);
        let at = |i: usize| src.wrapping_add(i) as *const __m512i;
        let to = |i: usize| dst.wrapping_add(i) as *mut __m512i;
        let store_aligned = |p: *mut __m512i, v: __m512i| {
            // SAFETY: the caller's (below): `p` is 64-byte aligned and inside `dst`'s range.
            unsafe {
                if STREAM {
                    _mm512_stream_si512(p, v)
                } else {
                    _mm512_store_si512(p, v)
                }
            }
        };
        // SAFETY (all loads and stores below): every offset `i` used lies in
        // `[0, len - 64]`, so each 64-byte access stays inside the caller's ranges; the
        // aligned stores are at `dst + i` with `dst + i` a multiple of 64.
        unsafe {
            let head = _mm512_loadu_si512(at(0));
            let t = [
                _mm512_loadu_si512(at(len - 256)),
                _mm512_loadu_si512(at(len - 192)),
                _mm512_loadu_si512(at(len - 128)),
                _mm512_loadu_si512(at(len - 64)),
            ];
            let mut i = 64 - (dst as usize & 63);
            let end = len - ROUND;
            while i < end {
                let a = _mm512_loadu_si512(at(i));
                let b = _mm512_loadu_si512(at(i + 64));
                let c = _mm512_loadu_si512(at(i + 128));
                let d = _mm512_loadu_si512(at(i + 192));
                store_aligned(to(i), a);
                store_aligned(to(i + 64), b);
                store_aligned(to(i + 128), c);
                store_aligned(to(i + 192), d);
                i += ROUND;
            }
            if STREAM {
                _mm_sfence();
            }
            _mm512_storeu_si512(to(0), head);
            _mm512_storeu_si512(to(len - 256), t[0]);
            _mm512_storeu_si512(to(len - 192), t[1]);
            _mm512_storeu_si512(to(len - 128), t[2]);
            _mm512_storeu_si512(to(len - 64), t[3]);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_destination_met_again_is_not_streamed() {
        let big = super::STREAM_MIN;
        assert!(
            !super::stream_into(0x1000, big - 1),
            "small copies never stream"
        );
        assert!(super::stream_into(0x1000, big), "a new destination streams");
        assert!(
            !super::stream_into(0x1000, big),
            "the same one again stays cached"
        );
        for d in 1..=super::RECENT {
            assert!(super::stream_into(0x1000 + d * big, big));
        }
        assert!(
            super::stream_into(0x1000, big),
            "forgotten after RECENT others"
        );
    }

    use super::*;

    /// A source pattern with no period that a shifted copy could match by chance.
    fn pattern(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_u32;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    /// Copy `len` bytes from `src_off` of a buffer into `dst_off` of another with `f`, and
    /// check the copied bytes, the guard bytes around them and the untouched source.
    fn check(
        f: unsafe fn(*mut u8, *const u8, usize),
        len: usize,
        src_off: usize,
        dst_off: usize,
        src: &[u8],
        dst: &mut [u8],
    ) {
        dst.fill(0xa5);
        // SAFETY: both offsets plus `len` lie inside the buffers (sized by the callers), and
        // they are two distinct allocations.
        unsafe {
            f(
                dst.as_mut_ptr().add(dst_off),
                src.as_ptr().add(src_off),
                len,
            )
        };
        assert_eq!(
            &dst[dst_off..dst_off + len],
            &src[src_off..src_off + len],
            "len {len}, src +{src_off}, dst +{dst_off}"
        );
        assert!(
            dst[..dst_off].iter().all(|&b| b == 0xa5),
            "wrote before dst: len {len}, src +{src_off}, dst +{dst_off}"
        );
        assert!(
            dst[dst_off + len..].iter().all(|&b| b == 0xa5),
            "wrote past dst: len {len}, src +{src_off}, dst +{dst_off}"
        );
    }

    /// Every size 0..=4 KiB + 64, each at every destination offset 0..64 (against a source
    /// offset that changes with the size) and at every source offset 0..64 (likewise).
    fn every_size_and_offset(f: unsafe fn(*mut u8, *const u8, usize), min: usize) {
        let max = 4096 + 64;
        let src = pattern(max + 128);
        let mut dst = vec![0u8; max + 128];
        let spread = [0, 1, 7, 16, 31, 32, 48, 63];
        for len in min..=max {
            for off in 0..64 {
                check(f, len, spread[len % 8], off, &src, &mut dst);
                check(f, len, off, spread[(len / 8) % 8], &src, &mut dst);
            }
        }
    }

    /// Large copies, up to 4 MiB and at odd sizes, at a few offsets each way.
    fn large(f: unsafe fn(*mut u8, *const u8, usize)) {
        let max = (4 << 20) + 4096;
        let src = pattern(max + 128);
        let mut dst = vec![0u8; max + 128];
        for len in [
            8191,
            65536,
            65536 + 17,
            1 << 20,
            (1 << 20) + 4095,
            4 << 20,
            max,
        ] {
            for (s, d) in [(0, 0), (0, 16), (16, 0), (48, 2), (63, 63), (5, 40)] {
                check(f, len, s, d, &src, &mut dst);
            }
        }
    }

    #[test]
    fn copy_every_size_and_offset() {
        every_size_and_offset(copy, 0);
    }

    #[test]
    fn copy_large() {
        large(copy);
    }

    /// Both the forward and the backward overlapping case go through memmove.
    #[test]
    fn copy_overlapping() {
        let base = pattern(3 * 8192);
        for len in [0, 1, 100, WIDE_MIN, 5000, 8192] {
            for shift in [1usize, 16, 64, 4096] {
                let mut v = base.clone();
                // SAFETY: both ranges lie inside `v` (3 * 8192 bytes).
                unsafe { copy(v.as_mut_ptr().add(shift), v.as_ptr(), len) };
                assert_eq!(
                    &v[shift..shift + len],
                    &base[..len],
                    "forward len {len} shift {shift}"
                );
                let mut v = base.clone();
                // SAFETY: as above.
                unsafe { copy(v.as_mut_ptr(), v.as_ptr().add(shift), len) };
                assert_eq!(
                    &v[..len],
                    &base[shift..shift + len],
                    "backward len {len} shift {shift}"
                );
            }
        }
    }

    /// The AVX2 loop itself, with plain and with non-temporal stores, on every size it may
    /// be given (from 256 up), so that a wrong head, tail or round boundary shows even
    /// where `copy` would not choose it.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_every_size_and_offset() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            assert!(
                std::env::var_os("CI").is_none(),
                "no AVX2 on this CPU: the wide copy is not tested"
            );
            println!("SKIPPED: no AVX2 on this CPU");
            return;
        }
        unsafe fn f(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: AVX2 checked above; the ranges are the test's, disjoint, `n >= 256`.
            unsafe { x86::copy_avx2::<false>(d, s, n) }
        }
        every_size_and_offset(f, 256);
        large(f);
        unsafe fn g(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: as in `f`.
            unsafe { x86::copy_avx2::<true>(d, s, n) }
        }
        every_size_and_offset(g, 256);
        large(g);
    }

    /// The AVX-512 loop, both kinds of store, every size from 512 up.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_every_size_and_offset() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            // Not an environment to set up: `copy` does not use this loop on such a CPU.
            println!("SKIPPED: no AVX-512 on this CPU (copy uses the AVX2 loop here)");
            return;
        }
        unsafe fn f(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: AVX-512F checked above; the ranges are the test's, disjoint, `n >= 512`.
            unsafe { x86::copy_avx512::<false>(d, s, n) }
        }
        unsafe fn g(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: as in `f`.
            unsafe { x86::copy_avx512::<true>(d, s, n) }
        }
        for h in [f as unsafe fn(*mut u8, *const u8, usize), g] {
            every_size_and_offset(h, 512);
            large(h);
        }
    }
}
