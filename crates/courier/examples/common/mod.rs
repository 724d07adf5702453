//! Set-up shared by the instruction-count examples (`smallcost`, `tcpcost`): two contexts
//! of one process, as two processes would have, each with a worker, joined by one link of
//! the transports `tls` allows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use courier::*;

/// Two linked workers: `a` (single-threaded, as applications use it) and `b` (thread-safe,
/// progressed by a helper thread while the link comes up); `ab` and `ba` are the two ends.
pub struct Linked {
    pub ctx_b: Context,
    pub a: Worker,
    pub b: Worker,
    pub ab: Endpoint,
    pub ba: Endpoint,
    _ctx_a: Context,
}

/// Connect two fresh workers over `tls` (a `COURIER_TLS` value) and print the link.
pub fn linked(tls: &str) -> Result<Linked> {
    let ctx_a = Context::new(ContextParams::default().config("COURIER_TLS", tls))?;
    let ctx_b = Context::new(ContextParams::default().config("COURIER_TLS", tls))?;
    let a = Worker::new(&ctx_a, WorkerParams::default())?;
    let b = Worker::new(
        &ctx_b,
        WorkerParams {
            thread_mode: ThreadMode::Multi,
        },
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let helper = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if b.progress() == 0 {
                    std::thread::yield_now();
                }
            }
        })
    };
    let ab = a.connect(&b.address()?, EndpointParams::default())?;
    ab.wait_connected(Duration::from_secs(5))?;
    let ba = loop {
        if let Some(ep) = b.incoming_endpoint() {
            break ep;
        }
        std::thread::yield_now();
    };
    stop.store(true, Ordering::Relaxed);
    let _ = helper.join();
    println!("link: {:?}", ab.transport());
    Ok(Linked {
        ctx_b,
        a,
        b,
        ab,
        ba,
        _ctx_a: ctx_a,
    })
}

/// The repetition count given as the first argument (default 1000).
pub fn count_arg() -> usize {
    std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}
