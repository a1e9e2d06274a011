// The shape-coverage model (coverage.h): cells, what a problem reaches,
// the candidates, feasibility by construction, and the tally.
#include "validation/coverage.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "qknorm/name_table.h"
#include "validation/case.h"
#include "validation/coverage_internal.h"

namespace qknorm::validation::coverage {
namespace {

// Kernels tile lengths at these whatever they declare (the tile sizes of
// FlashAttention-style kernels and of most GEMM micro-kernels).
constexpr int64_t kStandardBlocks[] = {16, 32, 64, 128, 256};
// head_dim values kernels specialize: 64 and 128 (most models), the
// non-powers of two 80, 96, 112, 192 (partial vector tiles), 256 (Gemma),
// 512 and 576 (MLA-style heads, past most kernels' register tiles).
constexpr int64_t kHeadDims[] = {64, 80, 96, 112, 128, 192, 256, 512, 576};
// The smallest odd head_dim above 1 (cheapest representative of "odd").
constexpr int64_t kOddHeadDim = 3;
// Decode: one query row, or a few (speculative decoding: up to 16).
constexpr int64_t kDecodeMax = 16;

int64_t resolved_kv(const AttentionProblem& p) { return kv_heads_of(p); }

// The residues of block b the model checks: 0, +1, -1, b/2 (distinct).
std::vector<int64_t> residues_of(int64_t b) {
  std::vector<int64_t> r;
  for (int64_t x : {int64_t{0}, int64_t{1}, b - 1, b / 2})
    if (std::find(r.begin(), r.end(), x) == r.end()) r.push_back(x);
  return r;
}

std::string residue_label(int64_t b, int64_t r) {
  const std::string rs = r == 0       ? "0"
                         : r == 1     ? "+1"
                         : r == b - 1 ? "-1"
                                      : std::to_string(r);
  return rs + " mod " + std::to_string(b);
}

// The smallest length >= from that is r mod b.
int64_t smallest_at(int64_t from, int64_t b, int64_t r) {
  const int64_t L = from + ((r - from % b) % b + b) % b;
  return L;
}

}  // namespace

constexpr NamedValue<Dim> kDimNames[] = {
    {Dim::kHeadDim, "head_dim"}, {Dim::kBatch, "batch"},
    {Dim::kHeads, "heads"},      {Dim::kQLen, "q_len"},
    {Dim::kKvLen, "kv_len"},     {Dim::kMask, "mask"},
};
constexpr NamedValue<MaskKind> kMaskKindNames[] = {
    {MaskKind::kNone, "none"},        {MaskKind::kCausal, "causal"},
    {MaskKind::kPadNone, "pad-none"}, {MaskKind::kPadOne, "pad-one"},
    {MaskKind::kPadAll, "pad-all"},   {MaskKind::kPadRun, "pad-run"},
};

const char* name(Dim d) { return name_in(kDimNames, d); }
const char* name(MaskKind k) { return name_in(kMaskKindNames, k); }

std::string full_name(const Cell& c) {
  return std::string(name(c.dim)) + ":" + c.label;
}

std::string pair_name(const Model& m, int a, int b) {
  return full_name(m.cells()[a]) + " x " + full_name(m.cells()[b]);
}

std::optional<AttentionProblem> realize(const Choice& c, double g) {
  if (c.head_dim < 1 || c.batch < 1 || c.heads < 1 || c.kv_heads < 1 ||
      c.q_len < 1 || c.kv_len < 1 || c.heads % c.kv_heads != 0)
    return std::nullopt;
  AttentionProblem p =
      attention_shape(c.batch, c.heads, c.q_len, c.kv_len, c.head_dim, g);
  p.kv_heads = c.kv_heads == c.heads ? 0 : c.kv_heads;
  std::vector<int64_t> full(static_cast<size_t>(c.batch), c.kv_len);
  switch (c.mask) {
    case MaskKind::kNone:
      break;
    case MaskKind::kCausal:
      p.mask.causal = true;
      break;
    case MaskKind::kPadNone:
      p.mask.key_lengths = full;
      break;
    case MaskKind::kPadOne:
      if (c.kv_len < 2) return std::nullopt;  // that would pad every key
      full[0] = c.kv_len - 1;
      p.mask.key_lengths = full;
      break;
    case MaskKind::kPadAll:
      full[0] = 0;
      p.mask.key_lengths = full;
      break;
    case MaskKind::kPadRun:
      if (c.kv_len <= kLongRun) return std::nullopt;  // no key left to see
      full[0] = c.kv_len - kLongRun;
      p.mask.key_lengths = full;
      break;
  }
  return p;
}

bool judged_sampled(const AttentionProblem& p) {
  const int64_t elements =
      p.batch * (p.heads * p.q_len + resolved_kv(p) * p.kv_len) * p.head_dim;
  return p.batch * p.heads * p.q_len * p.kv_len >= kSampledPairs ||
         elements >= kSampledElements;
}

double cost(const AttentionProblem& p) {
  // Measured with qknorm-check --json's case costs (all 21 entries with
  // their oracles and naive baselines, shared out over the 21; 2-core Zen
  // 4 under load, scaled to a quiet machine): 1x1x5x5x1 ~1 ms in all;
  // 1x1x768x2048xD 7.0 s at D = 1 and 16.3 s at D = 8 (the per-pair
  // softmax work is worth about 5 dimensions), of which the entries 1.7 s;
  // sampled (--sample 64) 1.4 s, of which the entries 1.0 s (no
  // long-double oracle, no naive baseline: the double pass only).
  // Per output element (B H Nq D + B Hk Nk D: encoding, running, decoding
  // and judging it, the oracle's and the naive baseline's share of its
  // preparation): 1x1x1x2049x576, 1.2 M elements, 5.5 CPU s for the 21
  // entries judged in full, 2.1 s sampled (kSampledElements). The element
  // term is 85% of the covering cases' cost: without it the array paired
  // head_dim 576 with batch 3 and 384 query rows as if it were free. The
  // constants are the ones whose array measured cheapest (--covering, CPU
  // seconds of the whole run, the same load): 108 s against 127 s without
  // the element term and 133 s with a least-squares fit of the per-case
  // costs (5e-5 / 5e-4 s per case, 2.5e-7 / 1.3e-7 s per element), whose
  // array traded elements for sampled pairs (3.7e8 B H Nq Nk D against
  // 2.2e8) that cost more than the fit said.
  constexpr double kCaseSeconds = 2.5e-4, kSampledCaseSeconds = 2.5e-4;
  constexpr double kElementSeconds = 2.2e-7, kSampledElementSeconds = 8.5e-8;
  constexpr double kEntrySeconds = 1.2e-9, kFullOracleSeconds = 6e-9,
                   kSampledOracleSeconds = 0.55e-9;  // per pair and (D + 5)
  constexpr double kPairDims = 5;
  const double pairs =
      static_cast<double>(p.batch) * p.heads * p.q_len * p.kv_len;
  const double elements = static_cast<double>(p.batch) *
                          (p.heads * p.q_len + resolved_kv(p) * p.kv_len) *
                          p.head_dim;
  const bool sampled = judged_sampled(p);
  return (sampled ? kSampledCaseSeconds : kCaseSeconds) +
         elements * (sampled ? kSampledElementSeconds : kElementSeconds) +
         pairs * (p.head_dim + kPairDims) *
             (kEntrySeconds +
              (sampled ? kSampledOracleSeconds : kFullOracleSeconds));
}

unsigned needs_of(const AttentionProblem& p) {
  unsigned n = kNeedNothing;
  if (resolved_kv(p) != p.heads) n |= kNeedGqa;
  if (p.mask.causal || !p.mask.key_lengths.empty()) n |= kNeedMask;
  return n;
}

Bits Model::Impl::head_dim_bits(int64_t d) const {
  Bits b;
  if (d == 1) b.set(hd_one);
  if (d > 1 && d % 2 == 1) b.set(hd_odd);
  for (const auto& [v, c] : head_dim)
    if (v == d) b.set(c);
  return b;
}

Bits Model::Impl::batch_bits(int64_t n) const {
  Bits b;
  if (n == 1) b.set(b_one);
  if (n == 2) b.set(b_two);
  if (n >= many_from) b.set(b_many);
  return b;
}

Bits Model::Impl::heads_bits(int64_t h, int64_t kv) const {
  Bits b;
  if (kv == h) {
    b.set(h_mha);
    return b;
  }
  const int64_t ratio = h / kv;
  if (ratio == 2) b.set(h_r2);
  if (ratio >= 3 && ratio <= 7 && (ratio & (ratio - 1)) != 0) b.set(h_r3_7);
  if (ratio == 4) b.set(h_r4);
  if (ratio == 8) b.set(h_r8);
  if (kv == 1) b.set(h_mqa);
  return b;
}

Bits Model::Impl::length_bits(int64_t len, bool kv) const {
  Bits b;
  for (const Residue& r : residues)
    if (len >= r.b - 1 && len % r.b == r.r) b.set(kv ? r.kv : r.q);
  if (!kv && len == 1) b.set(q_one);
  if (!kv && len >= 2 && len <= kDecodeMax) b.set(q_small);
  if (kv && len >= kLongKv) b.set(kv_long);
  return b;
}

Bits Model::Impl::mask_bits(const AttentionProblem& p) const {
  Bits b;
  const Mask& m = p.mask;
  const int64_t q = p.q_len, kv = p.kv_len;
  if (!m.causal && m.key_lengths.empty()) {
    b.set(m_none);
    return b;
  }
  if (m.causal) b.set(q < kv ? m_lt : q > kv ? m_gt : m_eq);
  bool masked_row = false, long_run = false;
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const int64_t L =
        m.key_lengths.empty() ? kv : m.key_lengths[static_cast<size_t>(bi)];
    if (!m.key_lengths.empty()) {
      if (L == kv) b.set(m_pad0);
      if (L == kv - 1) b.set(m_pad1);
      if (L == 0) b.set(m_padall);
    }
    // Every row sees a prefix [0, e) of the keys (attention.h): e =
    // min(L, i + kv - q + 1) under causal. A row with e <= 0 is fully
    // masked; the row with the smallest e >= 1 has the longest masked run,
    // kv - e keys.
    const int64_t top = m.causal ? std::min(L, kv - q + 1) : L;
    if (top <= 0) masked_row = true;
    if (L >= 1) {
      const int64_t min_e =
          m.causal ? std::min(L, std::max<int64_t>(1, kv - q + 1)) : L;
      if (kv - min_e >= kLongRun) long_run = true;
    }
  }
  if (masked_row && kv >= kLongRow) b.set(m_rows);
  if (long_run) b.set(m_run);
  return b;
}

