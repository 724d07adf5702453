//! The CUDA driver, loaded at run time (never linked): `libcuda.so.1`, or the library
//! `COURIER_CUDA_LIB` names.
//!
//! Courier has no build-time CUDA dependency. The driver is loaded once per process, the
//! first time CUDA memory is asked for (`mem_map` with memory type `cuda`), or when a
//! context is created in a process that has already loaded the driver itself (it may then
//! hand Courier device pointers it allocated on its own). Where the driver or a device is
//! missing, asking for CUDA memory gives a clear error naming what is missing.
//!
//! Once the driver is loaded, every buffer an operation is given is looked at: device
//! memory is staged through host memory (see `proto::stage`), because neither the CPU nor
//! the kernel (CMA, sockets) can touch it. Copies go through one private non-blocking
//! stream and are waited for before Courier goes on, so data a copy wrote is in place
//! before any completion, acknowledgement or signal that follows it.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Error, Status};

type CuResult = c_int;
type CuDevicePtr = u64;
type CuContext = *mut c_void;
type CuStream = *mut c_void;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
const ATTR_MEMORY_TYPE: c_uint = 2;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
const ATTR_IS_MANAGED: c_uint = 8;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// The driver entry points Courier uses (names as exported by `libcuda.so.1`).
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, c_int) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_push_current: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    htod_async: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult,
    dtoh_async: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult,
    dtod_async: unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_uint, CuDevicePtr) -> CuResult,
    mem_get_address_range:
        unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// The IPC calls (same-host peers map each other's device memory); absent in drivers
    /// without them, which then reach device memory through its owner only.
    ipc: Option<IpcApi>,
    /// `cuMemHostAlloc`: page-locked host memory for staging buffers (kept for the
    /// process's life, so never freed); absent, staging uses plain memory.
    host_alloc: Option<unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult>,
}

/// `CU_MEMHOSTALLOC_PORTABLE`: page-locked for every context, not only the current one.
const HOSTALLOC_PORTABLE: c_uint = 1;

/// `CUipcMemHandle`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct IpcHandle([u8; 64]);

