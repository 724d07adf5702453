//! The configuration table's parsers and its lookups.

use super::*;
use proptest::prelude::*;

fn cfg(over: &[(&str, &str)]) -> Result<Config> {
    let mut raw = BTreeMap::new();
    for v in VARS {
        raw.insert(v.name, v.default.to_string());
    }
    for (k, val) in over {
        raw.insert(var(k).name, val.to_string());
    }
    Config::parse(raw)
}

#[test]
fn defaults_parse() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.tls.effective(), "self,shm,tcp");
    assert_eq!(c.keepalive_timeout, Duration::from_secs(2));
    assert_eq!(c.rndv_thresh, None);
    // Small-message streams run ahead of their receiver only when the cells they touch
    // (a line each) outgrow a core's first-level cache: see the analysis in bench/.
    assert_eq!(c.shm_fifo_size, 1024);
}

/// COURIER_BCOPY_THRESH was listed and parsed but never read; it is gone, and setting it
/// in code is refused (in the environment it is warned about like any unknown name).
#[test]
fn closest_names_for_typos() {
    assert_eq!(closest_var("COURIER_TSL"), Some("COURIER_TLS"));
    assert_eq!(closest_var("COURIER_LOG_LEVL"), Some("COURIER_LOG_LEVEL"));
    assert_eq!(
        closest_var("COURIER_RNDV_TRESH"),
        Some("COURIER_RNDV_THRESH")
    );
    assert_eq!(closest_var("COURIER_SOMETHING_ELSE_ENTIRELY"), None);
    assert!(unknown_var_message("COURIER_TSL").contains("did you mean COURIER_TLS?"));
    assert!(!unknown_var_message("COURIER_ZZZZZZZZZZZZZZZ").contains("did you mean"));
}

#[test]
fn bcopy_thresh_is_not_a_variable() {
    assert!(VARS.iter().all(|v| v.name != "COURIER_BCOPY_THRESH"));
    let e =
        Config::from_env_with(&[("COURIER_BCOPY_THRESH", "4k")]).expect_err("an unknown variable");
    assert_eq!(e.status(), Status::BadConfig);
    assert!(
        e.to_string()
            .contains("not a Courier configuration variable"),
        "{e}"
    );
}

#[test]
fn tls_lists_and_exclusions() {
    let t = TlsSelection::parse("^shm").unwrap();
    assert!(t.allows("self") && !t.allows("shm") && t.allows("tcp"));
    let t = TlsSelection::parse("tcp").unwrap();
    assert_eq!(t.effective(), "tcp");
    let t = TlsSelection::parse("sm,self").unwrap();
    assert_eq!(t.effective(), "self,shm");
}

#[test]
fn bad_values_name_the_variable_and_accepted_values() {
    let e = cfg(&[("COURIER_TLS", "tcp,ib")]).unwrap_err();
    assert_eq!(e.status(), Status::BadConfig);
    assert!(
        e.detail().contains("COURIER_TLS")
            && e.detail().contains("\"ib\"")
            && e.detail().contains("accepted"),
        "{e}"
    );
    for (k, v) in [
        ("COURIER_RNDV_THRESH", "lots"),
        ("COURIER_CUDA_STAGING", "plenty"),
        ("COURIER_CUDA_IPC_THRESH", "big"),
    ] {
        let e = cfg(&[(k, v)]).unwrap_err();
        assert!(
            e.detail().contains(k) && e.detail().contains("a size"),
            "{e}"
        );
    }
    let e = cfg(&[("COURIER_SHM_FIFO_SIZE", "100")]).unwrap_err();
    assert!(e.detail().contains("power of two"), "{e}");
    let e = cfg(&[("COURIER_LOG_LEVEL", "loud")]).unwrap_err();
    assert!(e.detail().contains("COURIER_LOG_LEVEL"), "{e}");
    let e = cfg(&[("COURIER_KEEPALIVE_TIMEOUT", "100ms")]).unwrap_err();
    assert!(e.detail().contains("shorter"), "{e}");
    let e = cfg(&[("COURIER_TCP_CONGESTION", "re no")]).unwrap_err();
    assert!(e.detail().contains("COURIER_TCP_CONGESTION"), "{e}");
    assert_eq!(cfg(&[]).unwrap().cuda_ipc_thresh, 16 << 10);
    assert_eq!(cfg(&[]).unwrap().cuda_staging, 256 << 20);
    assert_eq!(
        cfg(&[("COURIER_CUDA_STAGING", "0")]).unwrap().cuda_staging,
        0
    );
}

