//! The element operations of reductions: and, or, xor on integers; max, min on integers
//! and reals; sum, prod on integers, reals and complex numbers. Integers wrap, as C's
//! unsigned arithmetic does (and as every OpenSHMEM implementation behaves for signed).
//!
//! `long double` is x87 extended precision, which Rust has no type for: its operations are
//! done by the x87 unit itself (inline assembly) on x86-64.

/// Combine `n` elements: `acc[i] = acc[i] op x[i]`.
pub type ReduceFn = unsafe fn(acc: *mut u8, x: *const u8, n: usize);

/// Integer and real arithmetic.
pub trait Arith: Copy {
    /// a + b
    fn add(a: Self, b: Self) -> Self;
    /// a × b
    fn mul(a: Self, b: Self) -> Self;
}
/// Ordering.
pub trait Order: Copy {
    /// The larger.
    fn max(a: Self, b: Self) -> Self;
    /// The smaller.
    fn min(a: Self, b: Self) -> Self;
}
/// Bitwise operations.
pub trait Bits: Copy {
    /// a & b
    fn and(a: Self, b: Self) -> Self;
    /// a | b
    fn or(a: Self, b: Self) -> Self;
    /// a ^ b
    fn xor(a: Self, b: Self) -> Self;
}

macro_rules! ints {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
        }
        impl Order for $t {
            fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
            fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
        }
        impl Bits for $t {
            fn and(a: Self, b: Self) -> Self { a & b }
            fn or(a: Self, b: Self) -> Self { a | b }
            fn xor(a: Self, b: Self) -> Self { a ^ b }
        }
    )*};
}
ints!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize);

macro_rules! reals {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(a: Self, b: Self) -> Self { a + b }
            fn mul(a: Self, b: Self) -> Self { a * b }
        }
        impl Order for $t {
            fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
            fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
        }
    )*};
}
reals!(f32, f64);

/// A C complex number (`float _Complex`, `double _Complex`): real, imaginary.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Complex<T>(pub T, pub T);

impl<T: Arith + std::ops::Sub<Output = T>> Arith for Complex<T> {
    fn add(a: Self, b: Self) -> Self {
        Complex(T::add(a.0, b.0), T::add(a.1, b.1))
    }
    fn mul(a: Self, b: Self) -> Self {
        Complex(
            T::mul(a.0, b.0) - T::mul(a.1, b.1),
            T::add(T::mul(a.0, b.1), T::mul(a.1, b.0)),
        )
    }
}

/// A C `long double` (x87 80-bit extended, in 16 bytes).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LongDouble(pub [u8; 16]);

#[cfg(target_arch = "x86_64")]
mod x87 {
    use super::LongDouble;
    use std::arch::asm;

    pub fn add(a: LongDouble, b: LongDouble) -> LongDouble {
        let mut o = LongDouble::default();
        // SAFETY: loads two 80-bit values from valid memory, adds them on the x87 stack
        // and stores the result; the stack is left empty as it was found.
        unsafe {
            asm!(
                "fld tbyte ptr [{a}]",
                "fld tbyte ptr [{b}]",
                "faddp st(1), st",
                "fstp tbyte ptr [{o}]",
                a = in(reg) &a, b = in(reg) &b, o = in(reg) &mut o,
                out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            );
        }
        o
    }

    pub fn mul(a: LongDouble, b: LongDouble) -> LongDouble {
        let mut o = LongDouble::default();
        // SAFETY: as in `add`, with a multiplication.
        unsafe {
            asm!(
                "fld tbyte ptr [{a}]",
                "fld tbyte ptr [{b}]",
                "fmulp st(1), st",
                "fstp tbyte ptr [{o}]",
                a = in(reg) &a, b = in(reg) &b, o = in(reg) &mut o,
                out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            );
        }
        o
    }

    /// a < b
    pub fn lt(a: LongDouble, b: LongDouble) -> bool {
        let r: u8;
        // SAFETY: loads b then a, compares (a in st(0)), pops both.
        unsafe {
            asm!(
                "fld tbyte ptr [{b}]",
                "fld tbyte ptr [{a}]",
                "fcomip st, st(1)",
                "fstp st(0)",
                "setb {r}",
                a = in(reg) &a, b = in(reg) &b, r = out(reg_byte) r,
                out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
            );
        }
        r != 0
    }
}

#[cfg(target_arch = "x86_64")]
impl Arith for LongDouble {
    fn add(a: Self, b: Self) -> Self {
        x87::add(a, b)
    }
    fn mul(a: Self, b: Self) -> Self {
        x87::mul(a, b)
    }
}
#[cfg(target_arch = "x86_64")]
impl Order for LongDouble {
    fn max(a: Self, b: Self) -> Self {
        if x87::lt(a, b) { b } else { a }
    }
    fn min(a: Self, b: Self) -> Self {
        if x87::lt(b, a) { b } else { a }
    }
}
macro_rules! elementwise {
    ($name:ident, $tr:ident, $f:ident) => {
        /// Elementwise over `n` values of `T` (unaligned access allowed).
        ///
        /// # Safety
        /// `acc` and `x` valid for `n` elements.
        pub unsafe fn $name<T: $tr>(acc: *mut u8, x: *const u8, n: usize) {
            let (a, b) = (acc as *mut T, x as *const T);
            for i in 0..n {
                // SAFETY: per the contract.
                unsafe {
                    let v = T::$f(a.add(i).read_unaligned(), b.add(i).read_unaligned());
                    a.add(i).write_unaligned(v);
                }
            }
        }
    };
}
elementwise!(sum, Arith, add);
elementwise!(prod, Arith, mul);
elementwise!(max, Order, max);
elementwise!(min, Order, min);
elementwise!(and, Bits, and);
elementwise!(or, Bits, or);
elementwise!(xor, Bits, xor);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_wrap_and_complex_multiplies() {
        let mut a = [i32::MAX, 3];
        let b = [1i32, -4];
        // SAFETY: two elements each.
        unsafe { sum::<i32>(a.as_mut_ptr().cast(), b.as_ptr().cast(), 2) };
        assert_eq!(a, [i32::MIN, -1]);
        let mut c = [Complex(1.0f64, 2.0)];
        let d = [Complex(3.0f64, -1.0)];
        // SAFETY: one element each.
        unsafe { prod::<Complex<f64>>(c.as_mut_ptr().cast(), d.as_ptr().cast(), 1) };
        assert_eq!(c[0], Complex(5.0, 5.0));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn long_double_arithmetic() {
        // 1.5 and 2.25 in x87 extended format: sign/exponent 0x3fff + e, explicit integer bit.
        fn ld(mant: u64, exp: u16) -> LongDouble {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&mant.to_le_bytes());
            b[8..10].copy_from_slice(&exp.to_le_bytes());
            LongDouble(b)
        }
        let one_half = ld(0xC000_0000_0000_0000, 0x3fff); // 1.5
        let two_q = ld(0x9000_0000_0000_0000, 0x4000); // 2.25
        assert_eq!(
            LongDouble::add(one_half, two_q),
            ld(0xF000_0000_0000_0000, 0x4000)
        ); // 3.75
        assert_eq!(
            LongDouble::mul(one_half, two_q),
            ld(0xD800_0000_0000_0000, 0x4000)
        ); // 3.375
        assert_eq!(LongDouble::max(one_half, two_q), two_q);
        assert_eq!(LongDouble::min(one_half, two_q), one_half);
    }
}
