//! Hello, two processes: a server that listens and keeps the endpoint it accepts, a
//! client that connects to it, and a tag message and an active message each way.
//!
//! ```sh
//! cargo run --release --example hello -- server 127.0.0.1:13337   # prints "listening on 127.0.0.1:13337"
//! cargo run --release --example hello -- client 127.0.0.1:13337
//! COURIER_TLS=tcp cargo run ...                                     # tcp even on one host (shm by default)
//! ```
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{
    AmFlags, ConnRequest, Context, ContextParams, Endpoint, EndpointParams, Error, Listener,
    Status, Worker, WorkerParams,
};

const TAG_TO_SERVER: u64 = 1;
const TAG_TO_CLIENT: u64 = 2;
const TAG_BYE: u64 = 3;
const AM_TO_SERVER: u16 = 1;
const AM_TO_CLIENT: u16 = 2;
const WAIT: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("server"), Some(addr)) => parse(addr).and_then(server),
        (Some("client"), Some(addr)) => parse(addr).and_then(client),
        _ => {
            eprintln!("usage: hello server IP:PORT | hello client IP:PORT");
            std::process::exit(2);
        }
    };
    if let Err(e) = result {
        // An error says what failed and why, e.g. "connection refused by 127.0.0.1:13337".
        eprintln!("hello: {e}");
        std::process::exit(1);
    }
}

fn parse(addr: &str) -> courier::Result<SocketAddr> {
    addr.parse()
        .map_err(|_| Error::msg(Status::InvalidAddress, format!("not IP:PORT: {addr}")))
}

/// Run an active-message handler that keeps the messages of handler `id` in a list.
fn collect_am(worker: &Worker, id: u16) -> courier::Result<Arc<Mutex<Vec<Vec<u8>>>>> {
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let into = got.clone();
    worker.am_set_handler(id, move |msg| {
        if let Ok(mut list) = into.lock() {
            list.push(msg.data().to_vec());
        }
    })?;
    Ok(got)
}

/// Progress until an active message arrived in `got`; returns it.
fn wait_am(worker: &Worker, got: &Mutex<Vec<Vec<u8>>>) -> courier::Result<Vec<u8>> {
    let mut msg = None;
    worker.progress_until(WAIT, || {
        msg = got.lock().ok().and_then(|mut list| list.pop());
        msg.is_some()
    })?;
    msg.ok_or_else(|| Error::msg(Status::Timeout, "no active message arrived"))
}

fn on_error(e: &Error) {
    eprintln!("hello: peer failed: {e}");
}

// snippet: server
fn server(addr: SocketAddr) -> courier::Result<()> {
    let ctx = Context::new(ContextParams::default())?;
    let worker = Worker::new(&ctx, WorkerParams::default())?;
    let ams = collect_am(&worker, AM_TO_SERVER)?;

    // The listener's handler runs inside progress; it keeps the accepted endpoint.
    let accepted: Arc<Mutex<Option<courier::Result<Endpoint>>>> = Arc::default();
    let slot = accepted.clone();
    let listener = Listener::new(&worker, addr, move |req: ConnRequest| {
        let ep = req.accept(EndpointParams::default().error_handler(on_error));
        if let Ok(mut s) = slot.lock() {
            *s = Some(ep);
        }
    })?;
    println!("listening on {}", listener.local_addr());
    let mut ep = None;
    worker.progress_until(WAIT, || {
        ep = accepted.lock().ok().and_then(|mut s| s.take());
        ep.is_some()
    })?;
    let ep = ep.ok_or_else(|| Error::msg(Status::Timeout, "no client"))??;

    // Tag: receive the client's message, answer on the accepted endpoint.
    let mut buf = [0u8; 64];
    let info = worker.tag_recv(&mut buf, TAG_TO_SERVER, u64::MAX)?;
    println!("server: tag: {}", text(&buf[..info.length]));
    ep.tag_send(b"hello, client", TAG_TO_CLIENT)?;

    // Active message: the client's, then one back.
    println!("server: am: {}", text(&wait_am(&worker, &ams)?));
    ep.am_send(AM_TO_CLIENT, b"", b"hello, client (am)", AmFlags::default())?;

    // The client says when it has everything; then close.
    worker.tag_recv(&mut buf, TAG_BYE, u64::MAX)?;
    ep.close()?;
    println!("server: done");
    Ok(())
}
// snippet-end

// snippet: client
fn client(addr: SocketAddr) -> courier::Result<()> {
    let ctx = Context::new(ContextParams::default())?;
    let worker = Worker::new(&ctx, WorkerParams::default())?;
    let ams = collect_am(&worker, AM_TO_CLIENT)?;
    let ep = worker.connect_sockaddr(addr, 7, EndpointParams::default().error_handler(on_error))?;
    ep.wait_connected(WAIT)?;
    println!("client: connected over {}", ep.transport().unwrap_or("?"));

    // Post the receive first, then send; both complete as the worker progresses.
    let mut buf = [0u8; 64];
    // The scope lends `buf` to the receive until it ends, and waits for it.
    let info = worker.scope(|s| {
        let recv = s.tag_recv(&mut buf, TAG_TO_CLIENT, u64::MAX)?;
        ep.tag_send(b"hello, server", TAG_TO_SERVER)?; // blocking: returns once sent
        recv.wait()
    })?;
    println!("client: tag: {}", text(&buf[..info.length]));

    ep.am_send(AM_TO_SERVER, b"", b"hello, server (am)", AmFlags::default())?;
    println!("client: am: {}", text(&wait_am(&worker, &ams)?));

    ep.tag_send(b"bye", TAG_BYE)?;
    ep.close()?;
    println!("client: done");
    Ok(())
}
// snippet-end

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
