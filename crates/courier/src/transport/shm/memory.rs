//! Same-host memory: the one interface through which the layers above reach memory of this
//! host's processes outside the frames of a link — shared segments (memfd and `mmap`), a
//! peer process's descriptors (`pidfd_getfd`), CMA copies (`process_vm_readv/writev`), and
//! the doorbell that wakes a peer's worker after a direct write into its memory. The
//! protocol layer's memory registry and one-sided paths use this and nothing else of shm.

use std::os::fd::{AsFd, OwnedFd};

use super::cma;
use crate::base::{Error, Result, Status};

pub(crate) use super::Doorbell;

/// Whether this process may read process `pid`'s memory at `addr` with CMA (a
/// `process_vm_readv` of one word).
pub(crate) fn cma_probe(pid: u32, addr: u64) -> bool {
    cma::read_word(pid, addr).is_ok()
}

/// Write `len` bytes at `local` into process `pid` at `remote` (CMA).
pub(crate) fn cma_write(pid: u32, local: usize, len: usize, remote: u64) -> Result<()> {
    cma::write_contiguous(pid, local, len, remote)
}

/// Read `len` bytes at `remote` in process `pid` into `local` (CMA).
///
/// # Safety
/// `local` must be valid for writes of `len` bytes.
pub(crate) unsafe fn cma_read(pid: u32, local: usize, len: usize, remote: u64) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { cma::read_contiguous(pid, local, len, remote) }
}

/// A shared mapping of a memory file (this process's segment, or one taken from a peer),
/// unmapped on drop.
pub(crate) struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a mapping is plain shared memory; all access goes through raw pointers and atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes (at least one) of `fd`, shared, readable and writable.
    pub(crate) fn map(fd: impl AsFd, len: usize) -> Result<Mapping> {
        Mapping::map_prot(fd, len, true)
    }

    fn map_prot(fd: impl AsFd, len: usize, writable: bool) -> Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh shared mapping of a memfd we hold; no Rust references alias it.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len.max(1),
                prot,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| Error::io("mmap", e))?;
        Ok(Mapping {
            ptr: p as *mut u8,
            len: len.max(1),
        })
    }

    /// Map `len` bytes of a peer's memory file `fd` (read-only unless `writable`), after
    /// checking that the file cannot shrink or grow under the mapping any more (sealed, as
    /// `memfd` seals every file it makes) and holds `len` bytes: a peer must not be able
    /// to make a load or store here fault (SIGBUS) by truncating its file.
    pub(crate) fn map_peer(fd: impl AsFd, len: usize, writable: bool) -> Result<Mapping> {
        use rustix::fs::SealFlags;
        let fd = fd.as_fd();
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| {
            Error::msg(
                Status::InvalidKey,
                format!("the peer's memory file cannot be sealed ({e}): not mapped"),
            )
        })?;
        let need = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
        if !seals.contains(need) {
            return Err(Error::msg(
                Status::InvalidKey,
                format!(
                    "the peer's memory file is not sealed against resizing (seals {seals:?}): not mapped"
                ),
            ));
        }
        let st = rustix::fs::fstat(fd).map_err(|e| Error::io("fstat", e))?;
        if st.st_size < 0 || (st.st_size as u64) < len as u64 {
            return Err(Error::msg(
                Status::InvalidKey,
                format!(
                    "the peer's memory file holds {} bytes, fewer than the {len} to map",
                    st.st_size
                ),
            ));
        }
        Mapping::map_prot(fd, len, writable)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping.
        let _ = unsafe { rustix::mm::munmap(self.ptr as *mut _, self.len) };
    }
}

/// A new memory file of `len` bytes (close-on-exec), for a segment peers may map: sealed
/// against shrinking and growing (and against changing its seals), so that no one, this
/// process included, can make a peer's mapping of it fault.
pub(crate) fn memfd(name: &str, len: usize) -> Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags, fcntl_add_seals, ftruncate, memfd_create};
    let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| Error::io("memfd_create", e))?;
    ftruncate(&fd, len as u64).map_err(|e| Error::io("ftruncate", e))?;
    fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(|e| Error::io("sealing a memory file", e))?;
    Ok(fd)
}

/// Another process of this host, held by a pidfd (which cannot come to name another
/// process once this one exits).
pub(crate) struct PeerProcess {
    pidfd: OwnedFd,
}

impl PeerProcess {
    /// Hold process `pid` (`InvalidKey` for a pid no process can have, `Unreachable` when
    /// the kernel refuses).
    pub(crate) fn open(pid: u32) -> Result<PeerProcess> {
        let p = rustix::process::Pid::from_raw(pid as i32).ok_or(Status::InvalidKey)?;
        let pidfd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
            .map_err(|e| Error::msg(Status::Unreachable, format!("pidfd_open({pid}): {e}")))?;
        Ok(PeerProcess { pidfd })
    }

    /// Whether the process has exited (its pidfd is readable then).
    pub(crate) fn exited(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, poll};
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// A copy of the process's descriptor `fd` (refused by the kernel's ptrace policy, or
    /// `BADF` for a descriptor it does not have).
    pub(crate) fn take_fd(&self, fd: i32) -> std::result::Result<OwnedFd, rustix::io::Errno> {
        rustix::process::pidfd_getfd(&self.pidfd, fd, rustix::process::PidfdGetfdFlags::empty())
    }
}
