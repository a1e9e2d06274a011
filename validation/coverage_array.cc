// The covering array (coverage.h): a cost-aware greedy, deterministic.
//
// For each set of needs N in the order {}, {GQA}, {mask}, {GQA, mask}, the
// items (feasible singles and pairs) whose needs are within N and that the
// rows built so far within N do not reach are covered by new rows within N:
// so an entry that supports the needs N gets, among its cases, every item
// within N. Each new row starts from the most costly uncovered item (its
// cheapest realization: big rows first, so that they carry many cheap items
// along), then improves, one dimension at a time (lengths and mask as one),
// the items it newly reaches per second of estimated cost (coverage::cost),
// with the seed item kept. Ties go to the cheaper value, then to the earlier
// candidate: no randomness.
#include <algorithm>
#include <limits>
#include <optional>

#include "validation/coverage.h"
#include "validation/coverage_internal.h"

namespace qknorm::validation::coverage {
namespace {

struct Row {
  size_t d = 0, b = 0, h = 0, t = 0;  // candidate indices
};

class Builder {
 public:
  // cap: no pair whose cheapest row costs more, no row costing more (but a
  // single's cheapest); infinity: the full array.
  Builder(const Model& m, double g, double cap)
      : m_(m), im_(m.impl()), g_(g), cap_(cap) {
    const Candidates& c = m.candidates();
    for (int64_t d : c.head_dims) d_bits_.push_back(im_.head_dim_bits(d));
    for (int64_t b : c.batches) b_bits_.push_back(im_.batch_bits(b));
    for (const auto& [h, kv] : c.heads)
      h_bits_.push_back(im_.heads_bits(h, kv));
    for (size_t c = 0; c < m.cells().size(); ++c) {
      const Dim d = m.cells()[c].dim;
      if (d == Dim::kHeadDim) d_all_.set(c);
      if (d == Dim::kBatch) b_all_.set(c);
      if (d == Dim::kHeads) h_all_.set(c);
    }
    free_ = d_all_ | b_all_ | h_all_;
  }

  // The cost() of the cheapest row reaching item (cells) within the item's
  // own needs; -1 if none.
  double item_cost(const Bits& item) {
    const size_t a = item._Find_first(), b = item._Find_next(a);
    const size_t n = m_.cells().size();
    if (item_cost_.empty()) item_cost_.assign(n * n, -2);
    double& memo = item_cost_[a * n + (b < kMaxCells ? b : a)];
    if (memo == -2) memo = compute_item_cost(item);
    return memo;
  }
  double compute_item_cost(const Bits& item) {
    const unsigned saved = needs_;
    needs_ = kNeedNothing;
    for (size_t c = item._Find_first(); c < kMaxCells; c = item._Find_next(c))
      needs_ |= m_.cells()[c].needs;
    const std::optional<Row> r = cheapest(item);
    needs_ = saved;
    return r ? row_cost(*r) : -1;
  }
  bool in_budget(size_t a, size_t b) {
    return cap_ == std::numeric_limits<double>::infinity() ||
           pair_in_budget(m_, static_cast<int>(a), static_cast<int>(b),
                          item_cost(Bits().set(a).set(b)), cap_);
  }

  std::vector<AttentionProblem> build() {
    const size_t n = m_.cells().size();
    for (unsigned needs :
         {unsigned{kNeedNothing}, unsigned{kNeedGqa}, unsigned{kNeedMask},
          unsigned{kNeedGqa | kNeedMask}}) {
      needs_ = needs;
      // The items within N, less what the rows within N already reach.
      unc_single_.reset();
      unc_pair_.assign(n, Bits());
      for (size_t c = 0; c < n; ++c)
        if (within(m_.cells()[c].needs) && m_.feasible(static_cast<int>(c)))
          unc_single_.set(c);
      for (const auto& [a, b] : m_.feasible_pairs())
        if (within(m_.needs(a, b)) && in_budget(a, b)) {
          unc_pair_[a].set(b);
          unc_pair_[b].set(a);
        }
      for (const auto& [row, bits] : rows_)
        if (within(row_needs(row))) cover(bits);
      order_seeds();
      while (true) {
        const std::optional<Row> r = next_row();
        if (!r) break;
        rows_.push_back({*r, bits(*r)});
        cover(rows_.back().second);
      }
    }
    prune();
    std::vector<AttentionProblem> out;
    for (const auto& [row, bits] : rows_)
      out.push_back(*realize(choice(row), g_));
    return out;
  }

