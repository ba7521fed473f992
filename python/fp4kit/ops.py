"""``torch.ops.fp4kit``: fp4kit as PyTorch custom operators.

Registering the operations with the dispatcher (rather than calling them as plain Python functions)
is what lets them live inside ``torch.compile(fullgraph=True)`` graphs and CUDA graphs: each op has a
schema that states what it reads, writes and returns (none of them mutates an input), a fake (meta)
implementation that computes output shapes without running anything, a CUDA implementation (the
kernels, on the current stream, no host synchronisation) and a CPU implementation (the host code, and
for ``gemm`` the spec-level reference: dequantize, then an fp32 matmul), so the same program runs and
can be checked on a machine without a GPU.

    torch.ops.fp4kit.quantize(w, format, tensor_scale=None) -> (packed, scales, tensor_scale)
    torch.ops.fp4kit.prepack(packed, scales, tensor_scale, format, n, k) -> buffer
    torch.ops.fp4kit.gemm(x, buffer, format, n, k, bias=None) -> y

The GEMM's scratch workspace is managed inside the CUDA implementation (like cuBLAS's): one zero-filled
buffer per (device, stream) in eager mode, a fresh one per call while a CUDA graph is being captured, so
captured graphs never share scratch memory with eager calls.
"""
from __future__ import annotations

import torch

from . import _C, group_size, torch_ops

__all__ = ["dequantize_packed"]

_lib = torch.library.Library("fp4kit", "DEF")
_lib.define("quantize(Tensor w, str format, Tensor? tensor_scale=None) -> (Tensor, Tensor, Tensor)")
_lib.define("prepack(Tensor packed, Tensor scales, Tensor? tensor_scale, str format, int n, int k) -> Tensor")
_lib.define("gemm(Tensor x, Tensor w, str format, int n, int k, Tensor? bias=None) -> Tensor")


# ---- quantize ---------------------------------------------------------------------------------------
def _quantize(w, format, tensor_scale=None):
    return torch_ops.quantize(w, format, tensor_scale)


_lib.impl("quantize", _quantize, "CPU")
_lib.impl("quantize", _quantize, "CUDA")


@torch.library.register_fake("fp4kit::quantize")
def _quantize_fake(w, format, tensor_scale=None):
    n, k = w.shape
    g = group_size(format)
    return (w.new_empty((n, k // 2), dtype=torch.uint8), w.new_empty((n, k // g), dtype=torch.uint8),
            w.new_empty((1,), dtype=torch.float32))


# ---- prepack ----------------------------------------------------------------------------------------
def _prepack(packed, scales, tensor_scale, format, n, k):
    return torch_ops.prepack(packed, scales, tensor_scale, format, n, k)


_lib.impl("prepack", _prepack, "CPU")
_lib.impl("prepack", _prepack, "CUDA")


@torch.library.register_fake("fp4kit::prepack")
def _prepack_fake(packed, scales, tensor_scale, format, n, k):
    return packed.new_empty((torch_ops._total_bytes(format, n, k),), dtype=torch.uint8)


# ---- gemm -------------------------------------------------------------------------------------------
def dequantize_packed(buffer: torch.Tensor, format: str, n: int, k: int) -> torch.Tensor:
    """Float32 [n, k] weights of a prepacked buffer (host computation; the CPU GEMM and tests use it).

    Per the spec: e2m1 * block scale * tensor scale, with the per-row tensor scale read back from the
    buffer (a row holding a NaN block scale dequantizes to NaN, as its GEMM outputs are)."""
    buf = buffer.detach().to("cpu").contiguous().numpy()
    packed, scales = _C.unpack_cpu(format, n, k, buf)
    w = torch.from_numpy(_C.dequantize_cpu(packed, scales, 1.0, format))
    if format == "nvfp4":
        lay = _C.packed_layout(format, n, k)
        off = lay["out_scale_offset"]
        row = torch.from_numpy(buf[off:off + 4 * n].copy().view("float32")) / 512.0
        w = w * row[:, None]
    return w


def _gemm_cpu(x, w, format, n, k, bias=None):
    if x.shape[-1] != k:
        raise ValueError(f"x: last dimension must be k = {k} (got shape {tuple(x.shape)})")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"x: dtype must be torch.bfloat16 or torch.float16 (got {x.dtype})")
    y = x.float() @ dequantize_packed(w, format, n, k).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _gemm_cuda(x, w, format, n, k, bias=None):
    return torch_ops.gemm(x.contiguous(), w, format, n, k, bias=bias)


def _load_cpp_kernels() -> bool:
    """Load libfp4kit_torch (the C++ CUDA kernel of gemm, built when torch was present at build time)."""
    import glob
    import os
    if os.environ.get("FP4KIT_PYTHON_OPS"):  # force the Python kernel (comparisons, debugging)
        return False
    here = os.path.dirname(os.path.abspath(__file__))
    libs = glob.glob(os.path.join(here, "libfp4kit_torch*.so"))
    if not libs:
        return False
    try:
        torch.ops.load_library(libs[0])
    except OSError as e:  # e.g. built against another torch: fall back, and say so
        import warnings
        warnings.warn(f"fp4kit: {libs[0]} did not load ({e}); torch.ops.fp4kit.gemm uses its Python kernel")
        return False
    return True


_lib.impl("gemm", _gemm_cpu, "CPU")
#: True when torch.ops.fp4kit.gemm's CUDA kernel is the C++ one (a few microseconds less host time per
#: call); False when it is _gemm_cuda above. Both check the same rules with the same messages.
CPP_CUDA_KERNEL = _load_cpp_kernels()
if not CPP_CUDA_KERNEL:
    _lib.impl("gemm", _gemm_cuda, "CUDA")


@torch.library.register_fake("fp4kit::gemm")
def _gemm_fake(x, w, format, n, k, bias=None):
    torch._check(x.shape[-1] == k, lambda: f"x: last dimension must be k = {k}")
    return x.new_empty(tuple(x.shape[:-1]) + (n,))
