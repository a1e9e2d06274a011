#include "cli/cost.h"

#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <set>
#include <thread>

#include "cli/pool.h"
#include "reference/reference.h"
#include "validation/judge.h"
#include "validation/metrics.h"
#include "validation/oracle.h"
#include "validation/run.h"
#include "validation/sampled.h"

namespace qknorm::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of the process (every thread) and of the calling thread. The
// rates are CPU seconds per unit of work, which other processes on the
// machine do not inflate; the share of a core the run gets is measured
// apart (core_share) and applied once to the whole estimate.
double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
double process_cpu() { return cpu_seconds(CLOCK_PROCESS_CPUTIME_ID); }
double thread_cpu() { return cpu_seconds(CLOCK_THREAD_CPUTIME_ID); }

// The share of a core each of `cores` busy threads gets now: their CPU time
// over `cores` x the wall time of a short arithmetic loop on each (1 on an
// idle machine; about cores / (load + cores) under load).
double core_share(int cores) {
  std::vector<double> cpu(static_cast<size_t>(cores), 0);
  std::vector<double> sink(static_cast<size_t>(cores), 0);
  auto spin = [&](int t) {
    const double c0 = thread_cpu();
    double x = 1 + t;
    for (int64_t i = 0; i < 40'000'000 && thread_cpu() - c0 < 0.03; ++i) {
      for (int k = 0; k < 64; ++k) x = x * 0.999999 + 1e-7;
    }
    sink[static_cast<size_t>(t)] = x;
    cpu[static_cast<size_t>(t)] = thread_cpu() - c0;
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < cores; ++t) pool.emplace_back(spin, t);
  spin(0);
  for (auto& t : pool) t.join();
  const double wall = seconds_since(t0);
  double sum = 0;
  for (double x : cpu) sum += x;
  volatile double keep = sink[0];
  (void)keep;
  return std::clamp(sum / (static_cast<double>(cores) * wall), 0.05, 1.0);
}

double work_of(const AttentionProblem& p) {
  return static_cast<double>(p.batch) * static_cast<double>(p.heads) *
         static_cast<double>(p.q_len) * static_cast<double>(p.kv_len) *
         static_cast<double>(p.head_dim);
}

// Visible (query, key) pairs of one head, summed over the batch.
double visible_pairs(const AttentionProblem& p) {
  double n = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.q_len; ++i)
      n += static_cast<double>(validation::visible_keys(p, b, i));
  return n;
}

// B H D x visible pairs: what an entry, the naive loops and the pass do.
double visible_work(const AttentionProblem& p) {
  return static_cast<double>(p.heads) * static_cast<double>(p.head_dim) *
         visible_pairs(p);
}

int64_t kv_heads(const AttentionProblem& p) {
  return p.kv_heads > 0 ? p.kv_heads : p.heads;
}

// Input elements of a case: q and dO [B, H, Nq, D], k and v [B, Hk, Nk, D].
double elements(const AttentionProblem& p) {
  return 2.0 * static_cast<double>(p.batch) * static_cast<double>(p.head_dim) *
         (static_cast<double>(p.heads) * static_cast<double>(p.q_len) +
          static_cast<double>(kv_heads(p)) * static_cast<double>(p.kv_len));
}

// The queries of batch b that see key j (a suffix of the query rows).
int64_t queries_seeing(const AttentionProblem& p, int64_t b, int64_t j) {
  if (!p.mask.key_lengths.empty() &&
      j >= p.mask.key_lengths[static_cast<size_t>(b)])
    return 0;
  if (!p.mask.causal) return p.q_len;
  const int64_t first = std::clamp<int64_t>(j - p.kv_len + p.q_len, 0, p.q_len);
  return p.q_len - first;
}

// Heads of a sampled row's sub-case on the other side: a query row reads its
// kv head (every head when the norm spans heads), a key row its group.
double query_row_heads(const AttentionProblem& p) {
  return p.variant == Variant::kQKNorm && p.norm.axis == NormAxis::kAllHeads
             ? static_cast<double>(p.heads)
             : 1.0;
}
double key_row_heads(const AttentionProblem& p) {
  return p.variant == Variant::kQKNorm && p.norm.axis == NormAxis::kAllHeads
             ? static_cast<double>(p.heads)
             : static_cast<double>(p.heads / kv_heads(p));
}

