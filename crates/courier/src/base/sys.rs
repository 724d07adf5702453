//! Small system helpers: host identity, randomness, thread identity.

use std::sync::OnceLock;

/// A 16-byte identity of this machine: the kernel's boot id (without one, the hostname,
/// padded). Processes with equal ids share a kernel, and so its CPUs, whatever network
/// namespace each runs in.
pub fn machine_id() -> [u8; 16] {
    static ID: OnceLock<[u8; 16]> = OnceLock::new();
    *ID.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let hex: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        let mut id = [0u8; 16];
        if hex.len() == 32 {
            for (i, pair) in hex.chunks(2).enumerate() {
                let s = std::str::from_utf8(pair).unwrap_or("00");
                id[i] = u8::from_str_radix(s, 16).unwrap_or(0);
            }
        } else {
            // No boot id: fall back to the hostname, padded.
            let h = rustix::system::uname();
            let name = h.nodename().to_bytes();
            for (i, b) in name.iter().take(16).enumerate() {
                id[i] = *b;
            }
        }
        id
    })
}

/// A 16-byte identity of this "host": the machine (`machine_id`) mixed with the network
/// namespace. Processes with equal ids share a kernel and a network namespace, so shared
/// memory wireup (abstract unix sockets, which are per namespace) and CMA work between them;
/// containers or namespaces on one machine count as separate hosts.
pub fn host_id() -> [u8; 16] {
    static ID: OnceLock<[u8; 16]> = OnceLock::new();
    *ID.get_or_init(|| {
        let mut id = machine_id();
        // The network namespace's inode number, folded into the last 8 bytes.
        if let Ok(link) = std::fs::read_link("/proc/self/ns/net") {
            let ns: u64 = link
                .to_string_lossy()
                .bytes()
                .filter(u8::is_ascii_digit)
                .fold(0u64, |a, d| {
                    a.wrapping_mul(10).wrapping_add((d - b'0') as u64)
                });
            for (i, b) in ns.to_le_bytes().iter().enumerate() {
                id[8 + i] ^= *b;
            }
        }
        id
    })
}

/// Cryptographically random bytes from the kernel.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    let mut filled = 0;
    while filled < 8 {
        match rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => {
                // getrandom cannot fail on supported kernels; mix time and pid as a last resort.
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                return (t as u64) ^ ((std::process::id() as u64) << 32);
            }
        }
    }
    u64::from_le_bytes(b)
}

/// This process's id.
pub fn pid() -> u32 {
    std::process::id()
}

/// A small number unique to the calling thread (never 0). Every entry of a single-thread
/// worker checks it, so it must cost one instruction wherever it is inlined: on x86-64 and
/// AArch64 it is the thread pointer itself (the address of the thread's control block,
/// which the ABI keeps in `fs:0` and `tpidr_el0`), read without going through a
/// thread-local accessor that the compiler may leave out of line; elsewhere (and under
/// Miri, which runs no inline assembly) the address of a thread-local byte.
#[inline(always)]
pub fn thread_token() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
    {
        let tp: usize;
        // SAFETY: a load of the thread control block's self pointer, which the x86-64 TLS
        // ABI stores at `fs:0` for every thread; it reads no memory of ours and has no
        // side effect.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:0", out(reg) tp, options(nostack, readonly, preserves_flags, pure));
        }
        tp
    }
    #[cfg(all(target_arch = "aarch64", target_os = "linux", not(miri)))]
    {
        let tp: usize;
        // SAFETY: a read of the thread pointer register, set for every thread; no memory
        // is touched.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags, pure));
        }
        tp
    }
    #[cfg(any(
        miri,
        not(all(
            any(target_arch = "x86_64", target_arch = "aarch64"),
            target_os = "linux"
        ))
    ))]
    {
        thread_local! {
            static TOKEN: u8 = const { 0 };
        }
        TOKEN.with(|t| t as *const u8 as usize)
    }
}

/// Copy `n` bytes; up to 16 bytes (frame headers, small payloads) without calling memcpy,
/// whose call and size dispatch cost more than the copy on the small-message paths.
///
/// # Safety
/// As `ptr::copy_nonoverlapping`.
#[inline(always)]
pub unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: every access below stays within the first `n` bytes of both ranges.
    unsafe {
        // Exact word sizes take one store: memory a peer's CPU is polling moves between
        // the caches on every store, so a second, overlapping one is not free.
        if n > 16 {
            std::ptr::copy_nonoverlapping(src, dst, n);
        } else if n == 8 {
            wr(dst.cast::<u64>(), rd(src.cast::<u64>()));
        } else if n > 8 {
            let (a, b) = (rd(src.cast::<u64>()), rd(src.add(n - 8).cast::<u64>()));
            wr(dst.cast::<u64>(), a);
            wr(dst.add(n - 8).cast::<u64>(), b);
        } else if n == 4 {
            wr(dst.cast::<u32>(), rd(src.cast::<u32>()));
        } else if n > 4 {
            let (a, b) = (rd(src.cast::<u32>()), rd(src.add(n - 4).cast::<u32>()));
            wr(dst.cast::<u32>(), a);
            wr(dst.add(n - 4).cast::<u32>(), b);
        } else {
            for i in 0..n {
                *dst.add(i) = *src.add(i);
            }
        }
    }
}

