//! Courier: one library that moves bytes between threads, processes and hosts by the
//! fastest route it can find.
//!
//! Layers, each using only the ones above it: [`base`] → [`wire`] → [`transport`] →
//! `proto` (protocols) → `api` (objects) → surfaces (the C ABI and the `courier` command
//! live in their own crates).
#![warn(missing_docs)]

pub mod base;
pub mod transport;
pub mod wire;

pub use base::{Config, Error, Result, Status};
