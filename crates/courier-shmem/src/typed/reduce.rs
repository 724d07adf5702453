//! Reductions, team-based (`_reduce`) and the deprecated active-set `_to_all`: the macros
//! that write them (`list.rs` calls them once per group of operations that take the same
//! types).

/// `shmem_T_OP_reduce` for each operation `OP` and each OpenSHMEM type name `T` listed
/// (with its Rust type), in module `OP`, each function named `T` there.
macro_rules! reduce_team {
    // Operations that take the same types: one module each.
    ([$($op:ident),+]: $types:tt) => {
        $(reduce_team!(@op $op: $types);)+
    };
    (@op $op:ident: [$($t:ident $ty:ty),+ $(,)?]) => {
        pub mod $op {
            $(
                export_one!(
                    $t, ["shmem_", stringify!($t), "_", stringify!($op), "_reduce"],
                    (
                        team: crate::team::TeamHandle,
                        dest: *mut $ty,
                        src: *const $ty,
                        nreduce: usize,
                    ) -> i32,
                    |c| {
                        let _ = c;
                        team_call!(team, w, m, crate::coll::reduce(
                            w,
                            N,
                            &m,
                            dest.cast(),
                            src.cast(),
                            nreduce,
                            size_of::<$ty>(),
                            crate::reduce::$op::<$ty>,
                        ))
                    }
                );
            )+
        }
    };
}

/// The deprecated `shmem_T_OP_to_all` for each operation `OP` and OpenSHMEM type name `T`
/// listed, in module `OP`; `pwrk` and `pSync` are not needed and not touched.
macro_rules! reduce_active {
    ([$($op:ident),+]: $types:tt) => {
        $(reduce_active!(@op $op: $types);)+
    };
    (@op $op:ident: [$($t:ident $ty:ty),+ $(,)?]) => {
        pub mod $op {
            $(
                export_one!(
                    $t, ["shmem_", stringify!($t), "_", stringify!($op), "_to_all"],
                    (
                        dest: *mut $ty,
                        src: *const $ty,
                        nreduce: i32,
                        pe_start: i32,
                        log_pe_stride: i32,
                        pe_size: i32,
                        pwrk: *mut $ty,
                        psync: *mut std::ffi::c_long,
                    ),
                    |c| {
                        let _ = pwrk;
                        let _ = (c, psync);
                        active_call!(pe_start, log_pe_stride, pe_size, w, m, crate::coll::reduce(
                            w,
                            N,
                            &m,
                            dest.cast(),
                            src.cast(),
                            crate::typed::count(N, nreduce),
                            size_of::<$ty>(),
                            crate::reduce::$op::<$ty>,
                        ))
                    }
                );
            )+
        }
    };
}
