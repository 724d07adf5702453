//! Put-with-signal: the macro that writes it for one element type (`list.rs` calls it)
//! and the untyped `shmem_putmem_signal`.

/// `shmem_T_put_signal` and `shmem_T_put_signal_nbi` (each also `shmem_ctx_...`) for
/// OpenSHMEM type name `$t` (also the module's name) and Rust type `$ty`; with `$bits`,
/// `shmem_putBITS_signal` and `shmem_putBITS_signal_nbi` in module `$m`.
macro_rules! signal_put {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            signal_put!(@fns [stringify!($t), "_put"], $ty, size_of::<$ty>());
        }
    };
    ($m:ident, $bits:literal, $ty:ty) => {
        pub mod $m {
            signal_put!(@fns ["put", $bits], $ty, size_of::<$ty>());
        }
    };
    (@fns [$($n:expr),+], $ty:ty, $size:expr) => {
        signal_put!(@one put_signal, ctx_put_signal, [$($n,)+ "_signal"], $ty, $size, false);
        signal_put!(
            @one put_signal_nbi, ctx_put_signal_nbi, [$($n,)+ "_signal_nbi"], $ty, $size, true
        );
    };
    (@one $f:ident, $cf:ident, [$($n:expr),+], $ty:ty, $size:expr, $nbi:literal) => {
        export_both!(
            $f, $cf, [$($n),+],
            (
                dest: *mut $ty,
                src: *const $ty,
                nelems: usize,
                sig_addr: *mut u64,
                signal: u64,
                sig_op: i32,
                pe: i32,
            ),
            |c| crate::signal::put_signal(
                N,
                c,
                dest.cast(),
                src.cast(),
                crate::typed::bytes(N, nelems, $size),
                sig_addr,
                signal,
                sig_op,
                pe,
                $nbi,
            )
        );
    };
}

signal_put!(@fns ["putmem"], std::ffi::c_void, 1);
