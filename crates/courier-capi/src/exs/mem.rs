//! Memory registrations: the caller's buffers, registered with Courier so that a peer may
//! write into them (its key travels with the first advertisement that needs it). Handles
//! are never reused, so a stale one is always recognised.

use courier_core::{MemMapParams, Memory, access};

use super::abi::*;
use super::inplace::Moved;
use super::{XResult, fail};

/// Most registrations at once.
pub(crate) const MEMS_MAX: usize = 1 << 16;

pub(crate) struct Mem {
    pub addr: usize,
    pub len: usize,
    /// Courier's registration (remote write allowed: receives are written by the peer).
    pub mem: Memory,
    /// Operations in flight that use it.
    pub busy: usize,
    /// The pages holding it, moved into a shared segment in place (`inplace.rs`): given
    /// back as private pages when the registration ends.
    moved: Option<Moved>,
}

impl Drop for Mem {
    fn drop(&mut self) {
        if let Some(m) = self.moved.take() {
            m.restore();
        }
    }
}

impl Mem {
    pub fn register(
        ctx: &courier_core::Context,
        addr: usize,
        len: usize,
        flags: i32,
    ) -> XResult<Mem> {
        if flags & !(EXS_MREG_READ | EXS_MREG_WRITE) != 0 {
            return Err(fail(
                libc::EINVAL,
                format!(
                    "unknown exs_mregister flags {:#x} (known: EXS_MREG_READ, EXS_MREG_WRITE)",
                    flags & !(EXS_MREG_READ | EXS_MREG_WRITE)
                ),
            ));
        }
        if addr == 0 || len == 0 {
            return Err(fail(
                libc::EINVAL,
                "exs_mregister needs a non-NULL address and a non-zero length",
            ));
        }
        if addr.checked_add(len).is_none() {
            return Err(fail(
                libc::EINVAL,
                "the region wraps around the address space",
            ));
        }
        let rights = access::READ | access::WRITE;
        if let Some((mem, moved)) = super::inplace::share(ctx, addr, len, rights) {
            return Ok(Mem {
                addr,
                len,
                mem,
                busy: 0,
                moved: Some(moved),
            });
        }
        // SAFETY: exs_mregister's contract: the caller's region stays valid until
        // exs_mderegister, which drops `mem`; the caller does not touch it while transfers
        // into it are in flight.
        let params = unsafe { MemMapParams::register(addr as *mut u8, len) };
        let mem = ctx.mem_map(params.access(rights))?;
        Ok(Mem {
            addr,
            len,
            mem,
            busy: 0,
            moved: None,
        })
    }

    /// A buffer of ours (an `exs_recvmsg` staging buffer), registered.
    pub fn allocate(ctx: &courier_core::Context, len: usize) -> XResult<Mem> {
        let mem = ctx.mem_map(MemMapParams::allocate(len).access(access::READ | access::WRITE))?;
        Ok(Mem {
            addr: mem.as_ptr() as usize,
            len,
            mem,
            busy: 0,
            moved: None,
        })
    }

    /// `[buf, buf + len)` lies inside the registration; `EFAULT` otherwise.
    pub fn covers(&self, mh: exs_mhandle_t, buf: usize, len: usize) -> XResult<()> {
        let end = buf.checked_add(len);
        if buf >= self.addr && end.is_some_and(|e| e <= self.addr + self.len) {
            return Ok(());
        }
        Err(fail(
            libc::EFAULT,
            format!(
                "buffer [{buf:#x}, +{len}) is not inside registration {mh} [{:#x}, +{})",
                self.addr, self.len
            ),
        ))
    }
}
