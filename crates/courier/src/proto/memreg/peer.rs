//! A same-host peer's memory as this process maps it: the peer's key table, which every
//! access is checked against, its regions' shared segments (taken only when the table's
//! record names them) and its device allocations opened through their IPC handles.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{
    MemRegistry, MemoryType, Record, SEGMENT_WORD, TABLE_BYTES, read_record, table_slot, word,
};
use crate::base::{Error, Result, Status};
use crate::transport::shm::memory::{Mapping, PeerProcess};
use crate::wire::keytable::{self, entry, header};
use crate::wire::rkey::{DeviceHandle, RkeyRepr};

/// A peer process's key table and region segments, mapped here.
pub(crate) struct PeerMaps {
    process: PeerProcess,
    pub(in crate::proto) table: Mapping,
    /// The device of the owner's key table: its region segments are memfds on the same
    /// file system.
    table_dev: u64,
    /// Mapped region segments by region id (never reused), not by fd number (which the
    /// owner's kernel reuses after an unmap), with the fd number they were checked under.
    regions: Mutex<HashMap<u64, (i32, Arc<Mapping>)>>,
    /// The owner's device allocations opened through their IPC handles, by region id, with
    /// the handle (regions in one allocation share its one opening).
    devices: Mutex<HashMap<u64, OpenedDevice>>,
}

/// Why `PeerMaps::segment` maps nothing.
pub(crate) enum SegmentRefusal {
    /// The key's fd is not the region's segment: refuse the key.
    Forged(Error),
    /// The segment cannot be mapped here (now): reach the region another way.
    Unavailable(Error),
}

/// A peer's device allocation opened here, with the IPC handle it was opened from.
type OpenedDevice = ([u8; 64], Arc<crate::base::cuda::IpcMapping>);

impl PeerMaps {
    /// Open the owner's device allocation holding region `region` (cached per region, and
    /// only while the owner's record describes that region). Its address here. Another
    /// live region in the same allocation (same handle) shares its opening: a driver opens
    /// a handle once per process. An owner in this very process (`own`) lends its
    /// allocation as it is.
    pub(crate) fn device_region(
        &self,
        driver: &'static crate::base::cuda::Driver,
        region: u64,
        handle: &DeviceHandle,
        own: bool,
    ) -> Result<Arc<crate::base::cuda::IpcMapping>> {
        let live = |id: u64| {
            self.record(id).is_some_and(|r| {
                r.valid == 1 && r.region == id && r.mem_type == MemoryType::Cuda.code() as u64
            })
        };
        let mut g = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, m)) = g.get(&region) {
            return Ok(m.clone());
        }
        if !live(region) {
            return Err(Error::new(
                Status::InvalidKey,
                "the device region is no longer mapped by its owner",
            ));
        }
        g.retain(|id, _| live(*id));
        let opened = g
            .values()
            .find(|(h, _)| *h == handle.handle)
            .map(|(_, m)| m.clone());
        let m = match opened {
            Some(m) => m,
            None => Arc::new(if own {
                driver.own_allocation(handle.alloc_base as usize)?
            } else {
                driver.ipc_open(&handle.handle)?
            }),
        };
        g.insert(region, (handle.handle, m.clone()));
        Ok(m)
    }

    /// The first two words (`valid`, then `region`) of region `region`'s record, which
    /// change only when the owner unmaps the region or gives its slot to another; valid
    /// as long as this table mapping is.
    pub(crate) fn record_head(&self, region: u64) -> Option<*const AtomicU64> {
        Some(word(self.table.ptr, table_slot(region)?, entry::VALID) as *const AtomicU64)
    }

    #[inline]
    pub(crate) fn record(&self, region: u64) -> Option<Record> {
        Some(read_record(self.table.ptr, table_slot(region)?))
    }

    /// Map the owner's segment of region `region` (memfd `fd`, `len` bytes), cached per
    /// region. The owner's record must still describe that region, so a segment is never
    /// taken for a region that was unmapped (and its fd number reused) meanwhile, and the
    /// descriptor taken must be the segment the record names: a key naming any other of
    /// the owner's descriptors (another region's segment, its key table, a file) is refused.
    pub(crate) fn region(&self, region: u64, fd: i32, len: usize) -> Result<Arc<Mapping>> {
        self.segment(region, fd, len).map_err(Error::from)
    }

    /// `region`, telling a forged key (its fd is not the region's segment) from a segment
    /// that cannot be mapped here now (region unmapped, descriptor not to be taken, key
    /// longer than the segment).
    pub(crate) fn segment(
        &self,
        region: u64,
        fd: i32,
        len: usize,
    ) -> std::result::Result<Arc<Mapping>, SegmentRefusal> {
        use SegmentRefusal::{Forged, Unavailable};
        let mut g = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, m)) = g.get(&region) {
            if *at == fd && m.len >= len {
                return Ok(m.clone());
            }
        }
        let live = || {
            self.record(region)
                .is_some_and(|r| r.valid == 1 && r.region == region)
        };
        let gone = || {
            Unavailable(Error::new(
                Status::InvalidKey,
                "the region is no longer mapped by its owner",
            ))
        };
        if !live() {
            return Err(gone());
        }
        // Regions the owner has unmapped are dropped from the cache as we go.
        g.retain(|id, _| {
            self.record(*id)
                .is_some_and(|r| r.valid == 1 && r.region == *id)
        });
        let forged = |what: &str| {
            Forged(Error::msg(
                Status::InvalidKey,
                format!(
                    "the key names descriptor {fd} of its owner, {what}, not the memory segment \
                     of region {region:#x} (forged key)"
                ),
            ))
        };
        if fd < 0 {
            return Err(forged("which does not exist"));
        }
        let local = match self.process.take_fd(fd) {
            Ok(f) => f,
            // No such descriptor while the region (and so its segment) is still there.
            Err(rustix::io::Errno::BADF) if live() => return Err(forged("which is not open")),
            Err(e) => {
                return Err(Unavailable(Error::msg(
                    Status::Unreachable,
                    format!("cannot take the peer's memory segment: {e}"),
                )));
            }
        };
        let st = rustix::fs::fstat(&local).map_err(|e| Unavailable(Error::io("fstat", e)))?;
        // Read after taking the descriptor: while the record still describes the region,
        // the segment it names is open in the owner, so its inode is not reused.
        if !live() {
            return Err(gone());
        }
        let slot = (region & 0xfff) as usize;
        let ino = word(self.table.ptr, slot, SEGMENT_WORD).load(Ordering::Acquire);
        if ino == 0 {
            return Err(forged("while the region has no shared segment"));
        }
        if st.st_ino as u64 != ino || st.st_dev as u64 != self.table_dev {
            return Err(forged("which is something else"));
        }
        let size = st.st_size as usize;
        if size < len {
            return Err(Unavailable(Error::new(
                Status::InvalidKey,
                "peer's memory segment is smaller than the key claims",
            )));
        }
        let m = Arc::new(Mapping::map_peer(&local, size, true).map_err(Unavailable)?);
        g.insert(region, (fd, m.clone()));
        Ok(m)
    }
}

