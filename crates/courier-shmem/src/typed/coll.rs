//! Collectives on teams, typed and `mem`, and the deprecated active-set forms: the macros
//! that write them (`list.rs` calls the typed one once per type).

/// The body of a team collective: `-1` if `team` is not a team, else `$call` on its
/// members and `0`. `$call` sees `w` (the world) and `m` (the members), named by the caller.
macro_rules! team_call {
    ($team:ident, $w:ident, $m:ident, $call:expr) => {{
        let $w = crate::init::world(N);
        match crate::team::lookup(N, $team) {
            None => -1,
            Some(t) => {
                let $m = crate::coll::Members::of(t);
                $call;
                0
            }
        }
    }};
}

/// The body of an active-set collective: `$call` on the PEs `pe_start`, stepping by
/// 2^`log_pe_stride`, `pe_size` of them; `$call` sees `w` and `m`.
macro_rules! active_call {
    ($start:ident, $log:ident, $size:ident, $w:ident, $m:ident, $call:expr) => {{
        let $w = crate::init::world(N);
        let $m = crate::coll::Members::active_set($w, N, $start, $log, $size);
        $call
    }};
}

/// `shmem_T_broadcast`, `_collect`, `_fcollect`, `_alltoall` and `_alltoalls` on a team,
/// for OpenSHMEM type name `$t` (also the module's name) and Rust type `$ty`; `@fns` writes
/// them for any element type and size, with the C names (after `shmem_`) in pieces.
macro_rules! coll_team {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            coll_team!(
                @fns $ty, size_of::<$ty>(),
                [stringify!($t), "_broadcast"],
                [stringify!($t), "_collect"],
                [stringify!($t), "_fcollect"],
                [stringify!($t), "_alltoall"],
                [stringify!($t), "_alltoalls"]
            );
        }
    };
    (
        @fns $ty:ty, $size:expr,
        $bcast:tt, $collect:tt, $fcollect:tt, $alltoall:tt, $alltoalls:tt
    ) => {
        coll_team!(@bcast $ty, $size, $bcast);
        coll_team!(@gather collect, $ty, $size, $collect);
        coll_team!(@gather fcollect, $ty, $size, $fcollect);
        coll_team!(@gather alltoall, $ty, $size, $alltoall);
        coll_team!(@strided $ty, $size, $alltoalls);
    };
    (@bcast $ty:ty, $size:expr, [$($n:expr),+]) => {
        export_one!(
            broadcast, ["shmem_", $($n),+],
            (
                team: crate::team::TeamHandle,
                dest: *mut $ty,
                src: *const $ty,
                nelems: usize,
                pe_root: i32,
            ) -> i32,
            |c| {
                let _ = c;
                team_call!(team, w, m, crate::coll::broadcast(
                    w,
                    N,
                    &m,
                    dest.cast(),
                    src.cast(),
                    crate::typed::bytes(N, nelems, $size),
                    pe_root,
                    true,
                ))
            }
        );
    };
    (@gather $op:ident, $ty:ty, $size:expr, [$($n:expr),+]) => {
        export_one!(
            $op, ["shmem_", $($n),+],
            (team: crate::team::TeamHandle, dest: *mut $ty, src: *const $ty, nelems: usize) -> i32,
            |c| {
                let _ = c;
                team_call!(team, w, m, crate::coll::$op(
                    w,
                    N,
                    &m,
                    dest.cast(),
                    src.cast(),
                    crate::typed::bytes(N, nelems, $size),
                ))
            }
        );
    };
    (@strided $ty:ty, $size:expr, [$($n:expr),+]) => {
        export_one!(
            alltoalls, ["shmem_", $($n),+],
            (
                team: crate::team::TeamHandle,
                dest: *mut $ty,
                src: *const $ty,
                dst: isize,
                sst: isize,
                nelems: usize,
            ) -> i32,
            |c| {
                let _ = c;
                team_call!(team, w, m, crate::coll::alltoalls(
                    w,
                    N,
                    &m,
                    dest.cast(),
                    src.cast(),
                    dst,
                    sst,
                    nelems,
                    $size,
                ))
            }
        );
    };
}

/// The deprecated active-set collectives on elements of `$bits` bits (Rust type `$ty`):
/// `shmem_broadcastBITS`, `shmem_collectBITS`, `shmem_fcollectBITS`, `shmem_alltoallBITS`,
/// `shmem_alltoallsBITS`, in module `$m`.
macro_rules! coll_active {
    ($m:ident, $bits:literal, $ty:ty) => {
        pub mod $m {
            coll_active!(
                @active broadcast, ["shmem_broadcast", $bits],
                (
                    dest: *mut std::ffi::c_void,
                    src: *const std::ffi::c_void,
                    nelems: usize,
                    pe_root: i32,
                ),
                |w, m| crate::coll::broadcast(
                    w,
                    N,
                    &m,
                    dest.cast(),
                    src.cast(),
                    crate::typed::bytes(N, nelems, size_of::<$ty>()),
                    pe_root,
                    false,
                )
            );
            coll_active!(@gather collect, ["shmem_collect", $bits], $ty);
            coll_active!(@gather fcollect, ["shmem_fcollect", $bits], $ty);
            coll_active!(@gather alltoall, ["shmem_alltoall", $bits], $ty);
            coll_active!(
                @active alltoalls, ["shmem_alltoalls", $bits],
                (
                    dest: *mut std::ffi::c_void,
                    src: *const std::ffi::c_void,
                    dst: isize,
                    sst: isize,
                    nelems: usize,
                ),
                |w, m| crate::coll::alltoalls(
                    w,
                    N,
                    &m,
                    dest.cast(),
                    src.cast(),
                    dst,
                    sst,
                    nelems,
                    size_of::<$ty>(),
                )
            );
        }
    };
    (@gather $op:ident, [$($n:expr),+], $ty:ty) => {
        coll_active!(
            @active $op, [$($n),+],
            (dest: *mut std::ffi::c_void, src: *const std::ffi::c_void, nelems: usize),
            |w, m| crate::coll::$op(
                w,
                N,
                &m,
                dest.cast(),
                src.cast(),
                crate::typed::bytes(N, nelems, size_of::<$ty>()),
            )
        );
    };
    // One active-set collective: the parameters given, then the active set's
    // (`PE_start`, `logPE_stride`, `PE_size`, `pSync`); `$call` sees `w` and `m`.
    (
        @active $f:ident, [$($n:expr),+], ($($p:ident: $t:ty),* $(,)?),
        |$w:ident, $mm:ident| $call:expr
    ) => {
        export_one!(
            $f, [$($n),+],
            (
                $($p: $t,)*
                pe_start: i32,
                log_pe_stride: i32,
                pe_size: i32,
                psync: *mut std::ffi::c_long,
            ),
            |c| {
                let _ = (c, psync);
                active_call!(pe_start, log_pe_stride, pe_size, $w, $mm, $call)
            }
        );
    };
}

/// `shmem_broadcastmem`, `shmem_collectmem`, ...: `nelems` counts bytes.
pub mod mem {
    coll_team!(
        @fns std::ffi::c_void, 1,
        ["broadcastmem"],
        ["collectmem"],
        ["fcollectmem"],
        ["alltoallmem"],
        ["alltoallsmem"]
    );
}

coll_active!(bits32, "32", u32);
coll_active!(bits64, "64", u64);
