#include "validation/sampled.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "qknorm/error.h"
#include "validation/operands.h"
#include "validation/rng.h"
#include "validation/rule.h"
#include "validation/rule_terms.h"
#include "validation/sampled_internal.h"

namespace qknorm::validation {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs f(i, t) for i = 0 .. n-1 on `threads` threads, t the thread's index
// (0 .. threads - 1).
void parallel_for(int64_t n, int threads,
                  const std::function<void(int64_t, int)>& f) {
  std::atomic<int64_t> next{0};
  auto work = [&](int t) {
    for (int64_t i = next++; i < n; i = next++) f(i, t);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& t : pool) t.join();
}

// ---------------------------------------------------------------------------
// Sub-cases.

// The heads of one side a sub-case keeps.
struct Heads {
  int64_t first = 0, count = 1;
};

// Copies rows [n0, n0 + n) of heads hs of batch b from a dense [B, Hx, N, D]
// tensor into *out (its memory kept).
void slice(const std::vector<double>& x, int64_t Hx, int64_t N, int64_t D,
           int64_t b, Heads hs, int64_t n0, int64_t n,
           std::vector<double>* out) {
  out->clear();
  out->reserve(static_cast<size_t>(hs.count * n * D));
  for (int64_t h = hs.first; h < hs.first + hs.count; ++h) {
    const auto* src = x.data() + ((b * Hx + h) * N + n0) * D;
    out->insert(out->end(), src, src + n * D);
  }
}

// A weight or bias of the side restricted to heads hs ([heads_x, D] shaped
// parameters; [D] and across-heads ones are kept whole).
std::vector<double> slice_param(const AttentionProblem& p,
                                const std::vector<double>& w, Heads hs) {
  if (w.empty() || p.norm.weight != ParamShape::kHeadDim ||
      p.norm.axis == NormAxis::kAllHeads)
    return w;
  const auto D = static_cast<size_t>(p.head_dim);
  return std::vector<double>(
      w.begin() + static_cast<ptrdiff_t>(hs.first * p.head_dim),
      w.begin() + static_cast<ptrdiff_t>((hs.first + hs.count) * p.head_dim));
  (void)D;
}

// The sub-case of queries [i0, i0 + nq) of heads qh and keys [j0, j0 + nk)
// of kv heads kh of batch b, without a mask (both ranges are what the rows
// see), or everything masked: nk = 0 (a fully masked query row i0, with
// every key padded away) or nq = 0 (key j0 that no query sees, with every
// query): the full oracle's subnormal counts cover every pair, masked or
// not, and so do these.
// Into *out, whose tensors keep their memory from its last use (one per
// thread: a key row's sub-case holds every query row of its heads).
void sub_case(const AttentionCase& c, int64_t b, Heads qh, Heads kh, int64_t i0,
              int64_t nq, int64_t j0, int64_t nk, AttentionCase* out) {
  const AttentionProblem& p = c.problem;
  const int64_t D = p.head_dim, Hk = kv_heads_of(p);
  AttentionCase& s = *out;
  s.problem = p;
  s.problem.batch = 1;
  s.problem.heads = qh.count;
  s.problem.kv_heads = kh.count;
  s.problem.mask = {};
  if (nk == 0) {
    j0 = 0;
    nk = p.kv_len;
    s.problem.mask.key_lengths = {0};
  } else if (nq == 0) {
    i0 = 0;
    nq = p.q_len;
    s.problem.mask.key_lengths = {0};
  }
  s.problem.q_len = nq;
  s.problem.kv_len = nk;
  slice(c.q, p.heads, p.q_len, D, b, qh, i0, nq, &s.q);
  slice(c.d_o, p.heads, p.q_len, D, b, qh, i0, nq, &s.d_o);
  slice(c.k, Hk, p.kv_len, D, b, kh, j0, nk, &s.k);
  slice(c.v, Hk, p.kv_len, D, b, kh, j0, nk, &s.v);
  s.q_weight = slice_param(p, c.q_weight, qh);
  s.q_bias = slice_param(p, c.q_bias, qh);
  s.k_weight = slice_param(p, c.k_weight, kh);
  s.k_bias = slice_param(p, c.k_bias, kh);
  s.storage = c.storage;
  s.seed = c.seed;
  s.dist = c.dist;
}

// Appends element e of table `from` to `to`, as element `full` of the whole
// tensor.
void append(ToleranceTable* to, const ToleranceTable& from, size_t e,
            int64_t full) {
  to->expected.push_back(from.expected[e]);
  to->delta.push_back(from.delta[e]);
  to->cond.push_back(from.cond[e]);
  to->masked_row.push_back(from.masked_row.empty() ? 0 : from.masked_row[e]);
  to->index_of.push_back(full);
}

const ToleranceTable& find(const std::vector<ToleranceTable>& ts, Field f) {
  for (const ToleranceTable& t : ts)
    if (t.field == f) return t;
  throw Error("sampled oracle", {}, std::string("no table ") + name(f));
}

}  // namespace

