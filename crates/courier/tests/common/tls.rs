//! The set-up of tests/rma.rs and rma_keys.rs: the transport named by its `COURIER_TLS`
//! value (`all` or `tcp`), the parent owning the memory, children (the test binary re-run
//! with `COURIER_TEST_ROLE`) started with the port and packed keys in their environment,
//! and the parent progressing until they exit.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use courier::*;

use super::{Owner, child_command, dial, keys_from_env, keys_hex, port_from_env, stderr_of};

pub fn ctx(tls: &str) -> Context {
    ctx_with(tls, &[])
}

pub fn ctx_with(tls: &str, cfg: &[(&str, &str)]) -> Context {
    let f = Features {
        rma: true,
        atomics: true,
        ..Default::default()
    };
    let mut p = ContextParams::default()
        .features(f)
        .config("COURIER_TLS", tls);
    for (k, v) in cfg {
        p = p.config(k, v);
    }
    Context::new(p).unwrap()
}

// ----- the owner (parent) -------------------------------------------------------------------

pub fn owner(tls: &str) -> (Owner, Context) {
    owner_with(tls, &[])
}

pub fn owner_with(tls: &str, cfg: &[(&str, &str)]) -> (Owner, Context) {
    let o = Owner::on(ctx_with(tls, cfg));
    let c = o.c.clone();
    (o, c)
}

pub fn spawn(
    tls: &str,
    scenario: &str,
    port: u16,
    keys: &[Vec<u8>],
    extra: &[(&str, String)],
) -> Child {
    command(tls, scenario, port, keys, extra).spawn().unwrap()
}

pub fn command(
    tls: &str,
    scenario: &str,
    port: u16,
    keys: &[Vec<u8>],
    extra: &[(&str, String)],
) -> Command {
    let mut cmd = child_command(scenario);
    cmd.env("COURIER_TLS", tls)
        .env("COURIER_TEST_PORT", port.to_string())
        .env("COURIER_TEST_KEYS", keys_hex(keys))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// Progress the owner until every child exits; each must exit 0.
pub fn serve_until_done(o: &Owner, mut children: Vec<Child>, mut also: impl FnMut()) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !children.is_empty() {
        o.w.progress();
        also();
        let mut i = 0;
        while i < children.len() {
            if let Some(st) = children[i].try_wait().unwrap() {
                let mut c = children.remove(i);
                let _ = c.wait();
                let err = stderr_of(&mut c);
                assert!(st.success(), "child failed ({st}):\n{err}");
            } else {
                i += 1;
            }
        }
        assert!(Instant::now() < deadline, "children did not finish in time");
    }
}

// ----- the children -------------------------------------------------------------------------

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

/// A child connected to its parent: over `tls`, with the `keys` passed (`rk`, unpacked).
pub struct Peer {
    pub tls: String,
    pub keys: Vec<Vec<u8>>,
    pub c: Context,
    pub w: Worker,
    pub ep: Endpoint,
    pub rk: Vec<RemoteKey>,
}

/// The body of a test file's `child_entry` test: in a child, connect to the parent, run
/// `act` for the child's role, flush, and exit 0 (a failed assertion fails the child); in
/// the parent (no role), nothing.
pub fn child_main(act: fn(&str, &Peer)) {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return;
    };
    let tls = std::env::var("COURIER_TLS").unwrap();
    let port = port_from_env();
    let keys = keys_from_env();
    let c = ctx(&tls);
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = dial(&w, port, std::process::id() as u64);
    ep.wait_connected(Duration::from_secs(10)).unwrap();
    let rk: Vec<RemoteKey> = keys.iter().map(|k| ep.rkey_unpack(k).unwrap()).collect();
    let p = Peer {
        tls,
        keys,
        c,
        w,
        ep,
        rk,
    };
    act(&role, &p);
    p.ep.flush().unwrap();
    p.w.flush().unwrap();
    std::process::exit(0);
}
