//! An unknown `COURIER_*` variable is reported once per process, at the first context, with
//! the known name it most likely meant; the variables launchers set for ranks are known.

use std::process::Command;

use courier::{Context, ContextParams};

/// Run in a child process (so the environment and the once-per-process logger are its own):
/// two contexts, each of which sees the misspelt variable.
#[test]
fn typo_child_entry() {
    if std::env::var("COURIER_TEST_ROLE").as_deref() != Ok("typo") {
        return;
    }
    let a = Context::new(ContextParams::default()).expect("first context");
    let b = Context::new(ContextParams::default()).expect("second context");
    drop((a, b));
    println!("two contexts made");
}

#[test]
fn unknown_variable_is_reported_once_with_the_closest_name() {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "typo_child_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("COURIER_TEST_ROLE", "typo")
        .env("COURIER_TSL", "tcp")
        // Set for ranks by `courier run` and the launchers: known, so never reported.
        .env("COURIER_RUN_RANK", "0")
        .env("COURIER_RUN_SIZE", "1")
        .env("COURIER_JOB_TIMEOUT", "120s")
        .env_remove("COURIER_LOG_LEVEL")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stdout}\n{stderr}");
    assert!(stdout.contains("two contexts made"), "{stdout}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("is not a Courier variable"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "reported once, at the first context: {stderr}"
    );
    assert!(
        lines[0].contains("COURIER_TSL") && lines[0].contains("did you mean COURIER_TLS?"),
        "{}",
        lines[0]
    );
    assert!(!stderr.contains("COURIER_RUN_RANK"), "{stderr}");
    assert!(!stderr.contains("COURIER_JOB_TIMEOUT is not"), "{stderr}");
}
