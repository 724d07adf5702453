//! Logging: `tracing` with a subscriber set up once from `COURIER_LOG_LEVEL`.
//!
//! The library installs a global subscriber only if the application has not installed one,
//! so applications that already use `tracing` keep control.

use std::sync::Once;

use super::config::LogLevel;

static INIT: Once = Once::new();

/// Install the stderr logger at `level` unless a global subscriber exists already.
pub fn init(level: LogLevel) {
    INIT.call_once(|| {
        let lvl = match level {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
            LogLevel::Trace => tracing::Level::TRACE,
        };
        let sub = tracing_subscriber::fmt()
            .with_max_level(lvl)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(false)
            .finish();
        // Err means the application installed its own subscriber: keep it.
        let _ = tracing::subscriber::set_global_default(sub);
    });
}
