"""Checkpoint loaders: a directory in the ModelOpt NVFP4, compressed-tensors NVFP4 or gpt-oss MXFP4 layout
-> FP4Weight for every quantized linear module, plain arrays for everything else.

Tensors are read with the `safetensors` package (``pip install "fp4kit[loaders]"``). With torch installed
they come as torch tensors (framework "pt"; ``device`` loads them straight onto a GPU), otherwise as numpy
arrays (framework "numpy"). numpy has no float8 or bfloat16; on the numpy path, float8 tensors (the scales)
come as their raw uint8 bytes and bfloat16 tensors are widened exactly to float32, both read through
``safetensors.deserialize`` (the whole file in memory, once per file holding such tensors).

The checkpoint decides what is quantized: a module is FP4 when it carries the layout's scale tensors. The
config is checked against it: a module the config excludes but that carries FP4 tensors, or a quantized
module missing one of its tensors, is an error rather than a guess.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from .weights import Array, FP4Weight, _check_array, _dtype, _shape, deinterleave_gate_up, fuse

__all__ = ["load_modelopt_checkpoint", "load_compressed_tensors_checkpoint", "load_gpt_oss_experts",
           "load_modelopt_experts", "ModelOptExperts",
           "GptOssExperts"]

PathLike = Union[str, Path]
# safetensors dtypes numpy holds natively; the others are converted (see the module docstring).
_NUMPY_DTYPES = {"F64", "F32", "F16", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8", "BOOL"}


def _safetensors():
    try:
        import safetensors
    except ImportError:
        raise ImportError('fp4kit\'s checkpoint loaders need the safetensors package: pip install "fp4kit[loaders]" '
                          "(or pip install safetensors)") from None
    return safetensors


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found ({what})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object (got {type(data).__name__})")
    return data


def _framework(framework: Optional[str], device: Any) -> str:
    if framework is None:
        framework = "pt" if importlib.util.find_spec("torch") is not None else "numpy"
    if framework not in ("pt", "numpy"):
        raise ValueError(f'framework: must be "pt", "numpy" or None (got {framework!r})')
    if device is not None and framework != "pt":
        raise ValueError('device: needs torch tensors (framework "pt"); numpy arrays live on the host')
    return framework


class _Checkpoint:
    """The safetensors files of one directory: which file holds which tensor; tensors read on demand."""

    def __init__(self, path: PathLike, framework: str, device: Any = None) -> None:
        st = _safetensors()
        self.path, self.framework = Path(path), framework
        self.device = "cpu" if device is None else (device if isinstance(device, int) else str(device))
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: not a directory")
        index = self.path / "model.safetensors.index.json"
        if index.is_file():  # the shards the model uses (repos may hold other *.safetensors files)
            weight_map = _read_json(index, "shard index").get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f'{index}: needs a "weight_map" object')
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{self.path}: no *.safetensors files")
        self.file: Dict[str, str] = {}
        self.dtype: Dict[str, str] = {}
        for f in files:
            with st.safe_open(str(self.path / f), framework=framework) as h:
                for name in h.keys():
                    if name in self.file:
                        raise ValueError(f"{name}: stored twice, in {self.file[name]} and {f}")
                    self.file[name], self.dtype[name] = f, h.get_slice(name).get_dtype()

    def load(self, names: Sequence[str]) -> Dict[str, Array]:
        st = _safetensors()
        by_file: Dict[str, List[str]] = defaultdict(list)
        for name in names:
            by_file[self.file[name]].append(name)
        out: Dict[str, Array] = {}
        for f, group in by_file.items():
            path, other = str(self.path / f), []
            with st.safe_open(path, framework=self.framework, device=self.device) as h:
                for name in group:
                    if self.framework == "numpy" and self.dtype[name] not in _NUMPY_DTYPES:
                        other.append(name)
                    else:
                        out[name] = h.get_tensor(name)
            if other:
                out.update(_numpy_fallback(st, path, other))
        return out


def _numpy_fallback(st: Any, path: str, names: Sequence[str]) -> Dict[str, np.ndarray]:
    """Tensors whose dtype numpy lacks: float8 -> raw uint8 bytes, bfloat16 -> float32 (exact),
    float4 (two per byte) -> packed uint8 [..., last/2]."""
    wanted, out = set(names), {}
    for name, info in st.deserialize(Path(path).read_bytes()):
        if name not in wanted:
            continue
        dt, shape, data = info["dtype"], list(info["shape"]), info["data"]
        if dt.startswith("F8_"):
            out[name] = np.frombuffer(data, np.uint8).reshape(shape)
        elif dt == "BF16":
            out[name] = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
        elif dt == "F4":
            out[name] = np.frombuffer(data, np.uint8).reshape(shape[:-1] + [shape[-1] // 2])
        else:
            raise TypeError(f"{name}: safetensors dtype {dt} has no numpy equivalent; install torch to read it")
    return out


def _assemble(tensors: Dict[str, Array], markers: Sequence[str], required: Sequence[str],
              build: Callable[..., FP4Weight], excluded: Callable[[str], Optional[str]],
              packed_attr: str) -> Dict[str, Any]:
    """Group tensors by module ("a.b.q_proj.weight" -> "a.b.q_proj"); modules carrying any marker tensor become
    FP4Weight (under the module name); every other tensor is returned as is (under its own name)."""
    modules: Dict[str, Dict[str, str]] = defaultdict(dict)
    for name in tensors:
        module, _, attr = name.rpartition(".")
        modules[module][attr] = name
    out: Dict[str, Any] = {}
    for module, attrs in modules.items():
        if not any(a in attrs for a in markers):
            w = tensors.get(attrs.get(packed_attr, ""))
            if w is not None and _dtype(w) in ("uint8", "float4_e2m1fn_x2"):
                raise ValueError(f"{module}.{packed_attr}: {_dtype(w)} (packed FP4?) but the module has none of "
                                 f"{', '.join(markers)}; the checkpoint is incomplete")
            out.update((name, tensors[name]) for name in attrs.values())
            continue
        pattern = excluded(module)
        if pattern is not None:
            raise ValueError(f"{module}: matches the config's exclusion {pattern!r} but carries FP4 tensors "
                             f"({', '.join(a for a in markers if a in attrs)}); checkpoint and config disagree")
        missing = [a for a in required if a not in attrs]
        if missing:
            raise ValueError(f"{module}: quantized module is missing {', '.join(missing)} "
                             f"(needs {', '.join(required)})")
        if module in tensors:
            raise ValueError(f"{module}: is both a tensor name and a module holding FP4 tensors")
        try:
            out[module] = build(*(tensors[attrs[a]] for a in required))
        except (TypeError, ValueError) as e:
            raise type(e)(f"{module}.{e}") from None
        out.update((name, tensors[name]) for a, name in attrs.items() if a not in required)
    return out


def _to_device(x: Any, device: Any) -> Any:
    if device is None:
        return x
    if isinstance(x, FP4Weight):
        return x.to(device)
    import torch
    if isinstance(x, np.ndarray):  # torch.from_numpy wants a writable array
        x = torch.from_numpy(x if x.flags.writeable else x.copy())
    return x.to(device)


# ---- ModelOpt --------------------------------------------------------------------------------------------
def load_modelopt_checkpoint(path: PathLike, device: Any = None, *, framework: Optional[str] = None,
                             swap_nibbles: bool = False) -> Dict[str, Any]:
    """Load a ModelOpt NVFP4 checkpoint directory (hf_quant_config.json + *.safetensors).

    Returns {module name: FP4Weight} for every module with weight + weight_scale + weight_scale_2, and
    {tensor name: array} for every other tensor (excluded and unquantized modules, biases, input_scale, ...).
    hf_quant_config.json must say {"quantization": {"quant_algo": "NVFP4", "group_size": 16,
    "exclude_modules": [fnmatch patterns]}}; modules matching exclude_modules must not carry FP4 tensors.
    device: load torch tensors onto this device (needs torch); framework: "pt", "numpy" or None (torch if
    installed); swap_nibbles: for checkpoints whose nibbles are swapped (see check_nibble_order)."""
    fw = _framework(framework, device)
    cfg_path = Path(path) / "hf_quant_config.json"
    q = _read_json(cfg_path, "ModelOpt quantization config").get("quantization")
    if not isinstance(q, dict):
        raise ValueError(f'{cfg_path}: needs a "quantization" object')
    algo = q.get("quant_algo")
    if algo != "NVFP4":
        raise ValueError(f'{cfg_path}: quantization.quant_algo must be "NVFP4" (got {algo!r}); '
                         "fp4kit reads NVFP4 weights only")
    group = q.get("group_size", 16)
    if group != 16:
        raise ValueError(f"{cfg_path}: quantization.group_size must be 16 for NVFP4 (got {group!r})")
    exclude = q.get("exclude_modules") or []
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise ValueError(f"{cfg_path}: quantization.exclude_modules must be a list of fnmatch patterns")

    def excluded(module: str) -> Optional[str]:
        return next((p for p in exclude if fnmatch.fnmatchcase(module, p)), None)

    ckpt = _Checkpoint(path, fw, device)
    return _assemble(ckpt.load(list(ckpt.file)), ("weight_scale", "weight_scale_2"),
                     ("weight", "weight_scale", "weight_scale_2"),
                     lambda w, s, s2: FP4Weight.from_modelopt(w, s, s2, swap_nibbles=swap_nibbles), excluded,
                     "weight")


# ---- compressed-tensors ----------------------------------------------------------------------------------
def load_compressed_tensors_checkpoint(path: PathLike, device: Any = None, *, framework: Optional[str] = None,
                                       swap_nibbles: bool = False) -> Dict[str, Any]:
    """Load a compressed-tensors NVFP4 checkpoint directory (config.json + *.safetensors).

    config.json's "quantization_config" must have format "nvfp4-pack-quantized" (and, where config_groups
    give weights, num_bits 4, type "float", group_size 16). Returns {module name: FP4Weight} for every module
    with weight_packed + weight_scale + weight_global_scale (tensor scale = 1 / weight_global_scale) and
    {tensor name: array} for every other tensor. Modules named in "ignore" (exact names or "re:" regular
    expressions, matched with re.match) must not carry FP4 tensors. Arguments as load_modelopt_checkpoint."""
    fw = _framework(framework, device)
    cfg_path = Path(path) / "config.json"
    qc = _read_json(cfg_path, "model config").get("quantization_config")
    if not isinstance(qc, dict):
        raise ValueError(f'{cfg_path}: needs a "quantization_config" object')
    method = qc.get("quant_method", "compressed-tensors")
    if method != "compressed-tensors":
        raise ValueError(f'{cfg_path}: quantization_config.quant_method must be "compressed-tensors" '
                         f"(got {method!r})")
    fmt = qc.get("format")
    if fmt != "nvfp4-pack-quantized":
        raise ValueError(f'{cfg_path}: quantization_config.format must be "nvfp4-pack-quantized" (got {fmt!r})')
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict):
        raise ValueError(f"{cfg_path}: quantization_config.config_groups must be an object")
    for gname, grp in groups.items():
        weights = grp.get("weights") if isinstance(grp, dict) else None
        for key, want in (("num_bits", 4), ("type", "float"), ("group_size", 16)):
            if isinstance(weights, dict) and key in weights and weights[key] != want:
                raise ValueError(f"{cfg_path}: quantization_config.config_groups.{gname}.weights.{key} must be "
                                 f"{want!r} for NVFP4 (got {weights[key]!r})")
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise ValueError(f"{cfg_path}: quantization_config.ignore must be a list of names")

    def excluded(module: str) -> Optional[str]:
        for p in ignore:
            if (re.match(p[3:], module) if p.startswith("re:") else p == module):
                return p
        return None

    ckpt = _Checkpoint(path, fw, device)
    return _assemble(ckpt.load(list(ckpt.file)), ("weight_packed", "weight_global_scale"),
                     ("weight_packed", "weight_scale", "weight_global_scale"),
                     lambda w, s, g: FP4Weight.from_compressed_tensors(w, s, g, swap_nibbles=swap_nibbles),
                     excluded, "weight_packed")


# ---- gpt-oss MXFP4 experts -------------------------------------------------------------------------------
@dataclass
class GptOssExperts:
    """One layer's MoE experts of a gpt-oss checkpoint.

    gate_up[e]: FP4Weight [2I, H] (rows [gate; up] when ``interleaved`` is False, else gpt-oss's own order
    gate0, up0, gate1, up1, ...); down[e]: FP4Weight [H, I]; gate_up_bias [E, 2I] (rows in gate_up's order)
    and down_bias [E, H] as stored (bfloat16 in gpt-oss; float32 on the numpy path)."""
    gate_up: List[FP4Weight]
    down: List[FP4Weight]
    gate_up_bias: Array
    down_bias: Array
    interleaved: bool

    @property
    def num_experts(self) -> int:
        return len(self.gate_up)


_GPT_OSS = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
            "down_proj_blocks", "down_proj_scales", "down_proj_bias")


def load_gpt_oss_experts(path_or_tensors: Union[PathLike, Mapping[str, Array]], layer: int, *,
                         deinterleave: bool = True, device: Any = None, framework: Optional[str] = None,
                         prefix: str = "model.layers.{layer}.mlp.experts.",
                         swap_nibbles: bool = False) -> GptOssExperts:
    """The MXFP4 experts of one layer of a gpt-oss checkpoint (a directory, or a mapping name -> tensor).

    Reads {prefix}gate_up_proj_blocks uint8 [E, 2I, H/32, 16], _scales uint8 [E, 2I, H/32], _bias [E, 2I] and
    the same for down_proj ([E, H, I/32, 16], [E, H, I/32], [E, H]); prefix is formatted with `layer`.
    deinterleave=True reorders gate_up's rows (and its bias) from gpt-oss's interleaved gate/up (even = gate,
    odd = up) to [gate; up]; False keeps them interleaved. device, framework, swap_nibbles as in
    load_modelopt_checkpoint (device also moves the tensors of a mapping)."""
    pre = prefix.format(layer=layer)
    names = {key: pre + key for key in _GPT_OSS}
    need = f"gpt-oss experts need {', '.join(names.values())}"
    if isinstance(path_or_tensors, Mapping):
        missing = [n for n in names.values() if n not in path_or_tensors]
        if missing:
            raise ValueError(f"{missing[0]}: missing from the tensors ({need})")
        t = {key: path_or_tensors[n] for key, n in names.items()}
        for key, x in t.items():
            _check_array(x, names[key])
    else:
        path = Path(path_or_tensors)
        if (path / "config.json").is_file():
            qc = _read_json(path / "config.json", "model config").get("quantization_config")
            if isinstance(qc, dict) and qc.get("quant_method") != "mxfp4":
                raise ValueError(f'{path / "config.json"}: quantization_config.quant_method must be "mxfp4" for '
                                 f"gpt-oss experts (got {qc.get('quant_method')!r})")
        ckpt = _Checkpoint(path, _framework(framework, device), device)
        missing = [n for n in names.values() if n not in ckpt.file]
        if missing:
            raise ValueError(f"{missing[0]}: missing from {path} ({need})")
        loaded = ckpt.load(list(names.values()))
        t = {key: loaded[n] for key, n in names.items()}
        device = None  # already there

    for key in ("gate_up_proj_blocks", "down_proj_blocks"):
        if len(t[key].shape) != 4 or int(t[key].shape[3]) != 16:
            raise ValueError(f"{names[key]}: shape must be (E, N, K/32, 16) (got {_shape(t[key])})")
    e, two_i, hb = _shape(t["gate_up_proj_blocks"])[:3]
    h = hb * 32
    if two_i % 64:
        raise ValueError(f"{names['gate_up_proj_blocks']}: 2I = {two_i} rows must be a multiple of 64 (gate and "
                         "up rows, I a multiple of down_proj's group of 32)")
    i = two_i // 2
    expect = {"gate_up_proj_scales": (e, two_i, hb), "gate_up_proj_bias": (e, two_i),
              "down_proj_blocks": (e, h, i // 32, 16), "down_proj_scales": (e, h, i // 32), "down_proj_bias": (e, h)}
    for key, shape in expect.items():
        if _shape(t[key]) != shape:
            raise ValueError(f"{names[key]}: shape must be {shape} for {names['gate_up_proj_blocks']} of shape "
                             f"{_shape(t['gate_up_proj_blocks'])} (E = {e}, 2I = {two_i}, H = {h}), "
                             f"got {_shape(t[key])}")

    def experts(proj: str) -> List[FP4Weight]:
        out = []
        for x in range(e):
            try:
                w = FP4Weight.from_gpt_oss(t[proj + "_blocks"][x], t[proj + "_scales"][x], swap_nibbles=swap_nibbles)
            except (TypeError, ValueError) as err:
                raise type(err)(f"{pre}{proj}_blocks/_scales, expert {x}: {err}") from None
            out.append(_to_device(w, device))
        return out

    gate_up, down = experts("gate_up_proj"), experts("down_proj")
    gate_up_bias = _to_device(t["gate_up_proj_bias"], device)
    if deinterleave:
        gate_up = [deinterleave_gate_up(w) for w in gate_up]
        gate_up_bias = deinterleave_gate_up(gate_up_bias, axis=1)
    return GptOssExperts(gate_up, down, gate_up_bias, _to_device(t["down_proj_bias"], device), not deinterleave)


# ---- ModelOpt NVFP4 per-expert modules -------------------------------------------------------------------
@dataclass
class ModelOptExperts:
    """One layer's MoE experts from per-expert NVFP4 modules (ModelOpt checkpoints of Qwen3-MoE, DeepSeek,
    Mixtral, ...). gate_up[e]: FP4Weight [2I, H], rows [gate; up] (GateUpLayout concatenated), gate and up
    each keeping its own tensor scale (per-row tensor scales after fuse); down[e]: FP4Weight [H, I]."""
    gate_up: List[FP4Weight]
    down: List[FP4Weight]

    @property
    def num_experts(self) -> int:
        return len(self.gate_up)


def load_modelopt_experts(path_or_modules: Union[PathLike, Mapping[str, Any]], layer: int, *,
                          prefix: str = "model.layers.{layer}.mlp.experts.{expert}.",
                          names: Sequence[str] = ("gate_proj", "up_proj", "down_proj"), device: Any = None,
                          framework: Optional[str] = None, swap_nibbles: bool = False) -> ModelOptExperts:
    """The NVFP4 experts of one layer, from a ModelOpt checkpoint directory or from the {module: FP4Weight}
    mapping load_modelopt_checkpoint returns (load the checkpoint once, then call this per layer).

    Experts are the modules {prefix}{gate}, {prefix}{up} and {prefix}{down} with prefix formatted with
    `layer` and expert = 0, 1, ... up to the first missing one; names = (gate, up, down): ("gate_proj",
    "up_proj", "down_proj") for Qwen3-MoE and DeepSeek, ("w1", "w3", "w2") with prefix
    "model.layers.{layer}.block_sparse_moe.experts.{expert}." for Mixtral. gate and up must be [I, H] and down
    [H, I], the same for every expert. device, framework, swap_nibbles: as load_modelopt_checkpoint (for a
    directory)."""
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer: must be an int >= 0 (got {layer!r})")
    if isinstance(names, str) or len(names) != 3 or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"names: must be three module names (gate, up, down) (got {names!r})")
    if isinstance(path_or_modules, Mapping):
        modules = path_or_modules
    else:
        modules = load_modelopt_checkpoint(path_or_modules, device, framework=framework, swap_nibbles=swap_nibbles)
    gate_n, up_n, down_n = names

    def name(e: int, proj: str) -> str:
        return prefix.format(layer=layer, expert=e) + proj

    count = 0
    while name(count, gate_n) in modules:
        count += 1
    if count == 0:
        raise ValueError(f"{name(0, gate_n)}: missing (no experts of layer {layer} under prefix {prefix!r} with "
                         f"names {tuple(names)})")
    gate_up, down = [], []
    shape = None
    for e in range(count):
        parts = []
        for proj in (gate_n, up_n, down_n):
            key = name(e, proj)
            if key not in modules:
                raise ValueError(f"{key}: missing (expert {e} of {count})")
            w = modules[key]
            if not isinstance(w, FP4Weight):
                raise ValueError(f"{key}: must be an NVFP4 module (got {type(w).__name__}; excluded from "
                                 "quantization in hf_quant_config.json?)")
            if w.format != "nvfp4":
                raise ValueError(f"{key}: must be NVFP4 (got {w.format})")
            parts.append(w)
        g, u, d = parts
        (i, h), (iu, hu), (hd, idn) = g.shape, u.shape, d.shape
        if (iu, hu) != (i, h) or (hd, idn) != (h, i):
            raise ValueError(f"{name(e, down_n)}: expert {e}: gate and up must be [I, H] and down [H, I] (got "
                             f"{g.shape}, {u.shape}, {d.shape})")
        if shape is None:
            shape = (i, h)
        elif (i, h) != shape:
            raise ValueError(f"{name(e, gate_n)}: expert {e} is [{i}, {h}], expert 0 is [{shape[0]}, {shape[1]}]: "
                             "every expert of a layer has one shape")
        gate_up.append(fuse([g, u]))
        down.append(d)
    return ModelOptExperts(gate_up, down)
