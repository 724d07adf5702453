//! Point-to-point synchronization, `wait_until`, `test` and their families: the macros
//! that write them for one type (`list.rs` calls them), and the untyped deprecated names.

/// `shmem_T_wait_until`, `_test`, `_wait_until_all`, `_any`, `_some`, `_test_all`, `_any`,
/// `_some` and the `_vector` forms of the last six, for OpenSHMEM type name `$t` (also the
/// module's name) and Rust type `$ty`.
macro_rules! wait_typed {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            export_one!(
                wait_until, ["shmem_", stringify!($t), "_wait_until"],
                (ivar: *mut $ty, cmp: i32, cmp_value: $ty),
                |c| {
                    let _ = c;
                    crate::wait::wait_until(N, ivar, cmp, cmp_value)
                }
            );
            export_one!(
                test, ["shmem_", stringify!($t), "_test"],
                (ivar: *mut $ty, cmp: i32, cmp_value: $ty) -> i32,
                |c| {
                    let _ = c;
                    crate::wait::test(N, ivar, cmp, cmp_value)
                }
            );
            // The six calls on a set of variables: each compares with the one value
            // `cmp_value`, or (`_vector`) variable i with `cmp_values[i]`.
            wait_typed!(
                @set [$t, ""], [$ty, cmp_value: $ty, cmp_value, std::ptr::null(), false],
                [wait_until_all, wait_until_any, wait_until_some, test_all, test_any, test_some]
            );
            wait_typed!(
                @set [$t, "_vector"],
                [$ty, cmp_values: *const $ty, <$ty>::default(), cmp_values, true],
                [
                    wait_until_all_vector,
                    wait_until_any_vector,
                    wait_until_some_vector,
                    test_all_vector,
                    test_any_vector,
                    test_some_vector
                ]
            );
        }
    };
    (
        @set [$t:ident, $sfx:literal], $set:tt,
        [$all:ident, $any:ident, $some:ident, $tall:ident, $tany:ident, $tsome:ident]
    ) => {
        wait_typed!(@one $all, [$t, "_wait_until_all", $sfx], $set, wait_all);
        wait_typed!(@one $any, [$t, "_wait_until_any", $sfx], $set, wait_any -> usize);
        wait_typed!(@some $some, [$t, "_wait_until_some", $sfx], $set, wait_some);
        wait_typed!(@one $tall, [$t, "_test_all", $sfx], $set, test_all -> i32);
        wait_typed!(@one $tany, [$t, "_test_any", $sfx], $set, test_any -> usize);
        wait_typed!(@some $tsome, [$t, "_test_some", $sfx], $set, test_some);
    };
    // One call on the whole set (`_all`, `_any`): `crate::wait::$call`.
    (
        @one $f:ident, [$t:ident, $($n:expr),+],
        [$ty:ty, $last:ident: $lt:ty, $value:expr, $values:expr, $vector:literal],
        $call:ident $(-> $r:ty)?
    ) => {
        export_one!(
            $f, ["shmem_", stringify!($t), $($n),+],
            (ivars: *mut $ty, nelems: usize, status: *const i32, cmp: i32, $last: $lt) $(-> $r)?,
            |c| {
                let _ = c;
                crate::wait::$call(
                    N,
                    wait_typed!(@many ivars, nelems, status, cmp, $value, $values, $vector),
                )
            }
        );
    };
    // One that also reports which variables met the condition (`_some`), in `indices`.
    (
        @some $f:ident, [$t:ident, $($n:expr),+],
        [$ty:ty, $last:ident: $lt:ty, $value:expr, $values:expr, $vector:literal],
        $call:ident
    ) => {
        export_one!(
            $f, ["shmem_", stringify!($t), $($n),+],
            (
                ivars: *mut $ty,
                nelems: usize,
                indices: *mut usize,
                status: *const i32,
                cmp: i32,
                $last: $lt,
            ) -> usize,
            |c| {
                let _ = c;
                crate::wait::$call(
                    N,
                    wait_typed!(@many ivars, nelems, status, cmp, $value, $values, $vector),
                    indices,
                )
            }
        );
    };
    // (The parameters are passed in: a macro's local names are its own.)
    (
        @many $ivars:ident, $nelems:ident, $status:ident, $cmp:ident,
        $value:expr, $values:expr, $vector:literal
    ) => {
        crate::wait::Many {
            ivars: $ivars,
            n: $nelems,
            status: $status,
            cmp: $cmp,
            value: $value,
            values: $values,
            vector: $vector,
        }
    };
}

/// The deprecated `shmem_T_wait` of OpenSHMEM type name `$t`: wait until `*ivar` is not
/// `cmp_value`.
macro_rules! wait_deprecated {
    ($t:ident, $ty:ty) => {
        pub mod $t {
            export_one!(
                wait, ["shmem_", stringify!($t), "_wait"],
                (ivar: *mut $ty, cmp_value: $ty),
                |c| {
                    let _ = c;
                    crate::wait::wait_until(N, ivar, crate::wait::CMP_NE, cmp_value)
                }
            );
        }
    };
}

export_one!(
    shmem_wait, ["shmem_wait"],
    (ivar: *mut i64, cmp_value: i64),
    |c| {
        let _ = c;
        crate::wait::wait_until(N, ivar, crate::wait::CMP_NE, cmp_value)
    }
);

export_one!(
    shmem_wait_until, ["shmem_wait_until"],
    (ivar: *mut i64, cmp: i32, cmp_value: i64),
    |c| {
        let _ = c;
        crate::wait::wait_until(N, ivar, cmp, cmp_value)
    }
);