struct IpcApi {
    get: unsafe extern "C" fn(*mut IpcHandle, CuDevicePtr) -> CuResult,
    open: unsafe extern "C" fn(*mut CuDevicePtr, IpcHandle, c_uint) -> CuResult,
    close: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
const IPC_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// The loaded driver, its first device's primary context and Courier's copy stream.
pub struct Driver {
    api: Api,
    ctx: CuContext,
    stream: CuStream,
    /// Library that was loaded.
    pub library: String,
    /// Devices the driver sees.
    pub devices: i32,
    /// The first device's name.
    pub device_name: String,
    /// Driver version, e.g. 12040.
    pub version: i32,
}

// SAFETY: the context and stream handles are process-wide driver objects, usable from any
// thread once that thread makes the context current (`Driver::current` does).
unsafe impl Send for Driver {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<Result<Driver, Error>> = OnceLock::new();
/// Set once the driver has loaded: from then on, buffers are checked for device memory.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether the driver is loaded in this process (one relaxed load: the cost of the check
/// on every operation when CUDA is not in use).
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a valid C string or null.
    let why = unsafe { libc::dlerror() };
    if why.is_null() {
        "not found".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated, owned by libc until the next dl call.
        unsafe { CStr::from_ptr(why) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Load the driver from `lib` (once per process; later calls return the first result,
/// whatever library they name).
pub fn load(lib: &str) -> Result<&'static Driver, Error> {
    let r = DRIVER.get_or_init(|| {
        let d = Driver::open(lib)?;
        ACTIVE.store(true, Ordering::Release);
        tracing::info!(
            "cuda: {} device(s), device 0 is {}, driver {} ({})",
            d.devices,
            d.device_name,
            d.version,
            d.library
        );
        Ok(d)
    });
    r.as_ref().map_err(|e| e.clone())
}

/// The driver, if it is loaded.
pub fn loaded() -> Option<&'static Driver> {
    DRIVER.get().and_then(|r| r.as_ref().ok())
}

/// Load the driver now if the application has already loaded `lib` itself (it uses CUDA,
/// so it may give Courier device pointers). Never loads a library that is not in memory.
pub fn adopt_if_present(lib: &str) {
    if DRIVER.get().is_some() {
        return;
    }
    let Ok(name) = CString::new(lib) else { return };
    // SAFETY: dlopen with a valid C string; RTLD_NOLOAD only looks, and the reference it
    // takes on a library already loaded is dropped at once.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return;
    }
    // SAFETY: a handle dlopen just returned.
    unsafe { libc::dlclose(h) };
    if let Err(e) = load(lib) {
        tracing::info!("cuda: the process has {lib} loaded, but: {e}");
    }
}

/// A function pointer of type `F` from a symbol's address.
///
/// # Safety
/// `F` must be an `extern "C"` function pointer type matching the symbol.
unsafe fn fn_from<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the type per the contract.
    unsafe { std::mem::transmute_copy(&p) }
}

impl Driver {
    fn open(lib: &str) -> Result<Driver, Error> {
        let name = CString::new(lib)
            .map_err(|_| Error::new(Status::InvalidParam, "COURIER_CUDA_LIB contains a NUL"))?;
        // SAFETY: dlopen with a valid C string; the handle is kept for the process's life.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(Error::msg(
                Status::NoDevice,
                format!(
                    "memory type cuda needs the CUDA driver, and {lib} could not be loaded: {}",
                    dl_error()
                ),
            ));
        }
        let sym = |s: &CStr| -> Result<*mut c_void, Error> {
            // SAFETY: symbol lookup in a loaded library.
            let p = unsafe { libc::dlsym(h, s.as_ptr()) };
            if p.is_null() {
                Err(Error::msg(
                    Status::NoDevice,
                    format!(
                        "{lib} lacks {} (not a CUDA driver, or one too old)",
                        s.to_string_lossy()
                    ),
                ))
            } else {
                Ok(p)
            }
        };
        macro_rules! f {
            ($name:literal) => {
                // SAFETY: the symbol has the signature of the field it is stored in, as
                // declared by the CUDA driver API for that exported name.
                unsafe { fn_from(sym($name)?) }
            };
        }
        let api = Api {
            init: f!(c"cuInit"),
            driver_get_version: f!(c"cuDriverGetVersion"),
            device_get_count: f!(c"cuDeviceGetCount"),
            device_get: f!(c"cuDeviceGet"),
            device_get_name: f!(c"cuDeviceGetName"),
            primary_ctx_retain: f!(c"cuDevicePrimaryCtxRetain"),
            ctx_get_current: f!(c"cuCtxGetCurrent"),
            ctx_set_current: f!(c"cuCtxSetCurrent"),
            ctx_push_current: f!(c"cuCtxPushCurrent_v2"),
            ctx_pop_current: f!(c"cuCtxPopCurrent_v2"),
            stream_create: f!(c"cuStreamCreate"),
            stream_synchronize: f!(c"cuStreamSynchronize"),
            mem_alloc: f!(c"cuMemAlloc_v2"),
            mem_free: f!(c"cuMemFree_v2"),
            htod_async: f!(c"cuMemcpyHtoDAsync_v2"),
            dtoh_async: f!(c"cuMemcpyDtoHAsync_v2"),
            dtod_async: f!(c"cuMemcpyDtoDAsync_v2"),
            pointer_get_attribute: f!(c"cuPointerGetAttribute"),
            mem_get_address_range: f!(c"cuMemGetAddressRange_v2"),
            get_error_name: f!(c"cuGetErrorName"),
            ipc: (|| {
                Some(IpcApi {
                    // SAFETY: as for `f!`.
                    get: unsafe { fn_from(sym(c"cuIpcGetMemHandle").ok()?) },
                    // SAFETY: as above.
                    open: unsafe { fn_from(sym(c"cuIpcOpenMemHandle_v2").ok()?) },
                    // SAFETY: as above.
                    close: unsafe { fn_from(sym(c"cuIpcCloseMemHandle").ok()?) },
                })
            })(),
            // SAFETY: as for `f!`.
            host_alloc: sym(c"cuMemHostAlloc").ok().map(|p| unsafe { fn_from(p) }),
        };
        let mut d = Driver {
            api,
            ctx: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            library: lib.to_string(),
            devices: 0,
            device_name: String::new(),
            version: 0,
        };
        // SAFETY: plain driver calls with valid out pointers.
        unsafe {
            let rc = (d.api.init)(0);
            if rc != 0 {
                return Err(Error::msg(
                    Status::NoDevice,
                    format!(
                        "cuInit failed: {} (no usable GPU or driver)",
                        d.error_name(rc)
                    ),
                ));
            }
            let mut version = 0;
            d.check(
                (d.api.driver_get_version)(&mut version),
                "cuDriverGetVersion",
            )?;
            d.version = version;
            let rc = (d.api.device_get_count)(&mut d.devices);
            if rc != 0 || d.devices <= 0 {
                return Err(Error::new(
                    Status::NoDevice,
                    "the CUDA driver sees no device",
                ));
            }
            let mut dev = 0;
            d.check((d.api.device_get)(&mut dev, 0), "cuDeviceGet")?;
            let mut name = [0 as c_char; 128];
            if (d.api.device_get_name)(name.as_mut_ptr(), name.len() as c_int, dev) == 0 {
                name[name.len() - 1] = 0;
                d.device_name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            }
            let mut ctx: CuContext = std::ptr::null_mut();
            d.check(
                (d.api.primary_ctx_retain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            d.ctx = ctx;
            let stream = d.in_ctx(|| {
                let mut stream: CuStream = std::ptr::null_mut();
                d.check(
                    (d.api.stream_create)(&mut stream, STREAM_NON_BLOCKING),
                    "cuStreamCreate",
                )?;
                Ok(stream)
            })?;
            d.stream = stream;
        }
        Ok(d)
    }

    fn error_name(&self, rc: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: valid out pointer; the driver returns a static string.
        if unsafe { (self.api.get_error_name)(rc, &mut p) } == 0 && !p.is_null() {
            // SAFETY: a static NUL-terminated string of the driver's.
            let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            format!("{s} ({rc})")
        } else {
            format!("CUDA error {rc}")
        }
    }

    fn check(&self, rc: CuResult, what: &str) -> Result<(), Error> {
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::msg(
                Status::IoError,
                format!("{what} failed: {}", self.error_name(rc)),
            ))
        }
    }

    /// Run `f` with Courier's context current on this thread. A thread with no current
    /// context adopts it (nothing of the application's is disturbed); one where the
    /// application made another context current gets ours pushed for the call and its
    /// own back after.
    fn in_ctx<T>(&self, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
        let mut cur: CuContext = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let rc = unsafe { (self.api.ctx_get_current)(&mut cur) };
        if rc == 0 && cur == self.ctx {
            return f();
        }
        if rc != 0 || cur.is_null() {
            // SAFETY: our retained primary context.
            self.check(
                unsafe { (self.api.ctx_set_current)(self.ctx) },
                "cuCtxSetCurrent",
            )?;
            return f();
        }
        // SAFETY: as above; popped below.
        self.check(
            unsafe { (self.api.ctx_push_current)(self.ctx) },
            "cuCtxPushCurrent",
        )?;
        let r = f();
        let mut ours: CuContext = std::ptr::null_mut();
        // SAFETY: valid out pointer; pops what we pushed.
        let popped = unsafe { (self.api.ctx_pop_current)(&mut ours) };
        let v = r?;
        self.check(popped, "cuCtxPopCurrent")?;
        Ok(v)
    }

    /// Whether `addr` is device memory (not managed memory, which the CPU may touch).
    pub fn is_device(&self, addr: usize) -> bool {
        if addr == 0 {
            return false;
        }
        let mut t: c_uint = 0;
        // SAFETY: a 4-byte out value for CU_POINTER_ATTRIBUTE_MEMORY_TYPE. Host memory the
        // driver does not know answers with an error, which means "not device memory".
        let rc = unsafe {
            (self.api.pointer_get_attribute)(
                (&mut t as *mut c_uint).cast(),
                ATTR_MEMORY_TYPE,
                addr as u64,
            )
        };
        if rc != 0 || t != MEMORYTYPE_DEVICE {
            return false;
        }
        // Room for the driver's boolean whatever width it writes.
        let mut managed = 0u64;
        // SAFETY: as above, 8 writable bytes.
        let rc = unsafe {
            (self.api.pointer_get_attribute)(
                (&mut managed as *mut u64).cast(),
                ATTR_IS_MANAGED,
                addr as u64,
            )
        };
        rc != 0 || managed == 0
    }

    /// The device allocation holding `addr`: (base, length).
    pub fn allocation_of(&self, addr: usize) -> Result<(usize, usize), Error> {
        self.in_ctx(|| {
            let (mut base, mut len) = (0u64, 0usize);
            // SAFETY: valid out pointers.
            let rc = unsafe { (self.api.mem_get_address_range)(&mut base, &mut len, addr as u64) };
            self.check(rc, "cuMemGetAddressRange")?;
            Ok((base as usize, len))
        })
    }

    /// Allocate `len` bytes of device memory.
    pub fn alloc(&'static self, len: usize) -> Result<DeviceAlloc, Error> {
        let p = self.in_ctx(|| {
            let mut p = 0u64;
            // SAFETY: valid out pointer.
            let rc = unsafe { (self.api.mem_alloc)(&mut p, len.max(1)) };
            if rc != 0 {
                return Err(Error::msg(
                    Status::NoMemory,
                    format!("cuMemAlloc of {len} bytes failed: {}", self.error_name(rc)),
                ));
            }
            Ok(p)
        })?;
        Ok(DeviceAlloc {
            ptr: p as usize,
            driver: self,
        })
    }

    /// Run an asynchronous copy on Courier's stream and wait for it.
    fn copy(&self, what: &str, start: impl FnOnce(CuStream) -> CuResult) -> Result<(), Error> {
        self.in_ctx(|| {
            self.check(start(self.stream), what)?;
            // SAFETY: our stream.
            self.check(
                unsafe { (self.api.stream_synchronize)(self.stream) },
                "cuStreamSynchronize",
            )
        })
    }

    /// Run `f` with Courier's context current and a `Copies` that starts copies on
    /// Courier's stream without waiting for them, so that the CPU works on while the
    /// device copies. Every copy `f` started is waited for before this returns, also when
    /// `f` fails: the memory they touch may be reused as soon as this returns.
    pub fn overlapped<T>(
        &self,
        f: impl FnOnce(&Copies<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.in_ctx(|| {
            let r = f(&Copies { driver: self });
            // SAFETY: our stream.
            let waited = self.check(
                unsafe { (self.api.stream_synchronize)(self.stream) },
                "cuStreamSynchronize",
            );
            let v = r?;
            waited?;
            Ok(v)
        })
    }

    /// Copy `len` bytes from host memory at `src` to device memory at `dst`; returns when
    /// the bytes are in place.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes; `dst` must be device memory of `len` bytes.
    pub unsafe fn to_device(&self, dst: usize, src: *const u8, len: usize) -> Result<(), Error> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per the contract.
        self.copy("cuMemcpyHtoDAsync", |s| unsafe {
            (self.api.htod_async)(dst as u64, src.cast(), len, s)
        })
    }

    /// Copy `len` bytes from device memory at `src` to host memory at `dst`.
    ///
    /// # Safety
    /// `dst` must be writable for `len` bytes; `src` must be device memory of `len` bytes.
    pub unsafe fn to_host(&self, dst: *mut u8, src: usize, len: usize) -> Result<(), Error> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per the contract.
        self.copy("cuMemcpyDtoHAsync", |s| unsafe {
            (self.api.dtoh_async)(dst.cast(), src as u64, len, s)
        })
    }

    /// Copy `len` bytes between two device buffers.
    ///
    /// # Safety
    /// Both must be device memory of `len` bytes.
    pub unsafe fn device_to_device(&self, dst: usize, src: usize, len: usize) -> Result<(), Error> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per the contract.
        self.copy("cuMemcpyDtoDAsync", |s| unsafe {
            (self.api.dtod_async)(dst as u64, src as u64, len, s)
        })
    }
}

