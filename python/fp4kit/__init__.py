"""fp4kit: BF16/FP16 x FP4 (NVFP4, MXFP4) GEMM for NVIDIA GPUs without FP4 tensor cores.

Host (numpy) API, usable without a GPU:
    packed, scales, tensor_scale = quantize(w, "nvfp4")      # checkpoint layout
    w_hat = dequantize(packed, scales, tensor_scale, "nvfp4")
    y = reference_gemm(x, w_hat, bias)                        # float64 oracle
    buf = prepack(packed, scales, tensor_scale, "nvfp4")      # kernel layout (host copy)

Checkpoint layout: packed uint8 [N, K/2] (low nibble = even K index), scales uint8 [N, K/group]
(NVFP4: E4M3, group 16; MXFP4: E8M0, group 32), and for NVFP4 one float32 tensor scale.

GPU work on torch tensors lives in ``fp4kit.torch_ops`` (imported on demand; needs torch).
Errors: a bad argument raises ValueError (shape, layout, value) or TypeError (dtype) naming the argument
and the rule; a valid request this build cannot serve raises NotImplementedError; CUDA errors raise
RuntimeError.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _C

__version__: str = _C.__version__
__all__ = ["quantize", "dequantize", "reference_gemm", "packed_layout", "prepack", "unpack",
           "cuda_device_count", "group_size"]

_GROUP = {"nvfp4": 16, "mxfp4": 32}


def group_size(format: str) -> int:
    """Values per block scale along K: 16 for "nvfp4", 32 for "mxfp4"."""
    try:
        return _GROUP[format]
    except KeyError:
        raise ValueError(f'format: must be "nvfp4" or "mxfp4" (got {format!r})') from None


def quantize(w: np.ndarray, format: str = "nvfp4",
             tensor_scale: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray, float]:
    """Quantize W [N, K] (float32 or float16, C-contiguous; K % group_size == 0) on the CPU.

    Returns (packed uint8 [N, K/2], scales uint8 [N, K/group], tensor_scale). NVFP4 uses the ModelOpt recipe
    (tensor_scale = amax / (6 * 448) unless given); MXFP4 uses the OCP recipe and returns tensor_scale 1.0.
    """
    return _C.quantize_cpu(w, format, tensor_scale)


def dequantize(packed: np.ndarray, scales: np.ndarray, tensor_scale: float = 1.0,
               format: str = "nvfp4") -> np.ndarray:
    """Checkpoint layout -> float32 [N, K] (NVFP4: e2m1 * e4m3 * tensor_scale; MXFP4: e2m1 * 2^(e-127))."""
    return _C.dequantize_cpu(packed, scales, float(tensor_scale), format)


def reference_gemm(x: np.ndarray, w: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
    """The test oracle: x float32 [M, K] @ w float32 [N, K]^T (+ bias float32 [N]), summed in float64."""
    return _C.reference_gemm(x, w, bias)


def packed_layout(format: str, n: int, k: int) -> dict:
    """Geometry of the prepacked (kernel-layout) buffer for W [n, k]: padded shape, region offsets and
    sizes, ``total_bytes``."""
    return _C.packed_layout(format, n, k)


def prepack(packed: np.ndarray, scales: np.ndarray, tensor_scale: Optional[float] = None,
            format: str = "nvfp4", row_tensor_scale: Optional[np.ndarray] = None) -> np.ndarray:
    """Checkpoint layout -> kernel layout on the CPU (uint8 [total_bytes]); copy it to the GPU to run GEMMs.

    NVFP4 may take one tensor scale or one float32 per row (fused projections); neither means 1.0.
    """
    return _C.prepack_cpu(format, packed, scales, tensor_scale, row_tensor_scale)


def unpack(buffer: np.ndarray, n: int, k: int, format: str = "nvfp4") -> Tuple[np.ndarray, np.ndarray]:
    """Kernel layout -> checkpoint layout (packed, scales); the inverse of prepack."""
    return _C.unpack_cpu(format, n, k, buffer)


def cuda_device_count() -> int:
    """Number of visible CUDA devices; 0 (never an exception) without a driver or a GPU."""
    return _C.cuda_device_count()