// About how many rows the sample of an axis of N rows holds (the rule of
// validation/sampled_plan.cc's pick_rows: first and last, tile boundaries up to
// half the budget but always the first two, the last full block's and the
// last partial block's, then random rows up to `rows`; fully masked and
// zero rows, a handful at most, are left out).
double expected_rows(int64_t B, int64_t H, int64_t N,
                     const validation::SampleOptions& o) {
  const int64_t total = B * H * N;
  const int64_t ends =
      N == 1 ? std::min<int64_t>(B * H, 8) : (B * H <= 8 ? 2 * B * H : 8);
  std::set<int64_t> blocks = {16, 32, 64, 128, 256};
  for (int64_t b : o.blocks)
    if (b > 1) blocks.insert(b);
  std::set<int64_t> all, must;
  for (int64_t blk : blocks) {
    const int64_t K = (N - 1) / blk;
    if (K <= 4096)  // beyond, `all` exceeds any sensible budget anyway
      for (int64_t k = 1; k <= K; ++k) all.insert({k * blk - 1, k * blk});
    else
      all.insert(-blk);  // a marker: too many
    for (int64_t k : {int64_t{1}, int64_t{2}, K - 1, K})
      if (k >= 1 && k <= K) must.insert({k * blk - 1, k * blk});
    if (N / blk >= 1 && N % blk != 0) must.insert(N / blk * blk);
  }
  const auto half = std::max<int64_t>(o.rows / 2, 1);
  const bool every =
      static_cast<int64_t>(all.size()) <= half &&
      std::none_of(all.begin(), all.end(), [](int64_t x) { return x < 0; });
  const int64_t tiles = every
                            ? static_cast<int64_t>(all.size())
                            : std::max(static_cast<int64_t>(must.size()), half);
  return static_cast<double>(std::min(total, std::max(o.rows, ends + tiles)));
}

// The sampled rows' long-double work: D x the pairs of their sub-cases,
// for a sample of `nq` query rows and `nk` key rows at random positions.
double rows_work(const AttentionProblem& p, double nq, double nk) {
  const double pairs = visible_pairs(p);  // = sum over keys of queries
  const double per_q = pairs / static_cast<double>(p.batch * p.q_len);
  const double per_k = pairs / static_cast<double>(p.batch * p.kv_len);
  return static_cast<double>(p.head_dim) *
         (nq * per_q * query_row_heads(p) + nk * per_k * key_row_heads(p));
}

// The calibration problem: small enough to time in milliseconds, large
// enough that the O(n^2 D) loops dominate the per-call overheads.
AttentionProblem calibration_problem() {
  AttentionProblem p;
  p.batch = 1, p.heads = 2, p.q_len = 96, p.kv_len = 96, p.head_dim = 64;
  p.g = 12.0;
  return p;
}

// The fast entries' second problem: 7.1x the calibration problem's work,
// 2.7x its input elements.
AttentionProblem large_calibration_problem() {
  AttentionProblem p = calibration_problem();
  p.q_len = p.kv_len = 256;
  return p;
}

// The third problem of fast entries in long runs: n = 1024, one head (8x
// the second's work).
AttentionProblem refine_calibration_problem() {
  AttentionProblem p = calibration_problem();
  p.heads = 1;
  p.q_len = p.kv_len = 1024;
  return p;
}
constexpr double kRefine = 5;  // seconds of one entry on the largest case

// Below this a calibration call is timed on the second problem too.
constexpr double kSlowCall = 0.1;

// The sampled oracle's: causal as the long runs are, small enough that its
// sampled rows (about 30 query and 30 key rows, forced by the tile
// boundaries of 16 ... 256) take a few tenths of a second.
AttentionProblem sampled_calibration_problem() {
  AttentionProblem p = calibration_problem();
  p.heads = 1;
  p.q_len = p.kv_len = 256;
  p.mask.causal = true;
  return p;
}

// The pass's calibration problem: long enough that its O(n^2 D) blocks run
// as at long lengths (its 64-row blocks against thousands of keys) and
// outweigh its O(n D) preparation, a fraction of a second of CPU.
AttentionProblem pass_calibration_problem() {
  AttentionProblem p = calibration_problem();
  p.heads = 1;
  p.q_len = p.kv_len = 2048;
  p.head_dim = 128;
  p.mask.causal = true;
  return p;
}

// calibrate_elements' problems: one query row against 1024 keys at D = 64
// (its 131 k input elements outweigh its 65 k multiply-adds per pass 20
// to 1, so the per-element costs dominate the O(n^2 D) ones subtracted),
// and a case of a handful of elements for the fixed cost of a judgement.
AttentionProblem element_calibration_problem() {
  AttentionProblem p = calibration_problem();
  p.heads = 1;
  p.q_len = 1;
  p.kv_len = 1024;
  return p;
}
AttentionProblem step_calibration_problem() {
  AttentionProblem p = calibration_problem();
  p.heads = 1;
  p.q_len = p.kv_len = p.head_dim = 2;
  return p;
}

