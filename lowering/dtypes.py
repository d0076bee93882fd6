"""Element types: MLIR element types of StableHLO tensors <-> numpy dtypes (ml_dtypes for bf16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir

# Keyed by the MLIR element type's own spelling (`str(ir.Type)`), a closed set of short names.
_ELEMENT_TYPES: dict[str, np.dtype] = {
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8),
    "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "complex<f32>": np.dtype(np.complex64),
    "complex<f64>": np.dtype(np.complex128),
}


def numpy_dtype(element_type: ir.Type) -> np.dtype | None:
    """The numpy dtype of an MLIR element type, or None if ipujax does not support it."""
    return _ELEMENT_TYPES.get(str(element_type))


def is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16


def is_integer(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.integer)
