#!/usr/bin/python3
"""Turns qknorm-bench and torch_peer.py output into issue 8's table.

  report.py bench --gb R1.json [R2.json ...] [--torch T.json ...]
                  --out-dir DIR [--meta KEY=VALUE ...]
      Pools every repetition of every round (the samples), takes medians,
      prints the side-by-side table and the goal verdicts, writes
      DIR/bench.csv and DIR/bench.json.
  report.py callgrind --dumps DIR --out-dir DIR [--top N]
      Reads the callgrind dumps qknorm-callgrind produced (one per counted
      call), prints instruction counts and each call's top functions by self
      count, writes DIR/callgrind.csv and DIR/callgrind.json.

Definitions (bench/README.md):
  rate       FLOPs per second, issue 8's model (forward 4 n^2 d per head,
             backward 10 n^2 d, causal counting only n (n + 1) / 2 pairs),
             one sample per repetition, median over the pooled samples;
             spread = min-max of the samples.
  GEMM rate  per direction, sum F / sum t over that direction's bare
             cblas_sgemm GEMMs of the same (d, n, threads), median times:
             forward QK^T and PV (the rate of the GEMM work of one attention
             forward), backward dV = P^T dO, dP = dO V^T, dQ = dS K and
             dK = dS^T Q (the backward's own shapes).
  xGEMM      rate / GEMM rate of the row's direction; xpeer: rate / torch
             rate of the same config.
  %peak      rate / (threads x per-core FMA peak of the entry's ISA measured
             in the same run, best sample: simd AVX3* -> avx512, other simd
             -> avx2, everything else -> the widest ISA measured).
Standard library only.
"""

import argparse
import csv
import glob
import json
import os
import re
import statistics
import subprocess
import sys

# Each direction's anchor: the bare GEMMs (gemm/<op>/... benchmarks) whose
# FLOP-weighted rate its rows are compared with.
ANCHOR_OPS = {"fwd": ("qk", "pv"), "bwd": ("dv", "dp", "dq", "dk")}
ANCHOR_ENTRY = {"fwd": "sgemm(qk+pv)", "bwd": "sgemm(dv+dp+dq+dk)"}
ANCHOR_LABEL = {"fwd": "QK^T+PV", "bwd": "dV+dP+dQ+dK"}

GOALS = [
    # (family, direction, versus, threshold): issue 18, "Targets" (they
    # replace issue 8's 0.8 / 0.6 / 1.5 / 0.85). Every full-grid entry of the
    # family is held to them, so the AVX2 target on an AVX-512 machine too.
    ("simd", "fwd", "gemm", 0.85),
    ("simd", "bwd", "gemm", 0.75),
    ("simd", "fwd", "peer", 2.0),
    ("simd", "bwd", "peer", 2.0),
    ("blas", "fwd", "gemm", 0.8),
]

# Issue 34's window target: the best simd target's f32 forward (one thread,
# d 128) with a window of 128 keys (window (127, 0), causal) at n = 4096,
# GFLOP/s over the visible pairs only, at least this fraction of the same
# entry's causal n = 512 rate, measured in the same run (the rows
# qknorm-bench's --qk_window registers).
WINDOW_GOAL = {"window_mask": "causal+window127", "n": 4096, "ref_mask":
               "causal", "ref_n": 512, "d": 128, "threads": 1,
               "threshold": 0.67}

# Issue 34's RoPE target: the same entry's forward (one thread, d 128,
# n 512, no mask) with RoPE over all 128 dims (half-split, after the norm,
# theta 10^6) costs at most this multiple of the same problem without it:
# the ratio of the two rows' median times, measured in the same run (the
# rows qknorm-bench's --qk_rope registers; both count the same FLOPs).
ROPE_GOAL = {"rope_mask": "none+rope128", "ref_mask": "none", "n": 512,
             "d": 128, "threads": 1, "threshold": 1.10}


