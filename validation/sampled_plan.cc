// The sampled oracle's plan: which rows it samples (validation/sampled.h).
#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "validation/sampled.h"
#include "validation/sampled_internal.h"

namespace qknorm::validation {

int64_t visible_keys(const AttentionProblem& p, int64_t b, int64_t i) {
  const KeyRange r = qknorm::visible_keys(p.mask, b, i, p.q_len, p.kv_len);
  return r.end - r.begin;
}

// The first query row of batch b that sees key j (q_len: none does).
int64_t first_query(const AttentionProblem& p, int64_t b, int64_t j) {
  if (!p.mask.key_lengths.empty() &&
      j >= p.mask.key_lengths[static_cast<size_t>(b)])
    return p.q_len;
  if (!p.mask.causal) return 0;
  return std::clamp<int64_t>(j - p.kv_len + p.q_len, 0, p.q_len);
}

namespace {

// The sample.

struct Picker {
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  std::vector<SampledRow>* out;
  void add(int64_t b, int64_t h, int64_t n, const char* why) {
    if (seen.insert({b, h, n}).second) out->push_back({b, h, n, why});
  }
};

// Positions 0 .. N-1 along one axis: the first and last, tile boundaries of
// every block size, then what `extra` adds, then random positions until
// `rows` rows are chosen; each at a random (b, h) but the first and last
// (every (b, h) when there are at most 8).
std::vector<SampledRow> pick_rows(int64_t B, int64_t H, int64_t N,
                                  const SampleOptions& opt, Rng& rng,
                                  const std::function<void(Picker&)>& extra) {
  std::vector<SampledRow> rows;
  Picker pk{{}, &rows};
  auto any_bh = [&](int64_t n, const char* why) {
    pk.add(rng.uniform_int(0, B - 1), rng.uniform_int(0, H - 1), n, why);
  };
  for (int64_t n : {int64_t{0}, N - 1}) {
    const char* why = n == 0 ? "first" : "last";
    if (B * H <= 8) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) pk.add(b, h, n, why);
    } else {
      for (int r = 0; r < 4; ++r) any_bh(n, why);
    }
  }
  std::vector<int64_t> blocks = {16, 32, 64, 128, 256};
  for (int64_t b : opt.blocks)
    if (b > 1) blocks.push_back(b);
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  // Every boundary (rows k blk - 1 and k blk) when they fit in half the
  // budget; else the first two, the last full block's, the last partial
  // block's first row, and random boundaries up to half the budget.
  std::vector<int64_t> all, must;
  for (int64_t blk : blocks) {
    const int64_t K = (N - 1) / blk;  // boundaries k blk, 1 <= k <= K
    for (int64_t k = 1; k <= K; ++k) {
      all.push_back(k * blk - 1);
      all.push_back(k * blk);
    }
    for (int64_t k : {int64_t{1}, int64_t{2}, K - 1, K})
      if (k >= 1 && k <= K) {
        must.push_back(k * blk - 1);
        must.push_back(k * blk);
      }
    if (N / blk >= 1 && N % blk != 0) must.push_back(N / blk * blk);
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  const int64_t half = std::max<int64_t>(opt.rows / 2, 1);
  if (static_cast<int64_t>(all.size()) <= half) {
    for (int64_t n : all) any_bh(n, "tile boundary");
  } else {
    for (int64_t n : must) any_bh(n, "tile boundary");
    while (static_cast<int64_t>(rows.size()) < half)
      any_bh(all[static_cast<size_t>(
                 rng.uniform_int(0, static_cast<int64_t>(all.size()) - 1))],
             "tile boundary");
  }
  extra(pk);
  // Random rows; stop early when every row is in.
  const int64_t total = B * H * N;
  while (static_cast<int64_t>(rows.size()) < std::min(opt.rows, total)) {
    const size_t before = rows.size();
    any_bh(rng.uniform_int(0, N - 1), "random");
    if (rows.size() == before && static_cast<int64_t>(pk.seen.size()) >= total)
      break;
  }
  return rows;
}

bool zero_row(const std::vector<double>& x, int64_t row, int64_t D) {
  for (int64_t d = 0; d < D; ++d)
    if (x[static_cast<size_t>(row * D + d)] != 0) return false;
  return true;
}

// The rows a kernel is most likely to get wrong, for one side (queries or
// keys) of N rows per (b, h) with H heads: per batch the first and last row
// `edge(b, n)` marks (each on a random head), then the first four all-zero
// rows of x.
template <typename Edge>
void add_edge_rows(Picker& pk, Rng& rng, int64_t B, int64_t H, int64_t N,
                   int64_t D, const std::vector<double>& x, const char* why,
                   Edge edge) {
  for (int64_t b = 0; b < B; ++b) {
    int64_t first = -1, last = -1;
    for (int64_t n = 0; n < N; ++n)
      if (edge(b, n)) {
        if (first < 0) first = n;
        last = n;
      }
    if (first >= 0) {
      pk.add(b, rng.uniform_int(0, H - 1), first, why);
      pk.add(b, rng.uniform_int(0, H - 1), last, why);
    }
  }
  int zeros = 0;
  for (int64_t r = 0; r < B * H * N && zeros < 4; ++r)
    if (zero_row(x, r, D)) {
      pk.add(r / (H * N), (r / N) % H, r % N, "zero row");
      ++zeros;
    }
}

}  // namespace

void plan_rows(const AttentionCase& c, const SampleOptions& opt, Rng& rng,
               SampledOracle* out) {
  const AttentionProblem& p = c.problem;
  const int64_t B = p.batch, H = p.heads, Hk = kv_heads_of(p), Nq = p.q_len,
                Nk = p.kv_len, D = p.head_dim;
  SampledOracle& so = *out;
  so.query_rows = pick_rows(B, H, Nq, opt, rng, [&](Picker& pk) {
    add_edge_rows(
        pk, rng, B, H, Nq, D, c.q, "fully masked",
        [&](int64_t b, int64_t i) { return visible_keys(p, b, i) == 0; });
  });
  so.key_rows = pick_rows(B, Hk, Nk, opt, rng, [&](Picker& pk) {
    add_edge_rows(
        pk, rng, B, Hk, Nk, D, c.k, "seen by no query",
        [&](int64_t b, int64_t j) { return first_query(p, b, j) >= Nq; });
  });
}

std::string SampledOracle::describe() const {
  auto counts = [](const std::vector<SampledRow>& rows) {
    std::vector<std::pair<std::string, int>> c;
    for (const SampledRow& r : rows) {
      auto it = std::find_if(c.begin(), c.end(),
                             [&](const auto& x) { return x.first == r.why; });
      if (it == c.end())
        c.push_back({r.why, 1});
      else
        ++it->second;
    }
    std::string s;
    for (const auto& [k, n] : c)
      s += (s.empty() ? "" : ", ") + k + " " + std::to_string(n);
    return s;
  };
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "; pass %.3g flops in %.1f s (error channel %.0f u_f64), rows "
                "in %.1f s",
                pass_flops, pass_seconds, given_units, rows_seconds);
  return "sample seed " + std::to_string(options.seed) + ": " +
         std::to_string(query_rows.size()) + " query rows (" +
         counts(query_rows) + "), " + std::to_string(key_rows.size()) +
         " key rows (" + counts(key_rows) + ")" + buf;
}

}  // namespace qknorm::validation