/// Copies started on Courier's stream inside `Driver::overlapped`, each in order after the
/// ones before it; `wait` returns when all of them are done.
pub struct Copies<'a> {
    driver: &'a Driver,
}

impl Copies<'_> {
    /// Start copying `len` bytes from host memory at `src` to device memory at `dst`.
    ///
    /// # Safety
    /// As `Driver::to_device`, and `src` must stay unchanged until `wait` (or the end of
    /// `overlapped`) returns.
    pub unsafe fn to_device(&self, dst: usize, src: *const u8, len: usize) -> Result<(), Error> {
        let d = self.driver;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per the contract.
        let rc = unsafe { (d.api.htod_async)(dst as u64, src.cast(), len, d.stream) };
        d.check(rc, "cuMemcpyHtoDAsync")
    }

    /// Start copying `len` bytes from device memory at `src` to host memory at `dst`.
    ///
    /// # Safety
    /// As `Driver::to_host`, and `dst` must not be read or written until `wait` (or the end
    /// of `overlapped`) returns.
    pub unsafe fn to_host(&self, dst: *mut u8, src: usize, len: usize) -> Result<(), Error> {
        let d = self.driver;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per the contract.
        let rc = unsafe { (d.api.dtoh_async)(dst.cast(), src as u64, len, d.stream) };
        d.check(rc, "cuMemcpyDtoHAsync")
    }

    /// Wait for every copy started so far.
    pub fn wait(&self) -> Result<(), Error> {
        let d = self.driver;
        // SAFETY: our stream.
        d.check(
            unsafe { (d.api.stream_synchronize)(d.stream) },
            "cuStreamSynchronize",
        )
    }
}

