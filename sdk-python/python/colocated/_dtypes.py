"""numpy dtypes <-> the runtime's element types."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ._errors import InvalidArgumentError

#: numpy's variable-length string dtype: the element type of string arrays.
STRING = np.dtypes.StringDType()

_TO_CORE: dict[np.dtype, str] = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.int8): "int8",
    np.dtype(np.int16): "int16",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.uint64): "uint64",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
}
_FROM_CORE: dict[str, np.dtype] = {name: dt for dt, name in _TO_CORE.items()}
_FROM_CORE["string"] = STRING


def core_name(dtype: np.dtype) -> str:
    """The runtime's name for a numpy dtype; ``InvalidArgumentError`` if unsupported."""
    if dtype.kind == "T":
        return "string"
    name = _TO_CORE.get(dtype)
    if name is None:
        raise InvalidArgumentError(
            f"dtype {dtype} is not supported; use one of bool, int8-int64, uint8-uint64, "
            "float16, bfloat16, float32, float64 or numpy.dtypes.StringDType()"
        )
    return name


def from_core(name: str) -> np.dtype:
    """The numpy dtype for the runtime's element type name."""
    return _FROM_CORE[name]


def canonicalize(dtype) -> np.dtype:
    """A numpy dtype from anything numpy accepts (fixed-width str becomes StringDType)."""
    dt = np.dtype(dtype)
    if dt.kind == "U":
        return STRING
    core_name(dt)
    return dt
