//! `courier info`: a drop-in for ucx_info.

use std::net::IpAddr;
use std::time::Duration;

use courier::onesided::{ATOMIC_BITS, Op, OwnerLimits, Reach, Route, TargetMemory, op_route};
use courier::{AtomicOp, Caps, Config, DeviceInfo, RndvMode, TransportInfo};

use crate::error::{CliError, CliResult};

mod devices;
mod endpoint;
mod onesided;

use devices::devices;
use endpoint::endpoint;
use onesided::{
    atomic_names, atomic_widths, one_sided_caps, one_sided_ranges, rma_names, shm_reach,
};

/// Options of `courier info` (ucx_info's). As with ucx_info's getopt, an option given twice
/// takes its last value; `-f` prints the configuration by itself, `-a` and `-C` modify it.
#[derive(clap::Args, Debug, Clone)]
#[command(
    disable_version_flag = true,
    args_override_self = true,
    group(clap::ArgGroup::new("print_config").args(["config", "full"]).multiple(true))
)]
pub struct InfoArgs {
    /// Version and build features
    #[arg(short = 'v')]
    pub version: bool,
    /// Build configuration (same as -v)
    #[arg(short = 'b')]
    pub build: bool,
    /// Transports and devices with their capabilities
    #[arg(short = 'd')]
    pub devices: bool,
    /// Only this transport in -d
    #[arg(
        short = 't',
        value_name = "NAME",
        requires = "devices",
        value_parser = ["self", "shm", "tcp", "cuda_copy"]
    )]
    pub transport: Option<String>,
    /// Configuration variables in force
    #[arg(short = 'c')]
    pub config: bool,
    /// With -c or -f: also default, accepted values and help
    #[arg(short = 'a', requires = "print_config")]
    pub all: bool,
    /// Configuration fully decorated: default, accepted values and help (implies -c)
    #[arg(short = 'f')]
    pub full: bool,
    /// With -c or -f: comment out the variables not set in the environment
    #[arg(short = 'C', requires = "print_config")]
    pub comment_defaults: bool,
    /// Endpoint lanes and protocol thresholds
    #[arg(short = 'e')]
    pub endpoint: bool,
    /// Features for -e: t tag, m am, s stream, r rma, a amo (at least one); e error handling
    /// (peer failure detection), w wakeup (both also keep transports that lack them out)
    #[arg(short = 'u', default_value = "t", requires = "endpoint")]
    pub features: String,
    /// Peer for -e: self (same process), intra (same host) or inter (another host)
    #[arg(short = 'P', default_value = "self", requires = "endpoint")]
    pub peer: String,
    /// Device types for -d and -e: all, shm (shared memory), net (tcp) or self
    #[arg(short = 'D', value_parser = ["all", "shm", "net", "self"])]
    pub device_types: Option<String>,
}

fn version_line() -> String {
    format!(
        "# Courier version={} ({} build, {}-{})",
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::env::consts::ARCH,
        std::env::consts::OS
    )
}

/// The transport named `name` among those `courier::transports` listed.
fn find<'a>(list: &'a [TransportInfo], name: &str) -> Option<&'a TransportInfo> {
    list.iter().find(|t| t.name == name)
}

/// The capabilities of a transport with one device (`self`, `shm`), or why it is not
/// usable.
fn memory_caps(list: &[TransportInfo], name: &str) -> Result<Caps, String> {
    let t = find(list, name).ok_or_else(|| format!("no transport {name}"))?;
    if let Some(why) = &t.unusable {
        return Err(why.clone());
    }
    t.devices
        .first()
        .ok_or_else(|| "no device".to_string())?
        .caps
        .clone()
}

/// The rendezvous threshold in force on a link with `c`: `COURIER_RNDV_THRESH` or the
/// transport's own.
fn rndv_thresh(c: &Caps, cfg: &Config) -> usize {
    cfg.rndv_thresh.unwrap_or(c.rndv_thresh).max(1)
}

/// The first size of `kind` messages sent by rendezvous on a link with `c`: the
/// threshold, or sooner where the message and its header no longer fit one frame.
fn rndv_from(c: &Caps, cfg: &Config, kind: courier::wire::Kind) -> usize {
    rndv_thresh(c, cfg).min((c.max_frame + 1).saturating_sub(kind.header_len()))
}