impl Driver {
    /// `len` bytes of page-locked host memory, zeroed, or why not: copies between it and
    /// the device run as one DMA transfer, with no bounce through the driver's own buffers.
    pub fn pinned_alloc(&self, len: usize) -> Result<*mut u8, Error> {
        let alloc = self.api.host_alloc.ok_or_else(|| {
            Error::new(
                Status::Unsupported,
                "this CUDA driver has no cuMemHostAlloc",
            )
        })?;
        let p = self.in_ctx(|| {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out pointer.
            let rc = unsafe { alloc(&mut p, len.max(1), HOSTALLOC_PORTABLE) };
            self.check(rc, "cuMemHostAlloc")?;
            Ok(p.cast::<u8>())
        })?;
        // SAFETY: `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(p, 0, len) };
        Ok(p)
    }

    fn ipc(&self) -> Result<&IpcApi, Error> {
        self.api
            .ipc
            .as_ref()
            .ok_or_else(|| Error::new(Status::Unsupported, "this CUDA driver has no IPC calls"))
    }

    /// The IPC handle of the device allocation that starts at `base`, for a same-host peer.
    pub fn ipc_handle(&self, base: usize) -> Result<[u8; 64], Error> {
        let ipc = self.ipc()?;
        self.in_ctx(|| {
            let mut h = IpcHandle([0; 64]);
            // SAFETY: valid out pointer.
            self.check(
                unsafe { (ipc.get)(&mut h, base as u64) },
                "cuIpcGetMemHandle",
            )?;
            Ok(h.0)
        })
    }

