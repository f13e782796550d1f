//! JavaScript values as host data, and back: typed arrays (their element type
//! names the dtype), numbers, bigints, booleans, strings, and nested arrays of
//! them (their nesting gives the shape).

use std::borrow::Cow;

use colocated_core::{self as core, DType};
use napi::bindgen_prelude::{
    BigInt, BigInt64Array, BigUint64Array, Float32Array, Float64Array, Int16Array, Int32Array,
    Int8Array, ToNapiValue, TypeName, TypedArray, TypedArrayType, Uint16Array, Uint32Array,
    Uint8Array, Unknown,
};
use napi::{sys, JsValue, ValueType};

use crate::errors::invalid;
use crate::sharding::type_name;

/// Host data of an array: bytes of a dense dtype (a typed array's own,
/// borrowed for the call: the put copies them once), or strings.
pub enum HostData<'a> {
    Dense(DType, Cow<'a, [u8]>),
    Strings(Vec<String>),
}

/// Reads `value` as an array's data. `dtype` overrides the element type the
/// value implies (a typed array may only be read as a type of its element
/// size: a `Uint16Array` as `float16`/`bfloat16`, a `Uint8Array` as `bool`);
/// `shape` reshapes a flat value (same number of elements).
/// A shape given as JavaScript numbers: non-negative safe integers.
pub fn dims(shape: &[f64]) -> core::Result<Vec<i64>> {
    shape
        .iter()
        .map(|&d| {
            if d.is_finite() && d >= 0.0 && d.fract() == 0.0 && d <= 9_007_199_254_740_991.0 {
                Ok(d as i64)
            } else {
                Err(invalid(format!(
                    "a shape holds non-negative integers, not {d} (in {shape:?})"
                )))
            }
        })
        .collect()
}

/// A count given as a JavaScript number: a positive integer of at most `max`.
pub fn count(name: &str, value: f64, max: u32) -> core::Result<usize> {
    if value.is_finite() && value >= 1.0 && value.fract() == 0.0 && value <= f64::from(max) {
        Ok(value as usize)
    } else {
        Err(invalid(format!(
            "{name} must be a positive integer of at most {max}, not {value}"
        )))
    }
}

pub fn read<'a>(
    value: &'a Unknown,
    dtype: Option<DType>,
    shape: Option<Vec<i64>>,
) -> core::Result<(Vec<i64>, HostData<'a>)> {
    let (natural, data) = if value.is_typedarray().unwrap_or(false) {
        typed_array(value, dtype)?
    } else {
        let mut shape = Vec::new();
        let mut leaves = Vec::new();
        nested(value, 0, &mut shape, &mut leaves)?;
        let shape = shape.iter().map(|&n| n as i64).collect();
        (shape, encode(&leaves, dtype)?)
    };
    let Some(shape) = shape else {
        return Ok((natural, data));
    };
    let have: i64 = natural.iter().product();
    let want = shape.iter().try_fold(
        1i64,
        |acc, &d| if d < 0 { None } else { acc.checked_mul(d) },
    );
    if want != Some(have) {
        return Err(invalid(format!(
            "shape {shape:?} does not hold the {have} elements given"
        )));
    }
    Ok((shape, data))
}

