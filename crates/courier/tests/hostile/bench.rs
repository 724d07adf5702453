//! `bench_hostile`: issue 30's numbers at full size (`bench/hostile.sh`; not in `make test`),
//! with the roles and the client of `hostile.rs`.

use super::*;

/// The median and the 99th percentile of `v`.
fn median_p99(v: &mut [Duration]) -> (Duration, Duration) {
    if v.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// The numbers at full size, with the default budget (`bench/hostile.sh`; not in
/// `make test`): floods of each kind for `COURIER_TEST_BENCH_SECS` (60) seconds by a peer that
/// reconnects each time the victim fails it, the victim's peak RSS over its idle RSS and a
/// legitimate client's round trips meanwhile (one flood with a polling client, one with a
/// client that sleeps while it waits); then 500 idle connections in setup, the
/// victim's CPU over 10 s and the client's round trips meanwhile, for each way of waiting.
#[test]
#[ignore]
fn bench_hostile() {
    let secs: u64 = std::env::var("COURIER_TEST_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    // `COURIER_TEST_BENCH_TLS=tcp`, `COURIER_TEST_BENCH_FLOODS=tag,get`,
    // `COURIER_TEST_BENCH_CLIENT=wait`: some rows only.
    let only = |var: &str, what: &str| {
        std::env::var(var).map_or(true, |v| v.split(',').any(|x| x.trim() == what))
    };
    // The client waits by polling (three busy processes on two CPUs in a flood: its tail is
    // mostly the scheduler's), as the library's blocking waits do (spin, yield, then
    // sleep), and by sleeping until its worker has an event.
    let modes: Vec<&str> = ["busy", "backoff", "wait"]
        .into_iter()
        .filter(|m| only("COURIER_TEST_BENCH_CLIENT", m))
        .collect();
    for tls in ["shm", "tcp"]
        .into_iter()
        .filter(|t| only("COURIER_TEST_BENCH_TLS", t))
    {
        for (kind, mode) in ["tag", "stream", "get"]
            .into_iter()
            .filter(|k| only("COURIER_TEST_BENCH_FLOODS", k))
            .flat_map(|k| modes.iter().map(move |m| (k, *m)))
        {
            // `COURIER_TEST_VICTIM_RCVBUF`: the victim's `COURIER_TCP_RCVBUF` apart from the
            // flooder's (which keeps this process's), to tell whose queue costs what.
            let mut venv = vec![("COURIER_TEST_PROGRESS_CPU", "1".to_string())];
            if let Ok(v) = std::env::var("COURIER_TEST_VICTIM_RCVBUF") {
                venv.push(("COURIER_TCP_RCVBUF", v));
            }
            let mut victim = Proc::start("victim", &venv);
            let addr = victim.read("ADDR");
            let rkey = victim.read("RKEY");
            let base = victim.read("BASE");
            let mut client = Client::connect(&unhex(&addr), tls);
            client.wait = client_wait(mode);
            let idle = vm(victim.pid(), "VmRSS:");
            let env = flood_env(kind, tls, usize::MAX, secs, 1_000_000, [addr, rkey, base]);
            let mut flooder = Proc::start("flood", &env);
            let mut rtts = Vec::new();
            let t0 = Instant::now();
            while !matches!(flooder.child.try_wait(), Ok(Some(_))) {
                rtts.push(client.round_trip());
                assert!(t0.elapsed() < Duration::from_secs(secs + 120), "flood hung");
            }
            let sent = flooder.read("SENT");
            let _ = flooder.finish();
            let peak = vm(victim.pid(), "VmHWM:");
            let err = victim.finish();
            let over = rtts
                .iter()
                .filter(|t| **t > Duration::from_millis(1))
                .count();
            let (med, p99) = median_p99(&mut rtts);
            let limits_named =
                err.matches("passed the limit").count() + err.matches("more such warnings").count();
            let cpu = err
                .lines()
                .find_map(|l| l.split_once("PROGRESS_CPU "))
                .map_or("", |(_, rest)| rest);
            println!(
                "BENCH flood={kind} tls={tls} client={mode} secs={secs} sent={sent} idle_rss_mib={} peak_growth_mib={} budget_mib=256 trips={} rtt_median_us={:.1} rtt_p99_us={:.1} rtt_over_1ms_pct={:.2} limit_warnings={limits_named} {cpu}",
                idle >> 20,
                peak.saturating_sub(idle) >> 20,
                rtts.len(),
                med.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6,
                over as f64 * 100.0 / rtts.len().max(1) as f64,
            );
        }
    }
    if !only("COURIER_TEST_BENCH_FLOODS", "idle") {
        return;
    }
    let mut victim = Proc::start("victim", &[]);
    let addr = victim.read("ADDR");
    let port: u16 = victim.read("PORT").parse().unwrap();
    let mut client = Client::connect(&unhex(&addr), "tcp");
    let mut idle = Vec::new();
    for _ in 0..500 {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            idle.push(s);
        }
    }
    // After a second's settling: 10 s of round trips, one every 10 ms, and the victim's
    // CPU time (and the wall time) meanwhile.
    let trips = |client: &Client| {
        std::thread::sleep(Duration::from_secs(1));
        let c0 = cpu(victim.pid());
        let t0 = Instant::now();
        let mut rtts = Vec::new();
        while t0.elapsed() < Duration::from_secs(10) {
            rtts.push(client.round_trip());
            std::thread::sleep(Duration::from_millis(10));
        }
        (rtts, cpu(victim.pid()) - c0, t0.elapsed())
    };
    // Each way of waiting with the idle connections, then alone: the round trips themselves
    // cost the victim CPU, and a client that polls while the victim sleeps pays the
    // scheduler's placement of the woken victim (`bench/ceilings.c sleepy`, the kernel's
    // own round trips timed the same way, is the floor of each).
    let mut with = Vec::new();
    for m in &modes {
        client.wait = client_wait(m);
        with.push(trips(&client));
    }
    drop(idle);
    let mut alone = Vec::new();
    for m in &modes {
        client.wait = client_wait(m);
        alone.push(trips(&client));
    }
    let _ = victim.finish();
    for ((m, (mut rtts, spent, window)), (mut rtts_a, spent_a, window_a)) in
        modes.iter().zip(with).zip(alone)
    {
        let (med, p99) = median_p99(&mut rtts);
        let (med_a, p99_a) = median_p99(&mut rtts_a);
        println!(
            "BENCH idle_connections=500 client={m} cpu_pct={:.2} cpu_pct_without_them={:.2} trips={} rtt_median_us={:.1} rtt_p99_us={:.1} rtt_median_without_them_us={:.1} rtt_p99_without_them_us={:.1}",
            spent.as_secs_f64() * 100.0 / window.as_secs_f64(),
            spent_a.as_secs_f64() * 100.0 / window_a.as_secs_f64(),
            rtts.len(),
            med.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            med_a.as_secs_f64() * 1e6,
            p99_a.as_secs_f64() * 1e6,
        );
    }
}

/// The client's way of waiting that `COURIER_TEST_BENCH_CLIENT` names.
fn client_wait(mode: &str) -> ClientWait {
    match mode {
        "busy" => ClientWait::Poll,
        "backoff" => ClientWait::Backoff,
        _ => ClientWait::Sleep,
    }
}