def parse_name(name):
    """'attn/simd:AVX2:f32/fwd/d:64/n:128/mask:none/T:1/real_time' -> dict."""
    parts = name.split("/")
    out = {"kind": parts[0]}
    rest = parts[1:]
    if out["kind"] in ("attn", "torch"):
        if out["kind"] == "attn":
            out["entry"], rest = rest[0], rest[1:]
        else:
            out["entry"] = "torch"
        out["dir"], rest = rest[0], rest[1:]
    elif out["kind"] in ("gemm", "fma"):
        out["op"], rest = rest[0], rest[1:]
    for p in rest:
        if ":" in p:
            k, v = p.split(":", 1)
            if k in ("d", "n", "T"):
                out[k] = int(v)
            elif k == "mask":
                out[k] = v
    return out


UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def load_gb(paths):
    """Samples (seconds per iteration) and flops per benchmark name."""
    samples, cpu, flops, errors, context = {}, {}, {}, {}, {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context = data.get("context", context)
        for b in data.get("benchmarks", []):
            if b.get("run_type") != "iteration":
                continue
            name = b.get("run_name", b["name"])
            name = re.sub(r"/(real_time|repeats:\d+)", "", name)
            if b.get("error_occurred"):
                errors[name] = b.get("error_message", "error")
                continue
            unit = UNIT[b.get("time_unit", "ns")]
            samples.setdefault(name, []).append(b["real_time"] * unit)
            cpu.setdefault(name, []).append(b["cpu_time"] * unit)
            flops[name] = b["flops"]
    return samples, cpu, flops, errors, context


def load_torch(paths):
    samples, cpu, flops, info = {}, {}, {}, []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            info.append("unreadable %s: %s" % (path, e))
            continue
        if data.get("skipped"):
            info.append(data["skipped"])
        for r in data.get("records", []):
            samples.setdefault(r["name"], []).extend(r["samples"])
            cpu.setdefault(r["name"], []).extend(r.get("cpu_samples", []))
            flops[r["name"]] = r["flops"]
        if data.get("torch_version"):
            info.append("torch %s, OMP_WAIT_POLICY %s" % (
                data["torch_version"], data.get("omp_wait_policy", "?")))
    return samples, cpu, flops, sorted(set(info))


def stats(flops, secs):
    rates = sorted(flops / s for s in secs)
    return {"median": statistics.median(rates), "min": rates[0],
            "max": rates[-1], "samples": len(rates)}


def cpu_rate(flops, secs, threads):
    """GFLOP/s from the CPU time of one-thread runs (median), None otherwise.

    On a shared machine a descheduled process loses wall time but not CPU
    time, so with one thread this rate shows what the kernel does when it
    runs; wall-clock rates stay the ones every ratio uses."""
    if threads != 1 or not secs:
        return None
    return flops / statistics.median(secs) * 1e-9


def isa_for(entry, peaks):
    widest = max(peaks, key=lambda k: peaks[k]) if peaks else None
    if entry.startswith("simd:"):
        target = entry.split(":")[1]
        if target.startswith("AVX3") and "avx512" in peaks:
            return "avx512"
        if "avx2" in peaks:
            return "avx2"
    return widest


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def cmd_bench(args):
    samples, cpu, flops, errors, context = load_gb(args.gb)
    tsamples, tcpu, tflops, tinfo = load_torch(args.torch or [])
    meta = dict(kv.split("=", 1) for kv in args.meta or [])

    # FMA peak per core, per ISA and thread count.
    peak_core = {}  # (isa, T) -> GFLOP/s per core
    for name, secs in samples.items():
        p = parse_name(name)
        if p["kind"] == "fma":
            # A peak is a capability: the best sample, the one the shared
            # machine disturbed least (the median would track the load).
            peak_core[(p["op"], p["T"])] = (
                stats(flops[name], secs)["max"] / p["T"] * 1e-9)
    # GEMM anchor per (dir, d, n, T): each direction's own GEMMs.
    gemm = {}
    for name, secs in samples.items():
        p = parse_name(name)
        if p["kind"] == "gemm":
            gemm.setdefault((p["d"], p["n"], p["T"]), {})[p["op"]] = (
                flops[name], secs)
    gemm_rate = {}
    for key, ops in gemm.items():
        for dr, names in ANCHOR_OPS.items():
            if not all(o in ops for o in names):
                continue
            f = sum(ops[o][0] for o in names)
            med = [statistics.median(ops[o][1]) for o in names]
            lo = [min(ops[o][1]) for o in names]
            hi = [max(ops[o][1]) for o in names]
            gemm_rate[(dr,) + key] = {
                "median": f / sum(med), "min": f / sum(hi),
                "max": f / sum(lo),
                "samples": min(len(ops[o][1]) for o in names)}
    # Torch peer per config.
    peer = {}
    for name, secs in tsamples.items():
        p = parse_name(name)
        key = (p["dir"], p["d"], p["n"], p["mask"], p["T"])
        peer[key] = stats(tflops[name], secs)
        peer[key]["cpu_gflops"] = cpu_rate(tflops[name], tcpu.get(name),
                                           p["T"])

    rows = []
    attn_names = [n for n in samples if parse_name(n)["kind"] == "attn"]
    for name in attn_names + list(errors):
        p = parse_name(name)
        if p["kind"] != "attn":
            continue
        key = (p["dir"], p["d"], p["n"], p["mask"], p["T"])
        row = {"entry": p["entry"], "family": p["entry"].split(":")[0],
               "dir": p["dir"], "d": p["d"], "n": p["n"],
               "mask": p["mask"], "threads": p["T"]}
        if name in errors:
            row["error"] = errors[name]
        else:
            st = stats(flops[name], samples[name])
            row.update({"gflops": st["median"] * 1e-9,
                        "ms": statistics.median(samples[name]) * 1e3,
                        "min": st["min"] * 1e-9, "max": st["max"] * 1e-9,
                        "samples": st["samples"],
                        "cpu_gflops": cpu_rate(flops[name], cpu.get(name),
                                               p["T"])})
            g = gemm_rate.get((p["dir"], p["d"], p["n"], p["T"]))
            row["gemm_gflops"] = g["median"] * 1e-9 if g else None
            row["x_gemm"] = st["median"] / g["median"] if g else None
            pr = peer.get(key)
            row["peer_gflops"] = pr["median"] * 1e-9 if pr else None
            row["x_peer"] = st["median"] / pr["median"] if pr else None
            isa = isa_for(p["entry"], {k[0]: v for k, v in peak_core.items()
                                       if k[1] == p["T"]})
            pk = peak_core.get((isa, p["T"]))
            row["peak_isa"] = isa
            row["frac_peak"] = (st["median"] * 1e-9 / (pk * p["T"])
                                if pk else None)
        rows.append(row)
    # Peer and GEMM rows, for the side-by-side view.
    for key, pr in peer.items():
        d_, dd, n, mask, t = key
        pk = peak_core.get((isa_for("torch", {k[0]: v for k, v in
                                              peak_core.items()
                                              if k[1] == t}), t))
        g = gemm_rate.get((d_, dd, n, t))
        rows.append({"entry": "torch", "family": "peer", "dir": d_, "d": dd,
                     "n": n, "mask": mask, "threads": t,
                     "gflops": pr["median"] * 1e-9, "min": pr["min"] * 1e-9,
                     "max": pr["max"] * 1e-9, "samples": pr["samples"],
                     "cpu_gflops": pr["cpu_gflops"],
                     "x_gemm": pr["median"] / g["median"] if g else None,
                     "x_peer": 1.0,
                     "frac_peak": (pr["median"] * 1e-9 / (pk * t)
                                   if pk else None)})
    for (dr, dd, n, t), g in gemm_rate.items():
        pk = peak_core.get((isa_for("gemm", {k[0]: v for k, v in
                                             peak_core.items()
                                             if k[1] == t}), t))
        rows.append({"entry": ANCHOR_ENTRY[dr], "family": "anchor",
                     "anchor_for": dr,
                     "dir": "gemm", "d": dd, "n": n, "mask": "none",
                     "threads": t, "gflops": g["median"] * 1e-9,
                     "min": g["min"] * 1e-9, "max": g["max"] * 1e-9,
                     "samples": g["samples"], "x_gemm": 1.0,
                     "frac_peak": (g["median"] * 1e-9 / (pk * t)
                                   if pk else None)})

    fam_order = {"simd": 0, "blas": 1, "reference": 2, "peer": 3,
                 "anchor": 4}
    dir_order = {"fwd": 0, "bwd": 1, "gemm": 2}
    rows.sort(key=lambda r: (dir_order.get(r["dir"], 9), r["d"], r["n"],
                             r["mask"] != "none", r["threads"],
                             fam_order.get(r["family"], 5), r["entry"]))

    print_table(rows, peak_core, context, tinfo)
    print_side_by_side(rows)
    goals = evaluate_goals(rows)
    print_goals(goals)
    window_goals = evaluate_window_goal(rows)
    print_window_goals(window_goals)
    rope_goals = evaluate_rope_goal(rows)
    print_rope_goals(rope_goals)
    goals = goals + window_goals + rope_goals

    os.makedirs(args.out_dir, exist_ok=True)
    cols = ["entry", "family", "dir", "d", "n", "mask", "threads", "gflops",
            "min", "max", "samples", "gemm_gflops", "x_gemm", "peer_gflops",
            "x_peer", "peak_isa", "frac_peak", "cpu_gflops", "error"]
    with open(os.path.join(args.out_dir, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
        json.dump({"meta": meta, "context": context, "torch": tinfo,
                   "fma_peak_per_core_gflops": {
                       "%s/T:%d" % k: v for k, v in peak_core.items()},
                   "gemm_gflops": {"d:%d/n:%d/T:%d" % k[1:]:
                                   v["median"] * 1e-9
                                   for k, v in gemm_rate.items()
                                   if k[0] == "fwd"},
                   "gemm_bwd_gflops": {"d:%d/n:%d/T:%d" % k[1:]:
                                       v["median"] * 1e-9
                                       for k, v in gemm_rate.items()
                                       if k[0] == "bwd"},
                   "rows": rows, "goals": goals}, f, indent=1)
    print("\nwrote %s/bench.csv and %s/bench.json" % (args.out_dir,
                                                     args.out_dir))
    return 0


def print_table(rows, peak_core, context, tinfo):
    ctx = context or {}
    print("host %s, %s CPUs at %s MHz, openblas %s, fma isas %s" % (
        ctx.get("host_name", "?"), ctx.get("num_cpus", "?"),
        ctx.get("mhz_per_cpu", "?"), ctx.get("openblas_corename", "?"),
        ctx.get("fma_isas", "?")))
    print("FMA peak per core (GFLOP/s, best sample): " + ", ".join(
        "%s T%d %.1f" % (k[0], k[1], v) for k, v in sorted(peak_core.items())))
    print("peer: " + ("; ".join(tinfo) if tinfo else "not run"))
    print("GFLOP/s: median over the samples (wall clock); cpu: the same "
          "from CPU time, 1 thread only")
    hdr = ("%-16s %-4s %-18s %2s %8s %13s %7s %7s %6s %6s" % (
        "entry", "dir", "shape", "T", "GFLOP/s", "min-max", "xGEMM",
        "xpeer", "%peak", "cpu"))
    print()
    print(hdr)
    print("-" * len(hdr))
    gemm = {(r["anchor_for"], r["d"], r["n"], r["threads"]): r for r in rows
            if r["family"] == "anchor"}
    last = None
    for r in rows:
        if r["family"] == "anchor":
            continue
        group = (r["dir"], r["d"], r["n"], r["mask"], r["threads"])
        if group != last:
            g = gemm.get((r["dir"], r["d"], r["n"], r["threads"]))
            print("%s%s d%d n%d %s T%d: sgemm %s %s" % (
                "" if last is None else "\n", r["dir"], r["d"], r["n"],
                r["mask"], r["threads"], ANCHOR_LABEL.get(r["dir"], "?"),
                "%.1f GFLOP/s (%.1f-%.1f)" % (g["gflops"], g["min"], g["max"])
                if g else "not measured"))
        last = group
        shape = "d%d n%d %s" % (r["d"], r["n"], r["mask"])
        if r.get("error"):
            print("%-16s %-4s %-18s %2d  ERROR %s" % (
                r["entry"], r["dir"], shape, r["threads"], r["error"]))
            continue
        spread = "%.1f-%.1f" % (r["min"], r["max"])
        frac = r.get("frac_peak")
        print("%-16s %-4s %-18s %2d %8.1f %13s %7s %7s %6s %6s" % (
            r["entry"], r["dir"], shape, r["threads"], r["gflops"], spread,
            fmt(r.get("x_gemm"), ".2f"), fmt(r.get("x_peer"), ".2f"),
            "-" if frac is None else "%.0f%%" % (100 * frac),
            fmt(r.get("cpu_gflops"), ".1f")))


def print_side_by_side(rows):
    """One line per config: sgemm, every full-grid entry and the peer."""
    full = []
    for r in rows:
        if r["family"] in ("simd", "blas") and r["entry"] not in full and \
                len({x["n"] for x in rows if x["entry"] == r["entry"]}) > 1:
            full.append(r["entry"])
    full.sort(key=lambda e: (not e.startswith("simd:"), e))
    cols = full + ["torch"]
    cell = {}
    for r in rows:
        if not r.get("error") and (r["entry"] in cols or
                                   r["family"] == "anchor"):
            cell[(r["entry"], r["dir"], r["d"], r["n"], r["mask"],
                  r["threads"])] = r
    print("\nSide by side: GFLOP/s (xGEMM / xpeer); sgemm = the direction's "
          "GEMM rate (fwd %s, bwd %s)" % (ANCHOR_LABEL["fwd"],
                                          ANCHOR_LABEL["bwd"]))
    hdr = "%-4s %-17s %2s %7s" % ("dir", "shape", "T", "sgemm") + "".join(
        " %19s" % c for c in cols)
    print(hdr)
    print("-" * len(hdr))
    keys = sorted({(r["dir"], r["d"], r["n"], r["mask"], r["threads"])
                   for r in rows if r["family"] != "anchor"},
                  key=lambda k: ({"fwd": 0, "bwd": 1}.get(k[0], 2), k[1],
                                 k[2], k[3] != "none", k[4]))
    for k in keys:
        dr, d, n, mask, t = k
        if not any((c,) + k in cell for c in full):
            continue
        g = cell.get((ANCHOR_ENTRY.get(dr), "gemm", d, n, "none", t))
        line = "%-4s %-17s %2d %7s" % (dr, "d%d n%d %s" % (d, n, mask), t,
                                       fmt(g["gflops"] if g else None,
                                           ".1f"))
        for c in cols:
            r = cell.get((c,) + k)
            if not r:
                line += " %19s" % "-"
            elif c == "torch":
                line += " %19s" % ("%.1f (%s)" % (r["gflops"], fmt(
                    r.get("x_gemm"), ".2f")))
            else:
                line += " %19s" % ("%.1f (%s/%s)" % (
                    r["gflops"], fmt(r.get("x_gemm"), ".2f"),
                    fmt(r.get("x_peer"), ".2f")))
        print(line)


def evaluate_goals(rows):
    """Issue 18's targets, per simd / blas entry measured on the full grid."""
    out = []
    by_entry = {}
    for r in rows:
        if r["family"] in ("simd", "blas") and not r.get("error"):
            by_entry.setdefault(r["entry"], []).append(r)
    for entry, rs in by_entry.items():
        if len({r["n"] for r in rs}) < 2:
            continue  # sanity rows only: no goal applies
        fam = rs[0]["family"]
        # Issue 18 judges the best simd target and AVX2 (the path of
        # AVX2-only machines); the 128-bit SSE4 / SSSE3 targets of the full
        # grid cannot reach an AVX2 sgemm's rate and get no goal.
        if fam == "simd" and not entry.split(":")[1].startswith("AVX"):
            continue
        for gfam, gdir, versus, thr in GOALS:
            if gfam != fam:
                continue
            col = "x_gemm" if versus == "gemm" else "x_peer"
            cands = [r for r in rs if r["dir"] == gdir and r.get(col)]
            if not cands:
                out.append({"entry": entry, "goal": "%s >= %.2fx %s" % (
                    gdir, thr, versus), "status": "not measured"})
                continue
            misses = [r for r in cands if r[col] < thr]
            worst = min(cands, key=lambda r: r[col])
            # A miss is unattainable on this machine when the target rate
            # exceeds the FMA peak measured in the same run: thr x reference
            # > rate / frac_peak, i.e. thr x frac_peak > ratio.
            above = [r for r in misses if r.get("frac_peak")
                     and thr * r["frac_peak"] > r[col]]
            # Likewise, above the direction's GEMM rate (the peer goals
            # only): thr x peer > GEMM, i.e. thr x x_gemm > x_peer.
            over_gemm = [r for r in misses if versus == "peer"
                         and r.get("x_gemm") and thr * r["x_gemm"] > r[col]]
            out.append({
                "entry": entry,
                "goal": "%s >= %.2fx %s" % (gdir, thr, versus),
                "status": "met" if not misses else "missed",
                "configs": len(cands), "missed": len(misses),
                "worst": "%.2f at d%d n%d %s T%d" % (
                    worst[col], worst["d"], worst["n"], worst["mask"],
                    worst["threads"]),
                "missed_at": ["d%d n%d %s T%d (%.2f%s)" % (
                    r["d"], r["n"], r["mask"], r["threads"], r[col],
                    ", above peak" if r in above else
                    ", above GEMM" if r in over_gemm else "")
                    for r in misses],
                "above_gemm": len(over_gemm),
                "above_peak": len(above),
                "above_peak_at": ["d%d n%d %s T%d" % (
                    r["d"], r["n"], r["mask"], r["threads"]) for r in above]})
    return out


def evaluate_window_goal(rows, goal=WINDOW_GOAL):
    """Issue 34's window target per simd entry with a window row."""
    out = []
    cell = {(r["entry"], r["n"], r["mask"]): r for r in rows
            if r["family"] == "simd" and r["dir"] == "fwd"
            and r["d"] == goal["d"] and r["threads"] == goal["threads"]}
    text = "window %d at n=%d / causal n=%d >= %.2f" % (
        int(goal["window_mask"].rsplit("window", 1)[1]) + 1, goal["n"],
        goal["ref_n"], goal["threshold"])
    for (entry, n, mask), w in sorted(cell.items()):
        if n != goal["n"] or mask != goal["window_mask"]:
            continue
        ref = cell.get((entry, goal["ref_n"], goal["ref_mask"]))
        if w.get("error") or not ref or ref.get("error"):
            out.append({"entry": entry, "goal": text,
                        "status": "not measured"})
            continue
        ratio = w["gflops"] / ref["gflops"]
        out.append({"entry": entry, "goal": text,
                    "status": "met" if ratio >= goal["threshold"]
                    else "missed",
                    "ratio": ratio, "window_gflops": w["gflops"],
                    "ref_gflops": ref["gflops"],
                    "window_spread": [w["min"], w["max"]],
                    "ref_spread": [ref["min"], ref["max"]]})
    return out


def print_window_goals(goals):
    if not goals:
        return
    print("\nWindow goal (issue 34): GFLOP/s over the visible pairs only, "
          "fwd d128 T1, medians of the same run:")
    for g in goals:
        if g["status"] == "not measured":
            print("  %-16s %s: not measured" % (g["entry"], g["goal"]))
            continue
        print("  %-16s %s: %-6s %.2f (%.1f (%.1f-%.1f) / %.1f (%.1f-%.1f) "
              "GFLOP/s)" % (
                  g["entry"], g["goal"], g["status"].upper(), g["ratio"],
                  g["window_gflops"], g["window_spread"][0],
                  g["window_spread"][1], g["ref_gflops"],
                  g["ref_spread"][0], g["ref_spread"][1]))


def evaluate_rope_goal(rows, goal=ROPE_GOAL):
    """Issue 34's RoPE target per simd entry with a RoPE row: median time
    with RoPE / median time of the same entry's row without it."""
    out = []
    cell = {(r["entry"], r["mask"]): r for r in rows
            if r["family"] == "simd" and r["dir"] == "fwd"
            and r["d"] == goal["d"] and r["n"] == goal["n"]
            and r["threads"] == goal["threads"]}
    text = "rope / no rope at n=%d d=%d <= %.2f" % (
        goal["n"], goal["d"], goal["threshold"])
    for (entry, mask), w in sorted(cell.items()):
        if mask != goal["rope_mask"]:
            continue
        ref = cell.get((entry, goal["ref_mask"]))
        if w.get("error") or not ref or ref.get("error"):
            out.append({"entry": entry, "goal": text,
                        "status": "not measured"})
            continue
        ratio = w["ms"] / ref["ms"]
        out.append({"entry": entry, "goal": text,
                    "status": "met" if ratio <= goal["threshold"]
                    else "missed",
                    "ratio": ratio, "rope_ms": w["ms"], "ref_ms": ref["ms"],
                    "rope_gflops": w["gflops"], "ref_gflops": ref["gflops"],
                    "rope_spread": [w["min"], w["max"]],
                    "ref_spread": [ref["min"], ref["max"]],
                    "samples": [w.get("samples"), ref.get("samples")]})
    return out


def print_rope_goals(goals):
    if not goals:
        return
    print("\nRoPE goal (issue 34): median time with RoPE / without, fwd "
          "d128 n512 T1, same run (GFLOP/s median (min-max), same FLOPs):")
    for g in goals:
        if g["status"] == "not measured":
            print("  %-16s %s: not measured" % (g["entry"], g["goal"]))
            continue
        print("  %-16s %s: %-6s %.3f (%.3f / %.3f ms; %.1f (%.1f-%.1f) / "
              "%.1f (%.1f-%.1f) GFLOP/s)" % (
                  g["entry"], g["goal"], g["status"].upper(), g["ratio"],
                  g["rope_ms"], g["ref_ms"], g["rope_gflops"],
                  g["rope_spread"][0], g["rope_spread"][1], g["ref_gflops"],
                  g["ref_spread"][0], g["ref_spread"][1]))


def print_goals(goals):
    print("\nGoals (issue 18), every measured config. A miss 'above peak' "
          "needs more than the FMA peak of this run, 'above GEMM' more than "
          "its GEMM rate (the target rate is thr x the peer's):")
    for g in goals:
        if g["status"] == "not measured":
            print("  %-16s %-22s not measured" % (g["entry"], g["goal"]))
            continue
        print("  %-16s %-22s %-6s %2d/%2d missed, worst %s%s" % (
            g["entry"], g["goal"], g["status"].upper(), g["missed"],
            g["configs"], g["worst"],
            "".join(", %d %s" % (g[k], label) for k, label in
                    (("above_peak", "above peak"), ("above_gemm", "above GEMM"))
                    if g.get(k))))
        if g["missed"]:
            print("      missed: " + ", ".join(g["missed_at"]))


def collapse_args(fn):
    """'f(int, float) [clone .x]' -> 'f(...) [clone .x]' at every depth."""
    out, depth = [], 0
    for ch in fn.replace("operator()", "operator<call>"):
        if ch == "(":
            if depth == 0:
                out.append("(...")
            depth += 1
        elif ch == ")" and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(ch)
    return "".join(out).replace("operator<call>", "operator()")


def top_functions(path, total, top):
    """Self instruction counts per function from callgrind_annotate."""
    try:
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", "--threshold=100",
             path], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    funcs = []
    for line in text.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\(\s*([\d.]+)%\)\s+(.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        count = int(m.group(1).replace(",", ""))
        # Frames enclosing the counted region (main, libc start) carry the
        # whole total when collection is toggled inside them: not a cost.
        if count >= total:
            continue
        fn = m.group(3)
        fn = re.sub(r"\s+\[[^\]]*\]$", "", fn)  # object file
        fn = re.sub(r"^[^:]*:", "", fn, count=1) if fn.startswith(
            ("???:", "./", "/")) else fn
        funcs.append({"function": collapse_args(fn)[:100], "ir": count,
                      "share": count / total if total else 0})
        if len(funcs) >= top:
            break
    return funcs


def cmd_callgrind(args):
    dumps = []
    for path in sorted(glob.glob(os.path.join(args.dumps, "callgrind.out.*"))):
        label, total = None, None
        prefix = "desc: Trigger: Client Request: "
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    label = line[len(prefix):].strip()
                elif line.startswith("summary:") or line.startswith(
                        "totals:"):
                    total = int(line.split()[1])
                    break
        if label and total is not None:
            dumps.append((label, total, path))
    if not dumps:
        print("callgrind: no dumps with client-request labels in %s"
              % args.dumps)
        return 1
    # Dump files are numbered in call order, i.e. registry order.
    dumps.sort(key=lambda x: int(x[2].rsplit(".", 1)[1]))
    counts = {label: (total, path) for label, total, path in dumps}
    gemm = sum(counts[k][0] for k in ("gemm qk", "gemm pv") if k in counts)
    shape = args.shape or "?"
    rows = []
    for i, (label, total, path) in enumerate(dumps):
        parts = label.split(" ")
        rows.append({"call": parts[0], "entry": parts[1] if len(parts) > 1
                     else "", "mask": parts[2] if len(parts) > 2 else "",
                     "ir": total, "path": path, "order": i})
    order = {"fwd": 0, "bwd": 1, "gemm": 2}
    rows.sort(key=lambda r: (order.get(r["call"], 9), r["mask"], r["order"]))
    print("instruction counts (Ir), one call each, shape %s, 1 thread" % shape)
    print("x_gemm_ir: Ir / (Ir of the bare sgemm QK^T + PV of the shape, "
          "x 2.5 for bwd: the FLOP ratio)")
    hdr = "%-5s %-18s %-7s %14s %10s" % ("call", "entry", "mask", "Ir",
                                          "x_gemm_ir")
    print(hdr)
    print("-" * len(hdr))
    last = None
    for r in rows:
        base = gemm * (2.5 if r["call"] == "bwd" else 1.0)
        r["x_gemm_ir"] = r["ir"] / base if gemm and r["call"] != "gemm" \
            else None
        if last is not None and (r["call"], r["mask"]) != last:
            print()
        last = (r["call"], r["mask"])
        print("%-5s %-18s %-7s %14s %10s" % (
            r["call"], r["entry"], r["mask"], "{:,}".format(r["ir"]),
            fmt(r["x_gemm_ir"], ".2f")))
    # Where the instructions go: the best simd target's f32 entry (first in
    # registry order) and blas:f32, no mask.
    simd_f32 = [r["entry"] for r in sorted(rows, key=lambda r: r["order"])
                if r["entry"].startswith("simd:") and
                r["entry"].endswith(":f32")]
    profiled = set(simd_f32[:1]) | {"blas:f32"}
    for r in rows:
        if r["call"] in ("fwd", "bwd") and r["entry"] in profiled and \
                r["mask"] == "nomask":
            r["top"] = top_functions(r["path"], r["ir"], args.top)
            print("\n%s %s %s: top functions by self Ir" % (
                r["call"], r["entry"], r["mask"]))
            for fn in r["top"]:
                print("  %5.1f%% %12s  %s" % (100 * fn["share"],
                                              "{:,}".format(fn["ir"]),
                                              fn["function"]))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "callgrind.csv"), "w",
              newline="") as f:
        w = csv.DictWriter(f, fieldnames=["call", "entry", "mask", "ir",
                                          "x_gemm_ir"],
                           extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    with open(os.path.join(args.out_dir, "callgrind.json"), "w") as f:
        json.dump({"shape": shape, "rows": rows}, f, indent=1)
    print("\nwrote %s/callgrind.csv and %s/callgrind.json" % (args.out_dir,
                                                             args.out_dir))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--gb", nargs="+", required=True)
    b.add_argument("--torch", nargs="*")
    b.add_argument("--out-dir", required=True)
    b.add_argument("--meta", nargs="*")
    c = sub.add_parser("callgrind")
    c.add_argument("--dumps", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--shape")
    c.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    return cmd_bench(args) if args.cmd == "bench" else cmd_callgrind(args)


if __name__ == "__main__":
    sys.exit(main())
