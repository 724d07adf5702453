//! `Context`: the features asked for, the configuration, a name for logs.

use std::sync::Arc;

use crate::base::{Config, Error, Result, Status, log};

/// Features an application asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Tag-matched messages.
    pub tag: bool,
    /// Active messages.
    pub am: bool,
    /// Streams.
    pub stream: bool,
    /// Remote memory access.
    pub rma: bool,
    /// Remote atomics.
    pub atomics: bool,
    /// Sleeping on an event fd.
    pub wakeup: bool,
}

impl Default for Features {
    fn default() -> Features {
        Features {
            tag: true,
            am: true,
            stream: true,
            rma: false,
            atomics: false,
            wakeup: true,
        }
    }
}

/// Parameters of a context.
#[derive(Clone, Debug, Default)]
pub struct ContextParams {
    /// Features.
    pub features: Features,
    /// Name used in log lines (defaults to `courier-<pid>`).
    pub name: Option<String>,
    /// `COURIER_*` values that override the environment.
    pub config: Vec<(String, String)>,
}

impl ContextParams {
    /// Override one configuration variable.
    pub fn config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.to_string(), value.to_string()));
        self
    }
    /// Set the log name.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
    /// Set the features.
    pub fn features(mut self, f: Features) -> Self {
        self.features = f;
        self
    }
}

pub(crate) struct ContextInner {
    pub cfg: Arc<Config>,
    pub mem: Arc<crate::proto::memreg::MemRegistry>,
    pub features: Features,
    pub name: String,
}

/// The root object: configuration and features shared by workers.
///
/// Its configuration comes from the `COURIER_*` environment variables, with the
/// `ContextParams::config` values taking precedence; an invalid value is an error that
/// names the variable.
///
/// ```
/// use courier::{Context, ContextParams, Features};
///
/// let ctx = Context::new(
///     ContextParams::default()
///         .name("my-app")
///         .features(Features { rma: true, atomics: true, ..Features::default() })
///         .config("COURIER_TLS", "self,shm"),
/// )?;
/// assert!(ctx.features().rma);
/// assert_eq!(ctx.name(), "my-app");
/// assert!(Context::new(ContextParams::default().config("COURIER_TLS", "pigeon")).is_err());
/// # Ok::<(), courier::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl Context {
    /// Create a context from the environment and `params`.
    pub fn new(params: ContextParams) -> Result<Context> {
        let over: Vec<(&str, &str)> = params
            .config
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut cfg = Config::from_env_with(&over)?;
        cfg.wakeup = params.features.wakeup;
        log::init(cfg.log_level);
        crate::base::config::warn_unknown_vars_once();
        cfg.auth_key = crate::base::auth::resolve(cfg.auth, cfg.auth_key_file.as_deref())?;
        let name = params
            .name
            .unwrap_or_else(|| format!("courier-{}", std::process::id()));
        tracing::info!("{name} COURIER_TLS={}", cfg.tls.effective());
        // An application that loaded the CUDA driver may hand us device pointers.
        crate::base::cuda::adopt_if_present(&cfg.cuda_lib);
        crate::proto::stage::set_pinned_max(cfg.cuda_staging);
        Ok(Context {
            inner: Arc::new(ContextInner {
                cfg: Arc::new(cfg),
                mem: Arc::new(crate::proto::memreg::MemRegistry::new()),
                features: params.features,
                name,
            }),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The features asked for.
    pub fn features(&self) -> Features {
        self.inner.features
    }

    /// The log name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub(crate) fn require(&self, ok: bool, what: &str) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::msg(
                Status::Unsupported,
                format!("feature {what} was not requested when the context was created"),
            ))
        }
    }
}
