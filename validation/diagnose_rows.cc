#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "reference/reference.h"
#include "validation/diagnose_internal.h"

namespace qknorm::validation::diag {
namespace {

// The rows of side (0: q, 1: k) whose normalization row's sum of squares
// exceeds the compute format's largest finite, or falls below its smallest
// normal where the clamp does not govern the divisor.
RangeRows range_rows(const AttentionCase& c, int side, Precision cf) {
  const AttentionProblem& p = c.problem;
  const NormRows nr = norm_rows(p, side);
  const std::vector<double>& x = side == 0 ? c.q : c.k;
  RangeRows r;
  const int64_t trows = nr.B * nr.H * nr.N;
  r.far.assign(static_cast<size_t>(trows), 0);
  if (p.variant != Variant::kQKNorm || p.norm.kind == NormKind::kNone) return r;
  const LD big = max_finite(cf), tiny = min_normal(cf);
  std::vector<char> norm_far(static_cast<size_t>(nr.rows()), 0);
  for (int64_t r0 = 0; r0 < nr.rows(); ++r0) {
    LD s2 = 0;
    for (int64_t e = 0; e < nr.len(); ++e) {
      const LD v = x[static_cast<size_t>(nr.at(r0, e))];
      s2 += v * v;
    }
    const LD scale = p.norm.kind == NormKind::kL2
                         ? std::sqrt(s2)
                         : s2 / static_cast<LD>(nr.len());
    const bool over = s2 > big;
    const bool under =
        s2 > 0 && s2 < tiny && scale > p.eps && p.norm.kind != NormKind::kLayer;
    r.over += over;
    r.under += under;
    norm_far[static_cast<size_t>(r0)] = over || under;
  }
  for (int64_t t = 0; t < trows; ++t) {
    const size_t nrow = row_of(nr, static_cast<size_t>(t * nr.D));
    r.far[static_cast<size_t>(t)] = norm_far[nrow];
    if (norm_far[nrow] && r.first < 0) r.first = t;
  }
  return r;
}

// c with every row of `q_far` / `k_far` (tensor rows) set to zero: its
// x_hat is 0, what an unscaled norm whose sum of squares overflows gives.
AttentionCase zero_rows(const AttentionCase& c, const RangeRows& qr,
                        const RangeRows& kr) {
  AttentionCase z = c;
  const auto D = static_cast<size_t>(c.problem.head_dim);
  for (size_t t = 0; t < qr.far.size(); ++t)
    if (qr.far[t]) std::fill_n(z.q.begin() + t * D, D, 0.0);
  for (size_t t = 0; t < kr.far.size(); ++t)
    if (kr.far[t]) std::fill_n(z.k.begin() + t * D, D, 0.0);
  return z;
}

}  // namespace

std::string range_text(const RangeRows& qr, const RangeRows& kr, Precision cf) {
  const std::string fmt(name(cf));
  std::string s;
  if (qr.over + kr.over > 0)
    s = format("||x|| > %.2g, where the %s sum of squares overflows",
               std::sqrt(max_finite(cf)), fmt.c_str());
  if (qr.under + kr.under > 0)
    s += (s.empty() ? "" : ", or ") +
         format(
             "||x|| < %.2g above eps, where the %s sum of squares "
             "underflows",
             std::sqrt(min_normal(cf)), fmt.c_str());
  return s;
}

RangeInfo range_info(const AttentionCase& c, Precision s) {
  const AttentionProblem& p = c.problem;
  const Precision cf = compute_format(s);
  RangeInfo ri;
  ri.qr = range_rows(c, 0, cf);
  ri.kr = range_rows(c, 1, cf);
  const RangeRows &qr = ri.qr, &kr = ri.kr;
  std::vector<char>&q_read = ri.q_read, &k_read = ri.k_read;
  q_read.assign(qr.far.size(), 0);
  k_read = kr.far;
  if (!ri.any()) return ri;
  const int64_t H = p.heads, Hk = kv_heads_of(p), G = H / Hk, Nq = p.q_len,
                Nk = p.kv_len, B = p.batch;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const size_t qi = static_cast<size_t>((b * H + h) * Nq + i);
        const int64_t kb = (b * Hk + h / G) * Nk;
        bool reads = qr.far[qi];
        for (int64_t j = 0; j < Nk && !reads; ++j)
          reads = kr.far[static_cast<size_t>(kb + j)] &&
                  visible(p.mask, b, i, j, Nq, Nk);
        q_read[qi] = reads;
        if (!reads) continue;
        for (int64_t j = 0; j < Nk; ++j)
          if (visible(p.mask, b, i, j, Nq, Nk))
            k_read[static_cast<size_t>(kb + j)] = 1;
      }
  return ri;
}