// CostRates' per-element terms and the fixed cost of a judgement, timed as
// run_suite runs them (best of two: shared cores), with the O(n^2 D) share
// the other rates already count subtracted.
void calibrate_elements(CostRates* r, bool full, bool sampled) {
  const AttentionProblem p = element_calibration_problem();
  const double el = elements(p), vis = visible_work(p), work = work_of(p);
  const validation::AttentionCase c = validation::make_attention_case(
      p, validation::Distribution::kGaussian, 1);
  const validation::AttentionCase narrow =
      validation::round_inputs(c, Precision::kF32);
  const Backend& nb = validation::naive_for(Precision::kF32);
  auto best_of_two = [](auto f) {
    double t = 1e300;
    for (int rep = 0; rep < 2; ++rep) {
      const double t0 = process_cpu();
      f();
      t = std::min(t, process_cpu() - t0);
    }
    return t;
  };
  auto per_elem = [&](double t, double pairs_s) {
    return std::max(0.0, t - pairs_s) / el;
  };
  validation::AttentionResult res;
  r->harness_elem = per_elem(
      best_of_two([&] { res = validation::run_attention(nb, narrow); }),
      r->naive * vis);
  if (full) {
    validation::OracleAttention orc;
    r->oracle_narrow_elem = per_elem(
        best_of_two([&] { orc = validation::oracle_attention(narrow); }),
        r->oracle_narrow * work);
    const validation::AttentionCase wide =
        validation::round_inputs(c, Precision::kF64);
    r->oracle_elem =
        per_elem(best_of_two([&] { (void)validation::oracle_attention(wide); }),
                 r->oracle * work);
    validation::PreparedAttention prep;
    r->naive_elem =
        per_elem(best_of_two([&] {
                   res = validation::run_attention(nb, narrow);
                   prep = validation::prepare_attention(
                       narrow, Precision::kF32, orc, &res, false, nb.name());
                 }),
                 r->naive * vis);
    r->judge_elem =
        per_elem(best_of_two([&] {
                   (void)validation::judge_attention(
                       prep, narrow, Precision::kF32, orc, res, nb.name());
                 }),
                 0);
    // The fixed cost: a tiny case's judgement, the entry's run included.
    const validation::AttentionCase tiny = validation::round_inputs(
        validation::make_attention_case(step_calibration_problem(),
                                        validation::Distribution::kGaussian, 1),
        Precision::kF32);
    const validation::OracleAttention to = validation::oracle_attention(tiny);
    validation::AttentionResult tr = validation::run_attention(nb, tiny);
    const validation::PreparedAttention tp = validation::prepare_attention(
        tiny, Precision::kF32, to, &tr, false, nb.name());
    r->step = best_of_two([&] {
      tr = validation::run_attention(nb, tiny);
      (void)validation::judge_attention(tp, tiny, Precision::kF32, to, tr,
                                        nb.name());
    });
  }
  if (sampled) {
    validation::SampleOptions o;
    o.rows = 64;
    o.seed = 1;
    o.threads = 1;
    validation::SampledOracle so;
    r->sampled_elem =
        per_elem(best_of_two([&] {
                   so = validation::sampled_oracle(narrow, Precision::kF32, o);
                 }),
                 r->pass_setup * el + r->pass * vis);
    r->judge_sampled_elem =
        per_elem(best_of_two([&] {
                   (void)validation::judge_sampled(narrow, so, res, nb.name());
                 }),
                 0);
  }
}

// The full oracle's rate for storage precision s: wide for f64, in double
// for the others (validation/oracle.h), where calibrate measured both.
double oracle_rate(const CostRates& r, Precision s) {
  return s == Precision::kF64 || r.oracle_narrow <= 0 ? r.oracle
                                                      : r.oracle_narrow;
}

// The three most expensive entries, costliest first.
std::vector<std::pair<std::string, double>> top_three(
    const std::vector<const Backend*>& entries,
    const std::vector<double>& per_entry) {
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return per_entry[a] > per_entry[b]; });
  std::vector<std::pair<std::string, double>> top;
  for (size_t k = 0; k < std::min<size_t>(3, order.size()); ++k)
    top.push_back({entries[order[k]]->name(), per_entry[order[k]]});
  return top;
}

