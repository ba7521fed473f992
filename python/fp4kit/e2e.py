"""End-to-end decoder throughput: a compact Llama runtime, BF16 (cuBLAS) vs NVFP4 / MXFP4 (fp4kit) weights.

    python -m fp4kit.e2e                                   # Llama-3.1-8B shapes, full depth, batch 1/10/64
    python -m fp4kit.e2e --model llama-3.3-70b             # FP4 at full depth; BF16 only where it fits
    python -m fp4kit.e2e --model llama-3.3-70b --layers 40 # BF16 and FP4 at the same depth
    python -m fp4kit.e2e --json out.json --plot out.png --commit abc1234 --markdown
    python -m fp4kit.e2e --model tiny --device cpu --prompt 16 --gen 8   # the same code, eager, on the CPU
    python -m fp4kit.e2e --step llama70b-a --json out.json # one step of the large-run plan (tools/gpu-e2e-large)
    python -m fp4kit.e2e_plan                              # that plan: memory and time per step (no torch needed)

Model: Llama-style decoder blocks in plain PyTorch: RMSNorm, rotary embeddings (half-split, as in Hugging
Face; no Llama-3.1 frequency rescaling, which changes no shape or cost), grouped-query attention through
``torch.nn.functional.scaled_dot_product_attention``, SwiGLU MLP. The q/k/v projections are one fused Linear
and gate/up another (fewer, larger GEMMs). Random weights of the real shapes, generated on the device in
bfloat16 (normal, std 0.02; RMSNorm weights 1). Presets: "llama-3.1-8b" (hidden 4096, 32 heads, 8 KV heads,
intermediate 14336, 32 layers, vocabulary 128256), "llama-3.3-70b" (8192, 64, 8, 28672, 80 layers, 128256),
"tiny" (256, 4, 2, 512, 2 layers, 1024; for the CPU and tests); ``--layers N`` changes the depth.
MoE presets: "gpt-oss-120b" (hidden 2880, 64 query / 8 KV heads of 64, 36 layers, 128 experts of 2880, top 4,
gpt-oss SwiGLU with interleaved gate/up rows and biases, vocabulary 201088; plain causal attention) and
"tiny-moe"; their MLPs run through torch.ops.fp4kit.fused_moe, so they have FP4 variants only.

Variants, everything else identical: "bf16" (torch.nn.Linear: cuBLAS), "nvfp4" and "mxfp4" (every Linear of
the blocks quantized from the same random BF16 weights, exactly as ``fp4kit.nn.convert(model, fmt,
exclude=["lm_head"])`` does, one layer at a time so that the BF16 copy of the whole model never exists).
Kept in BF16 in all variants: the token embedding, the LM head, the RMSNorm weights; the KV cache and all
activations are BF16.

Runtime: a static KV cache [layers, batch, kv_heads, max_len, head_dim] (one allocation per layer); prefill
is one forward over the prompt (causal SDPA); the decode step feeds one token per sequence, writes its K/V
at a position held in a tensor and attends over the whole cache with a length mask, so the step is
shape-static. On CUDA it is
captured once in a CUDA graph and replayed for each generated token; greedy ids (argmax) stay on the GPU
(no host synchronisation per token). ``--compile`` runs the decode step through ``torch.compile`` before
capture (fuses the element-wise work; both variants alike). On the CPU everything runs eagerly and fp4kit's
operators run their CPU reference.

Measurement, per model, variant and batch (prompt 512 and 256 generated tokens by default): the prefill
produces the first token and the decode steps the other gen - 1. prefill_ms: one prefill after a warm-up
one (CUDA events); decode_tok_s = batch * (gen - 1) / decode time (the graph replays, CUDA events);
total_tok_s = batch * gen / (prefill + decode); peak_gib: torch.cuda.max_memory_allocated over the run,
weights included; ratio_vs_bf16: decode tokens/s over the BF16 row of the same model, depth and batch.

Fit rule: before each variant, and again before each batch, the tool estimates the memory it needs (weights
exactly, the KV cache, prefill activations roughly; fp4kit.e2e_plan) against the free GPU memory. A variant
whose smallest batch does not fit is skipped, and so is a batch that does not fit (or runs out of memory); the
tool prints the rule and the largest depth that would fit. BF16 Llama-3.3-70B (141 GB of weights) fits one H200
at batches 1 and 10 but leaves too little for batch 64's KV cache and prefill: FP4 runs at full depth, and BF16
is compared with FP4 at batch 64 at a depth that fits (``--layers N``, the same for every variant), saying so.
The large runs (Llama-3.3-70B, gpt-oss-120b) are split into steps of at most 10 minutes each
(``fp4kit.e2e_plan.LARGE_STEPS``, ``--step NAME``); ``--json`` is rewritten after every measured row.

Weights are drawn and quantized on the GPU (``torch.Tensor.normal_`` in BF16, then fp4kit's GPU quantizer and
prepack, one Linear or expert at a time; no host round trip), recorded per row as ``build_s``. Drawing FP4
codes directly would save only the quantizer's pass over the weights and would break "FP4 quantized from the
same BF16 weights".
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from . import __version__
from . import nn as fnn
from . import tables
from .e2e_plan import (GIB, KEPT_BF16, LARGE_STEPS, PRESETS, VARIANTS, Config, cache_len, max_layers,  # noqa: F401
                       memory_estimate, plan_text, weight_bytes)
from .e2e_plan import _max_layers, act_bytes as _act_bytes, kv_bytes as _kv_bytes  # noqa: F401

__all__ = ["Config", "PRESETS", "VARIANTS", "KEPT_BF16", "Decoder", "KVCache", "Runner", "build_model", "generate",
           "cache_len", "weight_bytes", "memory_estimate", "max_layers", "run", "table", "markdown", "plot", "main"]

_BF16 = torch.bfloat16
_GIB = float(GIB)


# ---- model ------------------------------------------------------------------------------------------
def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


class Block(torch.nn.Module):
    """One decoder block: x + o(attn(norm(x))), then x + down(silu(gate) * up)(norm(x))."""

    def __init__(self, cfg: Config, qkv: torch.nn.Module, o: torch.nn.Module, gate_up: torch.nn.Module,
                 down: torch.nn.Module, device) -> None:
        super().__init__()
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.attn_norm = torch.nn.Parameter(torch.ones(cfg.hidden, dtype=_BF16, device=device), requires_grad=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(cfg.hidden, dtype=_BF16, device=device), requires_grad=False)

    def mlp(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        g, u = self.gate_up(_rms(x, self.mlp_norm, eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class MoEBlock(torch.nn.Module):
    """A decoder block whose MLP is a mixture of FP4 experts: x + o(attn(norm(x))), then
    x + fused_moe(norm(x)) with top-k routing by a BF16 router (softmax over the selected logits)."""

    def __init__(self, cfg: Config, qkv: torch.nn.Module, o: torch.nn.Module, router: torch.nn.Module,
                 w_gate_up: torch.Tensor, w_down: torch.Tensor, b_gate_up: Optional[torch.Tensor],
                 b_down: Optional[torch.Tensor], fmt: str, device) -> None:
        super().__init__()
        self.cfg, self.fmt = cfg, fmt
        self.qkv, self.o, self.router = qkv, o, router
        self.register_buffer("w_gate_up", w_gate_up)
        self.register_buffer("w_down", w_down)
        self.register_buffer("b_gate_up", b_gate_up)
        self.register_buffer("b_down", b_down)
        self.attn_norm = torch.nn.Parameter(torch.ones(cfg.hidden, dtype=_BF16, device=device), requires_grad=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(cfg.hidden, dtype=_BF16, device=device), requires_grad=False)

    def mlp(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        c = self.cfg
        h = _rms(x, self.mlp_norm, eps).reshape(-1, c.hidden).contiguous()
        # Softmax over the top-k logits in one kernel (fp4kit.route; it reads the router's bf16 logits as they are).
        ids, wts = torch.ops.fp4kit.route(self.router(h), c.top_k)
        y = torch.ops.fp4kit.fused_moe(h, ids, wts, self.w_gate_up, self.w_down, self.fmt, c.intermediate,
                                       c.moe_activation, c.moe_layout, self.b_gate_up, self.b_down)
        return x + y.view(x.shape)


class KVCache:
    """Static K/V cache [layers, batch, kv_heads, max_len, head_dim] in bfloat16, zero-filled (a masked slot
    must hold finite values: softmax gives it weight 0, and 0 * NaN would still be NaN).

    ``k[i]`` and ``v[i]`` are layer i's [batch, kv_heads, max_len, head_dim], one allocation per layer: the
    decode step writes them in place, and under torch.compile a write into a view of one big tensor would be
    turned into a copy of the whole cache."""

    def __init__(self, cfg: Config, batch: int, max_len: int, device, dtype: torch.dtype = _BF16) -> None:
        shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.slots = torch.arange(max_len, device=device)
        self.rows = torch.arange(batch, device=device)
        self.batch, self.max_len = batch, max_len

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class Decoder(torch.nn.Module):
    """Llama-style decoder. ``forward(ids)`` is the full (prefill) forward; ``step(ids, pos, cache)`` the
    shape-static decode step. Build one with :func:`build_model`."""

    def __init__(self, cfg: Config, device) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.utils.skip_init(torch.nn.Embedding, cfg.vocab, cfg.hidden, device=device, dtype=_BF16)
        self.layers = torch.nn.ModuleList()
        self.norm = torch.nn.Parameter(torch.ones(cfg.hidden, dtype=_BF16, device=device), requires_grad=False)
        self.lm_head = torch.nn.utils.skip_init(torch.nn.Linear, cfg.hidden, cfg.vocab, bias=False, device=device,
                                                dtype=_BF16)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
        self.register_buffer("inv_freq", inv.float().to(device), persistent=False)
        self.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.norm.device

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, S, n, head_dim], pos int [B or 1, S] -> x rotated (half-split layout), in x's dtype."""
        f = pos[..., None].float() * self.inv_freq
        cos, sin = f.cos()[:, :, None, :], f.sin()[:, :, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def _qkv(self, blk, x: torch.Tensor, pos: torch.Tensor):
        c = self.cfg
        b, s, _ = x.shape
        qkv = blk.qkv(_rms(x, blk.attn_norm, c.eps)).view(b, s, c.heads + 2 * c.kv_heads, c.head_dim)
        qk = self._rope(qkv[:, :, :c.heads + c.kv_heads], pos)
        return qk[:, :, :c.heads], qk[:, :, c.heads:], qkv[:, :, c.heads + c.kv_heads:]

    def forward(self, ids: torch.Tensor, cache: Optional[KVCache] = None, last_only: bool = False) -> torch.Tensor:
        """ids int [B, S] at positions 0..S-1 -> logits [B, S, vocab] ([B, 1, vocab] with last_only).
        With a cache, the K/V of every layer are written to its slots 0..S-1 (a fresh prefill)."""
        c = self.cfg
        b, s = ids.shape
        if cache is not None and (cache.batch != b or cache.max_len < s):
            raise ValueError(f"cache: holds batch {cache.batch} x {cache.max_len} positions; ids is {b} x {s}")
        pos = torch.arange(s, device=ids.device)[None]
        g = c.heads // c.kv_heads
        x = self.embed(ids)
        for i, blk in enumerate(self.layers):
            q, k, v = (t.transpose(1, 2) for t in self._qkv(blk, x, pos))  # [B, n, S, hd]
            if cache is not None:
                cache.k[i][:, :, :s].copy_(k)
                cache.v[i][:, :, :s].copy_(v)
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)
            x = x + blk.o(a.transpose(1, 2).reshape(b, s, c.heads * c.head_dim))
            x = blk.mlp(x, c.eps)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(_rms(x, self.norm, c.eps))

    def step(self, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One decode step: ids int [B] at positions pos int [B] -> logits [B, vocab]. Writes the new K/V at
        `pos` and attends over cache slots 0..pos (a mask over the whole cache: shapes never change)."""
        c = self.cfg
        b = ids.shape[0]
        g = c.heads // c.kv_heads
        mask = (cache.slots[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, max_len]
        x = self.embed(ids)[:, None]
        for i, blk in enumerate(self.layers):
            q, k, v = self._qkv(blk, x, pos[:, None])
            kc, vc = cache.k[i], cache.v[i]
            kc[cache.rows, :, pos] = k[:, 0]  # [B, kv_heads, head_dim] into slot pos[b] of sequence b
            vc[cache.rows, :, pos] = v[:, 0]
            # GQA for one query token: the `g` query heads of a KV head act as `g` query rows of that head.
            a = F.scaled_dot_product_attention(q.reshape(b, c.kv_heads, g, c.head_dim), kc, vc, attn_mask=mask)
            x = x + blk.o(a.reshape(b, 1, c.heads * c.head_dim))
            x = blk.mlp(x, c.eps)
        return self.lm_head(_rms(x[:, 0], self.norm, c.eps))


def build_model(cfg: Config, variant: str = "bf16", device="cpu", seed: int = 0) -> Decoder:
    """Random-weight decoder on `device`. Weights are drawn in bfloat16 on the device (normal, std 0.02) in a
    fixed order from `seed`, so every variant starts from the same BF16 weights. "nvfp4"/"mxfp4" replace each
    block Linear by ``fp4kit.nn.Linear.from_linear`` (what ``fp4kit.nn.convert(..., exclude=["lm_head"])``
    does) right after drawing it."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: must be one of {', '.join(VARIANTS)} (got {variant!r})")
    if cfg.experts and variant == "bf16":
        raise NotImplementedError(f"variant: {cfg.name} has MoE blocks, which this benchmark builds with FP4 experts "
                                  "only (use nvfp4 or mxfp4)")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape) -> torch.Tensor:
        return torch.empty(shape, dtype=_BF16, device=device).normal_(0.0, 0.02, generator=gen)

    def linear(n: int, k: int) -> torch.nn.Module:
        lin = torch.nn.utils.skip_init(torch.nn.Linear, k, n, bias=False, device=device, dtype=_BF16)
        lin.weight.requires_grad_(False).normal_(0.0, 0.02, generator=gen)
        return lin if variant == "bf16" else fnn.Linear.from_linear(lin, variant)

    def experts(n: int, k: int) -> torch.Tensor:  # E experts drawn and quantized one at a time, then stacked
        from .moe import stack_experts
        from .weights import FP4Weight
        return stack_experts([FP4Weight.from_float(draw(n, k), variant) for _ in range(cfg.experts)], device)

    with torch.no_grad():
        model = Decoder(cfg, device)
        model.embed.weight.normal_(0.0, 0.02, generator=gen)
        shapes = cfg.linear_shapes()
        for _ in range(cfg.layers):
            if not cfg.experts:
                model.layers.append(Block(cfg, *(linear(*shapes[n]) for n in ("qkv", "o", "gate_up", "down")), device))
                continue
            qkv, o = linear(*shapes["qkv"]), linear(*shapes["o"])
            router = torch.nn.utils.skip_init(torch.nn.Linear, cfg.hidden, cfg.experts, bias=cfg.moe_bias,
                                              device=device, dtype=_BF16)
            router.weight.requires_grad_(False).normal_(0.0, 0.02, generator=gen)
            if cfg.moe_bias:
                router.bias.requires_grad_(False).normal_(0.0, 0.02, generator=gen)
            w_gu, w_dn = experts(*shapes["gate_up"]), experts(*shapes["down"])
            b_gu = draw(cfg.experts, 2 * cfg.intermediate) if cfg.moe_bias else None
            b_dn = draw(cfg.experts, cfg.hidden) if cfg.moe_bias else None
            model.layers.append(MoEBlock(cfg, qkv, o, router, w_gu, w_dn, b_gu, b_dn, variant, device))
        model.lm_head.weight.normal_(0.0, 0.02, generator=gen)
    return model.requires_grad_(False).eval()


