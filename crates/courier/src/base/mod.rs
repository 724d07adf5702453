//! base — status codes and errors, the `COURIER_*` configuration table, logging, and small
//! system helpers. Every other layer uses this one; it uses none of them.

pub mod config;
pub mod cuda;
pub mod log;
pub mod status;
pub mod sys;

pub use config::Config;
pub use status::{Error, Result, Status};