void diagnose_norm_range(const AttentionCase& c, Precision s,
                         const RangeInfo& ri, const Fields& fs,
                         std::vector<Diagnosis>* out) {
  if (!ri.any()) return;
  const AttentionProblem& p = c.problem;
  const Precision cf = compute_format(s);
  const RangeRows &qr = ri.qr, &kr = ri.kr;
  const int64_t H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len, Nk = p.kv_len,
                B = p.batch;
  const FailingRows fq = failing_rows(fs, true, B * H * Nq),
                    fk = failing_rows(fs, false, B * Hk * Nk);
  const int64_t failing = fq.count + fk.count;
  if (failing == 0) return;
  int64_t direct = 0, reading = 0;
  for (size_t t = 0; t < fq.mark.size(); ++t)
    if (fq.mark[t]) direct += qr.far[t], reading += ri.q_read[t];
  for (size_t t = 0; t < fk.mark.size(); ++t)
    if (fk.mark[t]) direct += kr.far[t], reading += ri.k_read[t];
  const std::string range = range_text(qr, kr, cf);
  auto row_text = [](const char* side, int64_t r, int64_t heads, int64_t n) {
    return format("%s[%lld,%lld,%lld]", side, (long long)(r / n / heads),
                  (long long)(r / n % heads), (long long)(r % n));
  };
  const std::string first = qr.first >= 0 ? row_text("q", qr.first, H, Nq)
                                          : row_text("k", kr.first, Hk, Nk);
  const bool over = qr.over + kr.over > 0;
  const std::string phrase = over && qr.under + kr.under > 0
                                 ? "norm overflow/underflow"
                             : over ? "norm overflow"
                                    : "norm underflow";
  const std::string counts =
      format("%lld q and %lld k rows of this case have %s (first %s)",
             (long long)(qr.over + qr.under), (long long)(kr.over + kr.under),
             range.c_str(), first.c_str());
  // (i) The forward equals x_hat = 0's on those rows.
  if (fs.fails(Field::kO) || fs.fails(Field::kLse)) {
    const AttentionCase z = zero_rows(c, qr, kr);
    std::array<std::vector<LD>, 4> store;
    const std::vector<LD> q = widen(z.q), k = widen(z.k), v = widen(z.v);
    std::vector<LD> o(q.size()), lse(static_cast<size_t>(B * H * Nq));
    reference::attention_forward<LD>(p, q.data(), k.data(), v.data(), o.data(),
                                     lse.data(), norm_args(z, &store));
    const auto [m, n] = matches(fs, {Field::kO, Field::kLse}, [&](Field f) {
      return f == Field::kO ? &o : &lse;
    });
    if (n > 0 && m >= kMost * n && reading >= kMost * failing) {
      out->push_back(
          {DiagnosisKind::kNormRange, phrase,
           format("%s: %s; the entry's o and lse equal what x_hat = 0 gives "
                  "for those rows on %lld of %lld failing elements, and %lld "
                  "of %lld failing rows are such rows or attend to one: they "
                  "normalize to 0 (an unscaled norm, as torch's F.normalize "
                  "in f32); scale the row before squaring",
                  phrase.c_str(), counts.c_str(), (long long)m, (long long)n,
                  (long long)reading, (long long)failing),
           0.97 * static_cast<double>(m) / static_cast<double>(n)});
      return;
    }
  }
  // (ii) The failing rows are those rows themselves.
  if (direct >= kMost * failing) {
    const bool all = direct == failing;
    out->push_back(
        {DiagnosisKind::kNormRange, phrase,
         format("%s: %s %lld failing rows (%s) are %s q/k rows with %s (%s): "
                "the norm or its backward mishandles rows whose "
                "sum of squares leaves the format's range; scale the row "
                "before squaring",
                phrase.c_str(), all ? "the" : "of the", (long long)failing,
                fs.failing_names({Field::kO, Field::kLse, Field::kDq,
                                  Field::kDk, Field::kDv})
                    .c_str(),
                all ? "exactly" : format("%lld", (long long)direct).c_str(),
                range.c_str(),
                format("the case has %lld q and %lld k such rows; first %s",
                       (long long)(qr.over + qr.under),
                       (long long)(kr.over + kr.under), first.c_str())
                    .c_str()),
         0.9 * static_cast<double>(direct) / static_cast<double>(failing)});
  }
}
namespace {

// ---- (d), (e ii) dK, dV against the oracle of a modified case ------------

// dk and/or dv fail while o, lse and dq pass.
bool only_dk_dv(const Fields& fs) {
  return (fs.fails(Field::kDk) || fs.fails(Field::kDv)) &&
         fs.passes(Field::kO) && fs.passes(Field::kLse) &&
         fs.passes(Field::kDq);
}

std::pair<int64_t, int64_t> dk_dv_matches(const Fields& fs,
                                          const AttentionCase& z) {
  const OracleAttention alt = oracle_attention(z);
  return matches(fs, {Field::kDk, Field::kDv},
                 [&](Field f) { return f == Field::kDk ? &alt.dk : &alt.dv; });
}

}  // namespace

