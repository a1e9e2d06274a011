#!/usr/bin/env python3
"""Unit test of report.py's goal evaluation (issue 18's targets) on made-up
rows: which configs miss, which misses are marked above the FMA peak or
above the GEMM rate, and which entries get no goal. Asserts nothing about
any measured speed. Run: python3 bench/report_test.py"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def row(entry, dr, n, x_gemm, x_peer, frac_peak, mask="none"):
    return {"entry": entry, "family": entry.split(":")[0], "dir": dr,
            "d": 128, "n": n, "mask": mask, "threads": 1,
            "x_gemm": x_gemm, "x_peer": x_peer, "frac_peak": frac_peak}


def goal(goals, entry, text):
    hits = [g for g in goals if g["entry"] == entry and g["goal"] == text]
    assert len(hits) == 1, (entry, text, goals)
    return hits[0]


class Goals(unittest.TestCase):
    def setUp(self):
        self.goals = report.evaluate_goals([
            # n128: 0.84x GEMM misses 0.85; peer 1.15x with the kernel at 58%
            # of the peak: 2x the peer is 2 x 0.58 / 1.15 = 1.01 of the peak.
            row("simd:AVX2:f32", "fwd", 128, 0.84, 1.15, 0.58),
            # n512: meets 0.85x GEMM; peer 1.6x at 30% of the peak: 2x the
            # peer is 0.38 of the peak but 2 x 0.86 / 1.6 = 1.08x the GEMM.
            row("simd:AVX2:f32", "fwd", 512, 0.86, 1.6, 0.30),
            row("simd:AVX2:f32", "bwd", 128, 0.75, 2.0, 0.5),
            row("simd:AVX2:f32", "bwd", 512, 0.74, 2.5, 0.5, "causal"),
            row("simd:SSE4:f32", "fwd", 128, 0.3, 0.5, 0.2),
            row("simd:SSE4:f32", "fwd", 512, 0.3, 0.5, 0.2),
            row("blas:f32", "fwd", 128, 0.80, 1.0, 0.5),
            row("blas:f32", "fwd", 512, 0.79, 1.0, 0.5),
        ])

    def test_gemm_targets(self):
        g = goal(self.goals, "simd:AVX2:f32", "fwd >= 0.85x gemm")
        self.assertEqual((g["status"], g["missed"], g["configs"]),
                         ("missed", 1, 2))
        self.assertEqual(g["missed_at"], ["d128 n128 none T1 (0.84)"])
        g = goal(self.goals, "simd:AVX2:f32", "bwd >= 0.75x gemm")
        self.assertEqual(g["missed_at"], ["d128 n512 causal T1 (0.74)"])
        g = goal(self.goals, "blas:f32", "fwd >= 0.80x gemm")
        self.assertEqual(g["missed"], 1)

    def test_peer_target_marks_unattainable_misses(self):
        g = goal(self.goals, "simd:AVX2:f32", "fwd >= 2.00x peer")
        self.assertEqual(g["missed_at"], [
            "d128 n128 none T1 (1.15, above peak)",
            "d128 n512 none T1 (1.60, above GEMM)"])
        self.assertEqual((g["above_peak"], g["above_gemm"]), (1, 2))
        g = goal(self.goals, "simd:AVX2:f32", "bwd >= 2.00x peer")
        self.assertEqual((g["status"], g["missed"]), ("met", 0))

    def test_128_bit_targets_get_no_goal(self):
        self.assertFalse([g for g in self.goals
                          if g["entry"] == "simd:SSE4:f32"])


class WindowGoal(unittest.TestCase):
    def rate(self, entry, n, mask, gflops):
        r = row(entry, "fwd", n, None, None, None, mask)
        r.update({"gflops": gflops, "min": gflops, "max": gflops})
        return r

    def test_ratio_of_the_two_rows(self):
        goals = report.evaluate_window_goal([
            self.rate("simd:AVX2:f32", 4096, "causal+window127", 20.0),
            self.rate("simd:AVX2:f32", 512, "causal", 25.0),
            self.rate("simd:AVX3:f32", 4096, "causal+window127", 10.0),
            self.rate("simd:AVX3:f32", 512, "causal", 25.0),
            self.rate("simd:SSE4:f32", 4096, "causal+window127", 10.0),
        ])
        by = {g["entry"]: g for g in goals}
        self.assertEqual(by["simd:AVX2:f32"]["goal"],
                         "window 128 at n=4096 / causal n=512 >= 0.67")
        self.assertEqual(by["simd:AVX2:f32"]["status"], "met")
        self.assertAlmostEqual(by["simd:AVX2:f32"]["ratio"], 0.8)
        self.assertEqual(by["simd:AVX3:f32"]["status"], "missed")
        self.assertEqual(by["simd:SSE4:f32"]["status"], "not measured")


class RopeGoal(unittest.TestCase):
    def timed(self, entry, mask, ms, n=512):
        r = row(entry, "fwd", n, None, None, None, mask)
        r.update({"ms": ms, "gflops": 100.0 / ms, "min": 90.0 / ms,
                  "max": 110.0 / ms, "samples": 6})
        return r

    def test_ratio_of_the_two_times(self):
        goals = report.evaluate_rope_goal([
            self.timed("simd:AVX2:f32", "none+rope128", 10.5),
            self.timed("simd:AVX2:f32", "none", 10.0),
            self.timed("simd:AVX3:f32", "none+rope128", 12.0),
            self.timed("simd:AVX3:f32", "none", 10.0),
            self.timed("simd:SSE4:f32", "none+rope128", 10.0),
            # Another n: neither the goal's row nor its reference.
            self.timed("simd:SSE4:f32", "none", 10.0, n=128),
            self.timed("simd:AVX3:f32+qwen3@H8kv8", "none+rope128", 11.0),
            self.timed("simd:AVX3:f32+qwen3@H8kv8", "none", 10.0),
        ])
        by = {g["entry"]: g for g in goals}
        self.assertEqual(len(goals), 4)
        self.assertEqual(by["simd:AVX2:f32"]["goal"],
                         "rope / no rope at n=512 d=128 <= 1.10")
        self.assertEqual(by["simd:AVX2:f32"]["status"], "met")
        self.assertAlmostEqual(by["simd:AVX2:f32"]["ratio"], 1.05)
        self.assertEqual(by["simd:AVX3:f32"]["status"], "missed")
        self.assertAlmostEqual(by["simd:AVX3:f32"]["ratio"], 1.2)
        self.assertEqual(by["simd:SSE4:f32"]["status"], "not measured")
        # 1.10 itself meets the goal ("at most").
        self.assertEqual(by["simd:AVX3:f32+qwen3@H8kv8"]["status"], "met")


if __name__ == "__main__":
    unittest.main()
