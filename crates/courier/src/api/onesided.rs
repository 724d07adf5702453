//! The one-sided objects: a peer's `RemoteKey`, and `Endpoint`'s one-sided operations.
//! Thin wrappers: the routes, the checks and the paths are the protocol layer's
//! (`proto::onesided`); these give them borrowed buffers and `Request`s.

use std::sync::atomic::{Ordering, fence};

use super::endpoint::{Endpoint, wait_now};
use super::request::Request;
use crate::base::Result;
use crate::proto::buf::Buf;
use crate::proto::onesided::{self, AtomicOp, Key, SignalOp, SignalTarget};
use crate::proto::request::Started;
use crate::proto::request::{Callback, Info};

/// A peer's remote key, unpacked on an endpoint.
pub struct RemoteKey {
    key: Key,
    /// The endpoint it was unpacked on (kept alive with the key).
    _ep: Endpoint,
}

impl RemoteKey {
    /// The region's start and length in the owner's process.
    pub fn bounds(&self) -> (u64, u64) {
        self.key.bounds()
    }

    /// A pointer valid in this process for `addr` in the owner's process, when the region
    /// is mapped here (same host, allocated memory, or the same context) and `addr` lies
    /// in it; `None` otherwise (`local_ptr` says why).
    pub fn direct_ptr(&self, addr: u64) -> Option<*mut u8> {
        self.key.direct_ptr(addr)
    }

    /// `direct_ptr` with the reason when there is none: `addr` outside the key's region
    /// (`OutOfRange`), a region its owner no longer maps or a key that does not match its
    /// record (`InvalidKey`), or a region not mapped in this process (`Unsupported`).
    pub fn local_ptr(&self, addr: u64) -> Result<*mut u8> {
        self.key.local_ptr(addr)
    }

    /// How operations reach the region: `local`, `direct`, `cma`, `cuda_ipc` or `remote`.
    pub fn path(&self) -> &'static str {
        self.key.path()
    }
}

impl Endpoint {
    /// Unpack a peer's remote key for use on this endpoint.
    pub fn rkey_unpack(&self, bytes: &[u8]) -> Result<RemoteKey> {
        let ctx = &self.worker().context().inner;
        Ok(RemoteKey {
            key: Key::unpack(&self.ep_ref(), bytes, &ctx.mem, &ctx.cfg)?,
            _ep: self.clone(),
        })
    }

    /// Write `data` at `raddr` in the peer's region, and wait until `data` may be reused
    /// (as `put_nb` completes).
    pub fn put(&self, data: &[u8], raddr: u64, key: &RemoteKey) -> Result<Info> {
        // SAFETY: waited for before the borrow of `data` ends (see `wait_now`).
        wait_now(unsafe { self.put_nb(data, raddr, key) })
    }

    /// Read into `buf` from `raddr` in the peer's region, waiting for the data.
    pub fn get(&self, buf: &mut [u8], raddr: u64, key: &RemoteKey) -> Result<Info> {
        // SAFETY: as `put`.
        wait_now(unsafe { self.get_nb(buf, raddr, key) })
    }

    /// Write the buffers of `iov`, one after another, starting at `raddr`, and wait until
    /// they may be reused.
    pub fn put_iov(&self, iov: &[&[u8]], raddr: u64, key: &RemoteKey) -> Result<Info> {
        // SAFETY: as `put`.
        wait_now(unsafe { self.put_iov_nb(iov, raddr, key) })
    }

    /// Read consecutive bytes from `raddr` into the buffers of `iov`, filling each in turn,
    /// waiting for the data.
    pub fn get_iov(&self, iov: &mut [&mut [u8]], raddr: u64, key: &RemoteKey) -> Result<Info> {
        // SAFETY: as `put`.
        wait_now(unsafe { self.get_iov_nb(iov, raddr, key) })
    }

    /// Put-with-signal (`put_signal_nb`), waiting until `data` may be reused.
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal(
        &self,
        data: &[u8],
        raddr: u64,
        key: &RemoteKey,
        sig_addr: u64,
        sig_key: &RemoteKey,
        value: u64,
        op: SignalOp,
    ) -> Result<Info> {
        // SAFETY: as `put`.
        wait_now(unsafe { self.put_signal_nb(data, raddr, key, sig_addr, sig_key, value, op) })
    }

