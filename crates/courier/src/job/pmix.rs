//! PMIx (Open MPI's `mpirun`, `srun --mpi=pmix`): the PMIx client library loaded at run
//! time (`libpmix.so.2`, or the file `COURIER_PMIX_LIB` names), never linked. PMIx's wire
//! protocol is its own business; Courier only calls the library: `PMIx_Init`, `PMIx_Put`
//! (global scope, byte objects), `PMIx_Commit`, `PMIx_Fence` (collecting data),
//! `PMIx_Get`, `PMIx_Abort`, `PMIx_Finalize`. Struct layouts are PMIx 4's (checked below).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::Duration;

use super::{Info, Launcher, LauncherKind};
use crate::base::{Error, Result, Status};

/// The library loaded when `COURIER_PMIX_LIB` names none.
pub const DEFAULT_LIB: &str = "libpmix.so.2";

const NSPACE_LEN: usize = 256;
const KEY_LEN: usize = 512;
const RANK_WILDCARD: u32 = u32::MAX - 1;
const SCOPE_GLOBAL: u8 = 3;
const ERR_TIMEOUT: c_int = -24;
const ERR_NOT_FOUND: c_int = -46;

/// `pmix_data_type_t` values Courier reads or writes.
mod ty {
    pub const BOOL: u16 = 1;
    pub const SIZE: u16 = 4;
    pub const INT: u16 = 6;
    pub const INT8: u16 = 7;
    pub const INT16: u16 = 8;
    pub const INT32: u16 = 9;
    pub const INT64: u16 = 10;
    pub const UINT: u16 = 11;
    pub const UINT8: u16 = 12;
    pub const UINT16: u16 = 13;
    pub const UINT32: u16 = 14;
    pub const UINT64: u16 = 15;
    pub const BYTE_OBJECT: u16 = 27;
}

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Proc {
    nspace: [c_char; NSPACE_LEN],
    rank: u32,
}

/// `pmix_byte_object_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ByteObject {
    bytes: *mut c_char,
    size: usize,
}

/// `pmix_value_t`: a type tag and a union at offset 8.
#[repr(C)]
struct Value {
    ty: u16,
    data: ValueData,
}

#[repr(C)]
union ValueData {
    flag: bool,
    int: c_int,
    u8_: u8,
    u16_: u16,
    u32_: u32,
    u64_: u64,
    bo: ByteObject,
    raw: [u64; 3],
}

/// `pmix_info_t`.
#[repr(C)]
struct InfoT {
    key: [c_char; KEY_LEN],
    flags: u32,
    value: Value,
}

const _: () = {
    assert!(std::mem::size_of::<Proc>() == 260);
    assert!(std::mem::size_of::<ByteObject>() == 16);
    assert!(std::mem::size_of::<Value>() == 32);
    assert!(std::mem::offset_of!(Value, data) == 8);
    assert!(std::mem::size_of::<InfoT>() == 552);
    assert!(std::mem::offset_of!(InfoT, flags) == 512);
    assert!(std::mem::offset_of!(InfoT, value) == 520);
};

impl InfoT {
    fn new(key: &str, ty: u16, data: ValueData) -> InfoT {
        let mut k = [0 as c_char; KEY_LEN];
        for (d, s) in k.iter_mut().zip(key.bytes().take(KEY_LEN - 1)) {
            *d = s as c_char;
        }
        InfoT {
            key: k,
            flags: 0,
            value: Value { ty, data },
        }
    }
}

type InitFn = unsafe extern "C" fn(*mut Proc, *mut InfoT, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const InfoT, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const InfoT, usize) -> c_int;
type GetFn =
    unsafe extern "C" fn(*const Proc, *const c_char, *const InfoT, usize, *mut *mut Value) -> c_int;
type AbortFn = unsafe extern "C" fn(c_int, *const c_char, *mut Proc, usize) -> c_int;
type ErrStrFn = unsafe extern "C" fn(c_int) -> *const c_char;
type DestructFn = unsafe extern "C" fn(*mut Value);

struct Api {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    abort: AbortFn,
    error_string: ErrStrFn,
    value_destruct: DestructFn,
}

