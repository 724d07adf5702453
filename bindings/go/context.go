package courier

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sort"
	"sync/atomic"
	"unsafe"
)

// Feature is a set of features a context asks for.
type Feature uint64

// Features.
const (
	FeatureTag    Feature = C.COURIER_FEATURE_TAG
	FeatureAM     Feature = C.COURIER_FEATURE_AM
	FeatureStream Feature = C.COURIER_FEATURE_STREAM
	FeatureRMA    Feature = C.COURIER_FEATURE_RMA
	FeatureAMO    Feature = C.COURIER_FEATURE_AMO
	FeatureWakeup Feature = C.COURIER_FEATURE_WAKEUP
)

// ContextParams are the parameters of NewContext. The zero value asks for the library's
// defaults (tag, active messages, streams, wakeup).
type ContextParams struct {
	// Features asked for; 0 means the defaults.
	Features Feature
	// Name used in log lines.
	Name string
	// Overrides of COURIER_* variables, e.g. {"COURIER_TLS": "tcp"}.
	Config map[string]string
}

// EnableTag asks for tag-matched messages.
func (p *ContextParams) EnableTag() *ContextParams { p.Features |= FeatureTag; return p }

// EnableAM asks for active messages.
func (p *ContextParams) EnableAM() *ContextParams { p.Features |= FeatureAM; return p }

// EnableStream asks for streams.
func (p *ContextParams) EnableStream() *ContextParams { p.Features |= FeatureStream; return p }

// EnableRMA asks for remote memory access (MemMap, Put, Get).
func (p *ContextParams) EnableRMA() *ContextParams { p.Features |= FeatureRMA; return p }

// EnableAtomics asks for remote atomics (Endpoint.Atomic).
func (p *ContextParams) EnableAtomics() *ContextParams { p.Features |= FeatureAMO; return p }

// EnableWakeup asks for sleeping on the worker's event fd (Worker.Wait).
func (p *ContextParams) EnableWakeup() *ContextParams { p.Features |= FeatureWakeup; return p }

// SetName sets the log name.
func (p *ContextParams) SetName(name string) *ContextParams { p.Name = name; return p }

// SetConfig overrides one COURIER_* variable.
func (p *ContextParams) SetConfig(name, value string) *ContextParams {
	if p.Config == nil {
		p.Config = map[string]string{}
	}
	p.Config[name] = value
	return p
}

// Context is the root object: configuration and features shared by workers.
type Context struct {
	ptr    *C.courier_context_t
	closed atomic.Bool
}

// NewContext creates a context from the environment and params (nil: defaults).
func NewContext(params *ContextParams) (*Context, error) {
	var cp C.courier_context_params_t
	var frees []unsafe.Pointer
	defer func() {
		for _, f := range frees {
			C.free(f)
		}
	}()
	if params != nil {
		if params.Features != 0 {
			cp.field_mask |= C.COURIER_CONTEXT_FIELD_FEATURES
			cp.features = C.uint64_t(params.Features)
		}
		if params.Name != "" {
			cp.field_mask |= C.COURIER_CONTEXT_FIELD_NAME
			cp.name = C.CString(params.Name)
			frees = append(frees, unsafe.Pointer(cp.name))
		}
		if len(params.Config) > 0 {
			keys := make([]string, 0, len(params.Config))
			for k := range params.Config {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			n := len(keys)
			arr := (*[1 << 20]C.courier_config_entry_t)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.courier_config_entry_t{}))))[:n:n]
			frees = append(frees, unsafe.Pointer(&arr[0]))
			for i, k := range keys {
				arr[i].name = C.CString(k)
				arr[i].value = C.CString(params.Config[k])
				frees = append(frees, unsafe.Pointer(arr[i].name), unsafe.Pointer(arr[i].value))
			}
			cp.field_mask |= C.COURIER_CONTEXT_FIELD_CONFIG
			cp.config = &arr[0]
			cp.config_count = C.size_t(n)
		}
	}
	var ptr *C.courier_context_t
	if _, err := call(func() C.courier_status_t { return C.courier_context_create(&cp, &ptr) }); err != nil {
		return nil, err
	}
	c := &Context{ptr: ptr}
	runtime.SetFinalizer(c, (*Context).Close)
	return c, nil
}

// Name is the context's log name.
func (c *Context) Name() string {
	if c.closed.Load() {
		return ""
	}
	s := C.GoString(C.courier_context_name(c.ptr))
	runtime.KeepAlive(c)
	return s
}

// Close releases the context (workers made from it stay usable). Safe to call twice.
func (c *Context) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	runtime.SetFinalizer(c, nil)
	C.courier_context_destroy(c.ptr)

	return nil
}

// ConfigVar is one COURIER_* variable with its default and help.
type ConfigVar struct {
	Name, Default, Help string
}

// ConfigVars lists every COURIER_* variable.
func ConfigVars() []ConfigVar {
	n := int(C.courier_config_var_count())
	out := make([]ConfigVar, 0, n)
	for i := 0; i < n; i++ {
		var v C.courier_config_var_t
		if C.courier_config_var(C.size_t(i), &v) == C.COURIER_OK {
			out = append(out, ConfigVar{C.GoString(v.name), C.GoString(v.default_value), C.GoString(v.help)})
		}
	}
	return out
}
