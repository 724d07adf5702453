//! Context: features, a log name, configuration overrides; and the configuration table.

use std::ffi::{CString, c_char};
use std::sync::OnceLock;

use courier_core::config::VARS;
use courier_core::{Context, ContextParams, Features};

use crate::ffi::*;
use crate::handle::*;
use crate::status::*;

/// Tag-matched messages.
pub const COURIER_FEATURE_TAG: u64 = 1 << 0;
/// Active messages.
pub const COURIER_FEATURE_AM: u64 = 1 << 1;
/// Streams.
pub const COURIER_FEATURE_STREAM: u64 = 1 << 2;
/// Remote memory access (put/get, `courier_mem_map`).
pub const COURIER_FEATURE_RMA: u64 = 1 << 3;
/// Remote atomics (`courier_ep_atomic`).
pub const COURIER_FEATURE_AMO: u64 = 1 << 4;
/// Sleeping on the worker's event fd (`courier_worker_arm` / `_wait`).
pub const COURIER_FEATURE_WAKEUP: u64 = 1 << 5;

/// `courier_context_params_t.features` is set (otherwise: tag, am, stream, wakeup).
pub const COURIER_CONTEXT_FIELD_FEATURES: u64 = 1 << 0;
/// `courier_context_params_t.name` is set.
pub const COURIER_CONTEXT_FIELD_NAME: u64 = 1 << 1;
/// `courier_context_params_t.config` and `config_count` are set.
pub const COURIER_CONTEXT_FIELD_CONFIG: u64 = 1 << 2;

const CONTEXT_FIELDS: u64 =
    COURIER_CONTEXT_FIELD_FEATURES | COURIER_CONTEXT_FIELD_NAME | COURIER_CONTEXT_FIELD_CONFIG;
const FEATURES: u64 = COURIER_FEATURE_TAG
    | COURIER_FEATURE_AM
    | COURIER_FEATURE_STREAM
    | COURIER_FEATURE_RMA
    | COURIER_FEATURE_AMO
    | COURIER_FEATURE_WAKEUP;

/// One `COURIER_*` configuration override.
#[repr(C)]
pub struct courier_config_entry_t {
    /// Variable name, e.g. `"COURIER_TLS"`.
    pub name: *const c_char,
    /// Value as it would be written in the environment, e.g. `"tcp"`.
    pub value: *const c_char,
}

/// Parameters of `courier_context_create`.
#[repr(C)]
pub struct courier_context_params_t {
    /// Which fields below are set (`COURIER_CONTEXT_FIELD_*`).
    pub field_mask: u64,
    /// `COURIER_FEATURE_*` bits.
    pub features: u64,
    /// Name used in log lines (copied).
    pub name: *const c_char,
    /// Overrides of the environment's `COURIER_*` values (copied).
    pub config: *const courier_config_entry_t,
    /// Number of entries in `config`.
    pub config_count: usize,
}

/// The root object: configuration and features shared by workers.
pub struct courier_context_t {
    pub(crate) ctx: Context,
    name: CString,
}
handle_kind!(courier_context_t, 1, "context");

fn features_from_mask(m: u64) -> Features {
    Features {
        tag: has(m, COURIER_FEATURE_TAG),
        am: has(m, COURIER_FEATURE_AM),
        stream: has(m, COURIER_FEATURE_STREAM),
        rma: has(m, COURIER_FEATURE_RMA),
        atomics: has(m, COURIER_FEATURE_AMO),
        wakeup: has(m, COURIER_FEATURE_WAKEUP),
    }
}

fn features_to_mask(f: Features) -> u64 {
    let mut m = 0;
    for (on, bit) in [
        (f.tag, COURIER_FEATURE_TAG),
        (f.am, COURIER_FEATURE_AM),
        (f.stream, COURIER_FEATURE_STREAM),
        (f.rma, COURIER_FEATURE_RMA),
        (f.atomics, COURIER_FEATURE_AMO),
        (f.wakeup, COURIER_FEATURE_WAKEUP),
    ] {
        if on {
            m |= bit;
        }
    }
    m
}