 private:
  bool within(unsigned needs) const { return (needs & ~needs_) == 0; }

  Choice choice(const Row& r) const {
    const Candidates& c = m_.candidates();
    const Model::Impl::Triple& t = im_.triples[r.t];
    Choice ch;
    ch.head_dim = c.head_dims[r.d];
    ch.batch = c.batches[r.b];
    ch.heads = c.heads[r.h].first;
    ch.kv_heads = c.heads[r.h].second;
    ch.q_len = t.q, ch.kv_len = t.kv, ch.mask = t.mask;
    return ch;
  }
  unsigned row_needs(const Row& r) const {
    const auto& [h, kv] = m_.candidates().heads[r.h];
    return heads_needs(h, kv) | im_.triples[r.t].needs;
  }
  Bits bits(const Row& r) const {
    const Model::Impl::Triple& t = im_.triples[r.t];
    return d_bits_[r.d] | b_bits_[r.b] | h_bits_[r.h] |
           (m_.candidates().batches[r.b] >= 2 ? t.bits2 : t.bits1);
  }
  double row_cost(const Row& r) const {
    const Candidates& c = m_.candidates();
    const Model::Impl::Triple& t = im_.triples[r.t];
    AttentionProblem p;
    p.batch = c.batches[r.b];
    p.heads = c.heads[r.h].first;
    p.q_len = t.q, p.kv_len = t.kv, p.head_dim = c.head_dims[r.d];
    return cost(p);
  }
  // Uncovered items a row reaching `r` would cover.
  int gain(const Bits& r) const {
    int g = static_cast<int>((unc_single_ & r).count());
    for (size_t c = r._Find_first(); c < r.size(); c = r._Find_next(c))
      g += static_cast<int>((unc_pair_[c] & r).count());
    return g;  // pairs counted twice: a pair weighs twice a single
  }
  void cover(const Bits& r) {
    unc_single_ &= ~r;
    for (size_t c = r._Find_first(); c < r.size(); c = r._Find_next(c))
      unc_pair_[c] &= ~r;
  }
  bool allowed(const Row& r) const { return within(row_needs(r)); }

  // Drops the rows (costliest first) whose every item another row within
  // the item's needs reaches too: the greedy's early rows are often
  // overtaken by later ones.
  void prune() {
    const size_t n = m_.cells().size();
    // count[a][b]: rows within the pair's needs reaching it ([a][a]: the
    // single). A row counts for an item iff its needs are within the
    // item's: the item's own needs set is the one with the fewest rows.
    std::vector<std::vector<int>> count(n, std::vector<int>(n, 0));
    auto item_needs = [&](size_t a, size_t b) {
      return m_.cells()[a].needs | m_.cells()[b].needs;
    };
    auto each = [&](size_t r, auto f) {
      const Bits& bits = rows_[r].second;
      const unsigned rn = row_needs(rows_[r].first);
      for (size_t a = bits._Find_first(); a < kMaxCells; a = bits._Find_next(a))
        for (size_t b = a; b < kMaxCells; b = bits._Find_next(b))
          if ((a == b || m_.cells()[a].dim != m_.cells()[b].dim) &&
              (rn & ~item_needs(a, b)) == 0)
            f(a, b);
    };
    for (size_t r = 0; r < rows_.size(); ++r)
      each(r, [&](size_t a, size_t b) { ++count[a][b]; });
    std::vector<size_t> order(rows_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return row_cost(rows_[x].first) > row_cost(rows_[y].first);
    });
    std::vector<char> keep(rows_.size(), 1);
    for (size_t r : order) {
      bool needed = false;
      each(r, [&](size_t a, size_t b) { needed |= count[a][b] < 2; });
      if (needed) continue;
      keep[r] = 0;
      each(r, [&](size_t a, size_t b) { --count[a][b]; });
    }
    std::vector<std::pair<Row, Bits>> kept;
    for (size_t r = 0; r < rows_.size(); ++r)
      if (keep[r]) kept.push_back(rows_[r]);
    rows_ = std::move(kept);
  }