Bits Model::Impl::bits(const AttentionProblem& p) const {
  return head_dim_bits(p.head_dim) | batch_bits(p.batch) |
         heads_bits(p.heads, resolved_kv(p)) | length_bits(p.q_len, false) |
         length_bits(p.kv_len, true) | mask_bits(p);
}

Model::Model(const ModelOptions& o) : opt_(o) {
  std::set<int64_t> blocks(std::begin(kStandardBlocks),
                           std::end(kStandardBlocks));
  for (int64_t b : o.block_sizes)
    if (b >= 2) blocks.insert(b);
  blocks_.assign(blocks.begin(), blocks.end());
  auto im = std::make_shared<Impl>();
  auto add = [&](Dim d, std::string label, unsigned needs) {
    cells_.push_back({d, std::move(label), needs});
    return static_cast<int>(cells_.size()) - 1;
  };
  // head_dim
  im->hd_one = add(Dim::kHeadDim, "1", kNeedNothing);
  im->hd_odd = add(Dim::kHeadDim, "odd>1", kNeedNothing);
  for (int64_t d : kHeadDims)
    im->head_dim.push_back({d, add(Dim::kHeadDim, std::to_string(d), 0)});
  // batch: more batch elements than threads leaves some thread two (an
  // entry that splits work by batch only); at least 3.
  im->many_from = std::max(o.threads, 2) + 1;
  im->b_one = add(Dim::kBatch, "1", kNeedNothing);
  im->b_two = add(Dim::kBatch, "2", kNeedNothing);
  im->b_many = add(Dim::kBatch, ">threads", kNeedNothing);
  // heads
  im->h_mha = add(Dim::kHeads, "MHA", kNeedNothing);
  im->h_r2 = add(Dim::kHeads, "ratio 2", kNeedGqa);
  im->h_r3_7 = add(Dim::kHeads, "ratio 3..7", kNeedGqa);
  im->h_r4 = add(Dim::kHeads, "ratio 4", kNeedGqa);
  im->h_r8 = add(Dim::kHeads, "ratio 8", kNeedGqa);
  im->h_mqa = add(Dim::kHeads, "MQA", kNeedGqa);
  // q_len, then kv_len
  im->q_one = add(Dim::kQLen, "1", kNeedNothing);
  im->q_small = add(Dim::kQLen, "2..16", kNeedNothing);
  for (int64_t b : blocks_)
    for (int64_t r : residues_of(b))
      im->residues.push_back(
          {b, r, add(Dim::kQLen, residue_label(b, r), 0), -1});
  for (Impl::Residue& r : im->residues)
    r.kv = add(Dim::kKvLen, residue_label(r.b, r.r), kNeedNothing);
  im->kv_long = add(Dim::kKvLen, "long", kNeedNothing);
  // mask
  im->m_none = add(Dim::kMask, "none", kNeedNothing);
  im->m_lt = add(Dim::kMask, "causal q<kv", kNeedMask);
  im->m_gt = add(Dim::kMask, "causal q>kv", kNeedMask);
  im->m_eq = add(Dim::kMask, "causal q=kv", kNeedMask);
  im->m_pad0 = add(Dim::kMask, "pad 0 keys", kNeedMask);
  im->m_pad1 = add(Dim::kMask, "pad 1 key", kNeedMask);
  im->m_padall = add(Dim::kMask, "pad all keys", kNeedMask);
  im->m_rows = add(Dim::kMask, "masked rows in long rows", kNeedMask);
  im->m_run = add(Dim::kMask, "long masked run", kNeedMask);
  if (cells_.size() > static_cast<size_t>(kMaxCells))
    throw std::invalid_argument("coverage: too many declared blocks");

  // Candidates. head_dim: every listed value, 1 and the smallest odd.
  cand_.head_dims = {1, kOddHeadDim};
  cand_.head_dims.insert(cand_.head_dims.end(), std::begin(kHeadDims),
                         std::end(kHeadDims));
  cand_.batches = {1, 2, im->many_from};
  // (heads, kv_heads): 2:1 is ratio 2 and MQA; 6:2 a non-power ratio with
  // two kv heads (a wrong query-to-kv-head map shows only there); 4:1, 8:1.
  cand_.heads = {{1, 1}, {2, 1}, {6, 2}, {4, 1}, {8, 1}};
  // Lengths: per residue cell the smallest length and the smallest long
  // one; 1 and 2 (decode); 255..257, which reach -1, +1 and 0 of every
  // standard block at once; 2049 (causal q > kv long).
  std::set<int64_t> lens = {1,   2,           255,     256,
                            257, kLongKv - 1, kLongKv, kLongKv + 1};
  for (const Impl::Residue& r : im->residues) {
    lens.insert(smallest_at(std::max<int64_t>(r.b - 1, 1), r.b, r.r));
    lens.insert(smallest_at(kLongKv, r.b, r.r));
  }
  cand_.q_lens.assign(lens.begin(), lens.end());
  cand_.kv_lens = cand_.q_lens;
  cand_.masks = {MaskKind::kNone,   MaskKind::kCausal, MaskKind::kPadNone,
                 MaskKind::kPadOne, MaskKind::kPadAll, MaskKind::kPadRun};

  // The (q_len, kv_len, mask) choices, cheapest first.
  for (int64_t q : cand_.q_lens)
    for (int64_t kv : cand_.kv_lens)
      for (MaskKind mk : cand_.masks) {
        // kv_len 1 reaches no kv_len cell, and with one key the softmax
        // has no gradient: dQ is 0 whatever a kernel computes, so such a
        // case cannot catch a dQ bug in the cells it reaches (the budgeted
        // array's cheapest rows left the dQ shape mutants untriggered).
        // Only the pair q_len 1 x causal q = kv needs it.
        if (kv == 1 && (q != 1 || mk != MaskKind::kCausal)) continue;
        Choice c;
        c.q_len = q, c.kv_len = kv, c.mask = mk;
        const std::optional<AttentionProblem> p1 = realize(c, 1);
        if (!p1) continue;
        c.batch = 2;
        const AttentionProblem p2 = *realize(c, 1);
        im->triples.push_back(
            {q, kv, mk,
             im->length_bits(q, false) | im->length_bits(kv, true) |
                 im->mask_bits(*p1),
             im->length_bits(q, false) | im->length_bits(kv, true) |
                 im->mask_bits(p2),
             mask_needs(mk)});
      }
  std::stable_sort(im->triples.begin(), im->triples.end(),
                   [](const Impl::Triple& a, const Impl::Triple& b) {
                     return a.q * a.kv < b.q * b.kv;
                   });

  // Feasibility by construction: a pair is feasible iff some choice of
  // candidates reaches both cells. head_dim, batch and heads cells are
  // independent of each other and of the lengths and mask (every
  // combination of their candidates realizes), so only pairs of two
  // (q_len, kv_len, mask) cells can be infeasible: those decide on the
  // triples (at batch 2, which reaches a superset of batch 1's cells).
  const size_t n = cells_.size();
  im->pair_ok.assign(n, Bits());
  Bits free_dims;  // head_dim, batch, heads cells
  for (size_t c = 0; c < n; ++c)
    if (cells_[c].dim == Dim::kHeadDim || cells_[c].dim == Dim::kBatch ||
        cells_[c].dim == Dim::kHeads)
      free_dims.set(c);
  Bits t_any;
  for (const Impl::Triple& t : im->triples) {
    t_any |= t.bits2;
    for (size_t c = 0; c < n; ++c)
      if (t.bits2.test(c)) im->pair_ok[c] |= t.bits2;
  }
  im->single_ok = free_dims | t_any;
  for (size_t c = 0; c < n; ++c) {
    if (free_dims.test(c)) {
      im->pair_ok[c] |= free_dims | t_any;
    } else if (t_any.test(c)) {
      im->pair_ok[c] |= free_dims;
    }
  }
  for (size_t a = 0; a < n; ++a)
    for (size_t b = a + 1; b < n; ++b) {
      if (cells_[a].dim == cells_[b].dim) continue;
      (im->pair_ok[a].test(b) ? im->feasible : im->infeasible)
          .push_back({static_cast<int>(a), static_cast<int>(b)});
    }
  impl_ = std::move(im);
}

