//go:build !courier_system

package courier

// The library of the Courier checkout this package is in: target/release/libcourier.a,
// linked statically (also when another module uses this one through a `replace` directive
// that points here). Build with -tags courier_system to use an installed library instead.

/*
#cgo CFLAGS: -I${SRCDIR}/../../crates/courier-capi/include -I${SRCDIR}/../../target/release
#cgo LDFLAGS: ${SRCDIR}/../../target/release/libcourier.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc

// __has_include finds any file on the include path: say what to do, not a linker error.
#if !__has_include(<libcourier.a>)
#error "Courier's library is not built: run `make capi` in the Courier repository (or install Courier with `make install` and build with -tags courier_system)"
#endif
*/
import "C"