fn load() -> Result<(Api, String)> {
    let name = std::env::var("COURIER_PMIX_LIB")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_LIB.to_string());
    // SAFETY: loading the PMIx client library runs its initialisers, which only set up the
    // library's own state.
    let lib = unsafe { libloading::Library::new(&name) }.map_err(|e| {
        Error::msg(
            Status::Unsupported,
            format!(
                "this process was started by a PMIx launcher (PMIX_NAMESPACE is set, e.g. by mpirun), but the PMIx client library {name} cannot be loaded: {e}. Install it (Debian: apt-get install libpmix2) or name it with COURIER_PMIX_LIB"
            ),
        )
    })?;
    // The library stays loaded for the life of the process: PMIx starts threads that run
    // its code.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    macro_rules! sym {
        ($n:literal, $t:ty) => {{
            // SAFETY: the symbol has this C signature in PMIx 4 (pmix.h); the library is
            // never unloaded, so the pointer stays valid.
            let s: libloading::Symbol<'static, $t> = unsafe { lib.get($n) }.map_err(|e| {
                Error::msg(
                    Status::Unsupported,
                    format!(
                        "{name} lacks {}: {e} (Courier needs the PMIx 4 client API)",
                        String::from_utf8_lossy(&$n[..$n.len() - 1])
                    ),
                )
            })?;
            *s
        }};
    }
    let api = Api {
        init: sym!(b"PMIx_Init\0", InitFn),
        finalize: sym!(b"PMIx_Finalize\0", FinalizeFn),
        put: sym!(b"PMIx_Put\0", PutFn),
        commit: sym!(b"PMIx_Commit\0", CommitFn),
        fence: sym!(b"PMIx_Fence\0", FenceFn),
        get: sym!(b"PMIx_Get\0", GetFn),
        abort: sym!(b"PMIx_Abort\0", AbortFn),
        error_string: sym!(b"PMIx_Error_string\0", ErrStrFn),
        value_destruct: sym!(b"PMIx_Value_destruct\0", DestructFn),
    };
    Ok((api, name))
}

pub(super) struct Client {
    api: Api,
    me: Proc,
    /// Ranks in the job.
    size: u32,
    /// Fences entered so far: each puts a marker of its own (`courier-fence.N`) before it, so a
    /// fence that times out can ask which ranks put theirs (see `missing_at`).
    fences: u64,
}

/// How long a timed-out fence asks each rank for its marker.
const MARKER_WAIT: Duration = Duration::from_secs(1);
/// How long a timed-out fence spends asking in all, and how many missing ranks it names.
const MISSING_BUDGET: Duration = Duration::from_secs(8);
const MISSING_NAMED: usize = 16;

// SAFETY: the PMIx client library is thread-safe; `me` is plain data; calls are serialised
// by the job's lock anyway.
unsafe impl Send for Client {}

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Status::InvalidParam, "a job key with a NUL byte"))
}

impl Client {
    fn error(&self, rc: c_int, what: &str) -> Error {
        // SAFETY: PMIx_Error_string returns a static string for any status.
        let s = unsafe { (self.api.error_string)(rc) };
        let text = if s.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        let status = match rc {
            ERR_TIMEOUT => Status::Timeout,
            ERR_NOT_FOUND => Status::NoMessage,
            _ => Status::IoError,
        };
        Error::msg(status, format!("PMIx: {what}: {text} ({rc})"))
    }

    fn proc_of(&self, rank: u32) -> Proc {
        Proc {
            nspace: self.me.nspace,
            rank,
        }
    }

    /// A value of `rank`'s `key`, given to `f` before it is freed.
    fn with_value<T>(
        &self,
        rank: u32,
        key: &str,
        info: &[InfoT],
        f: impl FnOnce(&Value) -> Result<T>,
    ) -> Result<T> {
        let p = self.proc_of(rank);
        let k = cstr(key)?;
        let mut v: *mut Value = std::ptr::null_mut();
        // SAFETY: valid proc, NUL-terminated key, an info array of `info.len()` entries, and
        // an out pointer; PMIx allocates the value.
        let rc = unsafe { (self.api.get)(&p, k.as_ptr(), info.as_ptr(), info.len(), &mut v) };
        if rc != 0 {
            return Err(self.error(rc, &format!("get {key:?} of rank {rank}")));
        }
        if v.is_null() {
            return Err(Error::msg(
                Status::ProtocolError,
                format!("PMIx: get {key:?} of rank {rank} succeeded with no value"),
            ));
        }
        // SAFETY: PMIx returned a valid, initialised value it allocated with malloc.
        let r = f(unsafe { &*v });
        // SAFETY: destruct frees what the value owns, free the value itself (what
        // PMIX_VALUE_RELEASE does).
        unsafe {
            (self.api.value_destruct)(v);
            libc::free(v as *mut c_void);
        }
        r
    }