/// Values that parse as sizes or durations but cannot work are refused when read, with
/// the variable named, instead of failing every connection later; names and yes/no
/// values take any case; TCP keepalive's whole seconds are what is in force.
#[test]
fn values_that_cannot_work_are_refused_when_read() {
    for (k, v, why) in [
        ("COURIER_TCP_SNDBUF", "3g", "int"),
        ("COURIER_TCP_RCVBUF", "18446744073709551615", "int"),
        ("COURIER_TCP_CONNECT_TIMEOUT", "0", "zero"),
        ("COURIER_KEEPALIVE_INTERVAL", "0s", "zero"),
        ("COURIER_TLS", "^self,shm,tcp", "every transport"),
        ("COURIER_NET_DEVICES", "lo,,eth0", "empty name"),
        ("COURIER_CUDA_LIB", "libx.so\nCOURIER_TLS=foo", "control"),
    ] {
        let e = cfg(&[(k, v)]).expect_err(k);
        assert_eq!(e.status(), Status::BadConfig);
        assert!(
            e.detail().contains(k) && e.detail().contains(why),
            "{k}: {e}"
        );
    }
    let c = cfg(&[("COURIER_TCP_SNDBUF", "2047m")]).unwrap();
    assert_eq!(c.tcp_sndbuf, 2047 << 20);
    // A too-long interval names both variables and both values.
    let e = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "inf")]).unwrap_err();
    assert!(
        e.detail().contains("COURIER_KEEPALIVE_INTERVAL=\"inf\"")
            && e.detail().contains("COURIER_KEEPALIVE_TIMEOUT=\"2s\""),
        "{e}"
    );
    let c = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "500ms")]).unwrap();
    assert_eq!(c.keepalive_interval, Duration::from_secs(1));
    let c = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "1.2s")]).unwrap();
    assert_eq!(c.keepalive_interval, Duration::from_secs(2));
    // What `courier info -c` shows as in force: the rounded value, and why.
    let (used, why) = c.adjusted("COURIER_KEEPALIVE_INTERVAL").unwrap();
    assert_eq!(used, "2s");
    assert!(why.contains("whole seconds"), "{why}");
    let c = cfg(&[("COURIER_KEEPALIVE_INTERVAL", "1s")]).unwrap();
    assert_eq!(c.adjusted("COURIER_KEEPALIVE_INTERVAL"), None);
    assert_eq!(c.adjusted("COURIER_TLS"), None);
    let c = cfg(&[
        ("COURIER_TLS", "SHM,Tcp"),
        ("COURIER_SHM_CMA", "YES"),
        ("COURIER_SHM_SEGMENT_COPY", "Off"),
    ])
    .unwrap();
    assert_eq!(c.tls.effective(), "shm,tcp");
    assert_eq!(c.shm_cma, CmaPolicy::Yes);
    assert!(!c.shm_segment_copy);
}

#[test]
fn tcp_congestion_choices() {
    assert_eq!(cfg(&[]).unwrap().tcp_congestion, TcpCongestion::Auto);
    let c = cfg(&[("COURIER_TCP_CONGESTION", "system")]).unwrap();
    assert_eq!(c.tcp_congestion, TcpCongestion::System);
    let c = cfg(&[("COURIER_TCP_CONGESTION", "cubic")]).unwrap();
    assert_eq!(c.tcp_congestion, TcpCongestion::Named("cubic".into()));
}

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("16k"), Some(16384));
    assert_eq!(parse_size("4M"), Some(4 << 20));
    assert_eq!(parse_size("8192"), Some(8192));
    assert_eq!(parse_size("x"), None);
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_duration("-1s"), None);
    assert_eq!(parse_duration("1e30s"), None);
    assert_eq!(parse_duration("1e300ms"), None);
}

#[test]
fn set_rechecks() {
    let mut c = cfg(&[]).unwrap();
    c.set("COURIER_TLS", "shm").unwrap();
    assert!(!c.tls.allows("tcp"));
    assert!(c.set("COURIER_NOPE", "1").is_err());
    assert!(c.set("COURIER_TLS", "bogus").is_err());
    assert_eq!(c.value("COURIER_TLS"), Some("shm"));
}

proptest! {
    #[test]
    fn duration_parse_never_panics(x in proptest::num::f64::ANY, unit in "(ms|us|s|m|)") {
        let _ = parse_duration(&format!("{x}{unit}"));
        let _ = parse_duration(&format!("{x:e}{unit}"));
    }

    #[test]
    fn size_parse_never_panics(s in ".{0,12}") {
        let _ = parse_size(&s);
        let _ = parse_duration(&s);
        let _ = TlsSelection::parse(&s);
    }

    #[test]
    fn sizes_round_trip(n in 0usize..1_000_000) {
        prop_assert_eq!(parse_size(&n.to_string()), Some(n));
        prop_assert_eq!(parse_size(&format!("{n}k")), Some(n * 1024));
    }
}

#[test]
fn exs_share_min_is_a_size_or_off() {
    assert_eq!(cfg(&[]).unwrap().exs_share_min, Some(64 << 10));
    let c = cfg(&[("COURIER_EXS_SHARE_MIN", "1m")]).unwrap();
    assert_eq!(c.exs_share_min, Some(1 << 20));
    for off in ["off", "0", "no"] {
        let c = cfg(&[("COURIER_EXS_SHARE_MIN", off)]).unwrap();
        assert_eq!(c.exs_share_min, None, "{off}");
    }
    let e = cfg(&[("COURIER_EXS_SHARE_MIN", "lots")]).unwrap_err();
    assert!(e.to_string().contains("COURIER_EXS_SHARE_MIN"), "{e}");
}