void diagnose_gqa(const AttentionCase& c, const Fields& fs,
                  std::vector<Diagnosis>* out) {
  const AttentionProblem& p = c.problem;
  const int64_t H = p.heads, G = H / kv_heads_of(p), Nq = p.q_len,
                D = p.head_dim;
  if (G <= 1 || !only_dk_dv(fs)) return;
  for (const int64_t keep : {int64_t{0}, G - 1}) {
    AttentionCase z = c;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < H; ++h)
        if (h % G != keep)
          std::fill_n(z.d_o.begin() + ((b * H + h) * Nq) * D, Nq * D, 0.0);
    const auto [m, n] = dk_dv_matches(fs, z);
    if (n == 0 || m < kMost * n) continue;
    out->push_back(
        {DiagnosisKind::kGqaGroupSum, "GQA group sum missing from dK/dV",
         format("GQA group sum missing from dK/dV: with %lld query heads per "
                "kv head, %s fail while o, lse, dq pass, and %lld of their "
                "%lld failing elements equal the oracle's dK/dV of query head "
                "%lld of each group alone (the other heads' dO zeroed): sum "
                "dK and dV over the group's query heads",
                (long long)G,
                fs.failing_names({Field::kDk, Field::kDv}).c_str(),
                (long long)m, (long long)n, (long long)keep),
         0.97 * static_cast<double>(m) / static_cast<double>(n)});
    return;
  }
}

namespace {

// ---- (e) rows after the last full block ----------------------------------

std::vector<int64_t> block_candidates(const std::vector<int64_t>& declared) {
  std::vector<int64_t> out;
  for (int64_t b : declared)
    if (b >= 2 && std::find(out.begin(), out.end(), b) == out.end())
      out.push_back(b);
  for (int64_t b : {8, 16, 32, 64, 128})
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  return out;
}

// The first row after the last full block of `blk` in a sequence of `len`
// rows, or -1 if there is no partial block after a full one.
int64_t tail_start(int64_t len, int64_t blk) {
  if (len <= blk || len % blk == 0) return -1;
  return len / blk * blk;
}

// "16", "8 or 16", "16, 32 or 64": the block sizes that cut the same tail.
std::string sizes_text(const std::vector<int64_t>& v) {
  std::string t;
  for (size_t i = 0; i < v.size(); ++i)
    t += (i == 0              ? ""
          : i + 1 == v.size() ? " or "
                              : ", ") +
         std::to_string(v[i]);
  return t;
}

}  // namespace

