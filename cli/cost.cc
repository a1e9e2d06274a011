#include "cli/cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>

#include "validation/harness.h"

namespace qknorm::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double work_of(const AttentionProblem& p) {
  return static_cast<double>(p.batch) * static_cast<double>(p.heads) *
         static_cast<double>(p.q_len) * static_cast<double>(p.kv_len) *
         static_cast<double>(p.head_dim);
}

// The calibration problem: small enough to time in milliseconds, large
// enough that the O(n^2 D) loops dominate the per-call overheads.
AttentionProblem calibration_problem() {
  AttentionProblem p;
  p.batch = 1, p.heads = 2, p.q_len = 96, p.kv_len = 96, p.head_dim = 64;
  p.g = 12.0;
  return p;
}

}  // namespace

CostEstimate estimate_cost(const std::vector<const Backend*>& entries,
                           const Suite& suite, const ExecConfig& exec,
                           bool time_forward) {
  const auto t_start = Clock::now();
  CostEstimate c;
  c.attention_cases = static_cast<int>(suite.attention.size());
  c.entries = static_cast<int>(entries.size());
  for (const AttentionSpec& s : suite.attention) c.work += work_of(s.problem);
  if (suite.attention.empty() || entries.empty()) return c;
  const AttentionProblem cp = calibration_problem();
  const double cw = work_of(cp);
  const validation::AttentionCase cal =
      validation::round_inputs(validation::make_attention_case(
                                   cp, validation::Distribution::kGaussian, 1),
                               Precision::kF64);
  auto t0 = Clock::now();
  (void)validation::oracle_attention(cal);
  const double oracle_rate = seconds_since(t0) / cw;
  t0 = Clock::now();
  (void)validation::run_attention(validation::naive_for(Precision::kF64), cal);
  const double naive_rate = seconds_since(t0) / cw;
  // Per (case, precision): one oracle, and one naive run if an entry other
  // than the reference family has that precision.
  std::array<bool, 4> prec{}, naive{};
  for (const Backend* b : entries) {
    if (!b->available()) continue;
    prec[static_cast<size_t>(b->precision())] = true;
    if (b->family() != "reference")
      naive[static_cast<size_t>(b->precision())] = true;
  }
  double n_prec = 0, n_naive = 0;
  for (size_t i = 0; i < 4; ++i) n_prec += prec[i], n_naive += naive[i];
  c.oracle_s = oracle_rate * c.work * n_prec;
  c.naive_s = naive_rate * c.work * n_naive;
  for (const Backend* b : entries) {
    if (!b->available()) continue;
    double rate = naive_rate;  // an entry that cannot run the calibration
    try {
      const validation::AttentionCase rc =
          validation::round_inputs(cal, b->precision());
      (void)validation::run_attention(*b, rc, exec);  // warm-up
      t0 = Clock::now();
      (void)validation::run_attention(*b, rc, exec);
      rate = seconds_since(t0) / cw;
    } catch (const std::exception&) {
    }
    c.entries_s += rate * c.work;
    // forward_gflops: at least 3 forward calls and 0.05 s (about a third of
    // a forward-and-backward call each), plus a warm-up.
    if (time_forward)
      c.timing_s += std::max(0.05, 4 * rate * work_of(suite.timing) / 3) + 0.01;
  }
  c.calibration_s = seconds_since(t_start);
  return c;
}

std::string describe(const CostEstimate& c) {
  auto t = [](double s) {
    return s < 120    ? fmt::format("{:.1f} s", s)
           : s < 7200 ? fmt::format("{:.1f} min", s / 60)
                      : fmt::format("{:.1f} h", s / 3600);
  };
  return fmt::format(
      "estimated work: {} attention cases x {} entries (sum of B H Nq Nk D "
      "{:.3g}): oracle ~{}, naive baselines ~{}, entries ~{}, timing ~{}; "
      "total ~{} (rates measured on this machine in {:.2f} s)",
      c.attention_cases, c.entries, c.work, t(c.oracle_s), t(c.naive_s),
      t(c.entries_s), t(c.timing_s), t(c.total()), c.calibration_s);
}

}  // namespace qknorm::cli
