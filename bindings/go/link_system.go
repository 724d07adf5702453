//go:build courier_system

package courier

// The installed library, found by pkg-config (set PKG_CONFIG_PATH to PREFIX/lib/pkgconfig
// for a prefix pkg-config does not search); its rpath lets programs run without
// LD_LIBRARY_PATH. CGO_CFLAGS and CGO_LDFLAGS may add to it.

/*
#cgo pkg-config: courier
#if !__has_include(<courier.h>)
#error "courier.h not found: install Courier (make install PREFIX=...) and set PKG_CONFIG_PATH to PREFIX/lib/pkgconfig"
#endif
*/
import "C"
