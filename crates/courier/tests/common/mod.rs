//! What the multi-process tests (tests/rma*.rs, atomic_post.rs, cuda*.rs, multiprocess*.rs)
//! and the two-sided API tests (api*.rs) share: how a test binary re-runs itself as a child,
//! and how parent and child find each other.
//!
//! A test starts a child by running its own binary again for its `child_entry` test only,
//! with the child's role in `COURIER_TEST_ROLE` ([`child_command`], [`Kid`]); `child_entry`
//! hands the role to its function ([`run_child`]) and the child exits 0 when that returns.
//! Where the parent owns the memory ([`Owner`]) it passes its port and packed keys in the
//! child's environment and the child connects ([`actor`]); where a child owns it
//! ([`target`]) the child prints them on stdout and the parent connects ([`client`]).
//!
//! - `child`: child processes, waiting on them, messages between parent and child.
//! - `peers`: transports, contexts, memory regions, and the two set-ups above.
//!
//! And, each for a few test files (not in the glob re-export):
//! - `net`: the transport selection of rma_refusals.rs, rma_paths.rs and rma_waits.rs.
//! - `tls`: the set-up of rma.rs and rma_keys.rs (transports by `COURIER_TLS`).
//! - `cuda`: the CUDA driver, device buffers and children of cuda.rs and cuda_memory.rs.
//! - `echo`: the echo and sink children of multiprocess.rs and multiprocess_faults.rs.
//! - `pair`: the pair of workers of api.rs and api_rendezvous.rs.
//! - `authed`: key files, transports and announcements of auth.rs and max_frame.rs.
//! - `cputime`: a thread's CPU time per call (hostile.rs's victim).
//!
//! Cargo builds each file in tests/ as a crate of its own, with this module in it; each uses
//! a part of it.
#![allow(dead_code)]

mod child;
mod peers;

pub mod authed;
pub mod cputime;
pub mod cuda;
pub mod echo;
pub mod net;
pub mod pair;
pub mod tls;

pub use child::*;
pub use peers::*;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// One `#[test]` a line: `name: call;` becomes `#[test] fn name() { call; }`, with the
/// line's attributes (doc comments) on it. For matrices of one scenario over transports
/// and kinds of memory, whose test names CI logs and notes refer to.
#[allow(unused_macros)] // not every test file has a matrix
macro_rules! matrix {
    ($($(#[$m:meta])* $name:ident: $call:expr;)+) => {
        $(
            $(#[$m])*
            #[test]
            fn $name() {
                $call;
            }
        )+
    };
}
#[allow(unused_imports)]
pub(crate) use matrix;

/// `n` bytes that differ with `seed` and along the buffer (in every 4 KiB page too).
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|i| ((i as u64).wrapping_mul(131).wrapping_add(s) >> 3) as u8 ^ (i >> 12) as u8)
        .collect()
}

/// Puts and gets over a region of `len` bytes: `(i, size, offset)`, from one byte to the
/// whole region, each size at an offset of its own inside it.
pub fn sizes_in(len: u64) -> Vec<(usize, usize, u64)> {
    [1usize, 8, 100, 4096, 65537, 300_000, len as usize]
        .into_iter()
        .enumerate()
        .map(|(i, size)| {
            let off = if size < len as usize {
                (i * 977) as u64 % (len - size as u64)
            } else {
                0
            };
            (i, size, off)
        })
        .collect()
}

/// Where two byte strings differ, for messages.
pub fn first_diff(a: &[u8], b: &[u8]) -> String {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => {
            let last = a.iter().zip(b).rposition(|(x, y)| x != y).unwrap();
            format!(
                "{n} bytes differ, from byte {i} ({:#04x} vs {:#04x}) to byte {last}",
                a[i], b[i]
            )
        }
        None if a.len() != b.len() => format!("lengths {} vs {}", a.len(), b.len()),
        None => "equal".into(),
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Packed keys as they travel in `COURIER_TEST_KEYS` or a `KEYS` line: hex, comma-separated.
pub fn keys_hex(keys: &[Vec<u8>]) -> String {
    keys.iter().map(|k| hex(k)).collect::<Vec<_>>().join(",")
}

/// The keys of [`keys_hex`] back.
pub fn keys_unhex(s: &str) -> Vec<Vec<u8>> {
    s.split(',').filter(|s| !s.is_empty()).map(unhex).collect()
}

/// `key` with a random secret in place of its own (`courier::wire::rkey::field::SECRET`),
/// resealed as a forger who knows the layout would.
pub fn forge_secret(key: &[u8]) -> Vec<u8> {
    use courier::wire::rkey::field::SECRET;
    let mut k = key.to_vec();
    let old = k[SECRET].to_vec();
    let mut new = [0u8; 16];
    new[..8].copy_from_slice(&RandomState::new().build_hasher().finish().to_le_bytes());
    new[8..].copy_from_slice(&RandomState::new().build_hasher().finish().to_le_bytes());
    if new[..] == old[..] {
        new[0] ^= 1;
    }
    k[SECRET].copy_from_slice(&new);
    courier::wire::rkey::reseal(&mut k);
    k
}

/// `key` claiming `len` bytes.
pub fn forge_length(key: &[u8], len: u64) -> Vec<u8> {
    let mut k = key.to_vec();
    k[courier::wire::rkey::field::LENGTH].copy_from_slice(&len.to_le_bytes());
    courier::wire::rkey::reseal(&mut k);
    k
}

/// CPU time of this whole process.
pub fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) },
        0
    );
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
