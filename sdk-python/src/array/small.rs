//! The fast path of small values: an array of one small dense buffer is read
//! into a fresh numpy value (a ufunc operand), a small numpy result is made into
//! an array laid out like it, and an operator with a Python scalar is computed
//! natively where `scalar_math` can. Also numpy's dtypes, resolved once.

use colocated_core as core;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyTuple};

use super::ArrayImpl;
use crate::errors::py_err;
use crate::scalar_math;

/// Values up to this size are copied as ufunc operands and results (cheaper than
/// pinning a view or passing an address); `_SMALL_BYTES` in `_device_put.py`.
const SMALL_BYTES: usize = 4096;

/// True for a dense element type whose array of `shape` fits in `SMALL_BYTES`.
fn is_small(dtype: core::DType, shape: &[i64]) -> bool {
    let Some(mut bytes) = dtype.byte_size() else {
        return false;
    };
    for &d in shape {
        match usize::try_from(d).ok().and_then(|d| bytes.checked_mul(d)) {
            Some(b) if b <= SMALL_BYTES => bytes = b,
            _ => return false,
        }
    }
    true
}

/// `numpy.frombuffer` and the numpy dtype of each dense element type, resolved
/// once per process.
pub(super) struct Numpy {
    frombuffer: Py<PyAny>,
    /// Indexed like `core::DType::ALL`.
    dtypes: Vec<Py<PyAny>>,
    /// The numpy scalar type of each dtype (`dtype.type`), indexed alike.
    scalar_types: Vec<Py<PyAny>>,
}

static NUMPY: PyOnceLock<Numpy> = PyOnceLock::new();

/// numpy's functions and dtypes (resolved on the first call).
pub(super) fn numpy(py: Python<'_>) -> PyResult<&'static Numpy> {
    NUMPY.get_or_try_init(py, || {
        let from_core = crate::hooks::hooks(py)?.numpy_dtypes.bind(py);
        let dtypes = core::DType::ALL
            .iter()
            .map(|d| from_core.get_item(d.name()).map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        let scalar_types = dtypes
            .iter()
            .map(|d| d.bind(py).getattr("type").map(Bound::unbind))
            .collect::<PyResult<_>>()?;
        Ok(Numpy {
            frombuffer: py.import("numpy")?.getattr("frombuffer")?.unbind(),
            dtypes,
            scalar_types,
        })
    })
}

impl Numpy {
    fn index(dtype: core::DType) -> PyResult<usize> {
        core::DType::ALL
            .iter()
            .position(|d| *d == dtype)
            .ok_or_else(|| PyValueError::new_err(format!("no numpy dtype for {dtype:?}")))
    }

    /// The numpy dtype of `dtype`.
    pub(super) fn dtype<'py>(
        &self,
        py: Python<'py>,
        dtype: core::DType,
    ) -> PyResult<&Bound<'py, PyAny>> {
        Ok(self.dtypes[Self::index(dtype)?].bind(py))
    }

    fn scalar_type<'py>(
        &self,
        py: Python<'py>,
        dtype: core::DType,
    ) -> PyResult<&Bound<'py, PyAny>> {
        Ok(self.scalar_types[Self::index(dtype)?].bind(py))
    }

    /// The dense core element type whose numpy scalar type `value` is an exact
    /// instance of.
    fn scalar_dtype(&self, value: &Bound<'_, PyAny>) -> Option<core::DType> {
        let ty = value.get_type();
        let found = self.scalar_types.iter().position(|t| t.is(&ty))?;
        let dtype = core::DType::ALL[found];
        (dtype != core::DType::String).then_some(dtype)
    }

    /// The core element type of a numpy dtype (dense types; native byte order).
    fn core_dtype(&self, np_dtype: &Bound<'_, PyAny>) -> Option<core::DType> {
        // numpy's builtin dtypes are singletons: identity first, equality after.
        let found = self
            .dtypes
            .iter()
            .position(|d| d.is(np_dtype))
            .or_else(|| {
                self.dtypes
                    .iter()
                    .position(|d| d.bind(np_dtype.py()).eq(np_dtype).unwrap_or(false))
            })?;
        let dtype = core::DType::ALL[found];
        (dtype != core::DType::String).then_some(dtype)
    }
}