# ---- generation -------------------------------------------------------------------------------------
class Runner:
    """Static state for greedy generation of one batch: the KV cache, the current ids and positions, the
    generated ids (all device tensors), and on CUDA the captured decode step.

    ``prefill(prompt)`` fills the cache and writes the first generated id; ``prepare()`` warms the decode
    step up (and captures it when ``graph``); each ``step()`` appends one id per sequence to ``out``."""

    def __init__(self, model: Decoder, batch: int, max_len: int, max_gen: int, graph: Optional[bool] = None,
                 compile: bool = False) -> None:
        dev = model.device
        self.model, self.graph = model, (dev.type == "cuda") if graph is None else graph
        if self.graph and dev.type != "cuda":
            raise ValueError(f"graph: CUDA graphs need a CUDA model (model is on {dev})")
        self.cache = KVCache(model.cfg, batch, max_len, dev)
        self.ids = torch.zeros(batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.t = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(batch, max_gen + 3, dtype=torch.long, device=dev)  # + room for warm-up steps
        self.logits: Optional[torch.Tensor] = None
        self._fn = torch.compile(model.step, dynamic=False) if compile else model.step
        self._g: Optional[torch.cuda.CUDAGraph] = None

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """prompt int [B, S] -> first generated ids [B]; resets the generation state."""
        b, s = prompt.shape
        with torch.no_grad():
            self.logits = self.model(prompt, self.cache, last_only=True)[:, 0]
            nxt = self.logits.argmax(-1)
        self.ids.copy_(nxt)
        self.pos.fill_(s)
        self.out[:, 0] = nxt
        self.t.fill_(1)
        return nxt

    def _step(self) -> None:
        with torch.no_grad():
            self.logits = self._fn(self.ids, self.pos, self.cache)
            nxt = self.logits.argmax(-1)
            self.ids.copy_(nxt)
            self.out.scatter_(1, self.t.expand(self.out.shape[0], 1), nxt[:, None])
            self.pos.add_(1)
            self.t.add_(1)

    def prepare(self) -> None:
        """Call after prefill: two warm-up steps (compilation, first-call costs), then on CUDA capture the
        step; the state is restored after both (warm-up K/V land in slots the real steps overwrite before
        reading them)."""
        if self.pos[0].item() + 2 > self.cache.max_len:
            raise ValueError("cache: needs 2 free slots after the prompt for the warm-up steps")
        saved = [a.clone() for a in (self.ids, self.pos, self.t)]

        def restore():
            for a, s in zip((self.ids, self.pos, self.t), saved):
                a.copy_(s)

        if self.graph:
            side = torch.cuda.Stream(self.ids.device)
            side.wait_stream(torch.cuda.current_stream(self.ids.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream(self.ids.device).wait_stream(side)
            restore()
            self._g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._g):
                self._step()
        else:
            for _ in range(2):
                self._step()
        restore()

    def step(self) -> None:
        """One decode step (a graph replay on CUDA)."""
        if self._g is not None:
            self._g.replay()
        else:
            self._step()


def generate(model: Decoder, prompt: torch.Tensor, gen: int, graph: Optional[bool] = None,
             compile: bool = False) -> torch.Tensor:
    """Greedy generation: prompt int [B, S] -> generated ids int [B, gen] (on the model's device)."""
    if gen < 1:
        raise ValueError(f"gen: must be >= 1 (got {gen})")
    r = Runner(model, prompt.shape[0], cache_len(prompt.shape[1], gen), gen, graph, compile)
    r.prefill(prompt)
    if gen > 1:
        r.prepare()
        for _ in range(gen - 1):
            r.step()
    return r.out[:, :gen].clone()


# ---- measurement ------------------------------------------------------------------------------------
class _Clock:
    def __init__(self, dev: torch.device) -> None:
        self.cuda = dev.type == "cuda"

    def now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


def _measure(model: Decoder, variant: str, batch: int, prompt: int, gen: int, graph: bool, compile: bool,
             seed: int) -> dict:
    dev, cfg = model.device, model.cfg
    clock = _Clock(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    g = torch.Generator(device=dev).manual_seed(seed + batch)
    ids = torch.randint(0, cfg.vocab, (batch, prompt), generator=g, device=dev)
    r = Runner(model, batch, cache_len(prompt, gen), gen, graph, compile)
    r.prefill(ids)  # warm-up
    a = clock.now()
    r.prefill(ids)
    prefill_ms = clock.ms(a, clock.now())
    decode_ms = 0.0
    if gen > 1:
        r.prepare()
        a = clock.now()
        for _ in range(gen - 1):
            r.step()
        decode_ms = clock.ms(a, clock.now())
    out = r.out[:, :gen]
    if bool((out < 0).any() | (out >= cfg.vocab).any()):
        raise RuntimeError(f"{variant}: generated ids out of range [0, {cfg.vocab})")
    peak = torch.cuda.max_memory_allocated(dev) / _GIB if dev.type == "cuda" else None
    del r
    steps = gen - 1
    return {"model": cfg.name, "variant": variant, "layers": cfg.layers, "batch": batch, "prompt": prompt, "gen": gen,
            "prefill_ms": round(prefill_ms, 3),
            "decode_ms_per_step": round(decode_ms / steps, 4) if steps else None,
            "decode_tok_s": round(batch * steps / decode_ms * 1e3, 2) if steps and decode_ms > 0 else None,
            "total_tok_s": round(batch * gen / (prefill_ms + decode_ms) * 1e3, 2),
            "peak_gib": round(peak, 3) if peak is not None else None,
            "weights_gib": round(weight_bytes(cfg, variant) / _GIB, 3), "ratio_vs_bf16": None}


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def run(models: Sequence[str] = ("llama-3.1-8b",), variants: Sequence[str] = VARIANTS,
        batches: Sequence[int] = (1, 10, 64), prompt: int = 512, gen: int = 256, layers: Optional[int] = None,
        device: str = "cuda", graph: Optional[bool] = None, compile: bool = False, seed: int = 0,
        commit: Optional[str] = None, log=print, notes: Sequence[str] = (), step: Optional[str] = None,
        on_update=None) -> dict:
    """Measure every (model, variant, batch); returns the report (see the module docstring for the fields).

    notes: lines recorded in the report's config (and shown under its README table); step: the name of the
    large-run step (e2e_plan.LARGE_STEPS) this run is; on_update(report): called with the report so far
    (``"partial": True``) after every measured or skipped row, so that a run cut short keeps its rows."""
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"variants: each must be one of {', '.join(VARIANTS)} (got {v!r})")
    for m in models:
        if m not in PRESETS:
            raise ValueError(f"model: must be one of {', '.join(PRESETS)} (got {m!r})")
    if not batches or min(batches) < 1 or prompt < 1 or gen < 1:
        raise ValueError(f"batches, prompt, gen: must be >= 1 (got {list(batches)}, {prompt}, {gen})")
    if layers is not None and layers < 1:
        raise ValueError(f"layers: must be >= 1 (got {layers})")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device: CUDA is not available (use --device cpu for the eager CPU path)")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        dev_name = torch.cuda.get_device_name(dev)
    elif dev.type == "cpu":
        dev_name = f"cpu ({platform.processor() or platform.machine()})"
    else:
        raise ValueError(f"device: must be cuda[:N] or cpu (got {device!r})")
    use_graph = dev.type == "cuda" if graph is None else graph
    if compile:  # one compilation per (model, batch); the cache is reset for each model
        dc = torch._dynamo.config
        limit = "recompile_limit" if hasattr(dc, "recompile_limit") else "cache_size_limit"
        setattr(dc, limit, max(getattr(dc, limit), len(batches) + 1))
    max_len = cache_len(prompt, gen)
    rows: List[dict] = []
    skipped: List[dict] = []

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def report(partial: bool) -> dict:
        base = {(r["model"], r["layers"], r["batch"]): r["decode_tok_s"] for r in rows if r["variant"] == "bf16"}
        for r in rows:
            ref = base.get((r["model"], r["layers"], r["batch"]))
            r["ratio_vs_bf16"] = round(r["decode_tok_s"] / ref, 3) if ref and r["decode_tok_s"] else None
        cfgs = {m: asdict(PRESETS[m] if layers is None else replace(PRESETS[m], layers=layers)) for m in models}
        rep = {"tool": "fp4kit.e2e", "device": dev_name, "commit": commit, "date": date,
               "config": {"models": cfgs, "variants": list(variants), "batches": list(batches), "prompt": prompt,
                          "gen": gen, "max_len": max_len, "cuda_graph": use_graph, "compile": compile, "seed": seed,
                          "weights": "random normal(0, 0.02) bf16 drawn on the device; FP4 quantized from the same "
                                     "on the device (build_s: drawing, quantizing and prepacking one variant)",
                          "kept_bf16": KEPT_BF16, "fp4kit": __version__, "torch": torch.__version__,
                          "decode_tok_s": "batch * (gen - 1) / decode time (the prefill produces the first token)",
                          "step": step, "notes": list(notes)},
               "rows": rows, "skipped": skipped}
        if partial:
            rep["partial"] = True
        return rep

    def update() -> None:
        if on_update is not None:
            on_update(report(True))

    def skip(cfg: Config, variant: str, batch: Optional[int], why: str) -> None:
        log(f"skipped: {variant} {cfg.name} ({cfg.layers} layers){f' batch {batch}' if batch else ''}: {why}")
        skipped.append({"model": cfg.name, "variant": variant, "layers": cfg.layers, "batch": batch, "reason": why})
        update()

    def rule(cfg: Config, variant: str, batch: int, free: int) -> str:
        n = _max_layers(cfg, variant, batch, max_len, prompt, free)
        return (f"Rule: when BF16 does not fit, compare BF16 and FP4 at a depth that fits (--layers N, here N <= {n} "
                f"for {variant} at batch {batch}) and say so; FP4 at full depth is then reported on its own")

    for name in models:
        cfg = PRESETS[name] if layers is None else replace(PRESETS[name], layers=layers)
        if cfg.layers != PRESETS[name].layers:
            log(f"note: {name} at {cfg.layers} of its {PRESETS[name].layers} layers, the same depth for every variant")
        for variant in variants:
            if cfg.experts and variant == "bf16":
                skip(cfg, variant, None, "MoE blocks: this benchmark builds them with FP4 experts only, so there is no "
                     "BF16 baseline for this model here")
                continue
            if dev.type == "cuda":
                _free(dev)
                free = torch.cuda.mem_get_info(dev)[0]
                wb = weight_bytes(cfg, variant)
                need = wb + _kv_bytes(cfg, min(batches), max_len) + _act_bytes(cfg, min(batches), prompt)
                if need > free:
                    b = min(batches)
                    skip(cfg, variant, None, f"needs about {need / _GIB:.1f} GiB (weights {wb / _GIB:.1f} GiB) at "
                         f"batch {b}, {free / _GIB:.1f} GiB are free. {rule(cfg, variant, b, free)}")
                    continue
            log(f"building {name} ({cfg.layers} layers) {variant} on {dev} ...")
            t0 = time.perf_counter()
            model = oom = None
            try:
                model = build_model(cfg, variant, dev, seed)
            except torch.cuda.OutOfMemoryError as e:
                oom = str(e).splitlines()[0]
            if model is None:
                _free(dev)
                skip(cfg, variant, None, f"out of memory while building: {oom}")
                continue
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            build_s = time.perf_counter() - t0
            log(f"  built in {build_s:.1f} s, weights {weight_bytes(cfg, variant) / _GIB:.2f} GiB")
            if compile:
                torch._dynamo.reset()
            for b in batches:
                if dev.type == "cuda":
                    _free(dev)
                    free = torch.cuda.mem_get_info(dev)[0]
                    need = _kv_bytes(cfg, b, max_len) + _act_bytes(cfg, b, prompt)
                    if need > free:
                        total = free + weight_bytes(cfg, variant)
                        skip(cfg, variant, b, f"needs about {need / _GIB:.1f} GiB beyond the weights, "
                             f"{free / _GIB:.1f} GiB are free. {rule(cfg, variant, b, total)}")
                        continue
                row = oom = None
                t1 = time.perf_counter()
                try:
                    row = _measure(model, variant, b, prompt, gen, use_graph, compile, seed)
                except torch.cuda.OutOfMemoryError as e:
                    oom = str(e).splitlines()[0]
                if row is None:  # outside the except block, so that the failed run's tensors can be freed
                    _free(dev)
                    skip(cfg, variant, b, f"out of memory: {oom}")
                    continue
                row["build_s"], row["seconds"] = round(build_s, 2), round(time.perf_counter() - t1, 2)
                rows.append(row)
                log(f"  batch {b}: prefill {row['prefill_ms']:.1f} ms, decode {row['decode_tok_s']} tok/s"
                    + (f", peak {row['peak_gib']:.2f} GiB" if row["peak_gib"] is not None else "")
                    + f" ({row['seconds']:.0f} s)")
                update()
            del model
            _free(dev)
    return report(False)


def table(rep: dict) -> str:
    """The report as a fixed-width text table (fp4kit.tables.e2e_text)."""
    return tables.e2e_text(rep)


def markdown(rep: dict) -> str:
    """The report as a Markdown table for the README (fp4kit.tables.e2e_markdown): one line per model, depth and
    batch, the variants' decode tokens/s side by side with their ratio to BF16."""
    return tables.e2e_markdown(rep)


def plot(rep: dict, path: str) -> None:
    """Left: decode tokens/s against batch, one line per (model, depth, variant); right: the FP4 variants'
    ratio to BF16."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter, ScalarFormatter
    except ImportError:
        raise ImportError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(11, 4.2))
    color, marker = {"bf16": "C0", "nvfp4": "C1", "mxfp4": "C2"}, {"bf16": "o", "nvfp4": "s", "mxfp4": "^"}
    batches = sorted({r["batch"] for r in rep["rows"]})
    groups = list(dict.fromkeys((r["model"], r["layers"]) for r in rep["rows"]))
    for model, layers, variant in dict.fromkeys((r["model"], r["layers"], r["variant"]) for r in rep["rows"]):
        sel = sorted((r for r in rep["rows"] if (r["model"], r["layers"], r["variant"]) == (model, layers, variant)
                      and r["decode_tok_s"]), key=lambda r: r["batch"])
        kw = {"color": color[variant], "marker": marker[variant], "label": f"{model} ({layers} layers) {variant}",
              "linestyle": ("-", "--", ":", "-.")[groups.index((model, layers)) % 4]}
        if sel:
            ax.plot([r["batch"] for r in sel], [r["decode_tok_s"] for r in sel], **kw)
        sel = [r for r in sel if r["ratio_vs_bf16"] and variant != "bf16"]
        if sel:
            ax_r.plot([r["batch"] for r in sel], [r["ratio_vs_bf16"] for r in sel], **kw)
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s")
    ax_r.axhline(1.0, color="gray", lw=0.8)
    ax_r.set_ylabel("decode tokens/s over BF16")
    for a in (ax, ax_r):
        a.set_xscale("log")
        a.set_xticks(batches)
        a.xaxis.set_major_formatter(ScalarFormatter())
        a.xaxis.set_minor_formatter(NullFormatter())
        a.set_xlabel("batch (sequences)")
        a.grid(alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    fig.suptitle(f"fp4kit.e2e on {rep['device']} ({rep['commit'] or 'no commit'}): prompt {rep['config']['prompt']}, "
                 f"{rep['config']['gen']} generated tokens", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ints(s: str) -> List[int]:
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (got {s!r})") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp4kit.e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-8b", help=f"comma-separated presets: {', '.join(PRESETS)}")
    p.add_argument("--layers", type=int, help="depth override for every model (default: the preset's)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default bf16,nvfp4,mxfp4)")
    p.add_argument("--batches", type=_ints, default=[1, 10, 64], help="comma-separated (default 1,10,64)")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--gen", type=int, default=256, help="generated tokens (default 256)")
    p.add_argument("--device", default="cuda", help="cuda[:N] (default) or cpu (eager, CPU reference GEMMs)")
    p.add_argument("--no-graph", action="store_true", help="run the decode step eagerly on CUDA too")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (before graph capture)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", help="commit id recorded in the JSON")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a plot of decode tokens/s vs batch (needs matplotlib)")
    p.add_argument("--markdown", action="store_true", help="also print the table in Markdown (for the README)")
    p.add_argument("--step", choices=sorted(LARGE_STEPS), help="run one step of the large-run plan (fp4kit.e2e_plan: "
                   "model, depth, variants and batches from the plan; --prompt / --gen still apply)")
    p.add_argument("--plan", action="store_true", help="print the large-run plan (memory and time) and exit")
    p.add_argument("--from-json", metavar="PATH", help="run nothing: read a report written by --json")
    p.add_argument("--readme", metavar="PATH", help="write the Markdown table between the README's markers for the "
                   "report's model (<!-- e2e-table:begin --> / <!-- e2e-table:end --> for llama-3.1-8b; "
                   "e2e-llama70b-table, e2e-gptoss-table)")
    a = p.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if a.plan:
        print(plan_text(a.prompt, a.gen))
        return 0
    if a.from_json:
        rep = json.loads(Path(a.from_json).read_text())
        print(table(rep))
        if a.readme:
            tables.update_readme(a.readme, tables.e2e_marker(rep), markdown(rep) + f"\n\n(`{a.from_json}`)")
        return 0
    models, layers = [m for m in a.model.split(",") if m], a.layers
    variants, batches, notes = [v for v in a.variants.split(",") if v], a.batches, []
    if a.step:
        st = LARGE_STEPS[a.step]
        models, layers, variants, batches = [st.model], st.layers, list(st.variants), list(st.batches)
        notes = [f"{st.model} at {st.layers} layers ({', '.join(st.variants)}): {st.note}"]

    def write(rep: dict) -> None:
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(a.json + ".tmp")
            tmp.write_text(json.dumps(rep, indent=2) + "\n")
            tmp.replace(a.json)

    try:
        rep = run(models, variants, batches, a.prompt, a.gen, layers, a.device, False if a.no_graph else None,
                  a.compile, a.seed, a.commit, log, notes=notes, step=a.step, on_update=write)
    except (ImportError, RuntimeError, ValueError, NotImplementedError) as e:
        print(f"fp4kit.e2e: error: {e}", file=sys.stderr)
        return 2
    print(table(rep))
    if a.markdown:
        print("\n" + markdown(rep))
    write(rep)
    if a.plot:
        try:
            plot(rep, a.plot)
        except ImportError as e:
            print(f"fp4kit.e2e: error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