int Model::index(Dim d, std::string_view label) const {
  for (size_t i = 0; i < cells_.size(); ++i)
    if (cells_[i].dim == d && cells_[i].label == label)
      return static_cast<int>(i);
  return -1;
}

std::vector<int> Model::reached(const AttentionProblem& p) const {
  const Bits b = impl_->bits(p);
  std::vector<int> r;
  for (size_t i = 0; i < cells_.size(); ++i)
    if (b.test(i)) r.push_back(static_cast<int>(i));
  return r;
}

bool Model::feasible(int c) const { return impl_->single_ok.test(c); }
bool Model::feasible(int a, int b) const {
  return cells_[a].dim != cells_[b].dim && impl_->pair_ok[a].test(b);
}
const std::vector<std::pair<int, int>>& Model::feasible_pairs() const {
  return impl_->feasible;
}
const std::vector<std::pair<int, int>>& Model::infeasible_pairs() const {
  return impl_->infeasible;
}

unsigned supported_needs(const Backend& entry) {
  unsigned n = kNeedNothing;
  AttentionProblem p = attention_shape(1, 2, 16, 16, 16, 1);
  p.kv_heads = 1;
  if (entry.supports(p)) n |= kNeedGqa;
  p.kv_heads = 0;
  p.mask.causal = true;
  p.mask.key_lengths = {15};
  if (entry.supports(p)) n |= kNeedMask;
  return n;
}