/// Create a context from the environment and `params` (NULL: all defaults).
/// `COURIER_ERR_INVALID_PARAM` for unknown bits in `field_mask` or `features`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_context_create(
    params: *const courier_context_params_t,
    context_out: *mut *mut courier_context_t,
) -> courier_status_t {
    boundary(|| {
        let out = out_arg(context_out, "context_out")?;
        let mut p = ContextParams::default();
        // SAFETY: NULL or a valid params struct.
        if let Some(params) = unsafe { params.as_ref() } {
            known_bits("context field_mask", params.field_mask, CONTEXT_FIELDS)?;
            if has(params.field_mask, COURIER_CONTEXT_FIELD_FEATURES) {
                known_bits("context features", params.features, FEATURES)?;
                p.features = features_from_mask(params.features);
            }
            if has(params.field_mask, COURIER_CONTEXT_FIELD_NAME) && !params.name.is_null() {
                // SAFETY: NULL (refused) or the caller's NUL-terminated string.
                p.name = Some(unsafe { str_arg(params.name, "params->name") }?.to_string());
            }
            if has(params.field_mask, COURIER_CONTEXT_FIELD_CONFIG) && params.config_count > 0 {
                // SAFETY: NULL (refused or defaulted) or the caller's valid params struct.
                let entries = unsafe { arg(params.config, "params->config") }?
                    as *const courier_config_entry_t;
                for i in 0..params.config_count {
                    // SAFETY: the caller promises `config_count` entries.
                    let e = unsafe { &*entries.add(i) };
                    // SAFETY: NULL (refused) or the caller's NUL-terminated string.
                    let name = unsafe { str_arg(e.name, "config[i].name") }?;
                    // SAFETY: NULL (refused) or the caller's NUL-terminated string.
                    let value = unsafe { str_arg(e.value, "config[i].value") }?;
                    p.config.push((name.to_string(), value.to_string()));
                }
            }
        }
        let ctx = Context::new(p)?;
        let name = CString::new(ctx.name().replace('\0', " ")).unwrap_or_default();
        let h = insert(courier_context_t { ctx, name })?;
        // SAFETY: `out` was checked non-NULL by out_arg; the caller's output pointer.
        unsafe { *out = h };
        Ok(COURIER_OK)
    })
}

/// Destroy a context. Workers made from it keep what they need and stay usable.
/// `COURIER_ERR_INVALID_HANDLE` (nothing done) for NULL or a context already destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_context_destroy(
    context: *mut courier_context_t,
) -> courier_status_t {
    boundary(|| {
        drop(remove(context, "context")?);
        Ok(COURIER_OK)
    })
}

/// The context's log name (valid while the context lives; "" for an invalid handle, with
/// the reason in `courier_last_error_detail()`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_context_name(context: *const courier_context_t) -> *const c_char {
    boundary_or(c"".as_ptr(), || match get(context, "context") {
        // The table holds the context until courier_context_destroy, so the name outlives
        // this reference.
        Ok(c) => c.name.as_ptr(),
        Err(e) => {
            record(&e);
            c"".as_ptr()
        }
    })
}

/// The `COURIER_FEATURE_*` bits the context was created with.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_context_features(
    context: *const courier_context_t,
    features_out: *mut u64,
) -> courier_status_t {
    boundary(|| {
        let c = get(context, "context")?;
        let out = out_arg(features_out, "features_out")?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe { *out = features_to_mask(c.ctx.features()) };
        Ok(COURIER_OK)
    })
}

/// One `COURIER_*` configuration variable as `courier info` lists it.
#[repr(C)]
pub struct courier_config_var_t {
    /// Full name, e.g. `COURIER_TLS`.
    pub name: *const c_char,
    /// Default value.
    pub default_value: *const c_char,
    /// One-line help.
    pub help: *const c_char,
}

struct VarStrings {
    name: CString,
    default: CString,
    help: CString,
}

static VAR_STRINGS: OnceLock<Vec<VarStrings>> = OnceLock::new();

fn var_strings() -> &'static [VarStrings] {
    VAR_STRINGS.get_or_init(|| {
        let c = |s: &str| CString::new(s).unwrap_or_default();
        VARS.iter()
            .map(|v| VarStrings {
                name: c(v.name),
                default: c(v.default),
                help: c(v.help),
            })
            .collect()
    })
}

/// Number of `COURIER_*` configuration variables.
#[unsafe(no_mangle)]
pub extern "C" fn courier_config_var_count() -> usize {
    boundary_or(0, || var_strings().len())
}

/// Variable `index` (0 ≤ index < `courier_config_var_count()`); the strings are static.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn courier_config_var(
    index: usize,
    var_out: *mut courier_config_var_t,
) -> courier_status_t {
    boundary(|| {
        let out = out_arg(var_out, "var_out")?;
        let v = var_strings().get(index).ok_or_else(|| {
            invalid(&format!(
                "configuration variable index {index} out of range"
            ))
        })?;
        // SAFETY: checked non-NULL by out_arg; the caller's output, as courier.h documents.
        unsafe {
            *out = courier_config_var_t {
                name: v.name.as_ptr(),
                default_value: v.default.as_ptr(),
                help: v.help.as_ptr(),
            }
        };
        Ok(COURIER_OK)
    })
}