  // The cheapest allowed row reaching `seed` (cells), if any. The cost
  // grows with each dimension's value alone, so each dimension takes its
  // cheapest candidate reaching the seed's cells of it (candidates are
  // ascending, triples cheapest first).
  std::optional<Row> cheapest(const Bits& seed) const {
    Row r;
    auto first = [&](const std::vector<Bits>& v, size_t* at) {
      for (*at = 0; *at < v.size(); ++*at)
        if (((seed & dbh_mask(v)) & ~v[*at]).none()) return true;
      return false;
    };
    if (!first(d_bits_, &r.d) || !first(b_bits_, &r.b)) return std::nullopt;
    // A head_dim the seed leaves free is never 1: at D = 1 the normalized q
    // and k are +-1, so dQ and dK are 0 whatever a kernel computes, and a
    // length or mask cell reached only there would test neither (the
    // half-block dQ tail mutant went UNTRIGGERED on such rows).
    while (!free_d_ok(r.d, seed) || ((seed & d_all_) & ~d_bits_[r.d]).any())
      if (++r.d == d_bits_.size()) return std::nullopt;
    for (r.h = 0; r.h < h_bits_.size(); ++r.h) {
      const auto& [h, kv] = m_.candidates().heads[r.h];
      if (within(heads_needs(h, kv)) &&
          ((seed & h_all_) & ~h_bits_[r.h]).none())
        break;
    }
    if (r.h == h_bits_.size()) return std::nullopt;
    const Bits t_seed = seed & ~free_;
    std::optional<Row> best;
    // Batch 1 if the seed does not fix it; a cell only a batch >= 2 reaches
    // (padding of 0 keys beside a padded element) may need batch 2.
    for (size_t b = r.b; b < b_bits_.size(); ++b) {
      if ((seed & b_all_).any() && b != r.b) break;
      Row x = r;
      x.b = b;
      const bool two = m_.candidates().batches[b] >= 2;
      for (x.t = 0; x.t < im_.triples.size(); ++x.t) {
        const Model::Impl::Triple& t = im_.triples[x.t];
        if (within(t.needs) && (t_seed & ~(two ? t.bits2 : t.bits1)).none())
          break;
      }
      if (x.t == im_.triples.size()) continue;
      if (!best || row_cost(x) < row_cost(*best)) best = x;
    }
    return best;
  }
  // Whether head_dim candidate d may serve `seed`: not D = 1 unless the seed
  // holds the head_dim-1 cell (cheapest's comment says why).
  bool free_d_ok(size_t d, const Bits& seed) const {
    return m_.candidates().head_dims[d] != 1 ||
           (im_.hd_one >= 0 && seed.test(static_cast<size_t>(im_.hd_one)));
  }
  const Bits& dbh_mask(const std::vector<Bits>& v) const {
    return &v == &d_bits_ ? d_all_ : &v == &b_bits_ ? b_all_ : h_all_;
  }

  // The items within N not reached yet, costliest cheapest row first.
  void order_seeds() {
    seeds_.clear();
    const size_t n = m_.cells().size();
    for (size_t a = 0; a < n; ++a) {
      if (unc_single_.test(a)) seeds_.push_back({Bits().set(a), 0, false});
      for (size_t b = unc_pair_[a]._Find_next(a); b < kMaxCells;
           b = unc_pair_[a]._Find_next(b))
        seeds_.push_back({Bits().set(a).set(b), 0, false});
    }
    for (Seed& s : seeds_) {
      const std::optional<Row> r = cheapest(s.cells);
      s.cost = r ? row_cost(*r) : -1;  // -1: none within N (cannot be)
    }
    // Lengths and mask items first: their rows keep the smallest head_dim
    // above 1, batch 1 and MHA (a long row with a large head_dim would cost its
    // D), then the rest, each costliest first.
    for (Seed& s : seeds_) s.lengths_only = (s.cells & free_).none();
    std::stable_sort(seeds_.begin(), seeds_.end(),
                     [](const Seed& a, const Seed& b) {
                       if (a.lengths_only != b.lengths_only)
                         return a.lengths_only;
                       return a.cost > b.cost;
                     });
    next_seed_ = 0;
  }
  bool uncovered(const Bits& item) const {
    const size_t a = item._Find_first(), b = item._Find_next(a);
    return b >= kMaxCells ? unc_single_.test(a) : unc_pair_[a].test(b);
  }

