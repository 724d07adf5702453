//! `courier perf -t ucp_add`: posted adds streamed with a window, flushed at the end, and
//! with `--check` the target word read back and compared with the number of adds. No
//! assertion looks at timing values.

mod common;
use common::{courier, numbers};

/// Run `ucp_add` with `--check` over `tls` (with `extra` options): it succeeds, and its
/// final row counts every iteration.
fn add_checked(tls: &str, extra: &[&str]) -> String {
    let mut args = vec!["perf", "-l", "-t", "ucp_add", "-n", "2000", "--check"];
    args.extend_from_slice(extra);
    let o = courier(&args, &[("COURIER_TLS", tls)]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(
        o.status.success(),
        "COURIER_TLS={tls} {extra:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        out.contains("Test:         atomic add bandwidth / message rate"),
        "{out}"
    );
    let fin = out
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no Final row:\n{out}"));
    let n = numbers(fin);
    assert_eq!(n.len(), 8, "{fin}");
    assert_eq!(n[0], 2000.0, "{fin}");
    out
}

#[test]
fn ucp_add_posted_and_checked_over_shm() {
    // ucp_add's default window is 1 (as ucx_perftest's): a window of 32 is asked for.
    add_checked("all", &["-O", "32"]);
    add_checked("all", &["-s", "4"]);
}

#[test]
fn ucp_add_posted_and_checked_over_tcp() {
    add_checked("tcp", &["-O", "32"]);
    // A window of 1: a progress call after every add; 32-bit adds.
    add_checked("tcp", &["-s", "4", "-O", "1"]);
}
