//! Atomics, standard, extended and bitwise, fetching, non-fetching and `_nbi`, and the
//! deprecated names: the macros that write them for one type (`list.rs` calls them).

/// `export_both!` with a context form (`f, cf`), `export_one!` without (`f`).
macro_rules! export_maybe_ctx {
    ($f:ident, $cf:ident, [$($n:expr),+], $($rest:tt)*) => {
        export_both!($f, $cf, [$($n),+], $($rest)*);
    };
    ($f:ident, [$($n:expr),+], $($rest:tt)*) => {
        export_one!($f, ["shmem_", $($n),+], $($rest)*);
    };
}

/// One atomic of OpenSHMEM type name `$t` and Rust type `$ty`, C name `shmem_T_F` (and
/// `shmem_ctx_T_F` when a second identifier is given); the first word is its kind.
macro_rules! amo_op {
    (fetch_inc $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (dest: *mut $ty, pe: i32) -> $ty,
            |c| crate::amo::fetch(N, c, dest, amo_op!(@rmw Add), 1 as $ty, 1 as $ty, pe)
        );
    };
    (inc $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (dest: *mut $ty, pe: i32),
            |c| crate::amo::post(N, c, dest, amo_op!(@rmw Add), 1 as $ty, pe)
        );
    };
    (fetch $op:ident: $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (dest: *mut $ty, value: $ty, pe: i32) -> $ty,
            |c| crate::amo::fetch(N, c, dest, amo_op!(@rmw $op), value, value, pe)
        );
    };
    (post $op:ident: $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (dest: *mut $ty, value: $ty, pe: i32),
            |c| crate::amo::post(N, c, dest, amo_op!(@rmw $op), value, pe)
        );
    };
    (set $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (dest: *mut $ty, value: $ty, pe: i32),
            |c| crate::amo::post(N, c, dest, crate::amo::Op::Set, value, pe)
        );
    };
    (cswap $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (dest: *mut $ty, cond: $ty, value: $ty, pe: i32) -> $ty,
            |c| crate::amo::fetch(N, c, dest, amo_op!(@rmw Cswap), value, cond, pe)
        );
    };
    (read $f:ident $(, $cf:ident)?; $t:ident, $ty:ty) => {
        export_maybe_ctx!(
            $f $(, $cf)?, [stringify!($t), "_", stringify!($f)],
            (src: *const $ty, pe: i32) -> $ty,
            |c| crate::amo::fetch(
                N,
                c,
                src.cast_mut(),
                crate::amo::Op::Fetch,
                1 as $ty,
                1 as $ty,
                pe,
            )
        );
    };
    (fetch_inc_nbi $f:ident, $cf:ident; $t:ident, $ty:ty) => {
        export_both!(
            $f, $cf, [stringify!($t), "_", stringify!($f)],
            (fetch: *mut $ty, dest: *mut $ty, pe: i32),
            |c| crate::amo::fetch_nbi(N, c, fetch, dest, amo_op!(@rmw Add), 1 as $ty, 1 as $ty, pe)
        );
    };
    (fetch_nbi $op:ident: $f:ident, $cf:ident; $t:ident, $ty:ty) => {
        export_both!(
            $f, $cf, [stringify!($t), "_", stringify!($f)],
            (fetch: *mut $ty, dest: *mut $ty, value: $ty, pe: i32),
            |c| crate::amo::fetch_nbi(N, c, fetch, dest, amo_op!(@rmw $op), value, value, pe)
        );
    };
    (cswap_nbi $f:ident, $cf:ident; $t:ident, $ty:ty) => {
        export_both!(
            $f, $cf, [stringify!($t), "_", stringify!($f)],
            (fetch: *mut $ty, dest: *mut $ty, cond: $ty, value: $ty, pe: i32),
            |c| crate::amo::fetch_nbi(N, c, fetch, dest, amo_op!(@rmw Cswap), value, cond, pe)
        );
    };
    (read_nbi $f:ident, $cf:ident; $t:ident, $ty:ty) => {
        export_both!(
            $f, $cf, [stringify!($t), "_", stringify!($f)],
            (fetch: *mut $ty, src: *const $ty, pe: i32),
            |c| crate::amo::fetch_nbi(
                N,
                c,
                fetch,
                src.cast_mut(),
                crate::amo::Op::Fetch,
                1 as $ty,
                1 as $ty,
                pe,
            )
        );
    };
    (@rmw $op:ident) => {
        crate::amo::Op::Rmw(courier::AtomicOp::$op)
    };
}

