"""fp4kit: BF16/FP16 x FP4 (NVFP4, MXFP4) GEMM for NVIDIA GPUs without FP4 tensor cores.

Host (numpy) API, usable without a GPU:
    packed, scales, tensor_scale = quantize(w, "nvfp4")      # checkpoint layout
    w_hat = dequantize(packed, scales, tensor_scale, "nvfp4")
    y = reference_gemm(x, w_hat, bias)                        # float64 oracle
    buf = prepack(packed, scales, tensor_scale, "nvfp4")      # kernel layout (host copy)

Checkpoint layout: packed uint8 [N, K/2] (low nibble = even K index), scales uint8 [N, K/group]
(NVFP4: E4M3, group 16; MXFP4: E8M0, group 32), and for NVFP4 one float32 tensor scale.

With torch (``pip install fp4kit[torch]``), the same functions take torch tensors (CPU or CUDA), and:
    w = FP4Weight.from_float(weight_tensor, "nvfp4").prepack()   # or from_modelopt / from_gpt_oss / loaders
    y = gemm(x, w, bias=None, out=None)                          # torch.ops.fp4kit.gemm
    model = fp4kit.nn.convert(model, "nvfp4")                    # nn.Linear -> fp4kit.nn.Linear
Mixture of experts (fp4kit.moe):
    w_gate_up = stack_experts(gate_up_weights, "cuda")          # E FP4Weights [2I, H] -> uint8 [E, stride]
    w_down = stack_experts(down_weights, "cuda")                # E FP4Weights [H, I]
    y = fused_moe(x, topk_ids, topk_weights, w_gate_up, w_down, "nvfp4", inter)   # torch.ops.fp4kit.fused_moe
    y = fused_moe_from_logits(x, router_logits, k, w_gate_up, w_down, "nvfp4", inter, routing="softmax")
    topk_ids, topk_weights = route(router_logits, k, routing="softmax")   # one kernel (torch.ops.fp4kit.route)
``torch.ops.fp4kit.{quantize,prepack,gemm,fused_moe,route}`` are registered by ``import fp4kit.ops`` (compile/graph
safe).
Checkpoints: FP4Weight constructors and ``load_modelopt_checkpoint``, ``load_compressed_tensors_checkpoint``,
``load_gpt_oss_experts`` (need ``safetensors``).
Errors: a bad argument raises ValueError (shape, layout, value) or TypeError (dtype) naming the argument
and the rule; a valid request this build cannot serve raises NotImplementedError; CUDA errors raise
RuntimeError.
"""
from __future__ import annotations

import sys
from typing import Optional, Tuple

import numpy as np

from . import _C

__version__: str = _C.__version__
__all__ = ["quantize", "dequantize", "reference_gemm", "packed_layout", "prepack", "unpack", "gemm",
           "cuda_device_count", "group_size", "FP4Weight", "fuse", "check_nibble_order", "deinterleave_gate_up",
           "interleave_gate_up", "swap_nibbles", "load_modelopt_checkpoint", "load_compressed_tensors_checkpoint",
           "load_gpt_oss_experts", "GptOssExperts", "load_modelopt_experts", "ModelOptExperts", "load_tuning_table",
           "clear_tuning_table", "dispatch_config",
           "stack_experts", "fused_moe", "fused_moe_from_logits", "route"]

_GROUP = {"nvfp4": 16, "mxfp4": 32}


def group_size(format: str) -> int:
    """Values per block scale along K: 16 for "nvfp4", 32 for "mxfp4"."""
    try:
        return _GROUP[format]
    except KeyError:
        raise ValueError(f'format: must be "nvfp4" or "mxfp4" (got {format!r})') from None