fn typed_array<'a>(
    value: &'a Unknown,
    dtype: Option<DType>,
) -> core::Result<(Vec<i64>, HostData<'a>)> {
    // SAFETY: `value` is a typed array (checked by the caller); its bytes
    // live as long as the value (nothing runs JavaScript meanwhile that
    // could detach them).
    let array = unsafe { value.cast::<TypedArray<'a>>() }.map_err(|e| invalid(e.reason.clone()))?;
    if is_detached(value) {
        return Err(invalid(
            "the typed array's buffer is detached (transferred or closed)",
        ));
    }
    let natural = match array.typed_array_type {
        TypedArrayType::Int8 => DType::I8,
        TypedArrayType::Uint8 | TypedArrayType::Uint8Clamped => DType::U8,
        TypedArrayType::Int16 => DType::I16,
        TypedArrayType::Uint16 => DType::U16,
        TypedArrayType::Int32 => DType::I32,
        TypedArrayType::Uint32 => DType::U32,
        TypedArrayType::Float32 => DType::F32,
        TypedArrayType::Float64 => DType::F64,
        TypedArrayType::BigInt64 => DType::I64,
        TypedArrayType::BigUint64 => DType::U64,
        _ => return Err(invalid("this kind of typed array is not supported")),
    };
    let dtype = match dtype {
        None => natural,
        Some(d) if d == natural => d,
        Some(d @ (DType::F16 | DType::BF16)) if natural == DType::U16 => d,
        Some(DType::Bool) if natural == DType::U8 => DType::Bool,
        Some(d) => {
            return Err(invalid(format!(
                "a typed array of {} cannot be read as {} (give a typed array of that \
                 element type, or an Array of numbers)",
                natural.name(),
                d.name()
            )))
        }
    };
    let view: &[u8] = &array.arraybuffer;
    // SAFETY: the view's bytes belong to `value`'s buffer, which outlives
    // the borrow of `value` (see above); only `array`, a handle to it, is
    // local.
    let bytes: &'a [u8] = unsafe { std::slice::from_raw_parts(view.as_ptr(), view.len()) };
    if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
        return Err(invalid("bool data must hold only 0 and 1"));
    }
    let size = natural.byte_size().unwrap_or(1);
    let len = (bytes.len() / size) as i64;
    Ok((vec![len], HostData::Dense(dtype, Cow::Borrowed(bytes))))
}

/// Whether the typed array `value`'s buffer is detached (transferred or
/// closed): it then reads as empty, which would hide the mistake.
fn is_detached(value: &Unknown) -> bool {
    let (env, raw) = (value.value().env, value.raw());
    let mut kind = 0;
    let mut length = 0;
    let mut data = std::ptr::null_mut();
    let mut buffer = std::ptr::null_mut();
    let mut offset = 0;
    let mut detached = false;
    // SAFETY: `raw` is a typed array of `env`, alive during this call; the
    // out-pointers are valid locals.
    unsafe {
        sys::napi_get_typedarray_info(
            env,
            raw,
            &mut kind,
            &mut length,
            &mut data,
            &mut buffer,
            &mut offset,
        ) == sys::Status::napi_ok
            && sys::napi_is_detached_arraybuffer(env, buffer, &mut detached) == sys::Status::napi_ok
            && detached
    }
}

/// The deepest nesting read (an array of higher rank, or a cycle, is refused
/// before it can overflow the stack).
pub const MAX_RANK: usize = 64;

/// A scalar of a nested array.
enum Leaf {
    Number(f64),
    BigInt(BigInt),
    Bool(bool),
    Str(String),
}

/// Flattens nested arrays (row-major): `shape` gets the length of each level.
fn nested(
    value: &Unknown,
    depth: usize,
    shape: &mut Vec<usize>,
    out: &mut Vec<Leaf>,
) -> core::Result<()> {
    if depth > MAX_RANK {
        return Err(invalid(format!(
            "arrays nest deeper than {MAX_RANK} (a cycle?)"
        )));
    }
    if !value.is_array().unwrap_or(false) {
        if shape.len() != depth {
            return Err(invalid("nested arrays are ragged"));
        }
        out.push(leaf(value)?);
        return Ok(());
    }
    // SAFETY: `value` is an array.
    let items = unsafe { value.cast::<Vec<Unknown>>() }.map_err(|e| invalid(e.reason.clone()))?;
    match shape.get(depth) {
        None if out.is_empty() => shape.push(items.len()),
        Some(&n) if n == items.len() => {}
        _ => return Err(invalid("nested arrays are ragged")),
    }
    if items.is_empty() && depth + 1 < shape.len() {
        return Err(invalid("nested arrays are ragged"));
    }
    for item in &items {
        nested(item, depth + 1, shape, out)?;
    }
    Ok(())
}

fn leaf(value: &Unknown) -> core::Result<Leaf> {
    // SAFETY: each cast follows the value's type.
    let read = unsafe {
        match value.get_type() {
            Ok(ValueType::Number) => value.cast::<f64>().map(Leaf::Number),
            Ok(ValueType::BigInt) => value.cast::<BigInt>().map(Leaf::BigInt),
            Ok(ValueType::Boolean) => value.cast::<bool>().map(Leaf::Bool),
            Ok(ValueType::String) => value.cast::<String>().map(Leaf::Str),
            _ => {
                return Err(invalid(format!(
                    "array data are numbers, bigints, booleans or strings, not {}",
                    type_name(value)
                )))
            }
        }
    };
    read.map_err(|e| invalid(e.reason.clone()))
}