void diagnose_tail_block(const AttentionCase& c, const Fields& fs,
                         const std::vector<int64_t>& declared,
                         std::vector<Diagnosis>* out) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len;
  const FailingRows fq = failing_rows(fs, true, B * H * Nq),
                    fk = failing_rows(fs, false, B * Hk * Nk);
  const std::vector<int64_t> cands = block_candidates(declared);
  auto key_len = [&](int64_t b) {
    return p.mask.key_lengths.empty()
               ? Nk
               : std::min(Nk, p.mask.key_lengths[static_cast<size_t>(b)]);
  };
  // Key rows that failing query rows attend to: the backward reads the
  // entry's own O and lse, so a wrong query row spreads to those keys' dk
  // and dv; they are not evidence against a query-side tail.
  std::vector<char> seen(fk.mark.size(), 0);
  for (size_t r = 0; r < fq.mark.size(); ++r) {
    if (!fq.mark[r]) continue;
    const int64_t bh = static_cast<int64_t>(r) / Nq,
                  i = static_cast<int64_t>(r) % Nq, b = bh / H,
                  kb = (b * Hk + bh % H / (H / Hk)) * Nk;
    for (int64_t j = 0; j < Nk; ++j)
      if (visible(p.mask, b, i, j, Nq, Nk))
        seen[static_cast<size_t>(kb + j)] = 1;
  }
  bool k_spread = fk.count > 0 && fq.count > 0;
  for (size_t r = 0; r < fk.mark.size() && k_spread; ++r)
    k_spread = !fk.mark[r] || seen[r];
  // (i) Every failing row of each failing side after the last full block.
  if (fq.count + fk.count > 0) {
    int64_t best = -1;
    double best_frac = 2;
    std::vector<int64_t> same;  // every size that cuts best's tail
    for (int64_t blk : cands) {
      bool ok = true;
      double frac = 0;
      for (size_t r = 0; r < fq.mark.size() && ok; ++r) {
        if (!fq.mark[r]) continue;
        const int64_t t = tail_start(Nq, blk), n = static_cast<int64_t>(r) % Nq;
        ok = t > 0 && n >= t;
        if (ok) frac = std::max(frac, static_cast<double>(Nq - t) / Nq);
      }
      for (size_t r = 0; r < fk.mark.size() && ok && !k_spread; ++r) {
        if (!fk.mark[r]) continue;
        const int64_t b = static_cast<int64_t>(r) / (Hk * Nk),
                      n = static_cast<int64_t>(r) % Nk, len = key_len(b),
                      t = tail_start(len, blk);
        ok = t > 0 && n >= t && n < len;
        if (ok) frac = std::max(frac, static_cast<double>(len - t) / len);
      }
      if (ok && frac < best_frac) best = blk, best_frac = frac, same.clear();
      if (ok && frac == best_frac) same.push_back(blk);
    }
    // A random failing row lands in the tail with probability best_frac;
    // fewer than 1% of random patterns would put them all there.
    const double chance = std::pow(
        best_frac, static_cast<double>(fq.count + (k_spread ? 0 : fk.count)));
    if (best > 0 && chance <= 0.01) {
      const bool declared_b =
          std::find(declared.begin(), declared.end(), best) != declared.end();
      std::string where;
      if (fq.count > 0)
        where = format(
            "the %lld failing query rows (%s) are all rows >= %lld "
            "of q_len %lld",
            (long long)fq.count,
            fs.failing_names({Field::kO, Field::kLse, Field::kDq}).c_str(),
            (long long)tail_start(Nq, best), (long long)Nq);
      if (k_spread)
        where += format(
            "; %s fail on the keys those rows attend to (the "
            "backward reads the entry's O and lse)",
            fs.failing_names({Field::kDk, Field::kDv}).c_str());
      else if (fk.count > 0)
        where += (where.empty() ? "" : "; ") +
                 format(
                     "the %lld failing key rows (%s) all lie after the "
                     "last full block of each batch's keys",
                     (long long)fk.count,
                     fs.failing_names({Field::kDk, Field::kDv}).c_str());
      out->push_back(
          {DiagnosisKind::kTailBlock, "rows after the last full block",
           format("rows after the last full block of %s%s: %s (first %s), "
                  "every earlier row passes: the tail loop of a partial last "
                  "block",
                  sizes_text(same).c_str(),
                  declared_b
                      ? format(" (%lld declared by the entry)", (long long)best)
                            .c_str()
                      : "",
                  where.c_str(), (fq.count > 0 ? fq.first : fk.first).c_str()),
           0.9 * (1 - chance)});
      return;
    }
  }
  // (ii) dK/dV without the query rows after the last full block.
  if (!only_dk_dv(fs)) return;
  std::vector<int64_t> tried;
  for (int64_t blk : cands) {
    const int64_t t = tail_start(Nq, blk);
    if (t < 0 || std::find(tried.begin(), tried.end(), t) != tried.end())
      continue;
    if (tried.size() == 3) break;  // each try is an oracle evaluation
    tried.push_back(t);
    AttentionCase z = c;
    const int64_t D = p.head_dim;
    for (int64_t bh = 0; bh < B * H; ++bh)
      std::fill_n(z.d_o.begin() + (bh * Nq + t) * D, (Nq - t) * D, 0.0);
    const auto [m, n] = dk_dv_matches(fs, z);
    if (n == 0 || m < kMost * n) continue;
    std::vector<int64_t> same;
    for (int64_t b : cands)
      if (tail_start(Nq, b) == t) same.push_back(b);
    out->push_back(
        {DiagnosisKind::kTailBlock,
         "rows after the last full block (dK/dV reduction)",
         format("rows after the last full block of %s: %s fail while o, "
                "lse, dq pass, and %lld of their %lld failing elements equal "
                "the oracle's without query rows >= %lld of q_len %lld (their "
                "dO zeroed): the reduction over query blocks drops the partial "
                "last block",
                sizes_text(same).c_str(),
                fs.failing_names({Field::kDk, Field::kDv}).c_str(),
                (long long)m, (long long)n, (long long)t, (long long)Nq),
         0.95 * static_cast<double>(m) / static_cast<double>(n)});
    return;
  }
}
}  // namespace qknorm::validation::diag