def _is_torch(a) -> bool:
    """True for a torch.Tensor, without importing torch for numpy input."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def quantize(w, format: str = "nvfp4", tensor_scale: Optional[float] = None):
    """Quantize W [N, K] (K % group_size == 0) to the checkpoint layout.

    numpy (float32/float16, C-contiguous): on the CPU, returns (packed uint8 [N, K/2], scales uint8
    [N, K/group], tensor_scale float). torch (float32/bfloat16/float16, CPU or CUDA): on W's device,
    returns tensors (tensor_scale float32 [1]); CPU and GPU results are bit-identical. NVFP4 uses the
    ModelOpt recipe (tensor_scale = amax / (6 * 448) unless given); MXFP4 the OCP recipe (tensor_scale 1).
    """
    if _is_torch(w):
        from . import torch_ops
        return torch_ops.quantize(w, format, tensor_scale)
    return _C.quantize_cpu(w, format, tensor_scale)


def dequantize(packed, scales, tensor_scale=1.0, format: str = "nvfp4"):
    """Checkpoint layout -> float32 [N, K] (NVFP4: e2m1 * e4m3 * tensor_scale; MXFP4: e2m1 * 2^(e-127)).

    numpy arrays give a numpy array; torch tensors (any device; float8 scale dtypes read as raw bytes)
    give a float32 tensor on the same device, computed on the host. tensor_scale: a number or a
    one-element array/tensor."""
    if _is_torch(packed):
        import torch

        from .torch_ops import _u8
        ts = float(tensor_scale.reshape(-1)[0]) if _is_torch(tensor_scale) else float(tensor_scale)
        host = [t.detach().cpu().contiguous().numpy() for t in (packed, _u8(scales))]
        return torch.from_numpy(_C.dequantize_cpu(host[0], host[1], ts, format)).to(packed.device)
    return _C.dequantize_cpu(packed, scales, float(np.asarray(tensor_scale).reshape(-1)[0]), format)


def reference_gemm(x: np.ndarray, w: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
    """The test oracle: x float32 [M, K] @ w float32 [N, K]^T (+ bias float32 [N]), summed in float64."""
    return _C.reference_gemm(x, w, bias)


def packed_layout(format: str, n: int, k: int) -> dict:
    """Geometry of the prepacked (kernel-layout) buffer for W [n, k]: padded shape, region offsets and
    sizes, ``total_bytes``."""
    return _C.packed_layout(format, n, k)


def prepack(packed, scales, tensor_scale=None, format: str = "nvfp4", row_tensor_scale=None):
    """Checkpoint layout -> kernel layout (uint8 [total_bytes]), once per weight.

    numpy: on the CPU (copy the result to the GPU to run GEMMs). torch tensors: on their device (the GPU
    prepack for CUDA tensors). NVFP4 may take one tensor scale or one float32 per row (fused projections,
    `row_tensor_scale`); neither means 1.0."""
    if _is_torch(packed):
        from . import torch_ops
        n, k = int(packed.shape[0]), 2 * int(packed.shape[1])
        ts = row_tensor_scale if row_tensor_scale is not None else tensor_scale
        return torch_ops.prepack(packed, scales, ts, format, n, k)
    return _C.prepack_cpu(format, packed, scales, tensor_scale, row_tensor_scale)


def unpack(buffer: np.ndarray, n: int, k: int, format: str = "nvfp4") -> Tuple[np.ndarray, np.ndarray]:
    """Kernel layout -> checkpoint layout (packed, scales), with the values prepack was given.

    Every byte comes back, except NVFP4 blocks prepack rewrites exactly: a negative scale returns positive
    with the block's codes negated, a zero scale's block returns zero codes; MXFP4 scales more than 2^120
    below their row's largest were flushed and return changed (fp4kit/repack.h)."""
    return _C.unpack_cpu(format, n, k, buffer)


def load_tuning_table(path: str) -> None:
    """Load a per-GPU tuning table (written by ``fp4kit-bench --tune``): the dispatcher then uses its
    entries for matching (device, format, dtype, N, K, m) and the analytic default elsewhere. A malformed
    table raises ValueError naming the line and the rule, and the previous table stays loaded."""
    _C.load_tuning_table(path)


def clear_tuning_table() -> None:
    """Forget the loaded tuning table: dispatch falls back to the analytic default."""
    _C.clear_tuning_table()


def dispatch_config(format: str, act: str, m: int, n: int, k: int, device_name: str, cc_major: int = 9,
                    sms: int = 0) -> str:
    """The kernel config the GEMM dispatcher picks for this problem on a device of that name, compute
    capability major ``cc_major`` and ``sms`` SMs (0: the H200's 132), with the reason (tuning-table entry
    or analytic rule), e.g. for ``torch.cuda.get_device_name()`` and
    ``torch.cuda.get_device_capability()[0]``. Hopper-only kernels are never picked for cc_major != 9."""
    return _C.dispatch_config(format, act, m, n, k, device_name, cc_major, sms)


def cuda_device_count() -> int:
    """Number of visible CUDA devices; 0 (never an exception) without a driver or a GPU."""
    return _C.cuda_device_count()


def gemm(x, w, bias=None, out=None):
    """Y[..., N] = X[..., K] @ W^T (+ bias) with torch tensors; W an FP4Weight prepacked on X's device.

    X, bias and out share one dtype, bfloat16 or float16. CUDA tensors run fp4kit's kernels on the current
    stream; CPU tensors the spec-level reference. Through torch.ops.fp4kit.gemm (compile and graph safe)
    unless `out` is given."""
    if not isinstance(w, FP4Weight):
        raise TypeError(f"w: must be an FP4Weight (got {type(w).__name__})")
    if w.prepacked is None:
        raise ValueError("w: prepack it once first (w.prepack(), or w.to(device).prepack())")
    import torch

    from . import ops as _ops  # noqa: F401  (registers torch.ops.fp4kit)
    from . import torch_ops
    n, k = w.shape
    if out is None:
        return torch.ops.fp4kit.gemm(x, w.prepacked, w.format, n, k, bias)
    return torch_ops.gemm(x, w.prepacked, w.format, n, k, bias=bias, out=out)


def stack_experts(weights, device=None):
    """Prepack E FP4Weights of one format and shape into one uint8 torch tensor [E, stride] (stride: the packed
    size rounded up to 256 bytes), or stack E floating torch tensors [N, K] into one bfloat16 tensor [E, N, K]
    (BF16 experts, format "bf16"), on `device` (default: the weights'); see fp4kit.moe.stack_experts."""
    from . import moe
    return moe.stack_experts(weights, device)