/// The standard atomics of `$t` (`shmem_T_atomic_fetch_inc`, `_inc`, `_fetch_add`, `_add`,
/// `_compare_swap` and the `_nbi` fetching ones), each also `shmem_ctx_...`.
macro_rules! amo_standard {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            amo_op!(fetch_inc atomic_fetch_inc, ctx_atomic_fetch_inc; $t, $ty);
            amo_op!(inc atomic_inc, ctx_atomic_inc; $t, $ty);
            amo_op!(fetch Add: atomic_fetch_add, ctx_atomic_fetch_add; $t, $ty);
            amo_op!(post Add: atomic_add, ctx_atomic_add; $t, $ty);
            amo_op!(cswap atomic_compare_swap, ctx_atomic_compare_swap; $t, $ty);
            amo_op!(fetch_inc_nbi atomic_fetch_inc_nbi, ctx_atomic_fetch_inc_nbi; $t, $ty);
            amo_op!(fetch_nbi Add: atomic_fetch_add_nbi, ctx_atomic_fetch_add_nbi; $t, $ty);
            amo_op!(cswap_nbi atomic_compare_swap_nbi, ctx_atomic_compare_swap_nbi; $t, $ty);
        }
    };
}

/// The extended atomics of `$t`: `shmem_T_atomic_fetch`, `_set`, `_swap` and the `_nbi`
/// fetching ones, each also `shmem_ctx_...`.
macro_rules! amo_extended {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            amo_op!(read atomic_fetch, ctx_atomic_fetch; $t, $ty);
            amo_op!(set atomic_set, ctx_atomic_set; $t, $ty);
            amo_op!(fetch Swap: atomic_swap, ctx_atomic_swap; $t, $ty);
            amo_op!(read_nbi atomic_fetch_nbi, ctx_atomic_fetch_nbi; $t, $ty);
            amo_op!(fetch_nbi Swap: atomic_swap_nbi, ctx_atomic_swap_nbi; $t, $ty);
        }
    };
}

/// The bitwise atomics of `$t`: `shmem_T_atomic_fetch_and`, `_and`, `_fetch_or`, `_or`,
/// `_fetch_xor`, `_xor` and the `_nbi` fetching ones, each also `shmem_ctx_...`.
macro_rules! amo_bitwise {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            amo_op!(fetch And: atomic_fetch_and, ctx_atomic_fetch_and; $t, $ty);
            amo_op!(post And: atomic_and, ctx_atomic_and; $t, $ty);
            amo_op!(fetch Or: atomic_fetch_or, ctx_atomic_fetch_or; $t, $ty);
            amo_op!(post Or: atomic_or, ctx_atomic_or; $t, $ty);
            amo_op!(fetch Xor: atomic_fetch_xor, ctx_atomic_fetch_xor; $t, $ty);
            amo_op!(post Xor: atomic_xor, ctx_atomic_xor; $t, $ty);
            amo_op!(fetch_nbi And: atomic_fetch_and_nbi, ctx_atomic_fetch_and_nbi; $t, $ty);
            amo_op!(fetch_nbi Or: atomic_fetch_or_nbi, ctx_atomic_fetch_or_nbi; $t, $ty);
            amo_op!(fetch_nbi Xor: atomic_fetch_xor_nbi, ctx_atomic_fetch_xor_nbi; $t, $ty);
        }
    };
}

/// The deprecated (OpenSHMEM 1.3) names of `$t`, without a context form:
/// `shmem_T_fadd`, `_finc`, `_add`, `_inc`, `_cswap`.
macro_rules! amo_deprecated {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            amo_op!(fetch Add: fadd; $t, $ty);
            amo_op!(fetch_inc finc; $t, $ty);
            amo_op!(post Add: add; $t, $ty);
            amo_op!(inc inc; $t, $ty);
            amo_op!(cswap cswap; $t, $ty);
        }
    };
}

/// The deprecated extended names of `$t`: `shmem_T_swap`, `_fetch`, `_set`.
macro_rules! amo_deprecated_extended {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            amo_op!(fetch Swap: swap; $t, $ty);
            amo_op!(read fetch; $t, $ty);
            amo_op!(set set; $t, $ty);
        }
    };
}

export_one!(
    shmem_swap, ["shmem_swap"],
    (dest: *mut i64, value: i64, pe: i32) -> i64,
    |c| crate::amo::fetch(N, c, dest, amo_op!(@rmw Swap), value, value, pe)
);
