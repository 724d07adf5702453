//! The same-host put/get copy (`src/copy.rs`) against the C library's memmove, which
//! it replaced: sizes 8 B to 4 MiB, destination offsets 0, 16, 48, 64, 2048 and 2064
//! bytes from a page-aligned source, the two alternated round by round; medians of the
//! rounds, and the ratio new/old (below 1 is faster).
//!
//!   cargo run --release -p courier-shmem --example copy_bench [-- untouched] [-- window N]
//!
//! `untouched`: the source pages are never written (the shared zero page, as a symmetric
//! block nobody has written yet, which `bench/shmem`'s get tests read). `window N`: cycle
//! over N source/destination pairs per size (as the bandwidth tests do), so that large
//! sizes come from memory rather than the cache.

#[allow(dead_code)]
#[path = "../src/copy.rs"]
mod copy;

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let untouched = args.iter().any(|a| a == "untouched");
    let window = args
        .iter()
        .position(|a| a == "window")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let sizes = [
        8usize,
        64,
        512,
        2048,
        3000,
        4096,
        16384,
        65536,
        262144,
        1 << 20,
        4 << 20,
    ];
    let offsets = [0usize, 16, 48, 64, 2048, 2064];
    let biggest = sizes[sizes.len() - 1];
    let stride = biggest + 8192;
    let span = stride * window;
    let src = map(span);
    let dst = map(span);
    // SAFETY: `map` returned `span` writable bytes for each.
    unsafe {
        std::ptr::write_bytes(dst, 1, span);
        if !untouched {
            for i in 0..span {
                *src.add(i) = (i * 7 + 3) as u8;
            }
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "source {}, window {window}, load {}",
        if untouched {
            "never written"
        } else {
            "written"
        },
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:>8} {:>5} {:>11} {:>11} {:>7}",
        "size", "off", "memmove ns", "copy ns", "new/old"
    );
    for &n in &sizes {
        let iters = (4_000_000 / (n + 64)).clamp(2, 20_000);
        for &off in &offsets {
            let mut old = Vec::new();
            let mut new = Vec::new();
            for _ in 0..15 {
                old.push(time(iters, window, stride, src, dst, off, n, |d, s, n| {
                    // SAFETY: `time` passes ranges inside the two mappings.
                    unsafe { std::ptr::copy(s, d, n) }
                }));
                new.push(time(iters, window, stride, src, dst, off, n, |d, s, n| {
                    // SAFETY: as above.
                    unsafe { copy::copy(d, s, n) }
                }));
            }
            let (o, w) = (median(&mut old), median(&mut new));
            println!("{n:>8} {off:>5} {o:>11.1} {w:>11.1} {:>7.2}", w / o);
        }
    }
}

/// Nanoseconds per copy of `n` bytes into `dst + off`, `iters` copies over the window.
#[allow(clippy::too_many_arguments)]
fn time(
    iters: usize,
    window: usize,
    stride: usize,
    src: *mut u8,
    dst: *mut u8,
    off: usize,
    n: usize,
    f: impl Fn(*mut u8, *const u8, usize),
) -> f64 {
    let t = Instant::now();
    for i in 0..iters {
        let w = (i % window) * stride;
        f(dst.wrapping_add(w + off), src.wrapping_add(w), n);
        std::hint::black_box(dst);
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `len` bytes of a shared memory file, as a peer's segment is mapped.
fn map(len: usize) -> *mut u8 {
    // SAFETY: plain libc calls on a fresh memfd; the mapping is checked below.
    unsafe {
        let fd = libc::memfd_create(c"copy_bench".as_ptr(), 0);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0, "ftruncate");
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert!(
            p != libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        libc::close(fd);
        p as *mut u8
    }
}
