#!/usr/bin/env python3
"""Per-call overhead of the PyTorch entry points at decode sizes.

For each shape: the kernel time (CUDA graph of 20 calls, median of replays, weights rotated past the L2),
then the eager per-call time of torch.ops.fp4kit.gemm and of fp4kit.torch_ops.gemm (wall clock over many
back-to-back calls, synchronised at the end, so host overhead that the GPU cannot hide shows up). The
overhead is eager minus graph. Writes JSON (device, commit, date, rows) with --json.

    tools/bench_overhead.py [--json bench/results/overhead.json] [--commit SHA]
"""
import argparse
import datetime
import json
import statistics
import time

import torch

import fp4kit.ops  # noqa: F401  (registers torch.ops.fp4kit)
from fp4kit import torch_ops

SHAPES = [("llama-3.3-70b", "o", 8192, 8192), ("llama-3.1-8b", "o", 4096, 4096), ("llama-3.1-8b", "qkv", 6144, 4096)]


def graph_us(fn, calls=20, replays=50, warm=0):
    """Per-call time of fn(0..calls-1) captured in one CUDA graph: median over `replays` replays, after `warm`
    untimed ones (tools/bench_routing.py uses it too)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    for _ in range(warm):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


def eager_us(fn, calls=200, rounds=7):
    for i in range(10):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("No CUDA GPU found: the overhead benchmark needs an NVIDIA GPU")
        return
    rows = []
    print(f"{'model':16s} {'layer':6s} {'format':6s} {'graph us':>9s} {'op us':>8s} {'op ovh':>7s} {'fn us':>8s} {'fn ovh':>7s}")
    for model, layer, n, k in SHAPES:
        for fmt in ("nvfp4", "mxfp4"):
            copies = max(2, int(256e6 // (n * k // 2)) + 1)
            bufs = []
            for c in range(copies):
                w = torch.randn(n, k, device="cuda")
                p, s, ts = torch.ops.fp4kit.quantize(w, fmt)
                bufs.append(torch.ops.fp4kit.prepack(p, s, ts if fmt == "nvfp4" else None, fmt, n, k))
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            op = lambda i: torch.ops.fp4kit.gemm(x, bufs[i % copies], fmt, n, k)  # noqa: E731
            fn = lambda i: torch_ops.gemm(x, bufs[i % copies], fmt, n, k)  # noqa: E731
            g, e_op, e_fn = graph_us(op), eager_us(op), eager_us(fn)
            rows.append({"model": model, "layer": layer, "format": fmt, "m": 1, "n": n, "k": k, "graph_us": g,
                         "op_eager_us": e_op, "op_overhead_us": e_op - g, "fn_eager_us": e_fn, "fn_overhead_us": e_fn - g})
            print(f"{model:16s} {layer:6s} {fmt:6s} {g:9.1f} {e_op:8.1f} {e_op - g:7.1f} {e_fn:8.1f} {e_fn - g:7.1f}")
    if a.json:
        out = {"tool": "bench_overhead.py", "device": torch.cuda.get_device_name(), "commit": a.commit,
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "torch": torch.__version__, "rows": rows}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
