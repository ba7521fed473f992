#!/usr/bin/env python3
"""MoE routing on the GPU: torch.ops.fp4kit.route (one kernel) against the same routing written in torch
operations the way an engine captures it in a CUDA graph (no host check), per call.

Models: gpt-oss-120b (E = 128, softmax top-4), Qwen3-30B-A3B (128, softmax top-8), DeepSeek-V3 (256, sigmoid
grouped top-8: 8 groups, 4 kept, scaling 2.5, correction bias), Mixtral-8x7B (8, softmax top-2); T tokens of
bfloat16 router logits. Method: 16 different logit tensors, one CUDA graph of 16 calls (call i routes tensor
i), median of 100 replays, per call; both sides in the same process. Writes JSON (device, commit, date,
rows) with --json.

    tools/bench_routing.py [--t 1,16,64,1024] [--json bench/results/routing.json] [--commit SHA]
"""
import argparse
import datetime
import json

import torch

import fp4kit.ops  # noqa: F401  (registers torch.ops.fp4kit)
from bench_overhead import graph_us  # tools/: the CUDA-graph timing both tools use

MODELS = [  # name, E, k, grouped (n_group, topk_group, scaling) or None
    ("gpt-oss-120b", 128, 4, None),
    ("qwen3-30b-a3b", 128, 8, None),
    ("deepseek-v3", 256, 8, (8, 4, 2.5)),
    ("mixtral-8x7b", 8, 2, None),
]


def torch_route(logits, k, grouped, bias):
    """The routing of fp4kit.moe.route_softmax_topk / route_sigmoid_grouped_topk in plain torch operations,
    without their host NaN check (so that it can be captured)."""
    lg = logits.float()
    if grouped is None:
        top, ids = torch.topk(lg, k, dim=-1)
        return ids.to(torch.int32), torch.softmax(top, dim=-1)
    n_group, topk_group, scale = grouped
    t, e = lg.shape
    scores = torch.sigmoid(lg)
    sel = scores + bias
    group_key = sel.view(t, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_key).scatter_(1, group_key.topk(topk_group, dim=-1).indices, 1.0)
    masked = sel.masked_fill(keep.repeat_interleave(e // n_group, dim=1) == 0, float("-inf"))
    ids = masked.topk(k, dim=-1).indices
    w = scores.gather(1, ids)
    return ids.to(torch.int32), w / w.sum(-1, keepdim=True) * scale


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", default="1,16,64,1024", help="token counts (comma-separated)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_routing: no CUDA device")
        return
    rows = []
    print(f"{'model':14} {'E':>4} {'k':>2} {'T':>5} {'fp4kit us':>10} {'torch us':>9} {'speedup':>8}")
    for name, e, k, grouped in MODELS:
        gen = torch.Generator(device="cuda").manual_seed(e * 7 + k)
        bias = (0.05 * torch.randn(e, device="cuda", generator=gen)) if grouped else None
        kw = {} if grouped is None else dict(n_group=grouped[0], topk_group=grouped[1],
                                               routed_scaling_factor=grouped[2], correction_bias=bias)
        routing = "softmax" if grouped is None else "sigmoid_grouped"
        for t in (int(x) for x in a.t.split(",")):
            logits = [torch.randn(t, e, device="cuda", generator=gen).bfloat16() for _ in range(16)]
            ours = graph_us(lambda i: torch.ops.fp4kit.route(logits[i], k, routing, True, **kw), 16, 100, warm=10)
            theirs = graph_us(lambda i: torch_route(logits[i], k, grouped, bias), 16, 100, warm=10)
            print(f"{name:14} {e:4d} {k:2d} {t:5d} {ours:10.2f} {theirs:9.2f} {theirs / ours:7.2f}x")
            rows.append(dict(model=name, E=e, top_k=k, T=t, routing=routing, fp4kit_us=ours, torch_us=theirs,
                             speedup=theirs / ours))
    if a.json:
        out = dict(tool="bench_routing", device=torch.cuda.get_device_name(), commit=a.commit,
                   date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   method="bfloat16 router logits; CUDA graph of 16 calls on 16 different logit tensors, median of "
                          "100 replays, per call; torch: the same routing in torch operations (topk / softmax, "
                          "or the grouped sigmoid routing), no host check",
                   rows=rows)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