std::vector<int64_t> declared_blocks(const Backend& entry) {
  // Blocks may depend on the problem (blas: its query block shrinks as
  // kv_len grows; causal tiles): probed at each power of two up to the
  // model's long kv_len, with and without a causal mask.
  std::set<int64_t> out;
  for (int64_t n = 1; n <= kLongKv; n *= 2)
    for (bool causal : {false, true}) {
      AttentionProblem p = attention_shape(1, 1, n, n, 64, 1);
      p.mask.causal = causal;
      for (int64_t b : entry.block_sizes(p))
        if (b >= 2) out.insert(b);
    }
  return {out.begin(), out.end()};
}

Model model_for(const Backend& entry, int threads) {
  ModelOptions o;
  o.block_sizes = declared_blocks(entry);
  o.threads = threads;
  return Model(o);
}

Tally::Tally(const Model& m, unsigned supported_needs)
    : m_(&m),
      needs_(supported_needs),
      single_(m.cells().size(), 0),
      pair_(m.cells().size(), std::vector<char>(m.cells().size(), 0)) {}

void Tally::add(const AttentionProblem& p) {
  const std::vector<int> r = m_->reached(p);
  for (size_t i = 0; i < r.size(); ++i) {
    single_[r[i]] = 1;
    for (size_t j = i + 1; j < r.size(); ++j) pair_[r[i]][r[j]] = 1;
  }
}