int resolve_threads(int threads) {
  return threads > 0
             ? threads
             : std::max(1,
                        static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

double simulate_schedule(const std::vector<SimStep>& plan, int jobs,
                         int cores) {
  const size_t n = plan.size();
  std::vector<char> started(n, 0), done(n, 0);
  std::vector<size_t> phase(n, 0);
  std::vector<double> left(n, 0);
  std::vector<size_t> running;
  // Skips finished (and empty) phases; true when step i has none left.
  auto settle = [&](size_t i) {
    while (phase[i] < plan[i].phases.size() && left[i] <= 1e-12)
      if (++phase[i] < plan[i].phases.size())
        left[i] = plan[i].phases[phase[i]].work;
    return phase[i] >= plan[i].phases.size();
  };
  double t = 0;
  size_t finished = 0;
  while (finished < n) {
    for (size_t i = 0; i < n && static_cast<int>(running.size()) < jobs; ++i) {
      if (started[i] || !std::all_of(plan[i].deps.begin(), plan[i].deps.end(),
                                     [&](size_t d) { return done[d] != 0; }))
        continue;
      started[i] = 1;
      left[i] = plan[i].phases.empty() ? 0 : plan[i].phases[0].work;
      if (settle(i)) {
        done[i] = 1, ++finished;
        i = static_cast<size_t>(-1);  // a dependency may have cleared: rescan
        continue;
      }
      running.push_back(i);
    }
    if (running.empty()) break;  // unreachable with a valid plan
    double demand = 0;
    for (size_t i : running) demand += plan[i].phases[phase[i]].threads;
    const double share = std::min(1.0, cores / demand);
    double dt = 1e300;
    for (size_t i : running)
      dt = std::min(dt, left[i] / (plan[i].phases[phase[i]].threads * share));
    t += dt;
    std::vector<size_t> still;
    for (size_t i : running) {
      left[i] -= dt * plan[i].phases[phase[i]].threads * share;
      if (settle(i))
        done[i] = 1, ++finished;
      else
        still.push_back(i);
    }
    running.swap(still);
  }
  return t;
}

double largest_work(const Suite& suite) {
  double w = 0;
  for (const AttentionSpec& s : suite.attention)
    w = std::max(w, visible_work(s.problem));
  return w;
}

void calibrate_sampled(CostRates* r, const ExecConfig& exec) {
  if (r->sampled) return;
  const auto t_start = Clock::now();
  const AttentionProblem p = sampled_calibration_problem();
  const validation::AttentionCase c0 = validation::make_attention_case(
      p, validation::Distribution::kGaussian, 1);
  validation::SampleOptions o;
  o.rows = 16;
  o.seed = 1;
  o.threads = resolve_threads(exec.threads);
  // The sampled rows' sub-case oracles are wide for f64 storage and in
  // double for the others (validation/oracle.h): both timed.
  const validation::SampledOracle so = validation::sampled_oracle(
      validation::round_inputs(c0, Precision::kF64), Precision::kF64, o);
  const validation::SampledOracle narrow = validation::sampled_oracle(
      validation::round_inputs(c0, Precision::kF32), Precision::kF32, o);
  // The pass, run on its own calibration case with the run's threads: the
  // CPU seconds of its blocks per pair x D, and of its preparation per input
  // element. (A copy of its loop, timed instead until this change, ran
  // 1.7x slower than the pass's register-blocked kernels: 12 against 7.0
  // CPU seconds per precision at 1x4x8192x128 causal.)
  const AttentionProblem pp = pass_calibration_problem();
  const validation::PassCost pc = validation::pass_cost(
      validation::round_inputs(validation::make_attention_case(
                                   pp, validation::Distribution::kGaussian, 1),
                               Precision::kF32),
      o.threads);
  r->pass = pc.block_cpu_seconds / visible_work(pp);
  r->pass_setup = pc.prep_cpu_seconds / elements(pp);
  double w = 0;
  for (const validation::SampledRow& row : so.query_rows)
    w += static_cast<double>(validation::visible_keys(p, row.b, row.n)) *
         query_row_heads(p);
  for (const validation::SampledRow& row : so.key_rows)
    w +=
        static_cast<double>(queries_seeing(p, row.b, row.n)) * key_row_heads(p);
  r->rows =
      so.rows_cpu_seconds / std::max(1.0, w * static_cast<double>(p.head_dim));
  r->rows_narrow = narrow.rows_cpu_seconds /
                   std::max(1.0, w * static_cast<double>(p.head_dim));
  r->sampled = true;
  r->seconds += seconds_since(t_start);
}

void calibrate_probabilities(CostRates* r) {
  if (r->probs > 0) return;
  const auto t_start = Clock::now();
  const AttentionProblem p = calibration_problem();
  const validation::AttentionCase c = validation::make_attention_case(
      p, validation::Distribution::kGaussian, 1);
  const std::vector<long double> q(c.q.begin(), c.q.end()),
      k(c.k.begin(), c.k.end());
  std::vector<long double> probs(
      static_cast<size_t>(p.batch * p.heads * p.q_len * p.kv_len));
  double best = 1e300;
  for (int rep = 0; rep < 2; ++rep) {  // shared cores: the best
    const auto t0 = Clock::now();
    reference::attention_probabilities<long double>(p, q.data(), k.data(),
                                                    probs.data());
    best = std::min(best, seconds_since(t0));
  }
  r->probs = std::max(best, 1e-9) / work_of(p);
  r->seconds += seconds_since(t_start);
}

CostRates calibrate(const std::vector<const Backend*>& entries,
                    const ExecConfig& run_exec, bool sampled,
                    double largest_work, int jobs, bool full_oracle) {
  // The entries are timed on the threads the pool gives them (run_suite's
  // pooled_exec), the sampled oracle on the run's own.
  const ExecConfig exec = pooled_exec(run_exec, jobs);
  const auto t_start = Clock::now();
  CostRates r;
  r.entry.assign(entries.size(), 0);
  const AttentionProblem cp = calibration_problem();
  const double cw = work_of(cp);
  double t0 = process_cpu();
  const validation::AttentionCase cal =
      validation::round_inputs(validation::make_attention_case(
                                   cp, validation::Distribution::kGaussian, 1),
                               Precision::kF64);
  r.setup = (process_cpu() - t0) / elements(cp);
  // The full oracle only when it is used (it is the slow part): wide for
  // f64 storage, in double for the others (validation/oracle.h).
  if (!sampled || full_oracle) {
    t0 = process_cpu();
    (void)validation::oracle_attention(cal);
    r.oracle = (process_cpu() - t0) / cw;
    const validation::AttentionCase narrow =
        validation::round_inputs(cal, Precision::kF32);
    t0 = process_cpu();
    (void)validation::oracle_attention(narrow);
    r.oracle_narrow = (process_cpu() - t0) / cw;
  }
  t0 = process_cpu();
  (void)validation::run_attention(validation::naive_for(Precision::kF64), cal);
  r.naive = (process_cpu() - t0) / cw;
  // Fast entries again on a problem 7.1x the work (drawn when needed).
  const AttentionProblem bp = large_calibration_problem();
  const double bw = work_of(bp), ce = elements(cp), be = elements(bp);
  validation::AttentionCase big, huge;
  const AttentionProblem hp = refine_calibration_problem();
  r.entry_elem.assign(entries.size(), 0);
  auto best_of = [&](int reps, const Backend& b,
                     const validation::AttentionCase& rc) {
    double t = 1e300;
    for (int rep = 0; rep < reps; ++rep) {  // shared cores: the best
      t0 = process_cpu();
      (void)validation::run_attention(b, rc, exec);
      t = std::min(t, process_cpu() - t0);
    }
    return t;
  };
  for (size_t ei = 0; ei < entries.size(); ++ei) {
    const Backend* b = entries[ei];
    r.entry[ei] = r.naive;  // an entry that cannot run the calibration
    if (!b->available()) continue;
    try {
      const validation::AttentionCase rc =
          validation::round_inputs(cal, b->precision());
      (void)validation::run_attention(*b, rc, exec);  // warm-up
      const double t1 = best_of(2, *b, rc);
      r.entry[ei] = t1 / cw;
      if (t1 >= kSlowCall) continue;
      if (big.q.empty())
        big = validation::make_attention_case(
            bp, validation::Distribution::kGaussian, 1);
      const double t2 =
          best_of(2, *b, validation::round_inputs(big, b->precision()));
      // t = elem * elements + rate * work through two points (a fast
      // entry's conversions and normalization, O(n D), outweigh its
      // O(n^2 D) part at these sizes: simd f16 at n = 96 / 256 / 1024,
      // 18 / 50 / 240 ms, fits elem = 3.6e-7 s, rate = 3.8e-10 s); if the
      // noise makes either negative, the larger problem's average rate.
      auto fit = [&](double ea, double wa, double ta, double eb, double wb,
                     double tb) {
        const double det = ea * wb - eb * wa;
        const double rate = (ea * tb - eb * ta) / det;
        const double elem = (ta * wb - tb * wa) / det;
        r.entry[ei] = rate > 0 && elem >= 0 ? rate : tb / wb;
        r.entry_elem[ei] = rate > 0 && elem >= 0 ? elem : 0;
      };
      fit(ce, cw, t1, be, bw, t2);
      // Where the run's largest case would take this entry more than
      // kRefine seconds, the rate from n = 256 and 1024 instead: at
      // n = 256 the kernels are not yet at their long-row speed (the fit
      // through 96 and 256 put n = 32768 at 5x its time).
      if (r.entry[ei] * largest_work > kRefine && t2 < kSlowCall) {
        if (huge.q.empty())
          huge = validation::make_attention_case(
              hp, validation::Distribution::kGaussian, 1);
        const double t3 =
            best_of(2, *b, validation::round_inputs(huge, b->precision()));
        fit(be, bw, t2, elements(hp), work_of(hp), t3);
      }
    } catch (const std::exception&) {
    }
  }
  r.share = core_share(resolve_threads(0));
  r.seconds = seconds_since(t_start);
  if (sampled) calibrate_sampled(&r, run_exec);
  // After the sampled rates: the sampled oracle's element term is what its
  // pass's preparation (pass_setup) and blocks leave.
  const auto t_elem = Clock::now();
  calibrate_elements(&r, !sampled || full_oracle, sampled);
  r.seconds += seconds_since(t_elem);
  return r;
}

CostEstimate estimate(const CostRates& rates,
                      const std::vector<const Backend*>& entries,
                      const Suite& suite, bool time_forward,
                      int64_t sample_rows, int threads, int jobs) {
  CostEstimate c;
  const int cores = resolve_threads(0), workers = resolve_jobs(jobs),
            oracle_threads = resolve_threads(threads),
            // run_suite's pooled_exec: one thread per entry when jobs > 1.
      entry_threads = workers > 1 ? 1 : oracle_threads;
  c.jobs = workers;
  c.cores = cores;
  // Steps are reported (and fed to the progress line) in seconds of wall
  // time were each run alone at this core share: CPU seconds over the
  // threads it runs on and the share.
  const double share = rates.share > 0 ? rates.share : 1;
  c.share = share;
  std::vector<SimStep> plan;
  c.sampled = sample_rows > 0;
  c.sample_rows = sample_rows;
  c.calibration_s = rates.seconds;
  c.attention_cases = static_cast<int>(suite.attention.size());
  c.entries = static_cast<int>(entries.size());
  c.steps.timing.assign(entries.size(), 0);
  std::vector<double> per_entry(entries.size(), 0);
  for (size_t ci = 0; ci < suite.attention.size(); ++ci) {
    const AttentionProblem& p = suite.attention[ci].problem;
    const double work = work_of(p), vis = visible_work(p);
    // This case's mode: the run's, or its own (AttentionSpec::sample_rows).
    const int64_t case_rows = suite.attention[ci].sample_rows > 0
                                  ? suite.attention[ci].sample_rows
                                  : sample_rows;
    const bool sampled = case_rows > 0;
    c.work += work;
    c.visible += vis;
    if (!sampled)
      c.oracle_bytes =
          std::max(c.oracle_bytes, 2.0 * sizeof(long double) * work /
                                       static_cast<double>(p.head_dim));
    std::array<double, 4> oracle{}, naive{};
    std::vector<double> entry(entries.size(), 0), entry_cpu(entry.size(), 0);
    // Which precisions get an oracle (some entry runs the case) and a naive
    // baseline (some entry outside the reference family, full mode).
    std::array<bool, 4> prec{}, with_naive{};
    for (size_t ei = 0; ei < entries.size(); ++ei) {
      const Backend* b = entries[ei];
      if (!b->available() || !b->supports(p)) continue;
      const auto pi = static_cast<size_t>(b->precision());
      prec[pi] = true;
      if (b->family() != "reference" && !sampled) with_naive[pi] = true;
      entry_cpu[ei] =
          rates.entry_elem[ei] * elements(p) + rates.entry[ei] * vis;
      // Sampled: the verdict's O(n D) properties on every row, about as
      // much as drawing the inputs.
      if (sampled) entry_cpu[ei] += rates.setup * elements(p);
      // Judging the fields, and the buffers of an entry whose fit has no
      // element term; the fixed cost of a judgement.
      entry_cpu[ei] +=
          ((sampled ? rates.judge_sampled_elem : rates.judge_elem) +
           (rates.entry_elem[ei] > 0 ? 0 : rates.harness_elem)) *
              elements(p) +
          rates.step;
      entry[ei] = entry_cpu[ei] / (entry_threads * share);
    }
    double pass = 0, rows_w = 0, flops = 0, prep = 0;
    if (sampled) {
      const validation::SampleOptions so =
          sample_options(entries, p, case_rows, 1, threads);
      pass = rates.pass * vis;                // CPU seconds, on oracle_threads
      prep = rates.pass_setup * elements(p);  // on one thread
      flops = 6 * vis;  // two D-term dots and O's D-term update per pair
      rows_w = rows_work(p, expected_rows(p.batch, p.heads, p.q_len, so),
                         expected_rows(p.batch, kv_heads(p), p.kv_len, so));
    }
    double case_s = 0;
    std::array<std::vector<SimPhase>, 4> oracle_phases;
    for (size_t pi = 0; pi < 4; ++pi) {
      // f64 storage keeps the wide oracle; the others' run in double.
      const bool wide = static_cast<Precision>(pi) == Precision::kF64;
      const double rows =
          rows_w *
          (wide || rates.rows_narrow <= 0 ? rates.rows : rates.rows_narrow);
      const double full = oracle_rate(rates, static_cast<Precision>(pi));
      const double full_elem = wide || rates.oracle_narrow_elem <= 0
                                   ? rates.oracle_elem
                                   : rates.oracle_narrow_elem;
      if (prec[pi]) {
        // One thread draws and rounds the inputs and prepares the pass (or
        // runs the full oracle); the sampled pass and rows run on
        // oracle_threads.
        const double serial = rates.setup * elements(p) +
                              (sampled ? prep + rates.sampled_elem * elements(p)
                                       : full * work + full_elem * elements(p));
        const double par = sampled ? pass + rows : 0;
        oracle_phases[pi] = {{serial, 1}, {par, oracle_threads}};
        oracle[pi] = (serial + par / oracle_threads) / share;
        c.oracle_s += oracle[pi];
        if (sampled) {
          c.pass_s += (prep + pass / oracle_threads) / share;
          c.rows_s += rows / oracle_threads / share;
          c.pass_flops += flops;
        }
      }
      if (with_naive[pi]) {
        naive[pi] =
            (rates.naive * vis + rates.naive_elem * elements(p)) / share;
        c.naive_s += naive[pi];
      }
      case_s += oracle[pi] + naive[pi];
    }
    for (size_t ei = 0; ei < entries.size(); ++ei) {
      c.entries_s += entry[ei];
      per_entry[ei] += entry[ei];
      case_s += entry[ei];
    }
    // The case's steps in run_suite's plan order (entry_order): per entry,
    // its precision's oracle (and naive baseline) first if not yet planned.
    std::array<size_t, 4> oracle_at, naive_at;
    oracle_at.fill(SIZE_MAX);
    naive_at.fill(SIZE_MAX);
    for (const size_t ei : entry_order(&entry, entries.size(), workers)) {
      const Backend* b = entries[ei];
      if (!b->available() || !b->supports(p)) continue;
      const auto pi = static_cast<size_t>(b->precision());
      SimStep e;
      if (oracle_at[pi] == SIZE_MAX) {
        oracle_at[pi] = plan.size();
        plan.push_back({oracle_phases[pi], {}});
      }
      e.deps.push_back(oracle_at[pi]);
      if (with_naive[pi]) {
        if (naive_at[pi] == SIZE_MAX) {
          naive_at[pi] = plan.size();
          plan.push_back({{{naive[pi] * share, 1}}, {oracle_at[pi]}});
        }
        e.deps.push_back(naive_at[pi]);
      }
      e.phases = {{entry_cpu[ei], entry_threads}};
      plan.push_back(std::move(e));
    }
    c.steps.oracle.push_back(oracle);
    c.steps.naive.push_back(naive);
    c.steps.entry.push_back(std::move(entry));
    c.case_s.push_back(case_s);
  }
  if (time_forward && !suite.attention.empty()) {
    for (size_t ei = 0; ei < entries.size(); ++ei) {
      if (!entries[ei]->available()) continue;
      // forward_gflops (suite.h): a warm-up, then kTimingMinReps forward
      // calls and kTimingMinSeconds, or one call after a long warm-up; a
      // forward call is about a third of a forward-and-backward one.
      const double call = (rates.entry_elem[ei] * elements(suite.timing) +
                           rates.entry[ei] * work_of(suite.timing)) /
                          share;
      const double fwd = call / 3;
      const int calls = 1 + (fwd >= kTimingLongCall ? 1 : kTimingMinReps);
      const double t = std::max(kTimingMinSeconds, calls * fwd) + 0.01;
      c.steps.timing[ei] = t;
      c.timing_s += t;
      per_entry[ei] += t;
    }
  }
  c.top_entries = top_three(entries, per_entry);
  // The timing runs alone after the pool (run_suite).
  c.wall_s = simulate_schedule(plan, workers, cores) / share + c.timing_s;
  return c;
}

CostEstimate estimate_sweep(const CostRates& rates,
                            const std::vector<const Backend*>& entries,
                            const std::vector<AttentionProblem>& points,
                            bool sdpa) {
  CostEstimate c;
  c.calibration_s = rates.seconds;
  c.entries = static_cast<int>(entries.size());
  std::vector<double> per_entry(entries.size(), 0);
  // A forward call, then a forward-and-backward one: a forward is about a
  // third of the latter (as the timing's estimate takes it).
  constexpr double kForwardThenBoth = 4.0 / 3;
  std::array<bool, 4> prec{};
  for (const Backend* b : entries)
    prec[static_cast<size_t>(b->precision())] = true;
  const int precisions =
      static_cast<int>(std::count(prec.begin(), prec.end(), true));
  for (const AttentionProblem& p : points) {
    const double work = work_of(p), vis = visible_work(p);
    const int variants = sdpa ? 2 : 1;
    c.attention_cases += variants;
    c.work += variants * work;
    c.visible += variants * vis;
    double case_s = variants * rates.probs * work;
    c.oracle_s += case_s;
    double oracle = 0;  // one per precision: wide for f64, else double
    for (size_t pi = 0; pi < 4; ++pi)
      if (prec[pi])
        oracle += rates.setup * elements(p) +
                  oracle_rate(rates, static_cast<Precision>(pi)) * work;
    c.oracle_s += variants * oracle;
    case_s += variants * oracle;
    for (size_t ei = 0; ei < entries.size(); ++ei) {
      if (!entries[ei]->available()) continue;
      const double e = kForwardThenBoth * (rates.entry_elem[ei] * elements(p) +
                                           rates.entry[ei] * vis);
      c.entries_s += e;
      per_entry[ei] += e;
      case_s += e;
    }
    if (sdpa) {
      const double n = precisions * kForwardThenBoth * rates.naive * vis;
      c.naive_s += n;
      case_s += n;
    }
    c.case_s.push_back(case_s);
  }
  c.top_entries = top_three(entries, per_entry);
  return c;
}

CostEstimate estimate_cost(const std::vector<const Backend*>& entries,
                           const Suite& suite, const ExecConfig& exec,
                           bool time_forward, int64_t sample_rows) {
  if (suite.attention.empty() || entries.empty()) {
    CostEstimate c;
    c.attention_cases = static_cast<int>(suite.attention.size());
    c.entries = static_cast<int>(entries.size());
    return c;
  }
  const CostRates r =
      calibrate(entries, exec, sample_rows > 0, largest_work(suite));
  return estimate(r, entries, suite, time_forward, sample_rows, exec.threads,
                  1);
}

double physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0
             ? static_cast<double>(pages) * static_cast<double>(size)
             : 0;
}

std::string duration_text(double s) {
  return s < 120    ? fmt::format("{:.1f} s", s)
         : s < 7200 ? fmt::format("{:.1f} min", s / 60)
                    : fmt::format("{:.1f} h", s / 3600);
}

std::string top_entries_text(const CostEstimate& c) {
  std::string out;
  for (const auto& [entry, s] : c.top_entries)
    out += (out.empty() ? "" : ", ") + entry + " ~" + duration_text(s);
  return out;
}

std::string describe(const CostEstimate& c) {
  const auto t = duration_text;
  const std::string work =
      fmt::format("sum of B H Nq Nk D {:.3g}, visible pairs x B H D {:.3g}",
                  c.work, c.visible);
  const std::string oracle =
      c.sampled
          ? fmt::format(
                "sampled oracle (--sample {}) ~{} (pass {:.3g} flops ~{}, "
                "sampled rows ~{}), no naive baselines",
                c.sample_rows, t(c.oracle_s), c.pass_flops, t(c.pass_s),
                t(c.rows_s))
          : fmt::format("oracle ~{}, naive baselines ~{}", t(c.oracle_s),
                        t(c.naive_s));
  return fmt::format(
      "estimated work: {} attention cases x {} entries ({}): {}, entries ~{}, "
      "timing ~{}; total ~{}{} (rates measured on this machine in {:.2f} s)",
      c.attention_cases, c.entries, work, oracle, t(c.entries_s), t(c.timing_s),
      t(c.total()),
      c.wall_s > 0
          ? fmt::format(
                " on {} job{} and {} core{}{} (the steps add up to ~{})",
                c.jobs, c.jobs == 1 ? "" : "s", c.cores,
                c.cores == 1 ? "" : "s",
                c.share < 0.95 ? fmt::format(", {:.2f} of each core "
                                             "free of other load",
                                             c.share)
                               : "",
                t(c.steps_total()))
          : "",
      c.calibration_s);
}

}  // namespace qknorm::cli
