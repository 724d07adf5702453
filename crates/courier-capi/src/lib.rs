//! Courier's C ABI (`libcourier.so`, `libcourier.a`, `include/courier.h`).
//!
//! Conventions, the same for every export:
//! - Objects are opaque handles made by `courier_<object>_create` (or `_map`, `_unpack`,
//!   or handed out by the library: connection requests, incoming endpoints, descriptors)
//!   and released by one verb, the same for every kind: `courier_<object>_destroy`.
//!   Older names stay as aliases: `courier_ep_close_force`, `courier_request_free`,
//!   `courier_worker_am_desc_release`, and `courier_mem_unmap` (the pair of `_map`).
//!   `courier_ep_close` flushes and tells the peer before it destroys; a connection
//!   request ends with `_accept` or `_reject`. Buffers the library allocates for the
//!   caller (addresses, packed keys) are released with `courier_buffer_free`.
//! - Handles are generation-checked (`handle.rs`): an opaque value packing kind, slot and
//!   generation, looked up on every call. NULL, another kind's handle, a destroyed handle and
//!   a freed request are refused with `COURIER_ERR_INVALID_HANDLE`, never dereferenced.
//! - Helpers every export shares (the panic boundary, argument checks, buffers) live in
//!   `ffi.rs`; each object's exports in its own file, none importing a later one.
//! - Arguments go object first, inputs next, outputs last. Outputs are written only when the
//!   call succeeds (`COURIER_OK`, or `COURIER_INPROGRESS` for operations that started).
//! - Every call returns a `courier_status_t` with the same stable numbers as
//!   `courier::Status`; `courier_status_string` names it and `courier_last_error_detail`
//!   gives the sentence of the last failure on the calling thread.
//! - Parameter structs begin with `uint64_t field_mask`; a field is read only when its
//!   `COURIER_*_FIELD_*` bit is set, so structs can grow without breaking callers. Bits
//!   this library does not know, in a field mask or a flags word, are refused with
//!   `COURIER_ERR_INVALID_PARAM` (the detail names them), never ignored.
//! - No Rust panic ever unwinds into C: every export and every call into a user callback
//!   runs behind a panic boundary (a caught panic is reported as `COURIER_ERR_PANIC`).
//! - Callbacks carry a `void *user_data` given at registration and run inside
//!   `courier_worker_progress` (or a wait that progresses), on the progressing thread.
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

mod am;
mod context;
mod endpoint;
/// cbindgen:ignore
pub mod exs;
mod ffi;
mod handle;
mod job;
mod listener;
mod memory;
mod request;
mod status;
mod stream;
mod tag;
mod worker;

#[cfg(test)]
mod abi_tests;

pub use am::*;
pub use context::*;
pub use endpoint::*;
pub use ffi::courier_iov_t;
pub use job::*;
pub use listener::*;
pub use memory::*;
pub use request::*;
pub use status::*;
pub use stream::*;
pub use tag::*;
pub use worker::*;
