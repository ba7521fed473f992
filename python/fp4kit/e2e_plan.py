"""fp4kit.e2e without torch: the model shapes, the memory arithmetic, and the plan of the large runs.

fp4kit.e2e re-exports everything here (``e2e.Config``, ``e2e.PRESETS``, ``e2e.memory_estimate``, ...); this
module needs numpy and fp4kit's compiled core only (for ``packed_layout``), so the plan can be checked on
any machine.

The large runs (``LARGE_STEPS``, run by ``tools/gpu-e2e-large STEP`` on one H200, one step per call of at most
10 minutes; each writes bench/results/e2e_<step>.json, and ``tools/report.py --merge`` joins the steps of one
model into bench/results/e2e_<group>.json: e2e_llama70b.json, e2e_gptoss.json):

    llama70b-a    Llama-3.3-70B, 80 layers: bf16 (batches 1, 10; batch 64 does not fit, see below), nvfp4
    llama70b-b    Llama-3.3-70B, 80 layers: mxfp4
    llama70b-fit  Llama-3.3-70B at FIT_DEPTH layers (64 of 80), batch 64: bf16, nvfp4, mxfp4 side by side
    gptoss-fp4    gpt-oss-120b, 36 layers (full depth): nvfp4, mxfp4 (MoE experts are FP4 only)

Memory on an H200 (GPU_FREE = 139 GiB free; prompt 512 + 256 generated tokens, so 768 KV slots; ``plan_text()``
prints the whole table):

    Llama-3.3-70B weights       BF16 131.4 GiB (141.1 GB); NVFP4 39.8 GiB, MXFP4 37.8 GiB (block Linears in the
                                prepacked layout; the embedding and LM head, 3.9 GiB, stay BF16 in every variant)
    KV cache (BF16)             2 (K, V) x 2 B x 80 layers x 8 KV heads x 768 slots x 128 = 240 MiB per
                                sequence: 0.23 GiB at batch 1, 2.3 GiB at 10, 15.0 GiB at 64
    prefill activations         about 0.42 MiB per prompt token (one layer live at a time) + 1 GiB margin:
                                1.2 GiB at batch 1, 3.1 GiB at 10, 14.4 GiB at 64
    BF16, 80 layers             batch 1: 132.9 GiB, batch 10: 136.8 GiB (both fit); batch 64: 160.8 GiB (no)
    BF16, 64 layers, batch 64   105.9 + 12.0 + 14.4 = 132.3 GiB (fits; 67 layers is the limit, the plan takes
                                the deepest multiple of 8, which leaves a margin for the allocator)
    FP4, 80 layers, batch 64    69.2 GiB (NVFP4), 67.2 GiB (MXFP4)
    gpt-oss-120b, batch 64      weights 63.4 / 61.0 GiB (NVFP4 / MXFP4) + KV 3.4 GiB (36 layers of 8 x 64) +
                                prefill 7.3 GiB (MoE slot intermediates included): 74.1 / 71.7 GiB

Time (``step_seconds``): a deliberately pessimistic model. Rates from the H200 runs: the FP4 decode kernel
moved the Llama-3.1-8B weights at about 0.8 TB/s at batch 1 and 0.4 TB/s at batch 64 (bench/results/
e2e_llama8b.json; the small 8B layers run far below the roofline, the 70B layers faster), the fused MoE layer
its touched experts at 1.1-2.3 TB/s (bench/results/moe.json; 0.8 TB/s here), BF16 (cuBLAS) 2.5 TB/s and 400
TFLOP/s; FP4 prefill runs the decode kernel in blocks of 64 tokens, each block reading every weight (every
touched expert) once; every prefill runs twice (warm-up + timed); random weights are drawn, quantized and
prepacked on the GPU at 20 GB of BF16 per second plus 3 ms per MoE expert. Estimates: llama70b-a 4.2 min,
llama70b-b 2.8, llama70b-fit 4.0, gptoss-fp4 5.0. ``tools/gpu-e2e-large`` also stops a run at 9.5 minutes, and
the JSON is rewritten after every measured row, so a step cut short keeps what it measured.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

from . import packed_layout

__all__ = ["Config", "PRESETS", "VARIANTS", "KEPT_BF16", "GIB", "GPU_FREE", "FIT_DEPTH", "Step", "LARGE_STEPS",
           "cache_len", "weight_bytes", "kv_bytes", "act_bytes", "memory_estimate", "max_layers", "fit_depth",
           "step_memory", "step_seconds", "plan_text"]

VARIANTS = ("bf16", "nvfp4", "mxfp4")
KEPT_BF16 = ("token embedding, LM head, RMSNorm weights, MoE routers (all variants); KV cache and activations are "
             "BF16")
GIB = 1 << 30
#: Free memory the large runs plan for: an H200 (about 140 GiB) less the CUDA context and torch's reserve.
GPU_FREE = 139 * GIB


@dataclass(frozen=True)
class Config:
    """Decoder shape. head_dim * heads need not equal hidden (it does for the Llama presets)."""
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rope_theta: float = 500000.0
    eps: float = 1e-5
    # Mixture of experts (experts > 0): the MLP is `experts` experts of `intermediate` each, top_k per token,
    # routed by a BF16 router (softmax over the top-k logits, as gpt-oss), run by torch.ops.fp4kit.fused_moe.
    experts: int = 0
    top_k: int = 0
    moe_activation: str = "silu"       # or "swiglu_oai" (gpt-oss)
    moe_layout: str = "concatenated"   # gate/up rows: or "interleaved" (gpt-oss)
    moe_bias: bool = False             # expert and router biases (gpt-oss has them)

    def __post_init__(self) -> None:
        for f in ("hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f}: must be >= 1 (got {getattr(self, f)})")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k: must be in [1, experts = {self.experts}] (got {self.top_k})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads: must be a multiple of kv_heads = {self.kv_heads} (got {self.heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even for rotary embeddings (got {self.head_dim})")

    def linear_shapes(self) -> Dict[str, tuple]:
        """(N, K) of each block's Linear: fused qkv, o, fused gate_up, down (of one expert, for an MoE)."""
        h, hd = self.hidden, self.head_dim
        return {"qkv": ((self.heads + 2 * self.kv_heads) * hd, h), "o": (h, self.heads * hd),
                "gate_up": (2 * self.intermediate, h), "down": (h, self.intermediate)}


