//! Array specs: a global shape, an element type and a sharding, checked
//! against each other (JAX's `ShapeDtypeStruct`).

use crate::dtype::{checked_byte_size, DType};
use crate::error::Result;
use crate::sharding::Sharding;

/// The spec of an array: shape, dtype and sharding (JAX's `ShapeDtypeStruct`).
#[derive(Clone, Debug)]
pub struct ArraySpec {
    /// Global shape.
    pub shape: Vec<i64>,
    /// Element type.
    pub dtype: DType,
    /// Layout over devices.
    pub sharding: Sharding,
}

impl ArraySpec {
    /// Validates the shape against the sharding.
    pub fn new(shape: Vec<i64>, dtype: DType, sharding: Sharding) -> Result<ArraySpec> {
        checked_byte_size(dtype, &shape)?;
        sharding.shard_shape(&shape)?;
        Ok(ArraySpec {
            shape,
            dtype,
            sharding,
        })
    }

    /// True when `other` has the same shape, dtype and an equivalent sharding.
    pub fn matches(&self, other: &ArraySpec) -> bool {
        self.dtype == other.dtype
            && self.shape == other.shape
            && self.sharding.equivalent(&other.sharding, self.shape.len())
    }

    /// `float32[8,2]` (shape and dtype, for messages).
    pub fn describe(&self) -> String {
        format!("{}{:?}", self.dtype.name(), self.shape)
    }
}
