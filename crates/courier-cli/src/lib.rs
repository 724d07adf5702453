//! What other crates of the workspace use of the `courier` command: the error type, and
//! `courier perf`'s control messages (test parameters), which the fuzz targets (`fuzz/`)
//! parse as a hostile client would send them. The command itself is `main.rs`.

pub mod error;
#[path = "perf/params.rs"]
pub mod perf_params;