/// One element of a dense dtype as a Python number (None for float16/bfloat16,
/// which numpy converts itself).
fn scalar_to_py<'py>(
    py: Python<'py>,
    dtype: core::DType,
    bytes: &[u8],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    use core::DType as D;
    macro_rules! read {
        ($t:ty) => {{
            let raw = <[u8; std::mem::size_of::<$t>()]>::try_from(bytes)
                .map_err(|_| PyValueError::new_err("scalar of the wrong size"))?;
            <$t>::from_ne_bytes(raw).into_pyobject(py)?.into_any()
        }};
    }
    Ok(Some(match dtype {
        D::Bool => pyo3::types::PyBool::new(py, bytes.first().is_some_and(|b| *b != 0))
            .to_owned()
            .into_any(),
        D::I8 => read!(i8),
        D::I16 => read!(i16),
        D::I32 => read!(i32),
        D::I64 => read!(i64),
        D::U8 => read!(u8),
        D::U16 => read!(u16),
        D::U32 => read!(u32),
        D::U64 => read!(u64),
        D::F32 => read!(f32),
        D::F64 => read!(f64),
        D::F16 | D::BF16 | D::String => return Ok(None),
    }))
}

/// The bytes of a small one-buffer dense array (waiting for them without the
/// GIL); None when the array is split, large or holds strings.
fn small_bytes(py: Python<'_>, array: &core::Array) -> PyResult<Option<Vec<u8>>> {
    let [buffer] = array.buffers() else {
        return Ok(None);
    };
    if !is_small(array.dtype(), array.shape()) {
        return Ok(None);
    }
    if buffer.ready_event().is_ready() {
        buffer.to_host_vec()
    } else {
        py.detach(|| buffer.to_host_vec())
    }
    .map(Some)
    .map_err(py_err)
}

/// `scalar_op` computed natively (see `scalar_math`): None when the
/// operator, the operand, the array or the outcome is one that numpy must
/// handle.
fn native_scalar_op(
    this: &ArrayImpl,
    py: Python<'_>,
    op: &Bound<'_, PyAny>,
    other: &Bound<'_, PyAny>,
    reflected: bool,
) -> PyResult<Option<ArrayImpl>> {
    let Some(op) = native_op(py, op)? else {
        return Ok(None);
    };
    let scalar = if other.is_exact_instance_of::<pyo3::types::PyInt>() {
        match (other.extract::<i64>(), other.extract::<u64>()) {
            (Ok(v), _) => scalar_math::Scalar::Int(v.into()),
            (_, Ok(v)) => scalar_math::Scalar::Int(v.into()),
            // Beyond every dtype's range: numpy raises OverflowError.
            _ => return Ok(None),
        }
    } else if other.is_exact_instance_of::<pyo3::types::PyFloat>() {
        scalar_math::Scalar::Float(other.extract::<f64>()?)
    } else {
        return Ok(None);
    };
    let array = this.array()?;
    // The fast path makes buffers in the default memory space only.
    let default_space = |b: &core::Buffer| b.memory_space() == b.device().default_memory_space();
    if !array.buffers().iter().all(default_space) {
        return Ok(None);
    }
    let Some(bytes) = small_bytes(py, array)? else {
        return Ok(None);
    };
    let Some((dtype, out)) = scalar_math::compute(array.dtype(), &bytes, op, scalar, reflected)
    else {
        return Ok(None);
    };
    let Ok(spec) = core::ArraySpec::new(array.shape().to_vec(), dtype, array.sharding().clone())
    else {
        return Ok(None);
    };
    let client = this.client.get().map_err(py_err)?;
    let out = core::Array::from_host_bytes(client, &out, spec).map_err(py_err)?;
    Ok(Some(ArrayImpl::wrap(client.clone(), out)))
}

/// `operator.add`, `sub`, `mul` and `truediv`, which `scalar_math` computes.
static NATIVE_OPS: PyOnceLock<[(Py<PyAny>, scalar_math::Op); 4]> = PyOnceLock::new();

/// The operator `op` is, if `scalar_math` computes it.
fn native_op(py: Python<'_>, op: &Bound<'_, PyAny>) -> PyResult<Option<scalar_math::Op>> {
    let ops = NATIVE_OPS.get_or_try_init(py, || -> PyResult<_> {
        let operator = py.import("operator")?;
        let get = |name: &str| operator.getattr(name).map(Bound::unbind);
        Ok([
            (get("add")?, scalar_math::Op::Add),
            (get("sub")?, scalar_math::Op::Sub),
            (get("mul")?, scalar_math::Op::Mul),
            (get("truediv")?, scalar_math::Op::TrueDiv),
        ])
    })?;
    Ok(ops.iter().find(|(f, _)| f.is(op)).map(|(_, o)| *o))
}

