"""FP4Weight: one FP4 weight matrix in fp4kit's checkpoint layout, built from the checkpoint layouts fp4kit
reads (ModelOpt NVFP4, compressed-tensors NVFP4, gpt-oss MXFP4), plus fusion and a nibble-order self-check.

A loaded weight is more than three arrays: it carries its format, its logical shape (N, K) and, for NVFP4,
one float32 tensor scale per row. Per-row scales are what keep a fused projection (qkv, gate_up) exact when
its parts were quantized with different tensor scales. Arrays stay what they were given (numpy arrays, or
torch tensors on any device); torch is imported only when a torch tensor is involved.

Layout (DESIGN.md section 2): packed uint8 [N, K/2], byte = code[2i] | code[2i+1] << 4; scales uint8
[N, K/group] (NVFP4: E4M3, group 16; MXFP4: E8M0, group 32); value = e2m1 * scale (* tensor_scale[row]).
Bad input raises ValueError (shape, value) or TypeError (dtype, type), naming the tensor and the rule.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

import fp4kit
from . import _is_torch  # noqa: E402  (defined before fp4kit imports this module)

__all__ = ["FP4Weight", "fuse", "check_nibble_order", "deinterleave_gate_up", "interleave_gate_up",
           "swap_nibbles"]

Array = Any  # numpy.ndarray or torch.Tensor

# One-byte dtypes that checkpoints use for raw FP4 / scale bytes; fp4kit reads them as uint8.
_PACKED_DTYPES = ("uint8", "float4_e2m1fn_x2")
_SCALE_DTYPES = {"nvfp4": ("uint8", "float8_e4m3fn"), "mxfp4": ("uint8", "float8_e8m0fnu")}


# ---- array helpers (numpy or torch, without importing torch for numpy input) ----------------------------
def _check_array(a: Any, name: str) -> None:
    if not (isinstance(a, np.ndarray) or _is_torch(a)):
        raise TypeError(f"{name}: must be a numpy array or a torch tensor (got {type(a).__name__})")


def _dtype(a: Array) -> str:
    return a.dtype.name if isinstance(a, np.ndarray) else str(a.dtype).replace("torch.", "")


def _shape(a: Array) -> Tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def _device(a: Array) -> str:
    return "cpu" if isinstance(a, np.ndarray) else str(a.device)


def _contiguous(a: Array) -> bool:
    return bool(a.flags.c_contiguous) if isinstance(a, np.ndarray) else a.is_contiguous()


def _nbytes(a: Optional[Array]) -> int:
    if a is None:
        return 0
    return int(a.nbytes) if isinstance(a, np.ndarray) else a.numel() * a.element_size()


def _host(a: Array) -> np.ndarray:
    """numpy view/copy on the host (torch: detached, moved to the CPU)."""
    return a if isinstance(a, np.ndarray) else a.detach().cpu().numpy()


def _like(x: np.ndarray, ref: Array) -> Array:
    """x (numpy) as the same kind of array as ref (torch: on ref's device)."""
    if isinstance(ref, np.ndarray):
        return x
    import torch
    return torch.from_numpy(np.ascontiguousarray(x)).to(ref.device)


def _concat(parts: Sequence[Array], axis: int = 0) -> Array:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=axis)
    import torch
    return torch.cat(list(parts), dim=axis)


def _raw_u8(a: Any, name: str, allowed: Sequence[str]) -> Array:
    """Check a one-byte tensor against the allowed dtypes and return it viewed as uint8."""
    _check_array(a, name)
    dt = _dtype(a)
    if dt not in allowed:
        raise TypeError(f"{name}: dtype must be {' or '.join(allowed)} (got {dt})")
    if dt != "uint8":
        import torch
        a = a.view(torch.uint8)
    return a


