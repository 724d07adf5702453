//! Child processes: this test binary re-run for one role, waited on, and talked to.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use courier::*;

use super::peers::Transport;

/// How long any one test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Parent to child, or child to parent: the round was checked.
pub const ACK: u64 = 0xac;
/// Parent to target child: finish.
pub const EXIT: u64 = 0xe41;

/// This test binary, to run only its `child_entry` test, as `role`. The caller adds the
/// rest of the child's environment and its stdio.
pub fn child_command(role: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env("COURIER_TEST_ROLE", role);
    cmd
}

/// The body of a test file's `child_entry` test: in a child, run the function of its role
/// and exit 0 when it returns (a failed assertion fails the child); in the parent (no
/// role), nothing.
pub fn run_child(roles: &[(&str, fn())]) {
    let Ok(role) = std::env::var("COURIER_TEST_ROLE") else {
        return;
    };
    match roles.iter().find(|(name, _)| *name == role) {
        Some((_, f)) => f(),
        None => panic!("unknown role {role}"),
    }
    std::process::exit(0);
}

/// The stderr of a child started with it piped, once it has exited.
pub fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    err
}

/// A child process; killed (and reaped) if the test ends before it does.
pub struct Kid {
    child: Child,
    pub role: String,
    stderr: Option<JoinHandle<String>>,
    stdout: Receiver<String>,
}

impl Kid {
    /// Start `role` over `net`, with `env` besides.
    pub fn spawn(role: &str, net: impl Transport, env: &[(&str, String)]) -> Kid {
        let mut cmd = child_command(role);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in net.env() {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        // Both pipes are drained all along, so a chatty child never blocks on them.
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Kid {
            child,
            role: role.into(),
            stderr: Some(stderr),
            stdout: rx,
        }
    }

    /// The value of the first stdout line `NAME value` (the child prints it at start).
    pub fn line(&self, name: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                // The test harness may have printed on the same line before.
                Ok(l) => {
                    if let Some((_, v)) = l.split_once(&format!("{name} ")) {
                        return v.to_string();
                    }
                }
                Err(_) => panic!("child {} printed no {name} line", self.role),
            }
        }
    }

    /// Kill it (SIGKILL) and reap it, as a peer that dies without a word.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.take();
    }

    /// `Some(stderr)` once it has exited; panics (with its stderr) if it failed.
    pub fn poll(&mut self) -> Option<String> {
        let st = self.child.try_wait().unwrap()?;
        let err = self.stderr.take().unwrap().join().unwrap();
        assert!(
            st.success(),
            "child {} failed ({st}); its stderr:\n{err}",
            self.role
        );
        Some(err)
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if self.stderr.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Progress `w` until every child has exited; each must exit 0. Returns their stderr.
pub fn serve(w: &Worker, kids: &mut [Kid]) -> Vec<String> {
    let mut out: Vec<Option<String>> = kids.iter().map(|_| None).collect();
    w.progress_until(DEADLINE, || {
        for (k, o) in kids.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                *o = k.poll();
            }
        }
        out.iter().all(Option::is_some)
    })
    .unwrap_or_else(|e| panic!("children did not finish in time: {e}"));
    out.into_iter().map(|o| o.unwrap()).collect()
}

/// [`serve`] for one child: its stderr.
pub fn serve_one(w: &Worker, kid: &mut Kid) -> String {
    serve(w, std::slice::from_mut(kid)).remove(0)
}

/// Progress `w` until `cond` holds; fails at once if the child exits meanwhile.
pub fn progress_until(w: &Worker, kid: &mut Kid, what: &str, mut cond: impl FnMut() -> bool) {
    let mut exited = None;
    w.progress_until(DEADLINE, || {
        if cond() {
            return true;
        }
        exited = kid.poll();
        exited.is_some()
    })
    .unwrap_or_else(|e| panic!("timed out waiting for {what}: {e}"));
    if let Some(err) = exited {
        assert!(
            cond(),
            "child {} exited while we waited for {what}; its stderr:\n{err}",
            kid.role
        );
    }
}

/// Wait for a request of the parent's, failing at once if `kid` exits meanwhile.
pub fn wait_req(mut r: Request<'_>, kid: &mut Kid, what: &str) -> Result<Info> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(res) = r.test() {
            return res.clone();
        }
        let _ = r.wait_timeout(Duration::from_millis(1));
        if let Some(err) = kid.poll() {
            if let Some(res) = r.test() {
                return res.clone();
            }
            panic!(
                "child {} exited while we waited for {what}; its stderr:\n{err}",
                kid.role
            );
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
    }
}

/// Receive the 8-byte message with `tag`, failing if `kid` exits first.
pub fn recv_u64(w: &Worker, kid: &mut Kid, tag: u64) -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let r = unsafe { w.tag_recv_nb(&mut b, tag, u64::MAX) }.unwrap();
    wait_req(r, kid, &format!("message {tag:#x}")).unwrap();
    u64::from_le_bytes(b)
}

pub fn send_u64(ep: &Endpoint, tag: u64, v: u64) {
    ep.tag_send(&v.to_le_bytes(), tag).unwrap();
}