    fn get_u32(&self, rank: u32, key: &str) -> Result<u32> {
        self.with_value(rank, key, &[], |v| {
            // SAFETY: the member read is the one the type tag names.
            let n: u64 = unsafe {
                match v.ty {
                    ty::UINT8 => v.data.u8_ as u64,
                    ty::UINT16 => v.data.u16_ as u64,
                    ty::UINT32 | ty::UINT => v.data.u32_ as u64,
                    ty::UINT64 | ty::SIZE => v.data.u64_,
                    ty::INT | ty::INT32 => v.data.int.max(0) as u64,
                    ty::INT8 => (v.data.u8_ as i8).max(0) as u64,
                    ty::INT16 => (v.data.u16_ as i16).max(0) as u64,
                    ty::INT64 => (v.data.u64_ as i64).max(0) as u64,
                    other => {
                        return Err(Error::msg(
                            Status::ProtocolError,
                            format!("PMIx: {key} has type {other}, not an integer"),
                        ));
                    }
                }
            };
            u32::try_from(n).map_err(|_| {
                Error::msg(
                    Status::ProtocolError,
                    format!("PMIx: {key} = {n} is too large"),
                )
            })
        })
    }
}

impl Client {
    /// Put `value` under the full key `key` (global scope, a byte object).
    fn put_raw(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let k = cstr(key)?;
        let mut v = Value {
            ty: ty::BYTE_OBJECT,
            data: ValueData {
                bo: ByteObject {
                    bytes: value.as_ptr() as *mut c_char,
                    size: value.len(),
                },
            },
        };
        // SAFETY: PMIx_Put copies the value (it does not keep our pointer) and does not
        // write through it.
        let rc = unsafe { (self.api.put)(SCOPE_GLOBAL, k.as_ptr(), &mut v) };
        if rc != 0 {
            return Err(self.error(rc, &format!("put {key:?}")));
        }
        Ok(())
    }

    /// Which ranks did not put `marker` (the one each rank puts and commits as it enters
    /// a fence), as words for an error. PMIx's fence does not say who is missing, but a
    /// get of a key that was never committed waits and fails, while one that was is
    /// answered by the rank's host's server: each rank is asked for `MARKER_WAIT`, within
    /// `MISSING_BUDGET` in all, naming at most `MISSING_NAMED`.
    fn missing_at(&self, marker: &str) -> String {
        let key = marker;
        let info = [timeout_info(MARKER_WAIT)];
        let start = std::time::Instant::now();
        let mut missing = Vec::new();
        let mut asked = 0u32;
        for r in (0..self.size).filter(|&r| r != self.me.rank) {
            if start.elapsed() >= MISSING_BUDGET || missing.len() >= MISSING_NAMED {
                break;
            }
            asked += 1;
            if self.with_value(r, key, &info, |_| Ok(())).is_err() {
                missing.push(r.to_string());
            }
        }
        let all = asked + 1 >= self.size;
        match (missing.is_empty(), all) {
            (true, true) => {
                "every other rank had entered it (the fence itself timed out)".to_string()
            }
            (true, false) => {
                format!("the {asked} other ranks asked had entered it; the rest were not asked")
            }
            (false, true) => format!(
                "{} of {} ranks did not join it: {}",
                missing.len(),
                self.size,
                missing.join(", ")
            ),
            (false, false) => format!(
                "ranks that did not join it: {}, and maybe others (not all were asked)",
                missing.join(", ")
            ),
        }
    }
}

fn timeout_info(timeout: Duration) -> InfoT {
    let secs = timeout.as_secs_f64().ceil().clamp(1.0, i32::MAX as f64) as c_int;
    InfoT::new("pmix.timeout", ty::INT, ValueData { int: secs })
}

