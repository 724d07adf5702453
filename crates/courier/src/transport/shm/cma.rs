//! Cross-memory attach: reading and writing the peer's memory with `process_vm_readv` and
//! `process_vm_writev`.

use crate::base::{Error, Result, Status};

/// iovecs per system call (well under IOV_MAX).
const BATCH: usize = 64;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Text for an errno value.
pub(super) fn errno_text(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// Read 8 bytes at `addr` in process `pid`. `Err(errno)` if the kernel refuses.
pub(super) fn read_word(pid: u32, addr: u64) -> std::result::Result<u64, i32> {
    let mut v = 0u64;
    let local = libc::iovec {
        iov_base: (&raw mut v).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: `local` describes our own 8-byte variable; the remote side is checked by the
    // kernel against the peer's address space.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    match n {
        8 => Ok(v),
        n if n < 0 => Err(errno()),
        _ => Err(libc::EFAULT),
    }
}

/// Scatter/gather read of `remote` segments of process `pid` into `local` segments; copies
/// min(total local, total remote) bytes.
///
/// # Safety
/// Every `local` segment must be valid for writes of its length.
pub(super) unsafe fn read(pid: u32, local: &[(usize, usize)], remote: &[(u64, u64)]) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { vectored(pid, local, remote, false) }
}

/// Scatter/gather write of `local` segments into `remote` segments of process `pid`; copies
/// min(total local, total remote) bytes.
///
/// # Safety
/// Every `local` segment must be valid for reads of its length.
pub(super) unsafe fn write(
    pid: u32,
    local: &[(usize, usize)],
    remote: &[(u64, u64)],
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { vectored(pid, local, remote, true) }
}

/// # Safety
/// Every `local` segment must be valid for writes (`write == false`) or reads of its length.
unsafe fn vectored(
    pid: u32,
    local: &[(usize, usize)],
    remote: &[(u64, u64)],
    write: bool,
) -> Result<()> {
    for &(a, l) in remote {
        if a.checked_add(l).is_none() || usize::try_from(a.saturating_add(l)).is_err() {
            return Err(Error::msg(
                Status::OutOfRange,
                format!("remote segment {a:#x}+{l} overflows the address space"),
            ));
        }
    }
    let (mut li, mut lo) = (0usize, 0usize);
    let (mut ri, mut ro) = (0usize, 0u64);
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut liov = [empty; BATCH];
    let mut riov = [empty; BATCH];
    loop {
        // Fill a batch from both cursors, skipping empty segments.
        let (mut ln, mut lsum) = (0usize, 0usize);
        let (mut i, mut off) = (li, lo);
        while ln < BATCH && i < local.len() {
            let (a, l) = local[i];
            if l > off {
                liov[ln] = libc::iovec {
                    iov_base: (a + off) as *mut libc::c_void,
                    iov_len: l - off,
                };
                ln += 1;
                lsum += l - off;
            }
            i += 1;
            off = 0;
        }
        let (mut rn, mut rsum) = (0usize, 0usize);
        let (mut i, mut off) = (ri, ro);
        while rn < BATCH && i < remote.len() {
            let (a, l) = remote[i];
            if l > off {
                let len = (l - off) as usize;
                riov[rn] = libc::iovec {
                    iov_base: (a + off) as usize as *mut libc::c_void,
                    iov_len: len,
                };
                rn += 1;
                rsum += len;
            }
            i += 1;
            off = 0;
        }
        if lsum == 0 || rsum == 0 {
            return Ok(());
        }
        // SAFETY: local iovecs lie in segments the caller vouches for; the kernel checks the
        // remote ones against the peer's address space.
        let got = unsafe {
            if write {
                libc::process_vm_writev(
                    pid as libc::pid_t,
                    liov.as_ptr(),
                    ln as _,
                    riov.as_ptr(),
                    rn as _,
                    0,
                )
            } else {
                libc::process_vm_readv(
                    pid as libc::pid_t,
                    liov.as_ptr(),
                    ln as _,
                    riov.as_ptr(),
                    rn as _,
                    0,
                )
            }
        };
        if got < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(map_errno(pid, e, write));
        }
        if got == 0 {
            return Err(map_errno(pid, libc::EFAULT, write));
        }
        // Advance both cursors by `got` bytes.
        let mut left = got as usize;
        while left > 0 && li < local.len() {
            let avail = local[li].1 - lo;
            let step = avail.min(left);
            lo += step;
            left -= step;
            if lo == local[li].1 {
                li += 1;
                lo = 0;
            }
        }
        let mut left = got as u64;
        while left > 0 && ri < remote.len() {
            let avail = remote[ri].1 - ro;
            let step = avail.min(left);
            ro += step;
            left -= step;
            if ro == remote[ri].1 {
                ri += 1;
                ro = 0;
            }
        }
    }
}

fn map_errno(pid: u32, e: i32, write: bool) -> Error {
    match e {
        libc::EFAULT => Error::msg(
            Status::OutOfRange,
            format!("remote address not mapped in peer (pid {pid})"),
        ),
        libc::ESRCH => Error::msg(Status::PeerFailure, format!("shm peer (pid {pid}) is gone")),
        _ => Error::msg(
            Status::IoError,
            format!(
                "{} pid {pid}: {}",
                if write {
                    "process_vm_writev to"
                } else {
                    "process_vm_readv from"
                },
                errno_text(e)
            ),
        ),
    }
}

/// Copy `len` bytes between `local` in this process and `remote` in process `pid`, in
/// either direction, looping over partial transfers.
fn contiguous(pid: u32, local: usize, len: usize, remote: u64, write: bool) -> Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            iov_base: (local + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the caller vouches for the local range; the kernel checks the remote one.
        let got = unsafe {
            if write {
                libc::process_vm_writev(pid as libc::pid_t, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0)
            }
        };
        if got < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(map_errno(pid, e, write));
        }
        if got == 0 {
            return Err(map_errno(pid, libc::EFAULT, write));
        }
        done += got as usize;
    }
    Ok(())
}

/// Read `len` bytes at `remote` in process `pid` into `local`.
///
/// # Safety
/// `local` must be valid for writes of `len` bytes.
pub(crate) unsafe fn read_contiguous(
    pid: u32,
    local: usize,
    len: usize,
    remote: u64,
) -> Result<()> {
    contiguous(pid, local, len, remote, false)
}

/// Write `len` bytes from `local` to `remote` in process `pid`.
pub(crate) fn write_contiguous(pid: u32, local: usize, len: usize, remote: u64) -> Result<()> {
    contiguous(pid, local, len, remote, true)
}