  std::optional<Row> next_row() {
    while (next_seed_ < seeds_.size() && (seeds_[next_seed_].cost < 0 ||
                                          !uncovered(seeds_[next_seed_].cells)))
      ++next_seed_;
    if (next_seed_ == seeds_.size()) return std::nullopt;
    const Bits seed = seeds_[next_seed_].cells;
    Row best = *cheapest(seed);
    const Bits t_seed = seed & ~free_;
    double best_score = gain(bits(best)) / row_cost(best);
    const double cap = std::max(cap_, row_cost(best));
    auto try_row = [&](const Row& r) {
      if (!allowed(r)) return;
      const Bits rb = bits(r);
      if ((seed & ~rb).any()) return;
      const double c = row_cost(r), s = gain(rb) / c;
      if (c > cap) return;
      if (s > best_score || (s == best_score && c < row_cost(best)))
        best_score = s, best = r;
    };
    for (int pass = 0; pass < 2; ++pass) {
      Row r = best;
      for (r.t = 0; r.t < im_.triples.size(); ++r.t)
        if ((t_seed & ~im_.triples[r.t].bits2).none()) try_row(r);
      if (seeds_[next_seed_].lengths_only) continue;
      r = best;
      for (r.d = 0; r.d < d_bits_.size(); ++r.d)
        if (free_d_ok(r.d, seed)) try_row(r);
      r = best;
      for (r.b = 0; r.b < b_bits_.size(); ++r.b) try_row(r);
      r = best;
      for (r.h = 0; r.h < h_bits_.size(); ++r.h) try_row(r);
    }
    return best;
  }

  struct Seed {
    Bits cells;
    double cost;
    bool lengths_only = false;  // cells of q_len, kv_len and mask only
  };
  const Model& m_;
  const Model::Impl& im_;
  double g_;
  double cap_;
  std::vector<double> item_cost_;  // [a * cells + b], -2: not yet
  unsigned needs_ = kNeedNothing;
  std::vector<Bits> d_bits_, b_bits_, h_bits_;
  Bits free_, d_all_, b_all_, h_all_;  // head_dim, batch, heads cells
  std::vector<Seed> seeds_;
  size_t next_seed_ = 0;
  Bits unc_single_;
  std::vector<Bits> unc_pair_;
  std::vector<std::pair<Row, Bits>> rows_;
};

}  // namespace

std::vector<AttentionProblem> covering_array(const Model& m, double g) {
  return Builder(m, g, std::numeric_limits<double>::infinity()).build();
}

bool anchor_pair(const Model& m, int a, int b) {
  const int hd = m.index(Dim::kHeadDim, "256"), b2 = m.index(Dim::kBatch, "2");
  return std::minmax(a, b) == std::minmax(hd, b2);
}

bool pair_in_budget(const Model& m, int a, int b, double cost, double cap) {
  return cost <= cap || anchor_pair(m, a, b);
}

double cheapest_cost(const Model& m, int a, int b) {
  Builder builder(m, 1, std::numeric_limits<double>::infinity());
  return builder.item_cost(Bits().set(a).set(b));
}

std::vector<double> pair_costs(const Model& m) {
  Builder builder(m, 1, std::numeric_limits<double>::infinity());
  std::vector<double> out;
  out.reserve(m.feasible_pairs().size());
  for (const auto& [a, b] : m.feasible_pairs())
    out.push_back(builder.item_cost(Bits().set(a).set(b)));
  return out;
}

double total_cost(const std::vector<AttentionProblem>& cases) {
  double t = 0;
  for (const AttentionProblem& p : cases) t += cost(p);
  return t;
}

BudgetedArray budgeted_covering_array(const Model& m, double g, double budget,
                                      double cap) {
  // One build at the named cap for the default run's model; a model with
  // more blocks (a plug-in's) whose array at that cap exceeds the budget
  // gets a lower cap, kCapStep at a time (each build ~0.3 s).
  BudgetedArray out;
  for (;; cap *= kCapStep) {
    out.cases = Builder(m, g, cap).build();
    out.case_cap = cap;
    out.cost = total_cost(out.cases);
    if (out.cost <= budget || cap < kMinCap) return out;
  }
}

}  // namespace qknorm::validation::coverage