def fused_moe(x, topk_ids, topk_weights, w_gate_up, w_down, format: str, inter: int, activation: str = "silu",
              layout: str = "concatenated", b_gate_up=None, b_down=None, alpha: float = 1.702, limit: float = 7.0):
    """Mixture-of-experts layer for given routing (torch.ops.fp4kit.fused_moe) on stack_experts() buffers:
    x bfloat16 [T, H], topk_ids int32 [T, k], topk_weights float32 [T, k]; returns Y [T, H]. See
    fp4kit.moe.fused_moe."""
    from . import moe
    return moe.fused_moe(x, topk_ids, topk_weights, w_gate_up, w_down, format, inter, activation, layout,
                         b_gate_up, b_down, alpha, limit)


def fused_moe_from_logits(x, router_logits, k: int, w_gate_up, w_down, format: str, inter: int,
                          activation: str = "silu", layout: str = "concatenated", b_gate_up=None, b_down=None,
                          alpha: float = 1.702, limit: float = 7.0, *, routing: str = "softmax",
                          renormalize: bool = True, n_group: int = 1, topk_group: int = 1,
                          routed_scaling_factor: float = 1.0, correction_bias=None):
    """Route router_logits [T, E] to k experts per token (routing "softmax" or "sigmoid_grouped", DeepSeek-V3's),
    then fused_moe. See fp4kit.moe.fused_moe_from_logits."""
    from . import moe
    return moe.fused_moe_from_logits(x, router_logits, k, w_gate_up, w_down, format, inter, activation, layout,
                                     b_gate_up, b_down, alpha, limit, routing=routing, renormalize=renormalize,
                                     n_group=n_group, topk_group=topk_group,
                                     routed_scaling_factor=routed_scaling_factor, correction_bias=correction_bias)


def _check_softmax_args(n_group, topk_group, routed_scaling_factor, correction_bias) -> None:
    """routing="softmax" takes none of the grouped routing's arguments: the first one set raises ValueError."""
    for name, changed in (("n_group", n_group != 1), ("topk_group", topk_group != 1),
                          ("routed_scaling_factor", routed_scaling_factor != 1.0),
                          ("correction_bias", correction_bias is not None)):
        if changed:
            raise ValueError(f'{name}: applies to routing="sigmoid_grouped" only (leave it at its default with '
                             'routing="softmax")')


def route(logits, k: int, routing: str = "softmax", renormalize: bool = True, n_group: int = 1,
          topk_group: int = 1, routed_scaling_factor: float = 1.0, correction_bias=None):
    """Mixture-of-experts routing, router logits [T, E] -> (topk_ids int32 [T, k], topk_weights float32 [T, k]).

    routing "softmax": the k largest logits, weights softmax(logits) there (renormalize: divided by their sum);
    routing "sigmoid_grouped" (DeepSeek-V3): scores sigmoid(logits), selection keys scores + correction_bias
    [E], n_group groups of consecutive experts ranked by the sum of their two best keys, the topk_group best
    kept, the k best experts among them; weights their scores (renormalize: divided by their sum) times
    routed_scaling_factor. Ids by descending key, ties to the lower id, fp32 arithmetic; a token with a NaN
    logit gets ids -1 and NaN weights (fused_moe then makes its row NaN). E <= 1024, k <= 32.

    numpy (float32/float16 logits, float32 correction_bias): on the CPU, returns numpy arrays. torch (float32,
    bfloat16 or float16): torch.ops.fp4kit.route on the logits' device (CUDA: one kernel, no host
    synchronisation, CUDA-graph and torch.compile safe). The same definitions as fp4kit.moe.route_softmax_topk
    and route_sigmoid_grouped_topk (torch operations, which check the logits for NaN on the host).
    """
    if isinstance(routing, str) and routing == "softmax":
        _check_softmax_args(n_group, topk_group, routed_scaling_factor, correction_bias)
    for name, v in (("k", k), ("n_group", n_group), ("topk_group", topk_group)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: must be an int (got {type(v).__name__})")
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: must be a bool (got {type(renormalize).__name__})")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)):
        raise TypeError(f"routed_scaling_factor: must be a number (got {type(routed_scaling_factor).__name__})")
    if not isinstance(routing, str):
        raise TypeError(f"routing: must be a str (got {type(routing).__name__})")
    if _is_torch(logits):
        import torch

        from . import ops as _ops  # noqa: F401  (registers torch.ops.fp4kit)
        return torch.ops.fp4kit.route(logits, k, routing, renormalize, n_group, topk_group,
                                      float(routed_scaling_factor), correction_bias)
    return _C.route_cpu(logits, k, routing, renormalize, n_group, topk_group, float(routed_scaling_factor),
                        correction_bias)


from .weights import (FP4Weight, check_nibble_order, deinterleave_gate_up, fuse, interleave_gate_up,  # noqa: E402
                      swap_nibbles)
from .loaders import (GptOssExperts, ModelOptExperts, load_compressed_tensors_checkpoint,  # noqa: E402
                      load_gpt_oss_experts, load_modelopt_checkpoint, load_modelopt_experts)