/// Encodes scalars as `dtype` (default: float32 for numbers, int64 for
/// bigints, bool for booleans, string for strings).
fn encode(leaves: &[Leaf], dtype: Option<DType>) -> core::Result<HostData<'static>> {
    let dtype = match (dtype, leaves.first()) {
        (Some(d), _) => d,
        (None, Some(Leaf::BigInt(_))) => DType::I64,
        (None, Some(Leaf::Bool(_))) => DType::Bool,
        (None, Some(Leaf::Str(_))) => DType::String,
        (None, _) => DType::F32,
    };
    if dtype == DType::String {
        let strings = leaves
            .iter()
            .map(|l| match l {
                Leaf::Str(s) => Ok(s.clone()),
                _ => Err(invalid("string arrays hold only strings")),
            })
            .collect::<core::Result<Vec<_>>>()?;
        return Ok(HostData::Strings(strings));
    }
    let size = dtype.byte_size().unwrap_or(1);
    let mut out = Vec::with_capacity(leaves.len() * size);
    for l in leaves {
        let n = number(l, dtype)?;
        put(&mut out, n, dtype)?;
    }
    Ok(HostData::Dense(dtype, Cow::Owned(out)))
}

/// A scalar as a number of `dtype`'s domain.
enum Num {
    Float(f64),
    Int(i128),
}

fn number(leaf: &Leaf, dtype: DType) -> core::Result<Num> {
    let float = matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    Ok(match leaf {
        Leaf::Str(_) => return Err(invalid(format!("a string is not a {}", dtype.name()))),
        Leaf::Bool(b) => Num::Int(i128::from(*b)),
        Leaf::Number(x) if float => Num::Float(*x),
        Leaf::Number(x) => {
            if x.fract() != 0.0 || !x.is_finite() {
                return Err(invalid(format!("{x} is not an integer ({})", dtype.name())));
            }
            Num::Int(*x as i128)
        }
        Leaf::BigInt(b) => {
            let (value, lossless) = b.get_i128();
            if !lossless {
                return Err(invalid(format!(
                    "a bigint out of range for {}",
                    dtype.name()
                )));
            }
            if float {
                Num::Float(value as f64)
            } else {
                Num::Int(value)
            }
        }
    })
}

fn put(out: &mut Vec<u8>, n: Num, dtype: DType) -> core::Result<()> {
    let range = |lo: i128, hi: i128, v: i128| {
        if v < lo || v > hi {
            Err(invalid(format!("{v} is out of range for {}", dtype.name())))
        } else {
            Ok(v)
        }
    };
    match (dtype, n) {
        (DType::F32, Num::Float(x)) => out.extend_from_slice(&(x as f32).to_le_bytes()),
        (DType::F64, Num::Float(x)) => out.extend_from_slice(&x.to_le_bytes()),
        (DType::F16, Num::Float(x)) => {
            out.extend_from_slice(&half::f16::from_f64(x).to_bits().to_le_bytes())
        }
        (DType::BF16, Num::Float(x)) => {
            out.extend_from_slice(&half::bf16::from_f64(x).to_bits().to_le_bytes())
        }
        (DType::Bool, Num::Int(v)) => out.push(u8::from(v != 0)),
        (DType::I8, Num::Int(v)) => out.push(range(i8::MIN.into(), i8::MAX.into(), v)? as i8 as u8),
        (DType::U8, Num::Int(v)) => out.push(range(0, u8::MAX.into(), v)? as u8),
        (DType::I16, Num::Int(v)) => out
            .extend_from_slice(&(range(i16::MIN.into(), i16::MAX.into(), v)? as i16).to_le_bytes()),
        (DType::U16, Num::Int(v)) => {
            out.extend_from_slice(&(range(0, u16::MAX.into(), v)? as u16).to_le_bytes())
        }
        (DType::I32, Num::Int(v)) => out
            .extend_from_slice(&(range(i32::MIN.into(), i32::MAX.into(), v)? as i32).to_le_bytes()),
        (DType::U32, Num::Int(v)) => {
            out.extend_from_slice(&(range(0, u32::MAX.into(), v)? as u32).to_le_bytes())
        }
        (DType::I64, Num::Int(v)) => out
            .extend_from_slice(&(range(i64::MIN.into(), i64::MAX.into(), v)? as i64).to_le_bytes()),
        (DType::U64, Num::Int(v)) => {
            out.extend_from_slice(&(range(0, u64::MAX.into(), v)? as u64).to_le_bytes())
        }
        (d, Num::Int(v)) if matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64) => {
            return put(out, Num::Float(v as f64), d)
        }
        (d, _) => {
            return Err(invalid(format!(
                "{} data cannot be made from numbers",
                d.name()
            )))
        }
    }
    Ok(())
}

