#include "validation/generators.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "qknorm/name_table.h"
#include "reference/reference.h"
#include "validation/rng.h"

namespace qknorm::validation {
namespace {

// Rows of a dense [BH, rows, D] tensor.
double* row(std::vector<double>& t, int64_t rows, int64_t D, int64_t bh,
            int64_t r) {
  return t.data() + (bh * rows + r) * D;
}

// A random subnormal of p with a random sign.
double subnormal(Rng& rng, Precision p) {
  const double tiny = min_subnormal(p);
  // Mantissa count in [1, 2^(digits-1)): min_normal / tiny of them.
  const int64_t steps = static_cast<int64_t>(min_normal(p) / tiny);
  const double m = static_cast<double>(rng.uniform_int(1, steps - 1));
  return (rng.uniform() < 0.5 ? -1.0 : 1.0) * m * tiny;
}

void below_eps(Rng& rng, std::vector<double>& t, int64_t rows, int64_t D,
               double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    if (rng.uniform() >= 1.0 / 3) continue;
    double* x = t.data() + r * D;
    const double n = reference::nrm2(x, D);
    if (n == 0) continue;
    const double target =
        std::ldexp(eps, -static_cast<int>(rng.uniform_int(1, 10)));
    for (int64_t d = 0; d < D; ++d) x[d] *= target / n;
  }
}

void subnormals(Rng& rng, std::vector<double>& t, int64_t rows, int64_t D,
                Precision p) {
  for (int64_t r = 0; r < rows; ++r) {
    const bool whole = rng.uniform() < 0.25;
    double* x = t.data() + r * D;
    for (int64_t d = 0; d < D; ++d)
      if (whole || rng.uniform() < 0.25) x[d] = subnormal(rng, p);
  }
}

// Copies src * 2^e (e in [-2, 2], sign `sign`) into dst: exact in every
// format while the values stay normal.
void multiple_of(Rng& rng, const double* src, double* dst, int64_t D,
                 double sign) {
  const int e = static_cast<int>(rng.uniform_int(-2, 2));
  for (int64_t d = 0; d < D; ++d) dst[d] = sign * std::ldexp(src[d], e);
}

}  // namespace

constexpr NamedValue<Structure> kStructureNames[] = {
    {Structure::kNone, "none"},
    {Structure::kRowsBelowEps, "below_eps"},
    {Structure::kParallelRows, "parallel"},
    {Structure::kAntiParallelRows, "antiparallel"},
    {Structure::kDuplicatedKeys, "dupkeys"},
    {Structure::kSubnormalEntries, "subnormal"},
};

const char* name(Structure s) { return name_in(kStructureNames, s); }

double min_subnormal(Precision p) {
  return min_normal(p) * 2 * unit_roundoff(p);
}

void apply_structure(AttentionCase* c, Structure s, uint64_t seed,
                     Precision range) {
  const AttentionProblem& p = c->problem;
  // q is [B, H, Nq, D]; k and v are [B, Hk, Nk, D] (GQA: Hk = kv_heads <
  // H), and query head h reads kv head h / group. Indexing k and v by the
  // query heads wrote past them under GQA (heap corruption, issue 33).
  const int64_t D = p.head_dim, Hk = kv_heads_of(p), group = p.heads / Hk;
  const int64_t BHq = p.batch * p.heads, BHk = p.batch * Hk;
  Rng rng(seed ^ 0x5bd1e995ull);
  c->structure = s;
  switch (s) {
    case Structure::kNone:
      return;
    case Structure::kRowsBelowEps:
      below_eps(rng, c->q, BHq * p.q_len, D, p.eps);
      below_eps(rng, c->k, BHk * p.kv_len, D, p.eps);
      return;
    case Structure::kSubnormalEntries:
      subnormals(rng, c->q, BHq * p.q_len, D, range);
      subnormals(rng, c->k, BHk * p.kv_len, D, range);
      return;
    case Structure::kParallelRows:
    case Structure::kAntiParallelRows: {
      // A key row of kv slice (b, hk) is a multiple of a query row of a
      // query head that reads it: (b, hk * group + r), r drawn under GQA
      // only (without GQA, r = 0 and the draws are those of before).
      const double sign = s == Structure::kParallelRows ? 1.0 : -1.0;
      for (int64_t bk = 0; bk < BHk; ++bk)
        for (int64_t j = 0; j < p.kv_len; ++j) {
          if (rng.uniform() >= 0.5) continue;
          const int64_t i = rng.uniform_int(0, p.q_len - 1);
          const int64_t r = group > 1 ? rng.uniform_int(0, group - 1) : 0;
          const int64_t bq = (bk / Hk) * p.heads + (bk % Hk) * group + r;
          multiple_of(rng, row(c->q, p.q_len, D, bq, i),
                      row(c->k, p.kv_len, D, bk, j), D, sign);
        }
      return;
    }
    case Structure::kDuplicatedKeys:
      if (p.kv_len < 2) return;
      for (int64_t bk = 0; bk < BHk; ++bk)
        for (int64_t j = 1; j < p.kv_len; ++j) {
          if (rng.uniform() >= 0.4) continue;
          const int64_t src = rng.uniform_int(0, j - 1);
          std::copy_n(row(c->k, p.kv_len, D, bk, src), D,
                      row(c->k, p.kv_len, D, bk, j));
          if (rng.uniform() < 0.5)
            std::copy_n(row(c->v, p.kv_len, D, bk, src), D,
                        row(c->v, p.kv_len, D, bk, j));
        }
      return;
  }
}

void apply_structure(ScaleNormCase* c, Structure s, uint64_t seed,
                     Precision range) {
  const ScaleNormProblem& p = c->problem;
  Rng rng(seed ^ 0x5bd1e995ull);
  c->structure = s;
  switch (s) {
    case Structure::kNone:
      return;
    case Structure::kRowsBelowEps:
      below_eps(rng, c->x, p.rows, p.dim, p.eps);
      return;
    case Structure::kSubnormalEntries:
      subnormals(rng, c->x, p.rows, p.dim, range);
      return;
    case Structure::kParallelRows:
    case Structure::kAntiParallelRows:
    case Structure::kDuplicatedKeys: {
      // Each new row is a multiple of a row as drawn (`origin`: src itself,
      // or the drawn row src was made from), never of a structured one: a
      // chain of multiples r <- src <- ... grew by up to 4x per link, past
      // the 4x headroom the draws keep for one multiple
      // (max_scale_exponent, case.cc), and overflowed the storage format
      // (found by the property soak, issue 32: f16, sink rows, rows=11 dim=15,
      // a chain of 2^7 over the sink row: x = -Inf, Orthogonality on
      // simd:SCALAR:f16). Rows sharing an origin stay exact +-2^k
      // multiples of it and of each other.
      const double sign = s == Structure::kAntiParallelRows ? -1.0 : 1.0;
      std::vector<int64_t> origin(static_cast<size_t>(p.rows));
      for (int64_t r = 0; r < p.rows; ++r) origin[static_cast<size_t>(r)] = r;
      for (int64_t r = 1; r < p.rows; ++r) {
        if (rng.uniform() >= 0.5) continue;
        const int64_t src =
            origin[static_cast<size_t>(rng.uniform_int(0, r - 1))];
        multiple_of(rng, c->x.data() + src * p.dim, c->x.data() + r * p.dim,
                    p.dim, sign);
        origin[static_cast<size_t>(r)] = src;
      }
      return;
    }
  }
}

}  // namespace qknorm::validation
