//! `x + 1` without numpy: a Python scalar added to, subtracted from,
//! multiplied with or dividing the value of a small integer or float array,
//! computed here when numpy 2 would give exactly this result and no warning.
//!
//! numpy's rules (NEP 50: Python scalars are "weak"): an integer array with a
//! Python int keeps its dtype (true division gives float64), and the int must
//! fit that dtype (numpy raises `OverflowError` otherwise); an integer array
//! with a Python float gives float64; a float array keeps its dtype, the
//! Python number converted to it. Each element is computed as numpy's loop
//! computes it (IEEE arithmetic in the result's type).
//!
//! Whatever numpy would warn or raise about is left to numpy, which then
//! warns or raises as usual: an integer result that overflows (numpy wraps an
//! array's, and warns for a scalar's), a float result that is not finite or
//! is subnormal, a product or quotient that underflows to zero, an operand
//! that is not finite, a Python int out of the dtype's range or too large to
//! convert exactly, a Python float out of float32's range. `compute` returns
//! `None` for all of them, and for every other dtype (bool, float16,
//! bfloat16, strings).

use colocated_core::DType;

/// The operators computed here (`operator.add`, `sub`, `mul`, `truediv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Sub,
    Mul,
    TrueDiv,
}

/// The Python operand: an exact `int` (within `i128`) or `float`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar {
    Int(i128),
    Float(f64),
}

/// How many results `compute` gave (the SDK's tests check that the fast path
/// is taken, and that it is not where numpy must decide).
#[cfg(feature = "testing")]
static COMPUTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The number of results computed here so far (`_colocated.native_scalar_ops`).
#[cfg(feature = "testing")]
#[pyo3::pyfunction]
pub(crate) fn native_scalar_ops() -> u64 {
    COMPUTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// `op(element, scalar)` for every element of `bytes` (native-endian values
/// of `dtype`), or `op(scalar, element)` when `reflected`: the result's dtype
/// and bytes, or `None` where numpy must decide (see the module's comment).
pub(crate) fn compute(
    dtype: DType,
    bytes: &[u8],
    op: Op,
    scalar: Scalar,
    reflected: bool,
) -> Option<(DType, Vec<u8>)> {
    macro_rules! int {
        ($t:ty) => {
            int_op::<$t>(dtype, bytes, op, scalar, reflected)
        };
    }
    // (A `?` below returns `None` at once: nothing computed.)
    let out = match dtype {
        DType::I8 => int!(i8),
        DType::I16 => int!(i16),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::U8 => int!(u8),
        DType::U16 => int!(u16),
        DType::U32 => int!(u32),
        DType::U64 => int!(u64),
        DType::F32 => {
            let x = match scalar {
                Scalar::Int(v) => exact_float(v, F32_EXACT)? as f32,
                Scalar::Float(f) => f32_of(f)?,
            };
            let out = map::<f32, f32>(bytes, |a| float_op(a, x, op, reflected))?;
            Some((DType::F32, out))
        }
        DType::F64 => {
            let x = match scalar {
                Scalar::Int(v) => exact_float(v, F64_EXACT)?,
                Scalar::Float(f) => f.is_finite().then_some(f)?,
            };
            let out = map::<f64, f64>(bytes, |a| float_op(a, x, op, reflected))?;
            Some((DType::F64, out))
        }
        DType::Bool | DType::F16 | DType::BF16 | DType::String => None,
    };
    #[cfg(feature = "testing")]
    if out.is_some() {
        COMPUTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    out
}

/// Integers whose magnitude is at most this convert to the float exactly.
const F32_EXACT: i128 = 1 << 24;
const F64_EXACT: i128 = 1 << 53;

/// `v` as a float, when it converts exactly.
fn exact_float(v: i128, limit: i128) -> Option<f64> {
    (v.unsigned_abs() <= limit.unsigned_abs()).then_some(v as f64)
}

/// A Python float as float32, when it is finite there and not flushed
/// towards zero (numpy might warn about that cast).
fn f32_of(f: f64) -> Option<f32> {
    let x = f as f32;
    (x.is_normal() || (x == 0.0 && f == 0.0)).then_some(x)
}

/// An element type that values are read as and written in.
trait Element: Copy {
    const SIZE: usize;
    fn read(bytes: &[u8]) -> Self;
    fn write(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn read(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_ne_bytes(raw)
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_ne_bytes());
            }
        }
    )*};
}
element!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

