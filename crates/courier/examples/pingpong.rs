//! A minimal tag ping-pong between two processes, for profiling the small-message path.
//!
//! ```sh
//! cargo run --release --example pingpong -- server            # prints PORT n
//! cargo run --release --example pingpong -- client PORT 100000
//! cargo run --release --example pingpong -- client PORT 100000 idle  # cost of an idle progress
//! cargo run --release --example pingpong -- client PORT 100000 wait  # block in Request::wait
//! cargo run --release --example pingpong -- client PORT 100000 flush # 8-byte put + flush
//! ```
//!
//! The server always blocks in `Request::wait` (`Worker::tag_recv`); the client polls,
//! unless told `wait`. With both blocking, `taskset -c 0` on both shows how the waits
//! share one CPU.
use std::sync::{Arc, Mutex};
use std::time::Instant;

use courier::*;

/// `n` progress calls that find nothing (a function of its own, so that
/// `valgrind --tool=callgrind --toggle-collect=pingpong::idle_progress` counts just them).
#[inline(never)]
fn idle_progress(w: &Worker, n: u64) {
    for _ in 0..n {
        w.progress();
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let ctx = Context::new(ContextParams::default())?;
    let w = Worker::new(&ctx, WorkerParams::default())?;
    let mut buf = [0u8; 8];
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let slot: Arc<Mutex<Option<Endpoint>>> = Arc::default();
            let s2 = slot.clone();
            let l = Listener::new(
                &w,
                "127.0.0.1:0".parse().map_err(|_| Status::InvalidAddress)?,
                move |r: ConnRequest| {
                    *s2.lock().unwrap() = r.accept(EndpointParams::default()).ok();
                },
            )?;
            println!("PORT {}", l.local_addr().port());
            let ep = loop {
                w.progress();
                if let Some(ep) = slot.lock().unwrap().take() {
                    break ep;
                }
            };
            // A region for the client's puts (`flush` mode): its address and key first.
            let mem = ctx.mem_map(MemMapParams::allocate(4096))?;
            let mut hello = (mem.as_ptr() as u64).to_le_bytes().to_vec();
            hello.extend(mem.pack_rkey()?);
            ep.tag_send(&hello, 3)?;
            loop {
                let info = match w.tag_recv(&mut buf, 0, 0) {
                    Ok(i) => i,
                    Err(_) => return Ok(()),
                };
                if info.tag == 0 {
                    return Ok(());
                }
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let mut r = unsafe { ep.tag_send_nb(&buf, 1) }?;
                while !r.is_done() {
                    w.progress();
                }
            }
        }
        Some("client") => {
            let port: u16 = args[2].parse().map_err(|_| Status::InvalidParam)?;
            let n: u64 = args[3].parse().map_err(|_| Status::InvalidParam)?;
            let ep =
                w.connect_sockaddr(([127, 0, 0, 1], port).into(), 1, EndpointParams::default())?;
            ep.wait_connected(std::time::Duration::from_secs(5))?;
            let mut hello = [0u8; 1024];
            let got = w.tag_recv(&mut hello, 3, u64::MAX)?.length.min(hello.len());
            let block = args.get(4).map(String::as_str) == Some("wait");
            if args.get(4).map(String::as_str) == Some("flush") {
                // Puts to the server's region, each flushed: the server, blocked in its
                // receive's wait, answers them as its worker progresses.
                let raddr =
                    u64::from_le_bytes(hello[..8].try_into().map_err(|_| Status::InvalidParam)?);
                let key = ep.rkey_unpack(&hello[8..got])?;
                let t = Instant::now();
                for i in 0..n {
                    ep.put(&i.to_le_bytes(), raddr, &key)?;
                    ep.flush()?;
                }
                println!(
                    "{} put + flush over {:?}: {:.3} us each",
                    n,
                    ep.transport(),
                    t.elapsed().as_secs_f64() * 1e6 / n as f64
                );
                ep.tag_send(b"", 0)?;
                return Ok(());
            }
            let t = Instant::now();
            for _ in 0..n {
                // SAFETY: the request is waited for, or dropped (which waits), before its buffer is
                // used again or goes; it is never forgotten.
                let mut r = unsafe { w.tag_recv_nb(&mut buf, 1, u64::MAX) }?;
                ep.tag_send(b"pingpong", 2)?;
                if block {
                    r.wait()?;
                    continue;
                }
                while !r.is_done() {
                    w.progress();
                }
            }
            let el = t.elapsed();
            println!(
                "{} round trips over {:?}: {:.3} us one-way",
                n,
                ep.transport(),
                el.as_secs_f64() * 1e6 / n as f64 / 2.0
            );
            if args.get(4).map(String::as_str) == Some("idle") {
                let t = Instant::now();
                idle_progress(&w, n * 10);
                println!(
                    "idle progress: {:.1} ns per call",
                    t.elapsed().as_secs_f64() * 1e9 / (n * 10) as f64
                );
            }
            ep.tag_send(b"", 0)?;
            Ok(())
        }
        _ => {
            eprintln!("usage: pingpong server | pingpong client PORT N [idle]");
            Ok(())
        }
    }
}
