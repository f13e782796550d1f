//! Element types and named values.

use crate::error::{Error, Result};
use crate::sys;

/// The element types a PJRT buffer may have that this crate moves to and from
/// host memory (PJRT's `PJRT_Buffer_Type`, less the sub-byte, complex, f8 and
/// token types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// Booleans, one byte each.
    Pred,
    /// Signed integers.
    S8,
    /// 16-bit signed.
    S16,
    /// 32-bit signed.
    S32,
    /// 64-bit signed.
    S64,
    /// 8-bit unsigned.
    U8,
    /// 16-bit unsigned.
    U16,
    /// 32-bit unsigned.
    U32,
    /// 64-bit unsigned.
    U64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl ElementType {
    /// Every type, in PJRT's numbering order.
    pub const ALL: [ElementType; 13] = [
        ElementType::Pred,
        ElementType::S8,
        ElementType::S16,
        ElementType::S32,
        ElementType::S64,
        ElementType::U8,
        ElementType::U16,
        ElementType::U32,
        ElementType::U64,
        ElementType::F16,
        ElementType::BF16,
        ElementType::F32,
        ElementType::F64,
    ];

    /// PJRT's number for the type.
    pub fn to_pjrt(self) -> sys::PJRT_Buffer_Type {
        match self {
            ElementType::Pred => sys::PJRT_Buffer_Type_PRED,
            ElementType::S8 => sys::PJRT_Buffer_Type_S8,
            ElementType::S16 => sys::PJRT_Buffer_Type_S16,
            ElementType::S32 => sys::PJRT_Buffer_Type_S32,
            ElementType::S64 => sys::PJRT_Buffer_Type_S64,
            ElementType::U8 => sys::PJRT_Buffer_Type_U8,
            ElementType::U16 => sys::PJRT_Buffer_Type_U16,
            ElementType::U32 => sys::PJRT_Buffer_Type_U32,
            ElementType::U64 => sys::PJRT_Buffer_Type_U64,
            ElementType::F16 => sys::PJRT_Buffer_Type_F16,
            ElementType::BF16 => sys::PJRT_Buffer_Type_BF16,
            ElementType::F32 => sys::PJRT_Buffer_Type_F32,
            ElementType::F64 => sys::PJRT_Buffer_Type_F64,
        }
    }

    /// The type of PJRT's number `value`; `unimplemented` for a type this
    /// crate does not move (complex, f8, sub-byte, token).
    pub fn from_pjrt(value: sys::PJRT_Buffer_Type) -> Result<ElementType> {
        ElementType::ALL
            .into_iter()
            .find(|t| t.to_pjrt() == value)
            .ok_or_else(|| {
                Error::unimplemented(format!(
                    "PJRT element type {value} is not supported (pred, s8-s64, u8-u64, f16, \
                     bf16, f32 and f64 are)"
                ))
            })
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 => 1,
            ElementType::S16 | ElementType::U16 | ElementType::F16 | ElementType::BF16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 => 8,
        }
    }
}

/// A named value's value (client create options, attributes).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int64(i64),
    /// A list of 64-bit integers.
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

/// A copy of `len` bytes at `ptr` as text (lossy), empty for null.
///
/// # Safety
/// `ptr` is null or points to `len` readable bytes.
pub(crate) unsafe fn string_of(ptr: *const std::os::raw::c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    let bytes = std::slice::from_raw_parts(ptr.cast::<u8>(), len);
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies `n` named values at `values`; values of a type this crate does not
/// know are left out.
///
/// # Safety
/// `values` is null or points to `n` valid `PJRT_NamedValue`s.
pub(crate) unsafe fn named_values(
    values: *const sys::PJRT_NamedValue,
    n: usize,
) -> Vec<(String, Value)> {
    if values.is_null() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(n);
    for v in std::slice::from_raw_parts(values, n) {
        let name = string_of(v.name, v.name_size);
        let value = match v.type_ {
            sys::PJRT_NamedValue_kString => {
                Value::String(string_of(v.__bindgen_anon_1.string_value, v.value_size))
            }
            sys::PJRT_NamedValue_kInt64 => Value::Int64(v.__bindgen_anon_1.int64_value),
            sys::PJRT_NamedValue_kInt64List => {
                let p = v.__bindgen_anon_1.int64_array_value;
                if p.is_null() {
                    Value::Int64List(Vec::new())
                } else {
                    Value::Int64List(std::slice::from_raw_parts(p, v.value_size).to_vec())
                }
            }
            sys::PJRT_NamedValue_kFloat => Value::Float(v.__bindgen_anon_1.float_value),
            sys::PJRT_NamedValue_kBool => Value::Bool(v.__bindgen_anon_1.bool_value),
            _ => continue,
        };
        out.push((name, value));
    }
    out
}

/// Named values pointing into `options` (which must outlive the result).
pub(crate) fn to_named_values(options: &[(String, Value)]) -> Vec<sys::PJRT_NamedValue> {
    options
        .iter()
        .map(|(name, value)| {
            let mut v: sys::PJRT_NamedValue = crate::plugin::args();
            v.struct_size = sys::PJRT_NamedValue_STRUCT_SIZE as usize;
            v.name = name.as_ptr().cast();
            v.name_size = name.len();
            match value {
                Value::String(s) => {
                    v.type_ = sys::PJRT_NamedValue_kString;
                    v.__bindgen_anon_1.string_value = s.as_ptr().cast();
                    v.value_size = s.len();
                }
                Value::Int64(i) => {
                    v.type_ = sys::PJRT_NamedValue_kInt64;
                    v.__bindgen_anon_1.int64_value = *i;
                    v.value_size = 1;
                }
                Value::Int64List(l) => {
                    v.type_ = sys::PJRT_NamedValue_kInt64List;
                    v.__bindgen_anon_1.int64_array_value = l.as_ptr();
                    v.value_size = l.len();
                }
                Value::Float(f) => {
                    v.type_ = sys::PJRT_NamedValue_kFloat;
                    v.__bindgen_anon_1.float_value = *f;
                    v.value_size = 1;
                }
                Value::Bool(b) => {
                    v.type_ = sys::PJRT_NamedValue_kBool;
                    v.__bindgen_anon_1.bool_value = *b;
                    v.value_size = 1;
                }
            }
            v
        })
        .collect()
}