    /// Start writing `data` at `raddr` in the peer's region. Completes when `data` may be reused:
    /// at once when the region is mapped here or reached by CMA (the data is then in
    /// place); when the owner carries the put out (tcp, or registered memory reached
    /// without CMA), once the data has left this process. `flush` says when every earlier
    /// put is in place, and reports one the owner refused.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`](crate::Worker::scope) makes the same request safely.
    pub unsafe fn put_nb<'a>(
        &self,
        data: &'a [u8],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'a>> {
        // SAFETY: forwarded contract: the caller keeps `data` valid for the request.
        let s = unsafe {
            self.put_raw(
                Buf::One((data.as_ptr() as usize, data.len())),
                raddr,
                key,
                Callback::None,
            )?
        };
        Ok(Request::new(self.worker(), s))
    }

    /// Start reading into `buf` from `raddr` in the peer's region.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`](crate::Worker::scope) makes the same request safely.
    pub unsafe fn get_nb<'a>(
        &self,
        buf: &'a mut [u8],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'a>> {
        // SAFETY: forwarded contract: the caller keeps `buf` valid for the request.
        let s = unsafe {
            self.get_raw(
                Buf::One((buf.as_mut_ptr() as usize, buf.len())),
                raddr,
                key,
                Callback::None,
            )?
        };
        Ok(Request::new(self.worker(), s))
    }

    /// Start writing the buffers of `iov`, one after another, starting at `raddr`.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`](crate::Worker::scope) makes the same request safely.
    pub unsafe fn put_iov_nb<'a>(
        &self,
        iov: &[&'a [u8]],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'a>> {
        let segs = iov.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        // SAFETY: forwarded contract: the caller keeps the buffers valid for the request.
        let s = unsafe { self.put_raw(Buf::Many(segs), raddr, key, Callback::None)? };
        Ok(Request::new(self.worker(), s))
    }

    /// Start reading consecutive bytes from `raddr` into the buffers of `iov`, filling
    /// each in turn.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`](crate::Worker::scope) makes the same request safely.
    pub unsafe fn get_iov_nb<'a>(
        &self,
        iov: &mut [&'a mut [u8]],
        raddr: u64,
        key: &RemoteKey,
    ) -> Result<Request<'a>> {
        let segs = iov
            .iter_mut()
            .map(|b| (b.as_mut_ptr() as usize, b.len()))
            .collect();
        // SAFETY: forwarded contract: the caller keeps the buffers valid for the request.
        let s = unsafe { self.get_raw(Buf::Many(segs), raddr, key, Callback::None)? };
        Ok(Request::new(self.worker(), s))
    }

    /// Put with a raw buffer and a callback.
    ///
    /// # Safety
    /// `data` must stay valid until completion.
    #[inline(always)]
    pub unsafe fn put_raw(
        &self,
        data: Buf,
        raddr: u64,
        key: &RemoteKey,
        cb: Callback,
    ) -> Result<Started> {
        // SAFETY: forwarded contract.
        unsafe { onesided::put(&self.ep_ref(), data, raddr, &key.key, cb) }
    }

    /// Get with a raw buffer and a callback.
    ///
    /// # Safety
    /// `buf` must stay valid until completion.
    #[inline(always)]
    pub unsafe fn get_raw(
        &self,
        buf: Buf,
        raddr: u64,
        key: &RemoteKey,
        cb: Callback,
    ) -> Result<Started> {
        // SAFETY: forwarded contract.
        unsafe { onesided::get(&self.ep_ref(), buf, raddr, &key.key, cb) }
    }

