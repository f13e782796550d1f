//! Element types of buffers and arrays.

use crate::error::{Error, Result};

/// The element type of a buffer. Numeric values are part of the C ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DType {
    /// `bool`, one byte per element (0 or 1).
    Bool = 1,
    /// Signed 8-bit integer.
    I8 = 2,
    /// Signed 16-bit integer.
    I16 = 3,
    /// Signed 32-bit integer.
    I32 = 4,
    /// Signed 64-bit integer.
    I64 = 5,
    /// Unsigned 8-bit integer.
    U8 = 6,
    /// Unsigned 16-bit integer.
    U16 = 7,
    /// Unsigned 32-bit integer.
    U32 = 8,
    /// Unsigned 64-bit integer.
    U64 = 9,
    /// IEEE half precision.
    F16 = 10,
    /// bfloat16.
    BF16 = 11,
    /// IEEE single precision.
    F32 = 12,
    /// IEEE double precision.
    F64 = 13,
    /// Variable-length UTF-8 strings (CPU memory only).
    String = 14,
}

impl DType {
    /// Every dtype, in ABI order.
    pub const ALL: [DType; 14] = [
        DType::Bool,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::String,
    ];

    /// Converts the ABI value, or fails with `invalid_argument`.
    pub fn from_u32(value: u32) -> Result<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| *d as u32 == value)
            .ok_or_else(|| Error::invalid_argument(format!("unknown dtype {value}")))
    }

    /// The element type named `name` (as [`name`](Self::name) gives it:
    /// `"float32"`, `"bfloat16"`, `"string"`, …), or `invalid_argument`
    /// listing the names.
    pub fn from_name(name: &str) -> Result<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
                Error::invalid_argument(format!(
                    "unsupported dtype {name:?} (the element types are {})",
                    names.join(", ")
                ))
            })
    }

    /// Bytes per element; `None` for variable-length strings.
    pub fn byte_size(self) -> Option<usize> {
        Some(match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
            DType::String => return None,
        })
    }

    /// Bytes of a dense array of this dtype with `dims`; `invalid_argument`
    /// for negative dimensions, a size past `isize::MAX`, or strings (which
    /// have no fixed size).
    pub fn dense_byte_size(self, dims: &[i64]) -> Result<usize> {
        if self == DType::String {
            return Err(Error::invalid_argument(
                "string arrays have no fixed byte size",
            ));
        }
        checked_byte_size(self, dims)
    }

    /// The numpy-style name (`"float32"`, `"bfloat16"`, `"string"`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::String => "string",
        }
    }
}

/// Validated dimensions: element count and byte size computed without overflow.
pub(crate) fn checked_num_elements(dims: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for (i, &d) in dims.iter().enumerate() {
        if d < 0 {
            return Err(Error::invalid_argument(format!(
                "dimension {i} is negative ({d})"
            )));
        }
        let d = usize::try_from(d)
            .map_err(|_| Error::invalid_argument(format!("dimension {i} ({d}) overflows")))?;
        n = n.checked_mul(d).ok_or_else(|| {
            Error::invalid_argument(format!("dims {dims:?} overflow the element count"))
        })?;
    }
    Ok(n)
}

/// Byte size of a dense buffer of `dtype` with `dims`, or `invalid_argument`.
pub(crate) fn checked_byte_size(dtype: DType, dims: &[i64]) -> Result<usize> {
    let n = checked_num_elements(dims)?;
    match dtype.byte_size() {
        Some(size) => n
            .checked_mul(size)
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "dims {dims:?} of {} overflow the byte size",
                    dtype.name()
                ))
            }),
        None => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn every_dtype_round_trips_through_its_abi_value() {
        for d in DType::ALL {
            assert_eq!(DType::from_u32(d as u32).unwrap(), d);
        }
        assert_eq!(
            DType::from_u32(99).unwrap_err().code(),
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn every_dtype_round_trips_through_its_name() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
        let err = DType::from_name("float128").unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.message().contains("bfloat16"), "{err}");
    }

    #[test]
    fn byte_size_rejects_negative_and_overflowing_dims() {
        assert_eq!(checked_byte_size(DType::F32, &[2, 3]).unwrap(), 24);
        assert_eq!(checked_byte_size(DType::F32, &[]).unwrap(), 4);
        assert_eq!(checked_byte_size(DType::F32, &[0, 7]).unwrap(), 0);
        let neg = checked_byte_size(DType::F32, &[2, -1]).unwrap_err();
        assert!(neg.message().contains("negative"));
        let big = checked_byte_size(DType::F64, &[i64::MAX, 2]).unwrap_err();
        assert_eq!(big.code(), ErrorCode::InvalidArgument);
        let big = checked_byte_size(DType::F64, &[1 << 61]).unwrap_err();
        assert!(big.message().contains("overflow"));
        assert_eq!(DType::F32.dense_byte_size(&[2, 3]).unwrap(), 24);
        let strings = DType::String.dense_byte_size(&[2]).unwrap_err();
        assert_eq!(strings.code(), ErrorCode::InvalidArgument);
    }
}