/// An array's gathered data as JavaScript sees it: a typed array of its
/// element type (`Uint8Array` of 0/1 for bool, `Uint16Array` of the bits for
/// float16 and bfloat16, `BigInt64Array` for int64), or strings.
pub enum Gathered {
    I8(Int8Array),
    U8(Uint8Array),
    I16(Int16Array),
    U16(Uint16Array),
    I32(Int32Array),
    U32(Uint32Array),
    I64(BigInt64Array),
    U64(BigUint64Array),
    F32(Float32Array),
    F64(Float64Array),
    Strings(Vec<String>),
}

/// Gathers `array` (waiting for it: call off the event loop) into the typed
/// array of its dtype, without an intermediate copy.
pub fn gather(array: &core::Array) -> core::Result<Gathered> {
    let n: usize = array.shape().iter().map(|&d| d as usize).product();
    Ok(match array.dtype() {
        DType::String => Gathered::Strings(array.to_host_strings()?),
        DType::Bool | DType::U8 => Gathered::U8(Uint8Array::new(fill::<u8>(array, n)?)),
        DType::I8 => Gathered::I8(Int8Array::new(fill::<i8>(array, n)?)),
        DType::I16 => Gathered::I16(Int16Array::new(fill::<i16>(array, n)?)),
        DType::U16 | DType::F16 | DType::BF16 => {
            Gathered::U16(Uint16Array::new(fill::<u16>(array, n)?))
        }
        DType::I32 => Gathered::I32(Int32Array::new(fill::<i32>(array, n)?)),
        DType::U32 => Gathered::U32(Uint32Array::new(fill::<u32>(array, n)?)),
        DType::I64 => Gathered::I64(BigInt64Array::new(fill::<i64>(array, n)?)),
        DType::U64 => Gathered::U64(BigUint64Array::new(fill::<u64>(array, n)?)),
        DType::F32 => Gathered::F32(Float32Array::new(fill::<f32>(array, n)?)),
        DType::F64 => Gathered::F64(Float64Array::new(fill::<f64>(array, n)?)),
    })
}

/// Plain numbers whose every bit pattern is a value.
trait Plain: Copy + Default {}
impl Plain for u8 {}
impl Plain for i8 {}
impl Plain for i16 {}
impl Plain for u16 {}
impl Plain for i32 {}
impl Plain for u32 {}
impl Plain for i64 {}
impl Plain for u64 {}
impl Plain for f32 {}
impl Plain for f64 {}

fn fill<T: Plain>(array: &core::Array, n: usize) -> core::Result<Vec<T>> {
    let mut out = vec![T::default(); n];
    // SAFETY: `out` holds `n` plain values, `n * size_of::<T>()` bytes, and
    // any bytes written are a valid `T`.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(
            out.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(out.as_slice()),
        )
    };
    array.to_host_into(bytes)?;
    Ok(out)
}

impl TypeName for Gathered {
    fn type_name() -> &'static str {
        "TypedArray | string[]"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ToNapiValue for Gathered {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        // SAFETY: forwarded to each value's own conversion, on the same env.
        unsafe {
            match val {
                Gathered::I8(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::U8(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::I16(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::U16(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::I32(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::U32(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::I64(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::U64(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::F32(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::F64(a) => ToNapiValue::to_napi_value(env, a),
                Gathered::Strings(s) => ToNapiValue::to_napi_value(env, s),
            }
        }
    }
}