SampledOracle sampled_oracle(const AttentionCase& c, Precision s,
                             const SampleOptions& opt) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len, D = p.head_dim, group = H / Hk;
  const bool all_heads =
      p.variant == Variant::kQKNorm && p.norm.axis == NormAxis::kAllHeads;
  // The pass (sampled_pass.cc) forms the logits without the cap, and its
  // error channel does not count it (issue 34: the full oracle has it).
  if (p.softcap != 0)
    throw Error("softcap", {},
                "the sampled oracle (--sample) does not take a logit softcap "
                "yet; judge this case with the full oracle (no --sample)");
  // The pass's blocks take every row's visible keys as a prefix (a common
  // prefix, then each row's ragged rest): a window's rows start later.
  if (has_window(p.mask))
    throw Error("mask", {},
                "the sampled oracle (--sample) does not take a sliding window "
                "yet; judge this case with the full oracle (no --sample)");
  // Its sub-cases and the pass rotate nothing (issue 34: the full oracle
  // does).
  if (has_rope(p))
    throw Error("rope", {},
                "the sampled oracle (--sample) does not take RoPE yet; judge "
                "this case with the full oracle (no --sample)");
  // Its pass's row sums hold no sink (issue 34: the full oracle's do).
  if (has_sinks(p))
    throw Error("sinks", {},
                "the sampled oracle (--sample) does not take attention sinks "
                "yet; judge this case with the full oracle (no --sample)");
  SampledOracle so;
  so.options = opt;
  so.storage = s;
  Rng rng(opt.seed);
  plan_rows(c, opt, rng, &so);

  // The whole case's logit amplitude, Qwen3's rounding flips and (from the
  // pass) LayerNorm's mean-shift logit change: every sampled row's tables
  // use them, as the full verdict does.
  so.amplitude = logit_amplitude(c);
  // Every head's q and k rows normalized once for all sub-cases (each
  // reads its rows' slice; SharedOperands), with the rows' cosine facts.
  const SharedOperands shared(c);
  const double dot = shared.cosine().units();
  double flip = 0, operand_flip = 0;
  if (p.variant == Variant::kQKNorm && p.norm.round_before_weight &&
      (s == Precision::kBF16 || s == Precision::kF16)) {
    const LD sc = std::fabs(static_cast<LD>(p.fixed_scale ? p.scale : p.g));
    const OperandMags qm = operand_mags(c, 0), km = operand_mags(c, 1);
    flip = static_cast<double>(logit_flip(c, qm, km, sc));
    operand_flip = static_cast<double>(logit_flip<LD>(c, qm, km, 1));
  }
  const auto t0 = Clock::now();
  const std::vector<LD> p_del = row_p_del(c);
  Pass pass = run_pass(c, so.amplitude, dot, p_del, opt.threads);
  so.pass_seconds = seconds_since(t0);
  so.pass_flops = pass.flops;
  so.given_units = pass.rows.units + pass.rows.soft_units;
  auto scope = [&](OracleAttention* o) {
    o->amplitude = so.amplitude;
    o->cosine_units = dot;
    o->count_q_len = Nq;
    o->count_kv_len = Nk;
    o->logit_flip = flip;
    o->operand_flip = operand_flip;
    o->logit_shift = pass.logit_shift;
  };

  // The sampled rows' sub-cases, on both cores.
  const auto t1 = Clock::now();
  const size_t nqr = so.query_rows.size(), nkr = so.key_rows.size();
  std::vector<std::vector<ToleranceTable>> sub(nqr + nkr);
  std::vector<int64_t> sub_head(nqr + nkr, 0);
  std::vector<std::string> errors(nqr + nkr);
  std::vector<double> cpu(nqr + nkr, 0);
  // One oracle workspace per thread: its n x D arrays are allocated once,
  // not once per sub-case.
  std::vector<OracleWorkspace> workspaces(
      static_cast<size_t>(std::max(1, opt.threads)));
  // So are its sub-case, oracle result and given rows (a key row's sub-case
  // holds every query row of its heads: fresh arrays of that size, each
  // page faulted in, were a fifth of the rows' time at n = 32768).
  struct Scratch {
    AttentionCase sc;
    OracleAttention o;
    GivenRows g;
  };
  std::vector<Scratch> scratch(static_cast<size_t>(std::max(1, opt.threads)));
  auto of = [&](int64_t b, Heads qh, int64_t q_row, Heads kh, int64_t k_row) {
    OracleOptions o;
    o.sub = {&shared, b, qh.first, q_row, kh.first, k_row};
    return o;
  };
  const auto items = static_cast<int64_t>(nqr + nkr);
  parallel_for(items, opt.threads, [&](int64_t w, int t) {
    OracleWorkspace* ws = &workspaces[static_cast<size_t>(t)];
    AttentionCase& sc = scratch[static_cast<size_t>(t)].sc;
    OracleAttention& o = scratch[static_cast<size_t>(t)].o;
    const double cpu0 = thread_cpu_seconds();
    try {
      if (static_cast<size_t>(w) < nqr) {
        const SampledRow& r = so.query_rows[static_cast<size_t>(w)];
        const Heads qh = all_heads ? Heads{0, H} : Heads{r.h, 1};
        const Heads kh = all_heads ? Heads{0, Hk} : Heads{r.h / group, 1};
        const int64_t n = visible_keys(p, r.b, r.n);
        sub_case(c, r.b, qh, kh, r.n, 1, 0, n, &sc);
        oracle_attention_into(sc, nullptr, {Nq, Nk, true, false}, ws,
                              of(r.b, qh, r.n, kh, 0), &o);
        scope(&o);
        sub[static_cast<size_t>(w)] =
            attention_tolerances(sc, s, o, false, opt.contract);
        sub_head[static_cast<size_t>(w)] = all_heads ? r.h : 0;
      } else {
        const SampledRow& r = so.key_rows[static_cast<size_t>(w) - nqr];
        const Heads qh = all_heads ? Heads{0, H} : Heads{r.h * group, group};
        const Heads kh = all_heads ? Heads{0, Hk} : Heads{r.h, 1};
        const int64_t i0 = first_query(p, r.b, r.n);
        sub_case(c, r.b, qh, kh, i0, Nq - i0, r.n, 1, &sc);
        if (i0 < Nq) {
          GivenRows& g = scratch[static_cast<size_t>(t)].g;
          for (std::vector<long double>* x :
               {&g.lse, &g.delta, &g.del, &g.ds_l1, &g.o_abs, &g.p_del,
                &g.ties})
            x->clear();
          g.units = pass.rows.units;
          g.soft_units = pass.rows.soft_units;
          for (int64_t h = qh.first; h < qh.first + qh.count; ++h)
            for (int64_t i = i0; i < Nq; ++i) {
              const auto row = static_cast<size_t>((r.b * H + h) * Nq + i);
              g.lse.push_back(pass.rows.lse[row]);
              g.delta.push_back(pass.rows.delta[row]);
              g.del.push_back(pass.rows.del[row]);
              g.ds_l1.push_back(pass.rows.ds_l1[row]);
              g.o_abs.push_back(pass.rows.o_abs[row]);
              g.p_del.push_back(p_del[row]);
              g.ties.push_back(pass.rows.ties[row]);
            }
          oracle_attention_into(sc, &g, {Nq, Nk, false, true}, ws,
                                of(r.b, qh, i0, kh, r.n), &o);
        } else {  // no query sees the key: the sub-case holds every query
          oracle_attention_into(sc, nullptr, {Nq, Nk, false, true}, ws,
                                of(r.b, qh, 0, kh, r.n), &o);
        }
        scope(&o);
        sub[static_cast<size_t>(w)] =
            attention_tolerances(sc, s, o, false, opt.contract);
        sub_head[static_cast<size_t>(w)] = all_heads ? r.h : 0;
      }
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(w)] = e.what();
    }
    cpu[static_cast<size_t>(w)] = thread_cpu_seconds() - cpu0;
  });
  for (const std::string& e : errors)
    if (!e.empty()) throw Error("sampled oracle", {}, e);
  so.rows_seconds = seconds_since(t1);
  for (double x : cpu) so.rows_cpu_seconds += x;

  // Gather the sampled rows' elements into tables of the whole tensors.
  const Precision wf = compute_format(s);
  ToleranceTable to = empty_table(Field::kO, s, B, H, Nq, D),
                 tl = empty_table(Field::kLse, wf, B, H, Nq, 1),
                 tq = empty_table(Field::kDq, s, B, H, Nq, D),
                 tk = empty_table(Field::kDk, s, B, Hk, Nk, D),
                 tv = empty_table(Field::kDv, s, B, Hk, Nk, D);
  for (size_t w = 0; w < nqr; ++w) {
    const SampledRow& r = so.query_rows[w];
    const auto hs = static_cast<size_t>(sub_head[w]);
    const int64_t row = (r.b * H + r.h) * Nq + r.n;
    for (int64_t d = 0; d < D; ++d) {
      const size_t e = hs * static_cast<size_t>(D) + static_cast<size_t>(d);
      append(&to, find(sub[w], Field::kO), e, row * D + d);
      append(&tq, find(sub[w], Field::kDq), e, row * D + d);
    }
    append(&tl, find(sub[w], Field::kLse), hs, row);
  }
  for (size_t w = 0; w < nkr; ++w) {
    const SampledRow& r = so.key_rows[w];
    const auto hs = static_cast<size_t>(sub_head[nqr + w]);
    const int64_t row = (r.b * Hk + r.h) * Nk + r.n;
    for (int64_t d = 0; d < D; ++d) {
      const size_t e = hs * static_cast<size_t>(D) + static_cast<size_t>(d);
      append(&tk, find(sub[nqr + w], Field::kDk), e, row * D + d);
      append(&tv, find(sub[nqr + w], Field::kDv), e, row * D + d);
    }
  }
  so.tables = {std::move(to), std::move(tl), std::move(tq), std::move(tk),
               std::move(tv)};
  if (p.variant == Variant::kQKNorm && !p.fixed_scale) {
    OracleAttention g = pass.dg;
    scope(&g);
    so.tables.push_back(attention_dg_tolerance(c, s, g, opt.contract));
  }
  // The lse range's slack: the rule's lse bound with |lse| <= log n + A.
  {
    OracleAttention o;
    scope(&o);
    const double uc = compute_roundoff(s);
    const double A = so.amplitude;
    double div = 0;
    if (p.variant == Variant::kQKNorm &&
        (p.norm.kind == NormKind::kRms || p.norm.kind == NormKind::kLayer))
      div = static_cast<double>(norm_rows(p, 0).len() - 1) / 2 +
            static_cast<double>(norm_rows(p, 1).len() - 1) / 2 + 2 * kOpUnits;
    so.lse_units = (dot + div) * std::fabs(A) +
                   sum_units(static_cast<double>(Nk)) + pass.logit_shift;
    so.lse_abs = flip + kOpUnits * ulp(wf, 0);
    (void)uc;
  }
  return so;
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

PassCost pass_cost(const AttentionCase& c, int threads) {
  timespec t0{}, t1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  const Pass p =
      run_pass(c, logit_amplitude(c), cosine_units(c), row_p_del(c), threads);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
  const double all = static_cast<double>(t1.tv_sec - t0.tv_sec) +
                     1e-9 * static_cast<double>(t1.tv_nsec - t0.tv_nsec);
  return {std::max(0.0, all - p.block_cpu_seconds), p.block_cpu_seconds};
}

}  // namespace qknorm::validation