PRESETS: Dict[str, Config] = {
    "llama-3.1-8b": Config("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256),
    "llama-3.3-70b": Config("llama-3.3-70b", 8192, 28672, 80, 64, 8, 128, 128256),
    "tiny": Config("tiny", 256, 512, 2, 4, 2, 64, 1024),
    # gpt-oss-120b's shapes (36 layers, 128 experts of 2880, top 4; attention 64 query / 8 KV heads of 64):
    # its MoE blocks, with plain causal attention (no sliding window or attention sinks: no shape changes).
    "gpt-oss-120b": Config("gpt-oss-120b", 2880, 2880, 36, 64, 8, 64, 201088, 150000.0, 1e-5, 128, 4, "swiglu_oai",
                           "interleaved", True),
    "tiny-moe": Config("tiny-moe", 256, 128, 2, 4, 2, 64, 1024, 500000.0, 1e-5, 8, 2, "swiglu_oai", "interleaved",
                       True),
}


# ---- memory ---------------------------------------------------------------------------------------------------
def cache_len(prompt: int, gen: int) -> int:
    """KV slots for a prompt and `gen` generated tokens (the last one is never fed back), rounded up to 64."""
    return -(-max(prompt + gen - 1, prompt + 2) // 64) * 64


def weight_bytes(cfg: Config, variant: str) -> int:
    """Bytes of the model's weights: block Linears in BF16 or FP4 (fp4kit's prepacked layout), plus the BF16
    embedding, LM head and norms."""
    per = 4 * cfg.hidden
    for name, (n, k) in cfg.linear_shapes().items():
        one = 2 * n * k if variant == "bf16" else packed_layout(variant, n, k)["total_bytes"]
        if cfg.experts and name in ("gate_up", "down"):  # E experts, stacked at a 256-byte stride; biases
            one = cfg.experts * ((one + 255) // 256 * 256 + (2 * n if cfg.moe_bias else 0))
        per += one
    if cfg.experts:  # the BF16 router
        per += 2 * cfg.experts * (cfg.hidden + (1 if cfg.moe_bias else 0))
    return cfg.layers * per + 2 * (2 * cfg.vocab * cfg.hidden + cfg.hidden)


def kv_bytes(cfg: Config, batch: int, max_len: int) -> int:
    """The BF16 KV cache: K and V of every layer, [batch, kv_heads, max_len, head_dim]."""
    return 2 * 2 * cfg.layers * batch * cfg.kv_heads * max_len * cfg.head_dim


def act_bytes(cfg: Config, batch: int, prompt: int) -> int:
    """Rough peak of the prefill's transient tensors (one layer live at a time) plus a fixed 1 GiB margin; for an
    MoE block also the fused layer's per-slot intermediates (top_k slots of gate_up, activation and output)."""
    qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
    per_token = 2 * (4 * cfg.intermediate + 3 * qkv + 3 * cfg.heads * cfg.head_dim + 6 * cfg.hidden)
    if cfg.experts:
        per_token += 2 * cfg.top_k * (3 * cfg.intermediate + cfg.hidden)
    return batch * prompt * per_token + 4 * batch * cfg.vocab + GIB


def memory_estimate(cfg: Config, variant: str, batch: int, prompt: int, gen: int) -> Dict[str, int]:
    """Bytes one measurement needs on the GPU: {"weights" (exact), "kv_cache" (exact), "activations" (the
    prefill's, rough, with a 1 GiB margin), "total"}."""
    max_len = cache_len(prompt, gen)
    est = {"weights": weight_bytes(cfg, variant), "kv_cache": kv_bytes(cfg, batch, max_len),
           "activations": act_bytes(cfg, batch, prompt)}
    est["total"] = sum(est.values())
    return est


def max_layers(cfg: Config, variant: str, batch: int, prompt: int, gen: int, free: int) -> int:
    """The largest depth of `cfg`'s shape whose memory_estimate total fits in `free` bytes."""
    return _max_layers(cfg, variant, batch, cache_len(prompt, gen), prompt, free)


def _max_layers(cfg: Config, variant: str, batch: int, max_len: int, prompt: int, free: int) -> int:
    one, two = replace(cfg, layers=1), replace(cfg, layers=2)
    per = weight_bytes(two, variant) - weight_bytes(one, variant) + kv_bytes(one, batch, max_len)
    fixed = weight_bytes(one, variant) - (per - kv_bytes(one, batch, max_len)) + act_bytes(cfg, batch, prompt)
    return max(0, (free - fixed) // per)


def fit_depth(cfg: Config, variant: str = "bf16", batch: int = 64, prompt: int = 512, gen: int = 256,
              free: int = GPU_FREE, multiple: int = 8) -> int:
    """The deepest multiple of `multiple` layers (at most the preset's depth) at which `variant` fits with
    `batch`'s KV cache and prefill activations in `free` bytes."""
    n = min(cfg.layers, max_layers(cfg, variant, batch, prompt, gen, free))
    return n // multiple * multiple


# ---- the large runs -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One call on the GPU machine: one model at one depth, some variants and batches. `group` names the merged
    report (bench/results/e2e_<group>.json) and its README table marker (e2e-<group>-table)."""
    name: str
    group: str
    model: str
    layers: int
    variants: Tuple[str, ...]
    batches: Tuple[int, ...]
    note: str = ""


#: The depth at which BF16 Llama-3.3-70B is compared with FP4 at batch 64 (see the module docstring).
FIT_DEPTH = 64

LARGE_STEPS: Dict[str, Step] = {s.name: s for s in (
    Step("llama70b-a", "llama70b", "llama-3.3-70b", 80, ("bf16", "nvfp4"), (1, 10, 64),
         "full depth; BF16 at batch 64 does not fit (weights 131.4 GiB + KV 15.0 GiB + prefill 14.4 GiB) and is "
         "skipped by the fit rule"),
    Step("llama70b-b", "llama70b", "llama-3.3-70b", 80, ("mxfp4",), (1, 10, 64), "full depth"),
    Step("llama70b-fit", "llama70b", "llama-3.3-70b", FIT_DEPTH, ("bf16", "nvfp4", "mxfp4"), (64,),
         f"{FIT_DEPTH} of 80 layers: the deepest multiple of 8 at which BF16 fits with batch 64's KV cache and "
         "prefill activations in 139 GiB, the same depth for every variant"),
    Step("gptoss-fp4", "gptoss", "gpt-oss-120b", 36, ("nvfp4", "mxfp4"), (1, 10, 64),
         "full depth; MoE experts are FP4 only (no BF16 baseline)"),
)}


def step_config(step: Step) -> Config:
    return replace(PRESETS[step.model], layers=step.layers)


def step_memory(step: Step, prompt: int = 512, gen: int = 256) -> List[dict]:
    """memory_estimate of every (variant, batch) of a step, in GiB, with whether it fits in GPU_FREE."""
    cfg = step_config(step)
    out = []
    for v in step.variants:
        for b in step.batches:
            est = memory_estimate(cfg, v, b, prompt, gen)
            out.append({"variant": v, "batch": b, **{k: round(x / GIB, 2) for k, x in est.items()},
                        "fits": est["total"] <= GPU_FREE})
    return out


# Pessimistic rates (bytes or FLOP per second), calibrated on the H200 runs: the Llama-3.1-8B end-to-end run
# (dense FP4, BF16) and the fused-MoE benchmark (touched expert bytes: 1.1-2.3 TB/s at T = 1..64; 0.8 here).
_RATE = {"fp4_small_m": 0.8e12, "fp4_m64": 0.4e12, "bf16": 2.5e12, "bf16_flops": 400e12, "kv": 2.5e12,
         "build_bf16": 20e9, "per_expert_s": 3e-3, "moe": 0.8e12}


def _expert_bytes(cfg: Config, variant: str) -> int:
    """One expert of one layer as stacked: gate_up and down at the 256-byte stride, plus their biases."""
    total = 0
    for name in ("gate_up", "down"):
        n, k = cfg.linear_shapes()[name]
        one = 2 * n * k if variant == "bf16" else packed_layout(variant, n, k)["total_bytes"]
        total += (one + 255) // 256 * 256 + (2 * n if cfg.moe_bias else 0)
    return total


def _block_bytes(cfg: Config, variant: str) -> Tuple[float, float]:
    """(dense, one expert) bytes of the blocks' weights: the Linears every token reads (all of them for a dense
    model; attention and router for an MoE), and one expert of every layer."""
    total = weight_bytes(cfg, variant) - 2 * (2 * cfg.vocab * cfg.hidden + cfg.hidden)
    if not cfg.experts:
        return total, 0.0
    expert = cfg.layers * _expert_bytes(cfg, variant)
    return total - cfg.experts * expert, expert


def _active(cfg: Config, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens route to in one layer (uniform routing)."""
    return cfg.experts * (1 - (1 - cfg.top_k / cfg.experts) ** tokens) if cfg.experts else 0.0


def step_seconds(step: Step, prompt: int = 512, gen: int = 256) -> float:
    """A pessimistic estimate of the step's GPU time (model in the module docstring), weight generation included."""
    cfg = step_config(step)
    head = 2 * cfg.vocab * cfg.hidden
    t = 0.0
    for v in step.variants:
        t += weight_bytes(cfg, "bf16") / _RATE["build_bf16"]
        if cfg.experts:  # experts are drawn, quantized and prepacked one at a time: a few ms each
            t += cfg.layers * cfg.experts * 2 * _RATE["per_expert_s"]
        dense, expert = _block_bytes(cfg, v)
        for b in step.batches:
            kv = kv_bytes(cfg, b, cache_len(prompt, gen))
            if v == "bf16":
                decode = (dense + head) / _RATE["bf16"] + kv / _RATE["kv"]
                prefill = dense * b * prompt / _RATE["bf16_flops"]  # 2 FLOP per 2-byte weight and token
            else:
                rate = _RATE["fp4_m64"] if b > 16 else _RATE["fp4_small_m"]
                decode = (dense / rate + _active(cfg, b) * expert / _RATE["moe"] + head / _RATE["bf16"]
                          + kv / _RATE["kv"])
                prefill = -(-b * prompt // 64) * (dense / _RATE["fp4_m64"] + _active(cfg, 64) * expert / _RATE["moe"])
            t += 2 * prefill + (gen - 1) * decode
    return t


def plan_text(prompt: int = 512, gen: int = 256) -> str:
    """The large-run plan as text: per step the variants, batches, memory per (variant, batch), estimated time."""
    lines = []
    for s in LARGE_STEPS.values():
        lines.append(f"{s.name}: {s.model} at {s.layers} layers, {', '.join(s.variants)}, batches "
                     f"{', '.join(map(str, s.batches))}; about {step_seconds(s, prompt, gen) / 60:.1f} min at most "
                     f"(pessimistic) -> bench/results/e2e_{s.group}.json ({s.note})")
        for m in step_memory(s, prompt, gen):
            lines.append(f"    {m['variant']:6} batch {m['batch']:3}: weights {m['weights']:6.1f} + KV "
                         f"{m['kv_cache']:5.1f} + prefill {m['activations']:5.1f} = {m['total']:6.1f} GiB "
                         f"{'fits' if m['fits'] else 'does not fit'} in {GPU_FREE / GIB:.0f} GiB")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m fp4kit.e2e_plan: the plan, without torch
    print(plan_text())