/// `f` of every element of `bytes`, or `None` once it gives `None`.
fn map<T: Element, U: Element>(bytes: &[u8], f: impl Fn(T) -> Option<U>) -> Option<Vec<u8>> {
    if bytes.len() % T::SIZE != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / T::SIZE * U::SIZE);
    for chunk in bytes.chunks_exact(T::SIZE) {
        f(T::read(chunk))?.write(&mut out);
    }
    Some(out)
}

/// An integer element type: checked arithmetic, and its value as float64
/// (rounded to nearest, as numpy's cast rounds).
trait Int: Element + TryFrom<i128> {
    fn checked(self, other: Self, op: Op) -> Option<Self>;
    fn as_f64(self) -> f64;
}

macro_rules! int_type {
    ($($t:ty),*) => {$(
        impl Int for $t {
            fn checked(self, other: Self, op: Op) -> Option<Self> {
                match op {
                    Op::Add => self.checked_add(other),
                    Op::Sub => self.checked_sub(other),
                    Op::Mul => self.checked_mul(other),
                    Op::TrueDiv => None,
                }
            }
            fn as_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
int_type!(i8, i16, i32, i64, u8, u16, u32, u64);

/// An integer array with a Python scalar (see `compute`).
fn int_op<T: Int>(
    dtype: DType,
    bytes: &[u8],
    op: Op,
    scalar: Scalar,
    reflected: bool,
) -> Option<(DType, Vec<u8>)> {
    match scalar {
        Scalar::Int(v) => {
            // numpy raises OverflowError for an int the dtype cannot hold.
            let x = T::try_from(v).ok()?;
            if op == Op::TrueDiv {
                let x = x.as_f64();
                let out = map::<T, f64>(bytes, |a| float_op(a.as_f64(), x, op, reflected))?;
                return Some((DType::F64, out));
            }
            let out = map::<T, T>(bytes, |a| {
                if reflected {
                    x.checked(a, op)
                } else {
                    a.checked(x, op)
                }
            })?;
            Some((dtype, out))
        }
        Scalar::Float(f) => {
            let x = f.is_finite().then_some(f)?;
            let out = map::<T, f64>(bytes, |a| float_op(a.as_f64(), x, op, reflected))?;
            Some((DType::F64, out))
        }
    }
}

/// A float type's arithmetic, and what numpy would warn about.
trait Float:
    Element
    + PartialEq
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    const ZERO: Self;
    fn is_finite(self) -> bool;
    fn is_normal(self) -> bool;
}

macro_rules! float_type {
    ($($t:ty),*) => {$(
        impl Float for $t {
            const ZERO: Self = 0.0;
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            fn is_normal(self) -> bool {
                <$t>::is_normal(self)
            }
        }
    )*};
}
float_type!(f32, f64);

/// `op(a, x)` (`op(x, a)` when `reflected`) unless numpy could warn: an
/// operand that is not finite, a result that is not finite or is subnormal,
/// or a product or quotient of non-zero operands that is zero (underflow).
fn float_op<F: Float>(a: F, x: F, op: Op, reflected: bool) -> Option<F> {
    if !a.is_finite() || !x.is_finite() {
        return None;
    }
    let (l, r) = if reflected { (x, a) } else { (a, x) };
    let out = match op {
        Op::Add => l + r,
        Op::Sub => l - r,
        Op::Mul => l * r,
        Op::TrueDiv => l / r,
    };
    let exact_zero = match op {
        Op::Add | Op::Sub => true,
        Op::Mul | Op::TrueDiv => l == F::ZERO || r == F::ZERO,
    };
    (out.is_normal() || (out == F::ZERO && exact_zero)).then_some(out)
}
