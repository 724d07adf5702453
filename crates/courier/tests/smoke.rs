use courier::*;
use std::time::Duration;

fn ctx(tls: &str) -> Context {
    Context::new(ContextParams::default().config("COURIER_TLS", tls)).unwrap()
}

#[test]
fn self_tag_roundtrip() {
    let c = ctx("all");
    let w = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = w
        .connect(&w.address().unwrap(), EndpointParams::default())
        .unwrap();
    assert_eq!(ep.transport(), Some("self"));
    for size in [0usize, 1, 100, 8192, 100_000, 3 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let mut buf = vec![0u8; size];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let r = unsafe { w.tag_recv_nb(&mut buf, 42, u64::MAX) }.unwrap();
        ep.tag_send(&data, 42).unwrap();
        let info = r.wait().unwrap();
        assert_eq!(info.length, size);
        assert!(buf == data, "size {size}");
    }
}

#[test]
fn tcp_two_workers_tag_am_stream() {
    let c = ctx("tcp");
    let a = Worker::new(&c, WorkerParams::default()).unwrap();
    let b = Worker::new(&c, WorkerParams::default()).unwrap();
    let ep = a
        .connect(&b.address().unwrap(), EndpointParams::default())
        .unwrap();
    assert_eq!(ep.transport(), Some("tcp"));
    for size in [1usize, 1000, 70_000, 5 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 13 + 1) as u8).collect();
        let mut buf = vec![0u8; size];
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut r = unsafe { b.tag_recv_nb(&mut buf, 9, u64::MAX) }.unwrap();
        // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used
        // again or goes; it is never forgotten.
        let mut s = unsafe { ep.tag_send_nb(&data, 9) }.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !(r.is_done() && s.is_done()) {
            a.progress();
            b.progress();
            assert!(std::time::Instant::now() < deadline, "stuck at size {size}");
        }
        assert_eq!(r.test().unwrap().as_ref().unwrap().length, size);
        drop(r);
        assert!(buf == data, "size {size}");
    }
    // Stream back from b.
    let bep = loop {
        if let Some(e) = b.incoming_endpoint() {
            break e;
        }
        b.progress();
    };
    let mut got = [0u8; 11];
    // SAFETY: the request is waited for, or dropped (which waits), before its buffer is used again
    // or goes; it is never forgotten.
    let mut r = unsafe { ep.stream_recv_exact_nb(&mut got) }.unwrap();
    bep.stream_send(b"hello ").unwrap();
    bep.stream_send(b"world").unwrap();
    while !r.is_done() {
        a.progress();
        b.progress();
    }
    drop(r);
    assert_eq!(&got, b"hello world");
}
