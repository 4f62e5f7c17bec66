"""PyTorch's CPU matmul on the prefill Gemm shapes kernel_bench times: the peer for its
`prefill-bf16` and `prefill-compute` rows (n = 512 prompt rows against TinyLlama's matrices).

Prints one Markdown table: GFLOP/s (2 n m k per call, best of --reps timed calls after warm-up
calls) of x @ w.T for bf16 x and w (what autocast runs: oneDNN, on the AMX tiles where the CPU has
them), of the same with x given in f32 and cast to bf16 inside the timing (the cast modserve's
kernels pay as their x packing), and of f32 x and w.

    .venv/bin/python tests/bench/torch_matmul.py --threads 1
    .venv/bin/python tests/bench/torch_matmul.py --threads 2

Then one TinyLlama layer's matrices as modserve's Transformer calls them (q/k/v fused into one
2560-row product, o, gate/up fused into one 11264-row product, down), bf16 x bf16 at n rows: the
peer of modserve-bench's "Gemm probe" line. Several layers' worth of weights alternate, so they
come from memory as in a forward pass.

Note what each row's numbers mean: PyTorch's bf16 product rounds every x to bf16 (8 significant
bits), while modserve's AMX Gemm splits x into three bf16 terms and keeps f32 accuracy, at three
tile products per useful one (docs/PERFORMANCE.md).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from loopback import cpu_model  # noqa: E402


def best_seconds(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=512, help="x rows (prompt tokens)")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {cpu_model()}, {args.threads} threads, "
          f"mkldnn {torch.backends.mkldnn.is_available()}")
    print("| m x k (weights) | n | bf16 x bf16 GFLOP/s | f32 x cast to bf16 | f32 x f32 |")
    print("|---|---:|---:|---:|---:|")
    n = args.rows
    for m, k in ((2048, 2048), (5632, 2048), (2048, 5632)):
        x32 = torch.randn(n, k)
        w32 = torch.randn(m, k) * 0.02
        x16, w16 = x32.to(torch.bfloat16), w32.to(torch.bfloat16)
        flop = 2.0 * n * m * k
        bf = flop / best_seconds(lambda: x16 @ w16.t(), args.reps) / 1e9
        cast = flop / best_seconds(lambda: x32.to(torch.bfloat16) @ w16.t(), args.reps) / 1e9
        f32 = flop / best_seconds(lambda: x32 @ w32.t(), args.reps) / 1e9
        print(f"| {m} x {k} | {n} | {bf:.1f} | {cast:.1f} | {f32:.1f} |")

    d, q, kv, ff = 2048, 2048, 256, 5632
    mats = ((q + 2 * kv, d), (d, q), (2 * ff, d), (d, ff))
    copies = [[(torch.randn(m, k) * 0.02).to(torch.bfloat16) for m, k in mats] for _ in range(4)]
    xs = [torch.randn(n, k).to(torch.bfloat16) for _, k in mats]
    turn = [0]

    def layer() -> None:
        ws = copies[turn[0] % len(copies)]
        turn[0] += 1
        for x, w in zip(xs, ws):
            x @ w.t()

    flop = sum(2.0 * n * m * k for m, k in mats)
    print(f"\nOne TinyLlama layer (q/k/v fused, o, gate/up fused, down; bf16, n = {n}, "
          f"{len(copies)} weight copies in turn): "
          f"{flop / best_seconds(layer, args.reps) / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