/// `-c`: every variable with its value in force, `NAME=value`; `full` (`-a`, `-f`): each
/// after its help, syntax and default; `comment_defaults` (`-C`): those not set in the
/// environment commented out, as ucx_info does.
fn config_text(cfg: &Config, full: bool, comment_defaults: bool) -> String {
    let mut s = String::new();
    for (v, value) in cfg.entries() {
        let given = shown(value);
        let used = cfg.adjusted(v.name);
        if full {
            s.push_str(&format!(
                "#\n# {}\n#\n# syntax:    {}\n# default:   {}\n",
                v.help, v.accepts, v.default
            ));
            if let Some((used, why)) = &used {
                s.push_str(&format!("# in force:  {used} (given: {given}; {why})\n"));
            }
            s.push_str("#\n");
        }
        let unset = std::env::var_os(v.name).is_none();
        let hash = if comment_defaults && unset { "# " } else { "" };
        let value = used.map_or(given, |(u, _)| u);
        s.push_str(&format!("{hash}{}={value}\n", v.name));
        if v.name == "COURIER_AUTH_KEY_FILE" {
            let line = courier::auth::in_force(cfg.auth, cfg.auth_key_file.as_deref());
            s.push_str(&format!("# authentication in force: {line}\n"));
        }
    }
    s
}

/// A value as `-c` prints it: trimmed, as it is read; control characters escaped, so that
/// each variable stays on its line.
fn shown(value: &str) -> String {
    value
        .trim()
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Entry point of `courier info`.
pub fn main(a: InfoArgs) -> CliResult<()> {
    let mut cfg = Config::from_env().map_err(|e| CliError::usage(e.detail().to_string()))?;
    // Said here, not through the library's log (which `info` does not set up): this is
    // the command users run to check their configuration.
    for k in courier::config::unknown_vars() {
        eprintln!(
            "courier: warning: {}",
            courier::config::unknown_var_message(&k)
        );
    }
    if let Some(d) = &a.device_types {
        restrict(&mut cfg, d)?;
    }
    let mut out = String::new();
    let any = a.version || a.build || a.devices || a.config || a.full || a.endpoint;
    if a.version || a.build {
        out.push_str(&version_line());
        out.push('\n');
        out.push_str("# transports: self (in-worker), shm (memfd FIFOs + CMA), tcp\n");
        out.push_str(&format!(
            "# apis: tag, active messages, stream, rma ({}), atomics ({}; {}), signal waits, semaphores\n",
            rma_names(),
            atomic_names(),
            atomic_widths()
        ));
    }
    if a.config || a.full {
        out.push_str(&config_text(&cfg, a.all || a.full, a.comment_defaults));
    }
    if a.devices {
        out.push_str(&devices(&cfg, a.transport.as_deref()));
    }
    if a.endpoint {
        out.push_str(&endpoint(&cfg, &a)?);
    }
    if !any {
        out.push_str(&version_line());
        out.push('\n');
        for t in courier::config::TRANSPORTS {
            let st = if cfg.tls.allows(t) {
                "allowed"
            } else {
                "excluded by COURIER_TLS"
            };
            out.push_str(&format!("#   {t:<5} {st}\n"));
        }
        out.push_str("# courier info -d: devices and capabilities; -c: configuration; -e -u tra: protocol thresholds\n");
    }
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(()),
        // The reader went away (`| head`): nothing more to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::run(format!(
            "cannot write to standard output: {e}"
        ))),
    }
}

/// `-D`: only transports of the given device type (and still only those `COURIER_TLS`
/// allows).
fn restrict(cfg: &mut Config, d: &str) -> CliResult<()> {
    let kept: Vec<&str> = courier::config::TRANSPORTS
        .into_iter()
        .filter(|t| match d {
            "shm" => *t == "shm",
            "net" => *t == "tcp",
            "self" => *t == "self",
            _ => true,
        })
        .filter(|t| cfg.tls.allows(t))
        .collect();
    if kept.is_empty() {
        return Err(CliError::usage(format!(
            "-D {d}: COURIER_TLS={} excludes every transport of that type",
            cfg.tls.spec
        )));
    }
    let spec = format!("{}, -D {d}", cfg.tls.spec);
    cfg.tls = courier::config::TlsSelection::parse(&kept.join(","))
        .map_err(|e| CliError::run(e.detail().to_string()))?;
    cfg.tls.spec = spec;
    Ok(())
}