pub(super) fn connect() -> Result<(Client, Info)> {
    let (api, _name) = load()?;
    let mut me = Proc {
        nspace: [0; NSPACE_LEN],
        rank: 0,
    };
    // SAFETY: an out proc struct of PMIx's layout, no info.
    let rc = unsafe { (api.init)(&mut me, std::ptr::null_mut(), 0) };
    let mut c = Client {
        api,
        me,
        size: 0,
        fences: 0,
    };
    if rc != 0 {
        return Err(c.error(
            rc,
            "PMIx_Init (PMIX_NAMESPACE is set, but the launcher's PMIx server did not answer)",
        ));
    }
    let size = c.get_u32(RANK_WILDCARD, "pmix.job.size")?;
    c.size = size;
    let rank = c.me.rank;
    if size == 0 || rank >= size {
        return Err(Error::msg(
            Status::ProtocolError,
            format!("PMIx: rank {rank} of a job of {size}"),
        ));
    }
    let local_rank = c.get_u32(rank, "pmix.lrank").unwrap_or(rank);
    let local_size = c.get_u32(RANK_WILDCARD, "pmix.local.size").unwrap_or(size);
    let host = c.get_u32(rank, "pmix.nodeid").unwrap_or(0);
    // SAFETY: PMIx wrote a NUL-terminated namespace into the array (zeroed before).
    let jobid = unsafe { CStr::from_ptr(c.me.nspace.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let info = Info {
        kind: LauncherKind::Pmix,
        rank,
        size,
        local_rank,
        local_size: local_size.max(local_rank + 1),
        host,
        jobid,
    };
    Ok((c, info))
}

impl Launcher for Client {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.put_raw(&format!("courier.{key}"), value)
    }

    fn commit(&mut self) -> Result<()> {
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.commit)() };
        if rc != 0 {
            return Err(self.error(rc, "commit"));
        }
        Ok(())
    }

    fn fence(&mut self, timeout: Duration) -> Result<()> {
        self.fences += 1;
        // Outside `courier.*`, where the job's own keys live.
        let marker = format!("courier-fence.{}", self.fences);
        self.put_raw(&marker, &[1])?;
        self.commit()?;
        let info = [
            InfoT::new("pmix.collect", ty::BOOL, ValueData { flag: true }),
            timeout_info(timeout),
        ];
        // SAFETY: no procs (= all of this namespace), an info array of two entries.
        let rc = unsafe { (self.api.fence)(std::ptr::null(), 0, info.as_ptr(), info.len()) };
        if rc != 0 {
            let mut e = self.error(rc, "fence");
            if rc == ERR_TIMEOUT {
                e = Error::msg(
                    Status::Timeout,
                    format!(
                        "PMIx fence {}: not every rank reached it within {timeout:?}; {}",
                        self.fences,
                        self.missing_at(&marker)
                    ),
                );
            }
            return Err(e);
        }
        Ok(())
    }

    fn barrier(&mut self, timeout: Duration) -> Result<()> {
        let info = [timeout_info(timeout)];
        // SAFETY: as in fence, without data collection.
        let rc = unsafe { (self.api.fence)(std::ptr::null(), 0, info.as_ptr(), info.len()) };
        if rc != 0 {
            return Err(self.error(rc, "barrier"));
        }
        Ok(())
    }

    fn get(&mut self, rank: u32, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let info = [timeout_info(timeout)];
        self.with_value(rank, &format!("courier.{key}"), &info, |v| {
            if v.ty != ty::BYTE_OBJECT {
                return Err(Error::msg(
                    Status::ProtocolError,
                    format!("PMIx: rank {rank}'s {key:?} has type {}, not bytes", v.ty),
                ));
            }
            // SAFETY: the tag says the union holds a byte object.
            let bo = unsafe { v.data.bo };
            if bo.size == 0 {
                return Ok(Vec::new());
            }
            if bo.bytes.is_null() {
                return Err(Error::msg(
                    Status::ProtocolError,
                    format!(
                        "PMIx: rank {rank}'s {key:?} is {} bytes at a null pointer",
                        bo.size
                    ),
                ));
            }
            // SAFETY: PMIx owns `size` bytes at `bytes` until the value is freed.
            Ok(unsafe { std::slice::from_raw_parts(bo.bytes as *const u8, bo.size) }.to_vec())
        })
    }

    fn abort(&mut self, code: i32, message: &str) {
        let m = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: a NUL-terminated message; no procs = the whole namespace.
        unsafe {
            (self.api.abort)(code, m.as_ptr(), std::ptr::null_mut(), 0);
        }
    }

    fn finalize(&mut self) {
        // SAFETY: no info.
        unsafe {
            (self.api.finalize)(std::ptr::null(), 0);
        }
    }
}