int Tally::singles_feasible() const {
  int n = 0;
  for (size_t c = 0; c < single_.size(); ++c)
    n += within(static_cast<int>(c)) && m_->feasible(static_cast<int>(c));
  return n;
}
int Tally::singles_reached() const {
  int n = 0;
  for (size_t c = 0; c < single_.size(); ++c)
    n += within(static_cast<int>(c)) && m_->feasible(static_cast<int>(c)) &&
         single_[c];
  return n;
}
int Tally::pairs_feasible() const {
  int n = 0;
  for (const auto& [a, b] : m_->feasible_pairs()) n += within(a) && within(b);
  return n;
}
int Tally::pairs_reached() const {
  int n = 0;
  for (const auto& [a, b] : m_->feasible_pairs())
    n += within(a) && within(b) && pair_[a][b];
  return n;
}
std::vector<int> Tally::unreached_singles() const {
  std::vector<int> r;
  for (size_t c = 0; c < single_.size(); ++c)
    if (within(static_cast<int>(c)) && m_->feasible(static_cast<int>(c)) &&
        !single_[c])
      r.push_back(static_cast<int>(c));
  return r;
}
std::vector<std::pair<int, int>> Tally::unreached_pairs() const {
  std::vector<std::pair<int, int>> r;
  for (const auto& [a, b] : m_->feasible_pairs())
    if (within(a) && within(b) && !pair_[a][b]) r.push_back({a, b});
  return r;
}

std::string Tally::summary() const {
  return "singles " + std::to_string(singles_reached()) + "/" +
         std::to_string(singles_feasible()) + ", pairs " +
         std::to_string(pairs_reached()) + "/" +
         std::to_string(pairs_feasible());
}

}  // namespace qknorm::validation::coverage
