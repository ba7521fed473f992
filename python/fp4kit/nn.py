"""fp4kit.nn: FP4 drop-ins for torch.nn.Linear, and a one-call model conversion.

``Linear`` keeps the weight only in fp4kit's prepacked layout (a uint8 buffer, so ``.to(device)`` and
``state_dict`` carry it like any buffer) and runs ``torch.ops.fp4kit.gemm``: the kernels on CUDA, the
spec-level reference on CPU. It is an inference module: no gradients flow to the FP4 weight.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Optional, Union

import torch

from . import group_size, torch_ops
from . import ops as _ops  # noqa: F401  (registers torch.ops.fp4kit)

__all__ = ["Linear", "convert"]

_ACT = (torch.bfloat16, torch.float16)


class Linear(torch.nn.Module):
    """y = x @ W^T + b with W stored in FP4 (NVFP4 or MXFP4); x, b, y in bfloat16 or float16."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, format: str = "nvfp4",
                 device: Union[None, str, torch.device] = None, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        g = group_size(format)
        if in_features % g:
            raise ValueError(f"in_features: must be a multiple of the {format} group size {g} (got {in_features})")
        if dtype not in _ACT:
            raise TypeError(f"dtype: must be torch.bfloat16 or torch.float16 (got {dtype})")
        self.in_features, self.out_features, self.format = in_features, out_features, format
        nbytes = torch_ops._total_bytes(format, out_features, in_features)
        self.register_buffer("weight_packed", torch.zeros(nbytes, dtype=torch.uint8, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device),
                                       requires_grad=False) if bias else None
        self.act_dtype = dtype

    @classmethod
    def from_quantized(cls, packed: torch.Tensor, scales: torch.Tensor, tensor_scale: Optional[torch.Tensor],
                       format: str, bias: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.bfloat16
                       ) -> "Linear":
        """From checkpoint-layout tensors: packed uint8 [N, K/2], scales [N, K/group], NVFP4 tensor scale
        (one float32, or one per row for fused projections; None for MXFP4)."""
        n, k = packed.shape[0], packed.shape[1] * 2
        mod = cls(k, n, bias is not None, format, packed.device, dtype)
        mod.weight_packed.copy_(torch.ops.fp4kit.prepack(packed, torch_ops._u8(scales), tensor_scale, format, n, k))
        if bias is not None:
            if tuple(bias.shape) != (n,):
                raise ValueError(f"bias: shape must be ({n},) (got {tuple(bias.shape)})")
            mod.bias.data.copy_(bias.to(dtype))
        return mod

    @classmethod
    def from_fp4weight(cls, w, bias: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.bfloat16) -> "Linear":
        """From an fp4kit.FP4Weight (torch tensors; its per-row tensor scales keep fused projections exact)."""
        return cls.from_quantized(w.packed, w.scales, w.tensor_scale, w.format, bias, dtype)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, format: str = "nvfp4",
                    dtype: Optional[torch.dtype] = None) -> "Linear":
        """Quantize a torch.nn.Linear (on its device) with the format's recipe (ModelOpt for NVFP4, OCP for
        MXFP4). dtype: activation dtype, default the Linear's own when it is bf16/fp16, else bfloat16."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear: must be a torch.nn.Linear (got {type(linear).__name__})")
        w = linear.weight.detach()
        dtype = dtype or (w.dtype if w.dtype in _ACT else torch.bfloat16)
        packed, scales, ts = torch.ops.fp4kit.quantize(w.contiguous(), format)
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls.from_quantized(packed, scales, ts if format == "nvfp4" else None, format, bias, dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 [out, in] weight this module multiplies by (exactly, per the format spec)."""
        return _ops.dequantize_packed(self.weight_packed, self.format, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.fp4kit.gemm(x, self.weight_packed, self.format, self.out_features, self.in_features,
                                     self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.format}, act_dtype={self.act_dtype}, packed_bytes={self.weight_packed.numel()}")


def convert(model: torch.nn.Module, format: str = "nvfp4", exclude: Iterable[str] = ("lm_head",),
            dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """Replace (in place) every torch.nn.Linear of `model` by an fp4kit Linear and return the model.

    exclude: fnmatch patterns of module names kept as they are (default: the output head). Linears whose
    in_features is not a multiple of the group size are kept too. Returns `model`.
    """
    patterns = list(exclude)
    g = group_size(format)
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and not any(fnmatch.fnmatch(name, p) for p in patterns)
               and mod.in_features % g == 0]
    for name, mod in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Linear.from_linear(mod, format, dtype))
    return model
