//! The hand-written C entry points: setup and query, memory management, ordering and
//! synchronization, teams, contexts, locks. (The typed families are in `typed`.) Each one
//! is thin: it checks nothing itself and calls the module that does, behind `guard`.

pub mod memory;
pub mod order;
pub mod sem;
pub mod setup;
pub mod teams;