    /// An atomic on a 64-bit (or, with `bits32`, 32-bit) word at `raddr`; the old value is
    /// in the completion's `Info::value`. `compare` is used by `Cswap` only.
    pub fn atomic(
        &self,
        op: AtomicOp,
        value: u64,
        compare: u64,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
    ) -> Result<Request<'static>> {
        let s = self.atomic_raw(op, value, compare, raddr, key, bits32, Callback::None)?;
        Ok(Request::new(self.worker(), s))
    }

    /// Atomic with a callback.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn atomic_raw(
        &self,
        op: AtomicOp,
        value: u64,
        compare: u64,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
        cb: Callback,
    ) -> Result<Started> {
        onesided::atomic(
            &self.ep_ref(),
            op,
            value,
            compare,
            raddr,
            &key.key,
            bits32,
            cb,
        )
    }

    /// A posted (non-fetching) atomic: `op` with `value` on the 64-bit (or, with `bits32`,
    /// 32-bit) word at `raddr`, returning nothing (`ucp_atomic_post`, OpenSHMEM's
    /// `shmem_atomic_add` and kin). `op` is `Add`, `And`, `Or` or `Xor`; `Swap` and `Cswap`
    /// exist for their old value, so they are refused (`InvalidParam`): use `atomic`.
    ///
    /// On a region mapped here it is carried out before this returns. Otherwise it goes to
    /// the owner, which answers only if it refuses it: `flush` waits until the owner has
    /// carried it out and reports a refusal (`fence` orders it like a put). What the key
    /// itself shows to be wrong (alignment, range, rights) is refused at once, before
    /// anything is sent.
    pub fn atomic_post(
        &self,
        op: AtomicOp,
        value: u64,
        raddr: u64,
        key: &RemoteKey,
        bits32: bool,
    ) -> Result<()> {
        onesided::atomic_post(&self.ep_ref(), op, value, raddr, &key.key, bits32)
    }

    /// Write `data` at `raddr` and then update the signal word at `sig_addr` (`Set` or
    /// `Add` `value`) as one operation: whoever sees the signal change sees the data. The
    /// request completes when `data` may be reused.
    ///
    /// # Safety
    /// The request borrows the buffer: see [`Request`]'s "Safety of borrowing requests"
    /// (keep it valid, and unused by others, until the request completes or its drop
    /// returns outside a callback; never forget the request; never drop it in flight
    /// inside a callback). [`Worker::scope`](crate::Worker::scope) makes the same request safely.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal_nb<'a>(
        &self,
        data: &'a [u8],
        raddr: u64,
        key: &RemoteKey,
        sig_addr: u64,
        sig_key: &RemoteKey,
        value: u64,
        op: SignalOp,
    ) -> Result<Request<'a>> {
        // SAFETY: forwarded contract: the caller keeps `data` valid for the request.
        let s = unsafe {
            self.put_signal_raw(
                Buf::One((data.as_ptr() as usize, data.len())),
                raddr,
                key,
                sig_addr,
                sig_key,
                value,
                op,
                Callback::None,
            )?
        };
        Ok(Request::new(self.worker(), s))
    }

    /// Put-with-signal with a raw buffer and a callback.
    ///
    /// # Safety
    /// `data` must stay valid until completion.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub unsafe fn put_signal_raw(
        &self,
        data: Buf,
        raddr: u64,
        key: &RemoteKey,
        sig_addr: u64,
        sig_key: &RemoteKey,
        value: u64,
        op: SignalOp,
        cb: Callback,
    ) -> Result<Started> {
        let sig = SignalTarget {
            addr: sig_addr,
            key: &sig_key.key,
            value,
            op,
        };
        // SAFETY: forwarded contract.
        unsafe { onesided::put_signal(&self.ep_ref(), data, raddr, &key.key, sig, cb) }
    }

    /// Order: operations issued after the fence are carried out after those before it.
    ///
    /// It reports no errors of the operations it orders (`flush` does). When no endpoint of
    /// the worker has operations through an owner to wait for, it returns at once, without
    /// looking at this endpoint: also `Ok` for one that failed or was closed meanwhile.
    /// Otherwise a closed endpoint gives `EndpointClosed`.
    pub fn fence(&self) -> Result<()> {
        // Operations through the owner run in order on one link, and direct ones are done
        // when issued; but a direct one issued after the fence would overtake one still on
        // its way to the owner. So when this endpoint has both, the fence waits until the
        // owner has carried out everything sent before it. A full fence orders this
        // process's own loads and stores.
        //
        // No endpoint of the worker has both: nothing to wait for, and no lock to take.
        // The flag is set under the lock before such an operation returns, so this thread
        // sees its own operations; another thread's are ordered only by a fence of its own.
        if !self.worker().inner.rma_mixed.load(Ordering::Acquire) {
            fence(Ordering::SeqCst);
            return Ok(());
        }
        if let Some(id) = self.with_state(|st, e| st.rma_fence_start(e))? {
            Request::new(self.worker(), Started::Pending(id)).wait()?;
        }
        fence(Ordering::SeqCst);
        Ok(())
    }
}
