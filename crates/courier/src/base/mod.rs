//! base — status codes and errors, the `COURIER_*` configuration table, logging, the
//! worker's state cell (a lock that costs nothing in single-thread mode), and small system
//! helpers. Every other layer uses this one; it uses none of them.

pub mod auth;
pub mod config;
pub mod cuda;
pub mod lock;
pub mod log;
pub mod status;
pub mod sys;

pub use config::Config;
pub use status::{Error, Result, Status};