/// A short gap between two looks at a word that another CPU writes (a put landing in
/// this process's memory, a signal word): a chain of 16 additions to a word on this
/// thread's stack, each reading back the store before it, some 30 ns. (`black_box` is
/// what keeps each store; the compiler lowers it so, though it does not promise to.)
///
/// A loop of bare loads keeps asking for the watched line, and the writer's store has to
/// take the line away from it: spaced looks let the store land sooner. Measured on this
/// project's 2-vCPU EPYC machine:
/// - `bench/ceilings.c cacheline`, two processes ping-ponging through two cache lines:
///   0.052-0.055 us one-way with bare loads, 0.034-0.037 with this gap;
/// - `courier perf -t ucp_put_lat`: 0.050-0.060 us with bare loads, 0.040-0.055 with this
///   gap (paired, 1.375 times as fast over 5 one-speed pairs, 1.09 over 8 later). Shorter
///   gaps (one to four stores per look) halved the bare ping-pong in an experiment
///   outside the repository but did not move `ucp_put_lat`; `pause` (22 ns here, longer on
///   recent Intel parts) helped about as much as this chain, less steadily. The
///   experiments are in `bench/analysis.md`.
#[inline(always)]
pub fn poll_gap() {
    let mut x = 0u32;
    for i in 0..16u32 {
        // Through memory: each step's store must be read back by the next.
        x = std::hint::black_box(x.wrapping_add(i));
    }
}

/// Copy `n` bytes from memory that another process may be writing at the same time (a
/// shared-memory FIFO cell a peer can rewrite) to `dst`, with relaxed atomic loads only:
/// whole 8-byte words where `src` is 8-aligned, single bytes elsewhere. A plain read of
/// bytes another process writes concurrently is a data race, undefined behaviour in Rust's
/// model; atomic loads are not (they compile to plain moves). The peer may tear the copy
/// (some bytes old, some new): the caller parses the copy, in private memory, and validates
/// every field of it, so a torn copy is at worst a malformed frame.
///
/// # Safety
/// `src` must be valid for reads of `n` bytes (and may be written concurrently); `dst`
/// valid for writes of `n` bytes, private, not overlapping `src`.
#[inline(always)]
pub unsafe fn copy_from_shared(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(test)]
    shared_reads::add(n);
    let mut i = 0;
    if (src as usize).is_multiple_of(8) {
        while i + 8 <= n {
            // SAFETY: `src + i` is 8-aligned and `i + 8 <= n`: inside both ranges.
            unsafe {
                dst.add(i)
                    .cast::<u64>()
                    .write_unaligned(load_shared_word(src.add(i)))
            };
            i += 8;
        }
    }
    while i < n {
        // SAFETY: `i < n`: inside both ranges; an atomic may alias memory another process
        // writes.
        unsafe {
            *dst.add(i) = std::sync::atomic::AtomicU8::from_ptr(src.add(i).cast_mut())
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        i += 1;
    }
}

/// One 8-byte word of memory another process may be writing, as `copy_from_shared` reads
/// it (its bytes in memory order: `to_ne_bytes` gives them back).
///
/// # Safety
/// `src` must be 8-aligned and valid for reads of 8 bytes.
#[inline(always)]
pub unsafe fn load_shared_word(src: *const u8) -> u64 {
    // SAFETY: per the caller's contract; an atomic may alias memory another process
    // writes.
    unsafe { std::sync::atomic::AtomicU64::from_ptr(src.cast::<u64>().cast_mut()) }
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Test hook: bytes this thread has read with `copy_from_shared`, so that a test can show
/// that a frame's bytes are read from shared memory once each, never twice.
#[cfg(test)]
pub mod shared_reads {
    use std::cell::Cell;

    thread_local! {
        static READ: Cell<usize> = const { Cell::new(0) };
    }

    pub(crate) fn add(n: usize) {
        READ.with(|r| r.set(r.get() + n));
    }

    /// Bytes read on this thread so far.
    pub fn count() -> usize {
        READ.with(|r| r.get())
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_from_shared, copy_small, shared_reads};

    #[test]
    fn copy_small_copies_exactly_n_bytes() {
        for n in 0..40usize {
            let src: Vec<u8> = (0..48u8)
                .map(|i| i.wrapping_mul(7).wrapping_add(1))
                .collect();
            let mut dst = vec![0xeeu8; 48];
            // SAFETY: both buffers hold 48 >= n bytes and do not overlap.
            unsafe { copy_small(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n], "n = {n}");
            assert!(
                dst[n..].iter().all(|&b| b == 0xee),
                "n = {n}: wrote past the end"
            );
        }
    }

    #[test]
    fn copy_from_shared_copies_exactly_and_counts() {
        #[repr(C, align(8))]
        struct Buf([u8; 48]);
        let mut src = Buf([0; 48]);
        for (i, b) in src.0.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(13).wrapping_add(5);
        }
        let want = src.0;
        // Loads through a pointer that may write, as a mapping's is.
        let base = src.0.as_mut_ptr();
        // Aligned and unaligned starts, every length up to 40.
        for start in [0usize, 1, 3, 8] {
            for n in 0..40usize {
                let mut dst = vec![0xeeu8; n];
                let before = shared_reads::count();
                // SAFETY: start + n <= 48: inside `src`; `dst` holds n bytes.
                unsafe { copy_from_shared(base.add(start), dst.as_mut_ptr(), n) };
                assert_eq!(dst[..], want[start..start + n], "start {start}, n {n}");
                assert_eq!(shared_reads::count() - before, n, "start {start}, n {n}");
            }
        }
    }
}