    /// Map a same-host peer's device allocation from its IPC handle; its address here.
    pub fn ipc_open(&'static self, handle: &[u8; 64]) -> Result<IpcMapping, Error> {
        let ipc = self.ipc()?;
        let ptr = self.in_ctx(|| {
            let mut p = 0u64;
            // SAFETY: valid out pointer; the handle is passed by value as the API wants.
            let rc = unsafe { (ipc.open)(&mut p, IpcHandle(*handle), IPC_LAZY_ENABLE_PEER_ACCESS) };
            self.check(rc, "cuIpcOpenMemHandle")?;
            Ok(p)
        })?;
        let mut m = IpcMapping {
            ptr: ptr as usize,
            len: 0,
            driver: self,
            opened: true,
        };
        m.len = self.allocation_of(m.ptr)?.1;
        Ok(m)
    }

    /// The device allocation that starts at `base` in this very process (another context
    /// of it owns the region): usable as it is, since a process cannot open its own IPC
    /// handles. Refused unless `base` starts an allocation the driver knows.
    pub fn own_allocation(&'static self, base: usize) -> Result<IpcMapping, Error> {
        let (start, len) = self.allocation_of(base)?;
        if start != base {
            return Err(Error::new(
                Status::InvalidKey,
                "the key's device allocation does not start where it says",
            ));
        }
        Ok(IpcMapping {
            ptr: base,
            len,
            driver: self,
            opened: false,
        })
    }
}

/// A peer's device allocation mapped here through its IPC handle (closed on drop), or,
/// when the peer is this process, the allocation itself.
pub struct IpcMapping {
    /// Where the allocation starts in this process.
    pub ptr: usize,
    /// Its length.
    pub len: usize,
    driver: &'static Driver,
    /// Opened from an IPC handle (and so to be closed).
    opened: bool,
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let d = self.driver;
        if !self.opened {
            return;
        }
        if let Ok(ipc) = d.ipc() {
            // SAFETY: a mapping we opened, closed once.
            let r = d.in_ctx(|| {
                d.check(
                    unsafe { (ipc.close)(self.ptr as u64) },
                    "cuIpcCloseMemHandle",
                )
            });
            if let Err(e) = r {
                tracing::warn!("closing a peer's device memory at {:#x}: {e}", self.ptr);
            }
        }
    }
}

/// Device memory Courier allocated; freed on drop.
pub struct DeviceAlloc {
    /// Device address.
    pub ptr: usize,
    driver: &'static Driver,
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: an allocation of ours, freed once.
        let r = d.in_ctx(|| d.check(unsafe { (d.api.mem_free)(self.ptr as u64) }, "cuMemFree"));
        if let Err(e) = r {
            tracing::warn!("freeing device memory at {:#x}: {e}", self.ptr);
        }
    }
}

/// Whether `addr` is device memory. Costs one relaxed load when the driver is not loaded.
#[inline]
pub fn is_device(addr: usize) -> bool {
    active() && loaded().is_some_and(|d| d.is_device(addr))
}
