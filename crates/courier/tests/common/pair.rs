//! Two workers of one context connected to each other over a transport, for the
//! two-sided API tests (tests/api.rs, api_rendezvous.rs): worker B runs in multi-thread
//! mode with its own progress thread (so shared use is exercised too), worker A is
//! single-thread on the test thread. For `self` both ends are one worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use courier::*;

pub struct Pair {
    pub a: Worker,
    pub b: Worker,
    /// A → B.
    pub ab: Endpoint,
    /// B → A.
    pub ba: Endpoint,
    pub stop: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<()>>,
    pub _ctx: Context,
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn pair(tls: &str) -> Pair {
    pair_with(tls, &[])
}

/// A pair whose context also has the variables `cfg`.
pub fn pair_with(tls: &str, cfg: &[(&str, &str)]) -> Pair {
    let mut params = ContextParams::default().config("COURIER_TLS", tls);
    for &(k, v) in cfg {
        params = params.config(k, v);
    }
    let ctx = Context::new(params).unwrap();
    let a = Worker::new(&ctx, WorkerParams::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    if tls == "self" {
        let ab = a
            .connect(&a.address().unwrap(), EndpointParams::default())
            .unwrap();
        let ba = a.incoming_endpoint().expect("passive self endpoint");
        return Pair {
            b: a.clone(),
            a,
            ab,
            ba,
            stop,
            thread: None,
            _ctx: ctx,
        };
    }
    let b = Worker::new(
        &ctx,
        WorkerParams {
            thread_mode: ThreadMode::Multi,
        },
    )
    .unwrap();
    let (b2, s2) = (b.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        while !s2.load(Ordering::Relaxed) {
            if b2.progress() == 0 {
                std::thread::yield_now();
            }
        }
    });
    let ab = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let ba = loop {
        a.progress();
        if let Some(e) = b.incoming_endpoint() {
            break e;
        }
        assert!(Instant::now() < deadline, "no incoming endpoint");
    };
    assert_eq!(ab.transport(), Some(tls));
    if tls == "shm" {
        // Made from a worker address, not a socket.
        assert_eq!(ab.local_sockaddr(), None);
    }
    Pair {
        a,
        b,
        ab,
        ba,
        stop,
        thread: Some(thread),
        _ctx: ctx,
    }
}

pub const TLS: [&str; 3] = ["self", "shm", "tcp"];

pub fn wait_on(w: &Worker, r: &mut Request<'_>) -> Result<Info> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(x) = r.test() {
            return x.clone();
        }
        w.progress();
        assert!(Instant::now() < deadline, "request did not complete");
    }
}
