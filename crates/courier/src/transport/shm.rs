//! shm — placeholder; being implemented (see transport/mod.rs for the contract).
use std::os::fd::BorrowedFd;

use super::{Caps, RawFrame, TxError};
use crate::base::{Config, Error, Result, Status};

/// Sending half.
pub struct Tx {
    caps: Caps,
}
/// Receiving half.
pub struct Rx {}
/// Accepts shm connections on an abstract unix socket.
pub struct Acceptor {
    name: Vec<u8>,
}

impl Acceptor {
    /// Bind a fresh abstract unix socket.
    pub fn bind(_cfg: &Config) -> Result<Acceptor> {
        Err(Error::new(Status::Unsupported, "shm not built yet"))
    }
    /// Socket name (abstract namespace, without the leading NUL).
    pub fn name(&self) -> &[u8] {
        &self.name
    }
    /// Fd to watch.
    pub fn fd(&self) -> BorrowedFd<'_> {
        unimplemented!()
    }
    /// Accept connections that are ready.
    pub fn accept(&mut self) -> Result<Option<(Tx, Rx)>> {
        Ok(None)
    }
}

/// Connect to a peer's acceptor.
pub fn connect(_name: &[u8], _cfg: &Config) -> Result<(Tx, Rx)> {
    Err(Error::new(Status::Unsupported, "shm not built yet"))
}

impl Tx {
    pub(crate) fn send(&mut self, _parts: &[&[u8]]) -> Result<(), TxError> {
        Err(TxError::NoResource)
    }
    pub(crate) fn flush(&mut self) -> Result<bool> {
        Ok(true)
    }
    pub(crate) fn caps(&self) -> &Caps {
        &self.caps
    }
    pub(crate) unsafe fn remote_read(&mut self, _l: &[(usize, usize)], _r: &[(u64, u64)]) -> Result<()> {
        Err(Status::Unsupported.into())
    }
}
impl Rx {
    pub(crate) fn peek(&mut self) -> Result<Option<RawFrame>> {
        Ok(None)
    }
    pub(crate) fn consume(&mut self) {}
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    pub(crate) fn on_readable(&mut self) -> Result<()> {
        Ok(())
    }
    pub(crate) fn arm(&mut self) -> Result<bool> {
        Ok(true)
    }
}