/// The bytes of a numpy scalar of a dense dtype (None for float16/bfloat16 or a
/// value that does not convert, which `tobytes` handles).
fn scalar_from_py(dtype: core::DType, value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    use core::DType as D;
    macro_rules! write {
        ($t:ty) => {
            value.extract::<$t>().ok().map(|v| v.to_ne_bytes().to_vec())
        };
    }
    match dtype {
        D::Bool => value.extract::<bool>().ok().map(|b| vec![u8::from(b)]),
        D::I8 => write!(i8),
        D::I16 => write!(i16),
        D::I32 => write!(i32),
        D::I64 => write!(i64),
        D::U8 => write!(u8),
        D::U16 => write!(u16),
        D::U32 => write!(u32),
        D::U64 => write!(u64),
        D::F32 => write!(f32),
        D::F64 => write!(f64),
        D::F16 | D::BF16 | D::String => None,
    }
}

#[pymethods]
impl ArrayImpl {
    /// The value of a small one-buffer dense array as a fresh numpy value that
    /// nobody else sees (a numpy scalar for rank 0, else an array), for a ufunc
    /// operand; None when the array is split, large or holds strings. Waits
    /// (without the GIL) for the data.
    fn small_value<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let array = self.array()?;
        let Some(bytes) = small_bytes(py, array)? else {
            return Ok(None);
        };
        let dtype = array.dtype();
        let numpy = numpy(py)?;
        let np_dtype = numpy.dtype(py, dtype)?;
        let shape = array.shape();
        if shape.is_empty() {
            if let Some(number) = scalar_to_py(py, dtype, &bytes)? {
                return numpy.scalar_type(py, dtype)?.call1((number,)).map(Some);
            }
        }
        let value = numpy
            .frombuffer
            .bind(py)
            .call1((PyBytes::new(py, &bytes), np_dtype))?;
        match shape.len() {
            0 => value.get_item(0).map(Some),
            1 => Ok(Some(value)),
            _ => value
                .call_method1(pyo3::intern!(py, "reshape"), (PyTuple::new(py, shape)?,))
                .map(Some),
        }
    }

    /// `op(value, other)` (or `op(other, value)` when `reflected`) for a Python
    /// scalar `other` and the value of this small one-buffer array, as an array
    /// laid out like this one; None when either step does not qualify (see
    /// `small_value` and `small_like`). The operator fast path of `Array`.
    fn scalar_op(
        &self,
        py: Python<'_>,
        op: &Bound<'_, PyAny>,
        other: &Bound<'_, PyAny>,
        reflected: bool,
    ) -> PyResult<Option<Self>> {
        if let Some(out) = native_scalar_op(self, py, op, other, reflected)? {
            return Ok(Some(out));
        }
        let Some(value) = self.small_value(py)? else {
            return Ok(None);
        };
        let out = if reflected {
            op.call1((other, value))?
        } else {
            op.call1((value, other))?
        };
        self.small_like(py, &out)
    }

    /// A small numpy result (`value`, an ndarray or numpy scalar) as an array
    /// laid out like this one-buffer array, or None when it does not qualify (a
    /// dtype the runtime lacks, a large value, another layout).
    fn small_like(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        let array = self.array()?;
        let [buffer] = array.buffers() else {
            return Ok(None);
        };
        // The fast path makes buffers in the default memory space only.
        if buffer.memory_space() != buffer.device().default_memory_space() {
            return Ok(None);
        }
        let numpy = numpy(py)?;
        let (dtype, shape) = match numpy.scalar_dtype(value) {
            // A numpy scalar: rank 0, its type says the dtype.
            Some(dtype) => (dtype, Vec::new()),
            None => {
                let Ok(np_dtype) = value.getattr(pyo3::intern!(py, "dtype")) else {
                    return Ok(None);
                };
                let Some(dtype) = numpy.core_dtype(&np_dtype) else {
                    return Ok(None);
                };
                let shape: Vec<i64> = value.getattr(pyo3::intern!(py, "shape"))?.extract()?;
                (dtype, shape)
            }
        };
        if !is_small(dtype, &shape) {
            return Ok(None);
        }
        let Ok(spec) = core::ArraySpec::new(shape, dtype, array.sharding().clone()) else {
            return Ok(None);
        };
        let client = self.client.get().map_err(py_err)?;
        let native = if spec.shape.is_empty() {
            scalar_from_py(dtype, value)
        } else {
            None
        };
        let out = match native {
            Some(bytes) => core::Array::from_host_bytes(client, &bytes, spec),
            None => {
                let bytes = value.call_method0(pyo3::intern!(py, "tobytes"))?;
                core::Array::from_host_bytes(client, bytes.cast::<PyBytes>()?.as_bytes(), spec)
            }
        }
        .map_err(py_err)?;
        Ok(Some(ArrayImpl::wrap(client.clone(), out)))
    }
}