def _positive_scalar(x: Any, name: str) -> float:
    """A positive, finite scalar from a Python number or a one-element float array/tensor."""
    if isinstance(x, (int, float, np.floating)) and not isinstance(x, bool):
        v = float(x)
    else:
        _check_array(x, name)
        if not _dtype(x).startswith(("float", "bfloat")):
            raise TypeError(f"{name}: dtype must be a floating type, float32 in checkpoints (got {_dtype(x)})")
        if math.prod(_shape(x)) != 1:
            raise ValueError(f"{name}: must hold one value, shape () or (1,) (got {_shape(x)})")
        v = float(x.item())
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: must be positive and finite (got {v})")
    return v


def swap_nibbles(packed: Array) -> Array:
    """A copy of packed uint8 bytes with the two nibbles of every byte exchanged."""
    return (packed << 4) | (packed >> 4)


def _rows(x: Array, start: int, step: int, axis: int) -> Array:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, None, step)
    return x[tuple(index)]


# ---- FP4Weight -------------------------------------------------------------------------------------------
class FP4Weight:
    """One FP4 weight W [N, K] in the checkpoint layout.

    Attributes: ``format`` ("nvfp4" | "mxfp4"), ``packed`` uint8 [N, K/2], ``scales`` uint8 [N, K/group],
    ``tensor_scale`` float32 [N] (NVFP4: one per row; None for MXFP4), ``prepacked`` (the kernel-layout
    buffer after :meth:`prepack`, else None). All arrays are numpy arrays, or torch tensors on one device.
    """

    def __init__(self, format: str, packed: Array, scales: Array, tensor_scale: Any = None, *,
                 swap_nibbles: bool = False) -> None:
        """packed uint8 [N, K/2]; scales [N, K/group] (uint8 or, as torch tensors, float8_e4m3fn for NVFP4 /
        float8_e8m0fnu for MXFP4: raw bytes); tensor_scale (NVFP4 only): None (1.0), a number or one-element
        array, or float32 [N] (one per row). swap_nibbles=True reads checkpoints whose nibbles are swapped."""
        self._init(format, packed, scales, tensor_scale, swap_nibbles, ("packed", "scales", "tensor_scale"))

    def _init(self, format: str, packed: Array, scales: Array, tensor_scale: Any, swap: bool,
              names: Tuple[str, str, str]) -> None:
        g = fp4kit.group_size(format)
        pname, sname, tname = names
        packed = _raw_u8(packed, pname, _PACKED_DTYPES)
        scales = _raw_u8(scales, sname, _SCALE_DTYPES[format])
        if packed.ndim != 2:
            raise ValueError(f"{pname}: must have 2 dimensions [N, K/2] (got shape {_shape(packed)})")
        n, k = int(packed.shape[0]), 2 * int(packed.shape[1])
        if k % g:
            raise ValueError(f"{pname}: K = 2 * {pname}.shape[1] = {k} must be a multiple of the group size {g} "
                             f"of {format}")
        if _is_torch(packed) != _is_torch(scales):
            raise TypeError(f"{sname}: must be the same kind of array as {pname} "
                            f"({type(packed).__name__}; got {type(scales).__name__})")
        if _device(scales) != _device(packed):
            raise ValueError(f"{sname}: must be on {pname}'s device {_device(packed)} (got {_device(scales)})")
        if _shape(scales) != (n, k // g):
            raise ValueError(f"{sname}: shape must be ({n}, {k // g}) for {pname} of shape {_shape(packed)} "
                             f"(K = {k}, one scale per {g} values), got {_shape(scales)}")
        for a, name in ((packed, pname), (scales, sname)):
            if not _contiguous(a):
                raise ValueError(f"{name}: must be contiguous (numpy.ascontiguousarray / .contiguous())")
        self.format, self.packed, self.scales = format, packed, scales
        self.tensor_scale = self._row_scales(tensor_scale, tname, n)
        if swap:
            self.packed = swap_nibbles(packed)
        self.prepacked: Optional[Array] = None

    def _row_scales(self, ts: Any, name: str, n: int) -> Optional[Array]:
        if self.format == "mxfp4":
            if ts is not None and not (isinstance(ts, (int, float, np.floating)) and float(ts) == 1.0):
                raise ValueError(f"{name}: MXFP4 has no tensor scale (give None)")
            return None
        if ts is None or isinstance(ts, (int, float, np.floating)):
            one = 1.0 if ts is None else float(ts)
            return _like(np.full(n, one, np.float32), self.packed)
        _check_array(ts, name)
        if _dtype(ts) != "float32":
            raise TypeError(f"{name}: dtype must be float32 (got {_dtype(ts)})")
        if _is_torch(ts) != _is_torch(self.packed) or _device(ts) != _device(self.packed):
            raise ValueError(f"{name}: must be the same kind of array, on the same device, as the packed weight")
        if math.prod(_shape(ts)) == 1 and _shape(ts) != (n,):
            return _like(np.full(n, float(ts.reshape(-1)[0]), np.float32), self.packed)
        if _shape(ts) != (n,):
            raise ValueError(f"{name}: shape must be ({n},) (one per row) or a single value (got {_shape(ts)})")
        if not _contiguous(ts):
            raise ValueError(f"{name}: must be contiguous (numpy.ascontiguousarray / .contiguous())")
        return ts

    @classmethod
    def _trusted(cls, format: str, packed: Array, scales: Array, tensor_scale: Optional[Array],
                 prepacked: Optional[Array] = None) -> "FP4Weight":
        w = cls.__new__(cls)
        w.format, w.packed, w.scales, w.tensor_scale, w.prepacked = format, packed, scales, tensor_scale, prepacked
        return w

    # -- constructors from checkpoint layouts --
    @classmethod
    def from_float(cls, w: Array, format: str = "nvfp4") -> "FP4Weight":
        """Quantize W [N, K] (numpy float32/float16 on the host, or a torch tensor on its own device)."""
        _check_array(w, "w")
        if _is_torch(w):
            from . import torch_ops
            packed, scales, ts = torch_ops.quantize(w, format)
        else:
            packed, scales, ts = fp4kit.quantize(w, format)
        return cls(format, packed, scales, ts if format == "nvfp4" else None)

    @classmethod
    def from_modelopt(cls, weight: Array, weight_scale: Array, weight_scale_2: Any, *,
                      swap_nibbles: bool = False) -> "FP4Weight":
        """ModelOpt NVFP4: weight uint8 [N, K/2], weight_scale E4M3 [N, K/16] (uint8 or float8_e4m3fn, row-major),
        weight_scale_2 the float32 tensor scale (value = e2m1 * weight_scale * weight_scale_2)."""
        ts = _positive_scalar(weight_scale_2, "weight_scale_2")
        w = cls.__new__(cls)
        w._init("nvfp4", weight, weight_scale, ts, swap_nibbles, ("weight", "weight_scale", "weight_scale_2"))
        return w

    @classmethod
    def from_compressed_tensors(cls, weight_packed: Array, weight_scale: Array, weight_global_scale: Any, *,
                                swap_nibbles: bool = False) -> "FP4Weight":
        """compressed-tensors NVFP4 ("nvfp4-pack-quantized"): as ModelOpt, but the global scale is the reciprocal
        of ModelOpt's: tensor scale = 1 / weight_global_scale (rounded once to float32)."""
        g = _positive_scalar(weight_global_scale, "weight_global_scale")
        ts = float(np.float32(1.0 / g))
        if not (math.isfinite(ts) and ts > 0):
            raise ValueError(f"weight_global_scale: 1 / {g} is not a finite, positive float32")
        w = cls.__new__(cls)
        w._init("nvfp4", weight_packed, weight_scale, ts, swap_nibbles,
                ("weight_packed", "weight_scale", "weight_global_scale"))
        return w

    @classmethod
    def from_gpt_oss(cls, blocks: Array, scales: Array, *, swap_nibbles: bool = False) -> "FP4Weight":
        """gpt-oss MXFP4, one expert (or one matrix): blocks uint8 [N, K/32, 16], scales E8M0 [N, K/32].

        Each 16-byte block holds 32 consecutive K values, element 2i in the low nibble of byte i (the order of
        gpt-oss's reference decoder), which is fp4kit's packing: packed = blocks.reshape(N, K/2)."""
        blocks = _raw_u8(blocks, "blocks", ("uint8",))
        if blocks.ndim != 3 or int(blocks.shape[2]) != 16:
            raise ValueError(f"blocks: shape must be (N, K/32, 16): 16 bytes = 32 FP4 values per scale "
                             f"(got {_shape(blocks)})")
        n, nb = int(blocks.shape[0]), int(blocks.shape[1])
        sc = _raw_u8(scales, "scales", _SCALE_DTYPES["mxfp4"])
        if _shape(sc) != (n, nb):
            raise ValueError(f"scales: shape must be ({n}, {nb}) for blocks of shape {_shape(blocks)}, "
                             f"got {_shape(sc)}")
        if not _contiguous(blocks):
            raise ValueError("blocks: must be contiguous (numpy.ascontiguousarray / .contiguous())")
        w = cls.__new__(cls)
        w._init("mxfp4", blocks.reshape(n, nb * 16), sc, None, swap_nibbles, ("blocks", "scales", "tensor_scale"))
        return w

    # -- properties --
    @property
    def shape(self) -> Tuple[int, int]:
        """The logical shape (N, K)."""
        return int(self.packed.shape[0]), 2 * int(self.packed.shape[1])

    @property
    def device(self) -> str:
        """'cpu' for numpy arrays, else the torch device of the tensors ('cpu', 'cuda:0', ...)."""
        return _device(self.packed)

    @property
    def nbytes(self) -> int:
        """Bytes of the checkpoint layout held here (packed + scales + tensor scales), without `prepacked`."""
        return _nbytes(self.packed) + _nbytes(self.scales) + _nbytes(self.tensor_scale)

    def __repr__(self) -> str:
        def desc(a: Optional[Array]) -> str:
            return "None" if a is None else f"{_dtype(a)}{list(_shape(a))}"
        kind = "torch" if _is_torch(self.packed) else "numpy"
        pre = "no" if self.prepacked is None else f"{desc(self.prepacked)}"
        return (f"FP4Weight({self.format}, shape={self.shape}, packed={desc(self.packed)}, "
                f"scales={desc(self.scales)}, tensor_scale={desc(self.tensor_scale)}, arrays={kind}, "
                f"device={self.device}, prepacked={pre}, nbytes={self.nbytes})")

    # -- conversions --
    def dequantize(self) -> Array:
        """float32 [N, K] from the spec: e2m1 * scale (* tensor_scale[row]), computed on the host; numpy for
        numpy weights, else a torch tensor on the weight's device. Bit-identical to fp4kit.dequantize of each
        row with its tensor scale: e2m1 * e4m3 is exact in float32, so multiplying by the row's tensor scale
        afterwards rounds once, as fp4kit.dequantize does."""
        out = fp4kit.dequantize(_host(self.packed), _host(self.scales), 1.0, self.format)
        if self.tensor_scale is not None:
            out *= _host(self.tensor_scale)[:, None]
        return _like(out, self.packed)

    def to(self, device: Any) -> "FP4Weight":
        """A new FP4Weight with every array as a torch tensor on `device` (needs torch)."""
        import torch

        def move(a: Optional[Array]) -> Optional[Array]:
            if a is None:
                return None
            if isinstance(a, np.ndarray):  # torch.from_numpy wants a writable array
                a = torch.from_numpy(a if a.flags.writeable else a.copy())
            return a.to(device)
        return FP4Weight._trusted(self.format, move(self.packed), move(self.scales), move(self.tensor_scale),
                                  move(self.prepacked))

    def prepack(self) -> "FP4Weight":
        """Fill `prepacked` with the kernel layout (fp4kit.prepack for numpy, fp4kit.torch_ops.prepack for torch
        tensors, on their device) using the per-row tensor scales; returns self."""
        n, k = self.shape
        if _is_torch(self.packed):
            from . import torch_ops
            self.prepacked = torch_ops.prepack(self.packed, self.scales, self.tensor_scale, self.format, n, k)
        else:
            self.prepacked = fp4kit.prepack(self.packed, self.scales, None, self.format,
                                            row_tensor_scale=self.tensor_scale)
        return self


# ---- fusion, gate/up interleave, nibble-order check -------------------------------------------------------
def _same_format_list(weights: Any, empty: str, rule: str, same_k_only: bool) -> List[FP4Weight]:
    """`weights` as a list of FP4Weights of one format and one shape (or, same_k_only, one K), with errors that
    name the offending entry; `empty` and `rule` finish the messages."""
    weights = list(weights)
    if not weights:
        raise ValueError(f"weights: need at least one {empty}")
    for i, w in enumerate(weights):
        if not isinstance(w, FP4Weight):
            raise TypeError(f"weights[{i}]: must be an FP4Weight (got {type(w).__name__})")
    first = weights[0]
    for i, w in enumerate(weights[1:], 1):
        if w.format != first.format:
            raise ValueError(f"weights[{i}]: format {w.format} differs from weights[0]'s {first.format}; {rule}")
        if same_k_only and w.shape[1] != first.shape[1]:
            raise ValueError(f"weights[{i}]: K = {w.shape[1]} differs from weights[0]'s K = {first.shape[1]}; {rule}")
        if not same_k_only and w.shape != first.shape:
            raise ValueError(f"weights[{i}]: shape {w.shape} differs from weights[0]'s {first.shape}; {rule}")
    return weights


def fuse(weights: Sequence[FP4Weight]) -> FP4Weight:
    """Concatenate weights along N (e.g. [q, k, v] -> qkv). NVFP4 parts keep their own per-row tensor scales,
    so the result dequantizes exactly to the concatenation of the parts; MXFP4 has none to keep."""
    weights = _same_format_list(weights, "FP4Weight to fuse",
                                "fused parts are stacked along N and must share format and K", same_k_only=True)
    first = weights[0]
    for i, w in enumerate(weights[1:], 1):
        if _is_torch(w.packed) != _is_torch(first.packed) or w.device != first.device:
            raise ValueError(f"weights[{i}]: arrays on {w.device} ({type(w.packed).__name__}) differ from "
                             f"weights[0]'s ({first.device}, {type(first.packed).__name__})")
    ts = None if first.tensor_scale is None else _concat([w.tensor_scale for w in weights])
    return FP4Weight._trusted(first.format, _concat([w.packed for w in weights]),
                              _concat([w.scales for w in weights]), ts)


def deinterleave_gate_up(x: Any, axis: int = 0) -> Any:
    """gpt-oss stores gate and up rows interleaved (even rows = gate, odd = up); return [gate; up].

    x: an FP4Weight (rows of packed, scales and tensor scales) or an array (numpy/torch) with an even length
    along `axis` (e.g. the bias [E, 2I] with axis=1)."""
    return _regroup(x, axis, interleave=False)


def interleave_gate_up(x: Any, axis: int = 0) -> Any:
    """The inverse of deinterleave_gate_up: [gate; up] -> rows gate0, up0, gate1, up1, ..."""
    return _regroup(x, axis, interleave=True)


def _regroup(x: Any, axis: int, interleave: bool) -> Any:
    if isinstance(x, FP4Weight):
        ts = None if x.tensor_scale is None else _regroup(x.tensor_scale, 0, interleave)
        return FP4Weight._trusted(x.format, _regroup(x.packed, 0, interleave), _regroup(x.scales, 0, interleave), ts)
    _check_array(x, "x")
    if x.ndim == 0 or int(x.shape[axis]) % 2:
        raise ValueError(f"x: length along axis {axis} must be even (gate and up rows; got shape {_shape(x)})")
    if not interleave:
        return _concat([_rows(x, 0, 2, axis), _rows(x, 1, 2, axis)], axis)
    half = int(x.shape[axis]) // 2
    index = [slice(None)] * x.ndim
    out = np.empty_like(x) if isinstance(x, np.ndarray) else x.new_empty(x.shape)
    for start in (0, 1):
        index[axis] = slice(start * half, (start + 1) * half)
        _rows(out, start, 2, axis)[...] = x[tuple(index)]
    return out


def check_nibble_order(weight: FP4Weight, reference_row: Array, row: int = 0, atol: float = 0.0) -> str:
    """Compare one dequantized row with its unquantized reference (float32/float16/bfloat16, length K) in both
    nibble orders. Returns "ok" when only the stored order fits, "swapped" when only the swapped order fits
    (reload with swap_nibbles=True); raises ValueError when neither fits or both do (pick another row).

    An order fits when every element is within the rounding bound of round-to-nearest quantization:
    |scale| * tensor_scale for NVFP4 (plus 2^-7 * tensor_scale for E4M3's subnormal step), 2 * scale for MXFP4
    (the OCP scale choice can clip by up to two steps), plus 2^-8 * |reference| (a BF16 reference) plus atol.
    Other quantizers (GPTQ-like, clipped scales) may need a larger atol."""
    if not isinstance(weight, FP4Weight):
        raise TypeError(f"weight: must be an FP4Weight (got {type(weight).__name__})")
    n, k = weight.shape
    if not 0 <= row < n:
        raise ValueError(f"row: must be in [0, {n}) (got {row})")
    _check_array(reference_row, "reference_row")
    if _is_torch(reference_row):
        reference_row = reference_row.detach().float().cpu().numpy()
    ref = np.asarray(reference_row, dtype=np.float64).reshape(-1)
    if ref.shape != (k,):
        raise ValueError(f"reference_row: must hold K = {k} values (got shape {_shape(reference_row)})")
    packed = _host(weight.packed[row:row + 1])
    scales = _host(weight.scales[row:row + 1])
    ts = 1.0 if weight.tensor_scale is None else float(_host(weight.tensor_scale[row:row + 1])[0])
    fmt = weight.format
    deq = {order: fp4kit.dequantize(p, scales, ts, fmt)[0].astype(np.float64)
           for order, p in (("ok", packed), ("swapped", swap_nibbles(packed)))}
    # |scale| * tensor_scale per element: code 7 (6.0) everywhere, divided by 6.
    unit = np.abs(fp4kit.dequantize(np.full_like(packed, 0x77), scales, ts, fmt)[0].astype(np.float64)) / 6.0
    bound = unit + 2.0 ** -7 * abs(ts) if fmt == "nvfp4" else 2.0 * unit
    tol = bound + 2.0 ** -8 * np.abs(ref) + atol
    err = {order: np.abs(d - ref) for order, d in deq.items()}
    fits = {order: bool(np.all(e <= tol)) for order, e in err.items()}  # NaN never fits
    if fits["ok"] != fits["swapped"]:
        return "ok" if fits["ok"] else "swapped"
    worst = ", ".join(f"{o}: max |error| {float(np.nanmax(e)) if np.isfinite(e).any() else float('nan'):.4g}"
                      for o, e in err.items())
    if fits["ok"]:
        raise ValueError(f"row {row}: reads the same in both nibble orders within tolerance ({worst}); "
                         "check another row")
    raise ValueError(f"row {row}: matches the reference in neither nibble order ({worst}, tolerance up to "
                     f"{float(np.max(tol)):.4g}); is reference_row the unquantized row {row} of this weight?")
