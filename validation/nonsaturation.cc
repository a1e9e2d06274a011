#include "validation/nonsaturation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "qknorm/error.h"
#include "validation/oracle.h"

namespace qknorm::validation {

double computed_logit_amplitude(const AttentionCase& c,
                                const OracleAttention* oracle, Precision s,
                                double amplitude) {
  const AttentionProblem& p = c.problem;
  const double u = compute_roundoff(s);
  const double D = static_cast<double>(p.head_dim);
  if (p.variant != Variant::kQKNorm || is_paper_formulation(p))
    return amplitude * (1 + (3 * D + 16) * u);
  // logit_flip is 0 unless x_hat is rounded before the weight, logit_shift
  // unless the kind is LayerNorm (validation/oracle.h): without either, as
  // for the paper's normalization under GQA (kv_heads < heads, which
  // is_paper_formulation excludes), the oracle's values are 0 and it is
  // not needed.
  const bool needs_oracle =
      p.norm.round_before_weight || p.norm.kind == NormKind::kLayer;
  if (oracle == nullptr && needs_oracle)
    throw Error("oracle", {},
                "computed_logit_amplitude: a formulation case with rounding "
                "flips or a mean shift needs its oracle (logit_flip, "
                "logit_shift)");
  const double len = static_cast<double>(
      std::max(norm_rows(p, 0).len(), norm_rows(p, 1).len()));
  // Round-before-weight formulations (Qwen3) round x_hat to storage before
  // the weight; the rule's amplitude is of the unrounded x_hat
  // (validation/operands.h), and each side's rounded operand can be up to
  // (1 + u_s) larger.
  const double us = unit_roundoff(s);
  const double rounding = p.norm.round_before_weight && s != compute_format(s)
                              ? 2 * us + us * us
                              : 0;
  const double e = amplitude * (1 + (6 * len + 3 * D + 32) * u + rounding);
  return oracle == nullptr ? e
                           : e + oracle->logit_flip + oracle->logit_shift * u;
}

std::string check_nonsaturation(const AttentionProblem& p,
                                const std::vector<double>& probs,
                                const std::vector<double>* lse, double a_plus_e,
                                Precision s) {
  using LD = long double;
  const double u = compute_roundoff(s);
  const double tiny = min_normal(compute_format(s));
  const LD a = a_plus_e;
  const int64_t Nq = p.q_len, Nk = p.kv_len;
  const bool sinks = has_sinks(p);
  char buf[480];
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const size_t li = static_cast<size_t>((b * p.heads + h) * Nq + i);
        const double* row = probs.data() + li * static_cast<size_t>(Nk);
        int64_t m = 0;
        for (int64_t j = 0; j < Nk; ++j) m += visible(p.mask, b, i, j, Nq, Nk);
        const LD mm = static_cast<LD>(m);
        const double rel = (2 * static_cast<double>(m) + 16) * u;
        // (m - 1) e^{2A} is 0 * inf for one visible key and a huge A.
        const LD lo = m <= 1 ? mm : 1 / (1 + (mm - 1) * std::exp(2 * a));
        const LD hi = m <= 1 ? mm : 1 / (1 + (mm - 1) * std::exp(-2 * a));
        auto where = [&](int64_t j, double pj) {
          std::snprintf(buf, sizeof buf,
                        "P[%lld,%lld,%lld,%lld] = %.17g (m = %lld visible "
                        "keys, amplitude A + E = %.9Lg, interval [%.9Lg, "
                        "%.9Lg], relative slack %.3e, absolute %.3e)",
                        (long long)b, (long long)h, (long long)i, (long long)j,
                        pj, (long long)m, a, lo, hi, rel, tiny);
          return std::string(buf);
        };
        LD sum = 0, entropy = 0;
        for (int64_t j = 0; j < Nk; ++j) {
          const double pj = row[j];
          if (!visible(p.mask, b, i, j, Nq, Nk)) {
            if (pj != 0) return "masked probability is not 0: " + where(j, pj);
            continue;
          }
          // A sink (attention.h) only lowers a row's probabilities: its
          // share is not bounded by the amplitude, so no lower bound.
          if (!((sinks || pj >= lo * (1 - rel) - tiny) &&
                pj <= hi * (1 + rel) + tiny))
            return "non-saturation bound violated: " + where(j, pj);
          sum += pj;
          if (pj > 0) entropy -= pj * std::log(static_cast<LD>(pj));
          if (lse == nullptr || pj <= 0) continue;
          // log(p +- tiny) moves log p by tiny / p: the flush resolution.
          const double l = (*lse)[li];
          const LD logit = std::log(static_cast<LD>(pj)) + l;
          const LD ltol = rel * (2 + std::fabs(l)) + tiny / pj;
          if (!(std::fabs(logit) <= a + ltol)) {
            char lbuf[160];
            std::snprintf(lbuf, sizeof lbuf,
                          " has logit log P + lse = %.9Lg outside "
                          "[-(A + E), A + E] (tolerance %.3Lg)",
                          logit, ltol);
            return "non-saturation logit bound violated: " + where(j, pj) +
                   lbuf;
          }
        }
        if (m == 0) continue;
        const LD sum_tol = rel + mm * tiny;
        if (sinks) {
          // The row holds 1 minus the sink's share exp(sink_h - lse_i):
          // without lse, at most 1; with it, that share, whose exponent
          // an entry forms to rel (2 + |sink| + |lse|) (the sink rounded,
          // the subtraction, the exp; rel covers each).
          const double sink = p.sinks[static_cast<size_t>(h)];
          LD want = 1, tol = sum_tol;
          if (lse != nullptr) {
            const double l = (*lse)[li];
            const LD share = std::exp(static_cast<LD>(sink) - l);
            want = 1 - share;
            tol += share * rel * (2 + std::fabs(sink) + std::fabs(l));
          }
          if (!(sum <= 1 + sum_tol &&
                std::fabs(sum - want) <= (lse != nullptr ? tol : 1 + tol))) {
            std::snprintf(buf, sizeof buf,
                          "row [%lld,%lld,%lld] sums to %.17Lg where 1 - the "
                          "sink's share is %.17Lg (m = %lld, tolerance %.3Lg)",
                          (long long)b, (long long)h, (long long)i, sum, want,
                          (long long)m, tol);
            return std::string(
                       "probabilities do not leave the sink's "
                       "share: ") +
                   buf;
          }
          continue;  // the entropy bound assumes rows summing to 1
        }
        if (!(std::fabs(sum - 1) <= sum_tol)) {
          std::snprintf(buf, sizeof buf,
                        "row [%lld,%lld,%lld] sums to %.17Lg (m = %lld, "
                        "tolerance %.3Lg)",
                        (long long)b, (long long)h, (long long)i, sum,
                        (long long)m, sum_tol);
          return std::string("probabilities do not sum to 1: ") + buf;
        }
        if (lse == nullptr) continue;
        const LD hmin = std::log1p((mm - 1) * std::exp(-2 * a));
        // A flushed p (below tiny) moves -p log p by at most
        // tiny (1 - log tiny).
        const LD htol = rel * (1 + std::log1p((mm - 1) * std::exp(2 * a))) +
                        mm * tiny * (1 - std::log(tiny));
        if (entropy < hmin - htol) {
          std::snprintf(buf, sizeof buf,
                        "row [%lld,%lld,%lld] entropy %.9Lg below the bound "
                        "log(1+(m-1)e^{-2(A+E)}) = %.9Lg (m = %lld, tolerance "
                        "%.3Lg)",
                        (long long)b, (long long)h, (long long)i, entropy, hmin,
                        (long long)m, htol);
          return std::string("non-saturation entropy bound violated: ") + buf;
        }
      }
  return "";
}

}  // namespace qknorm::validation
