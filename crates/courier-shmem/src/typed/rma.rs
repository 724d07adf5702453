//! Puts, gets, `p`/`g`, strided and `_nbi` forms: the macros that write them for one
//! element type (`list.rs` calls them), and the untyped `mem` forms.

/// The blocking, `_nbi` and strided puts and gets of elements of type `$ty`, plain and
/// with a context; each `[...]` is a C name after `shmem_` (or `shmem_ctx_`), in pieces.
macro_rules! rma_ops {
    ($ty:ty, $put:tt, $get:tt, $put_nbi:tt, $get_nbi:tt, $iput:tt, $iget:tt) => {
        rma_ops!(@contig $ty, put, ctx_put, $put, put, false);
        rma_ops!(@contig $ty, get, ctx_get, $get, get, false);
        rma_ops!(@contig $ty, put_nbi, ctx_put_nbi, $put_nbi, put, true);
        rma_ops!(@contig $ty, get_nbi, ctx_get_nbi, $get_nbi, get, true);
        rma_ops!(@strided $ty, iput, ctx_iput, $iput);
        rma_ops!(@strided $ty, iget, ctx_iget, $iget);
    };
    (@contig $ty:ty, $f:ident, $cf:ident, [$($n:expr),+], $op:ident, $nbi:literal) => {
        export_both!(
            $f, $cf, [$($n),+],
            (dest: *mut $ty, src: *const $ty, nelems: usize, pe: i32),
            |c| crate::rma::$op(
                N,
                c,
                dest.cast(),
                src.cast(),
                crate::typed::bytes(N, nelems, size_of::<$ty>()),
                pe,
                $nbi,
            )
        );
    };
    (@strided $ty:ty, $f:ident, $cf:ident, [$($n:expr),+]) => {
        export_both!(
            $f, $cf, [$($n),+],
            (dest: *mut $ty, src: *const $ty, dst: isize, sst: isize, nelems: usize, pe: i32),
            |c| crate::rma::$f(
                N,
                c,
                dest.cast(),
                src.cast(),
                dst,
                sst,
                nelems,
                size_of::<$ty>(),
                pe,
            )
        );
    };
}

/// `shmem_T_put`, `_get`, `_put_nbi`, `_get_nbi`, `_iput`, `_iget` (each also
/// `shmem_ctx_...`) for OpenSHMEM type name `$t` (also the module's name) and Rust type
/// `$ty`; with `pg`,
/// also `_p` and `_g` (a type whose values cannot cross an `extern "C"` signature has
/// them inline in the header instead).
macro_rules! rma_typed {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            rma_typed!(@ops stringify!($t), $ty);
        }
    };
    ($t:ident, $ty:ty, pg) => {
        pub mod $t {
            rma_typed!(@ops stringify!($t), $ty);
            export_both!(
                p, ctx_p, [stringify!($t), "_p"],
                (dest: *mut $ty, value: $ty, pe: i32),
                |c| crate::rma::p(N, c, dest, value, pe)
            );
            export_both!(
                g, ctx_g, [stringify!($t), "_g"],
                (src: *const $ty, pe: i32) -> $ty,
                |c| crate::rma::g(N, c, src, pe)
            );
        }
    };
    (@ops $tn:expr, $ty:ty) => {
        rma_ops!(
            $ty,
            [$tn, "_put"],
            [$tn, "_get"],
            [$tn, "_put_nbi"],
            [$tn, "_get_nbi"],
            [$tn, "_iput"],
            [$tn, "_iget"]
        );
    };
}

/// `shmem_putBITS`, `_getBITS`, `shmem_putBITS_nbi`, ..., `shmem_iputBITS`, `shmem_igetBITS`
/// (each also `shmem_ctx_...`) for elements of `$bits` bits, Rust type `$ty`, in module `$m`.
macro_rules! rma_sized {
    ($m:ident, $bits:literal, $ty:ty) => {
        pub mod $m {
            rma_ops!(
                $ty,
                ["put", $bits],
                ["get", $bits],
                ["put", $bits, "_nbi"],
                ["get", $bits, "_nbi"],
                ["iput", $bits],
                ["iget", $bits]
            );
        }
    };
}

/// The untyped forms: `nelems` counts bytes.
macro_rules! rma_mem {
    ($($f:ident, $cf:ident, $op:ident, $nbi:literal);+ $(;)?) => {$(
        export_both!(
            $f, $cf, [stringify!($f)],
            (dest: *mut std::ffi::c_void, src: *const std::ffi::c_void, nelems: usize, pe: i32),
            |c| crate::rma::$op(N, c, dest.cast(), src.cast(), nelems, pe, $nbi)
        );
    )+};
}

rma_mem!(
    putmem, ctx_putmem, put, false;
    getmem, ctx_getmem, get, false;
    putmem_nbi, ctx_putmem_nbi, put, true;
    getmem_nbi, ctx_getmem_nbi, get, true;
);
