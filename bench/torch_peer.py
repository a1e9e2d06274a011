#!/usr/bin/python3
"""Framework peer for issue 8: the same QKNorm attention in PyTorch, fp32.

Per head (B = 1, H = 8, q_len = kv_len = n):
    q_hat = F.normalize(q, dim=-1), k_hat likewise (eps 1e-12, a clamp on the
    norm, as in Henry et al.'s code), S = g * q_hat k_hat^T (no 1/sqrt(d)),
    causal: S masked to -inf above the diagonal, P = softmax(S), O = P v.
Forward is timed under torch.no_grad() (the peer's cheapest forward); backward
is timed as the autograd backward of O with a fixed dO, the forward graph
built untimed before each timed backward.

Threads: torch.set_num_threads(T) here, and the caller sets
OPENBLAS_NUM_THREADS=T (and OMP_NUM_THREADS=T) in the environment before
the process starts, because Debian's torch links OpenBLAS and
set_num_threads does not limit OpenBLAS's own pool (shared/NUMERICS.md).

Output: one JSON object on stdout (or --out FILE) with "records", each
{"name": "torch/<fwd|bwd>/d:D/n:N/mask:M/T:T", "flops": ..., "samples": [wall
s per iteration, one per repetition], "cpu_samples": [process CPU s]} using issue 8's FLOP model (causal counts
only the n (n + 1) / 2 visible pairs, though torch computes all n^2).
Without torch it prints {"skipped": "<reason>", "records": []} and exits 0.

Run with /usr/bin/python3 (Debian python3-torch 1.13.1).
"""

import argparse
import json
import os
import sys
import time

G = 12.3197  # the paper's g0 for L = 72, as in the C++ benchmark
HEADS = 8


def visible_pairs(n, causal):
    return n * (n + 1) / 2 if causal else float(n * n)


def parse_list(s, conv=int):
    return [conv(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--n", default="128,512,2048")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--dirs", default="fwd,bwd")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.1,
                    help="seconds each repetition runs at least")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()

    def emit(obj):
        text = json.dumps(obj, indent=1)
        if args.out == "-":
            print(text)
        else:
            with open(args.out, "w") as f:
                f.write(text + "\n")

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:  # skip cleanly: the peer is optional
        emit({"skipped": "torch not importable: %s" % e, "records": []})
        return 0

    torch.set_num_threads(args.threads)
    torch.manual_seed(20201005)
    env_blas = os.environ.get("OPENBLAS_NUM_THREADS")
    if env_blas != str(args.threads):
        print("torch_peer: warning: OPENBLAS_NUM_THREADS=%s but --threads %d"
              % (env_blas, args.threads), file=sys.stderr)

    def attention(q, k, v, causal):
        qh = F.normalize(q, dim=-1)
        kh = F.normalize(k, dim=-1)
        s = G * torch.matmul(qh, kh.transpose(-1, -2))
        if causal:
            n = s.shape[-1]
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, v)

    def time_reps(step):
        """Wall and process-CPU seconds per iteration, one per repetition."""
        step()  # untimed warm-up (allocator, OpenBLAS buffers)
        samples, cpu_samples = [], []
        for _ in range(args.reps):
            iters, elapsed, cpu = 0, 0.0, 0.0
            while elapsed < args.min_time or iters == 0:
                wall_s, cpu_s = step()
                elapsed += wall_s
                cpu += cpu_s
                iters += 1
            samples.append(elapsed / iters)
            cpu_samples.append(cpu / iters)
        return samples, cpu_samples

    def timed(fn):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - t0, time.process_time() - c0

    records = []
    for d in parse_list(args.d):
        for n in parse_list(args.n):
            q = torch.randn(1, HEADS, n, d)
            k = torch.randn(1, HEADS, n, d)
            v = torch.randn(1, HEADS, n, d)
            d_o = torch.randn(1, HEADS, n, d)
            for mask in parse_list(args.masks, str):
                causal = mask == "causal"
                pairs = visible_pairs(n, causal) * HEADS
                for direction in parse_list(args.dirs, str):
                    if direction == "fwd":
                        def step():
                            with torch.no_grad():
                                return timed(lambda: attention(q, k, v,
                                                               causal))
                        flops = 4.0 * d * pairs
                    else:
                        qg, kg, vg = (t.clone().requires_grad_(True)
                                      for t in (q, k, v))

                        def step():
                            qg.grad = kg.grad = vg.grad = None
                            o = attention(qg, kg, vg, causal)
                            return timed(lambda: o.backward(d_o))
                        flops = 10.0 * d * pairs
                    name = "torch/%s/d:%d/n:%d/mask:%s/T:%d" % (
                        direction, d, n, mask, args.threads)
                    wall, cpu = time_reps(step)
                    records.append({"name": name, "flops": flops,
                                    "samples": wall, "cpu_samples": cpu})
                    print("torch_peer: %s %.2f GFLOP/s" % (
                        name, flops / sorted(records[-1]["samples"])[
                            len(records[-1]["samples"]) // 2] * 1e-9),
                        file=sys.stderr)
    emit({"torch_version": torch.__version__, "threads": args.threads,
          "openblas_num_threads": env_blas,
          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
          "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