impl From<SegmentRefusal> for Error {
    fn from(r: SegmentRefusal) -> Error {
        match r {
            SegmentRefusal::Forged(e) | SegmentRefusal::Unavailable(e) => e,
        }
    }
}

impl MemRegistry {
    /// Map a same-host peer's key table (cached per process and context).
    pub(crate) fn peer(&self, key: &RkeyRepr) -> Result<Arc<PeerMaps>> {
        let mut g = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = g.get(&(key.pid, key.ctx_id)) {
            return Ok(p.clone());
        }
        if key.table_fd < 0 {
            return Err(Error::new(
                Status::Unsupported,
                "the owner publishes no key table",
            ));
        }
        let process = PeerProcess::open(key.pid)?;
        let fd = process.take_fd(key.table_fd).map_err(|e| {
            Error::msg(
                Status::Unreachable,
                format!("pidfd_getfd refused ({e}); the kernel's ptrace policy forbids it"),
            )
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::io("fstat", e))?;
        let size = st.st_size as usize;
        if size != TABLE_BYTES {
            return Err(Error::new(
                Status::InvalidKey,
                "the key names something that is not a Courier key table",
            ));
        }
        // Read-only: a peer's table is read here, never written.
        let table = Mapping::map_peer(&fd, TABLE_BYTES, false)?;
        if word(table.ptr, 0, header::MAGIC).load(Ordering::Acquire) != keytable::MAGIC
            || word(table.ptr, 0, header::CTX_ID).load(Ordering::Acquire) != key.ctx_id
        {
            return Err(Error::new(
                Status::InvalidKey,
                "the key's owner is gone (its process id now belongs to something else)",
            ));
        }
        let p = Arc::new(PeerMaps {
            process,
            table,
            table_dev: st.st_dev as u64,
            regions: Mutex::new(HashMap::new()),
            devices: Mutex::new(HashMap::new()),
        });
        // Peers that exited meanwhile leave the cache with their mappings (remote keys
        // still unpacked from them keep theirs until dropped).
        g.retain(|_, m| !m.process.exited());
        g.insert((key.pid, key.ctx_id), p.clone());
        Ok(p)
    }

    /// Release the cached mappings of peers that exited (when a peer fails): their key
    /// tables and segments, so that peer churn grows neither descriptors nor maps.
    pub(crate) fn forget_exited_peers(&self) {
        let mut g = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        g.retain(|_, m| !m.process.exited());
    }
}
