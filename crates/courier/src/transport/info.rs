//! What each transport can do in this process, for tools (`courier info`) and applications
//! that want to know before they connect: [`transports`].
//!
//! The capabilities reported are those of a test link made here and now (a loopback pair,
//! a shared-memory link to this process, a tcp connection on each interface address), so
//! what is reported works; a transport or address that cannot be used says why.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::{Caps, LinkTx, loopback, shm, tcp};
use crate::base::Config;

/// One transport as [`transports`] reports it.
#[derive(Clone, Debug)]
pub struct TransportInfo {
    /// Its name, as `COURIER_TLS` takes it: `self`, `shm` or `tcp`.
    pub name: &'static str,
    /// Why it cannot be used at all here (excluded by `COURIER_TLS`, no network interface
    /// that is up); `None` when `devices` says what it can do.
    pub unusable: Option<String>,
    /// Its devices: `memory` for `self` and `shm`, one per network interface for `tcp`.
    pub devices: Vec<DeviceInfo>,
}

/// One device of a transport.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The device: `memory`, or a network interface's name.
    pub name: String,
    /// The device's addresses (network interfaces only), in the order the system lists
    /// them.
    pub addresses: Vec<IpAddr>,
    /// Those of `addresses` that a test connection did not work on, each with why.
    pub failed: Vec<(IpAddr, String)>,
    /// What a link on it can do, as the test link showed; why it cannot be used, if so.
    pub caps: std::result::Result<Caps, String>,
    /// Facts worth showing beside the capabilities, as (what, value): for `shm`, how
    /// likely CMA is to work between processes here (`cma likelihood`).
    pub notes: Vec<(&'static str, String)>,
}

/// Whether transport `name` can work in this process at all, without making a link (shm:
/// memory files, shared mappings and abstract unix sockets); why not. A name Courier does
/// not know is refused.
pub fn probe_transport(cfg: &Config, name: &str) -> std::result::Result<(), String> {
    match name {
        shm::NAME => shm::probe(cfg),
        loopback::NAME | tcp::NAME => Ok(()),
        other => Err(format!("no transport named {other}")),
    }
}

/// Every transport Courier has, in the order a worker prefers them, with what it can do
/// in this process under `cfg` or why it cannot be used.
pub fn transports(cfg: &Config) -> Vec<TransportInfo> {
    vec![self_info(cfg), shm_info(cfg), tcp_info(cfg)]
}

fn excluded(cfg: &Config) -> Option<String> {
    Some(format!("excluded by COURIER_TLS={}", cfg.tls.spec))
}

fn memory_device(caps: std::result::Result<Caps, String>) -> DeviceInfo {
    DeviceInfo {
        name: "memory".into(),
        addresses: Vec::new(),
        failed: Vec::new(),
        caps,
        notes: Vec::new(),
    }
}

fn self_info(cfg: &Config) -> TransportInfo {
    let name = loopback::NAME;
    if !cfg.tls.allows(name) {
        return TransportInfo {
            name,
            unusable: excluded(cfg),
            devices: Vec::new(),
        };
    }
    let ((tx, _rx), _other) = loopback::pair();
    TransportInfo {
        name,
        unusable: None,
        devices: vec![memory_device(Ok(LinkTx::Loopback(tx).caps().clone()))],
    }
}

fn shm_info(cfg: &Config) -> TransportInfo {
    let name = shm::NAME;
    if !cfg.tls.allows(name) {
        return TransportInfo {
            name,
            unusable: excluded(cfg),
            devices: Vec::new(),
        };
    }
    let mut dev = memory_device(shm_caps(cfg));
    dev.notes.push(("cma likelihood", shm::cma_status()));
    TransportInfo {
        name,
        unusable: None,
        devices: vec![dev],
    }
}

/// The capabilities of a shared-memory link from this process to itself.
fn shm_caps(cfg: &Config) -> std::result::Result<Caps, String> {
    shm::probe(cfg)?;
    let mut acc = shm::Acceptor::bind(cfg).map_err(|e| e.to_string())?;
    // One thread plays both sides: the setup does not block on the acceptor.
    let mut conn = shm::connect_start(acc.name(), cfg).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut kept = Vec::new();
    loop {
        match acc.accept() {
            Ok(Some(link)) => kept.push(link),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
        if conn.poll().map_err(|e| e.to_string())? {
            break;
        }
        if Instant::now() > deadline {
            return Err("a test connection did not complete in 3 s".into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    conn.finish()
        .map(|(tx, _rx)| LinkTx::Shm(tx).caps().clone())
        .map_err(|e| e.to_string())
}

fn tcp_info(cfg: &Config) -> TransportInfo {
    let name = tcp::NAME;
    if !cfg.tls.allows(name) {
        return TransportInfo {
            name,
            unusable: excluded(cfg),
            devices: Vec::new(),
        };
    }
    let ifs = tcp::interfaces(cfg);
    if ifs.is_empty() {
        let why = match &cfg.net_devices {
            Some(l) => format!(
                "no interface that is up matches COURIER_NET_DEVICES={}",
                l.join(",")
            ),
            None => "no network interface is up".into(),
        };
        return TransportInfo {
            name,
            unusable: Some(why),
            devices: Vec::new(),
        };
    }
    // One device per interface, with its addresses in the order the system lists them.
    let mut by_device: Vec<(String, Vec<IpAddr>)> = Vec::new();
    for (dev, ip) in ifs {
        match by_device.iter_mut().find(|(n, _)| *n == dev) {
            Some((_, ips)) => ips.push(ip),
            None => by_device.push((dev, vec![ip])),
        }
    }
    let devices = by_device
        .into_iter()
        .map(|(dev, ips)| tcp_device(cfg, dev, &ips))
        .collect();
    TransportInfo {
        name,
        unusable: None,
        devices,
    }
}

/// Interface `dev` with addresses `ips`: each address is tried with a test connection;
/// the capabilities are those of the first that works.
fn tcp_device(cfg: &Config, dev: String, ips: &[IpAddr]) -> DeviceInfo {
    let mut caps = None;
    let mut failed = Vec::new();
    for ip in ips {
        match tcp_caps(*ip, cfg) {
            Ok(c) => {
                caps.get_or_insert(c);
            }
            Err(e) => failed.push((*ip, e)),
        }
    }
    let caps = match caps {
        Some(mut c) => {
            if c.device.is_empty() || c.device == "?" {
                c.device = dev.clone();
            }
            Ok(c)
        }
        None => Err(failed
            .iter()
            .map(|(ip, e)| format!("{ip}: {e}"))
            .collect::<Vec<_>>()
            .join("; ")),
    };
    DeviceInfo {
        name: dev,
        addresses: ips.to_vec(),
        failed,
        caps,
        notes: Vec::new(),
    }
}

/// The capabilities of a tcp connection to a listener on `ip`, in this process.
fn tcp_caps(ip: IpAddr, cfg: &Config) -> std::result::Result<Caps, String> {
    let mut l = tcp::Listener::bind(SocketAddr::new(ip, 0), cfg).map_err(|e| e.to_string())?;
    let (tx, _rx) = tcp::connect(l.local_addr(), cfg).map_err(|e| e.to_string())?;
    let _ = l.accept();
    Ok(LinkTx::Tcp(tx).caps().clone())
}
