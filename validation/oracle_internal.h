// The oracle's internal pieces shared by its files (oracle_attention.cc,
// oracle_operands.cc): the channel indices, the scratch arrays and the
// channels' path through the weight and the normalization backward.
// Internal to the validation library.
#ifndef QKNORM_VALIDATION_ORACLE_INTERNAL_H_
#define QKNORM_VALIDATION_ORACLE_INTERNAL_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "validation/field.h"
#include "validation/operands.h"
#include "validation/oracle.h"

namespace qknorm::validation {

// The channels' indices in the oracle's per-channel arrays (Channel,
// validation/field.h).
inline constexpr size_t kMag = at(Channel::kMagnitude),
                        kOAbs = at(Channel::kStoredOAbs),
                        kSub = at(Channel::kSubnormalCount),
                        kORel = at(Channel::kStoredORel),
                        kSoft = at(Channel::kSoftmaxTerms),
                        kPRes = at(Channel::kPResolution),
                        kShift = at(Channel::kLayerShift),
                        kFlip = at(Channel::kRoundingFlip);
// The last two channels get no per-pair weight (oracle_in adds their terms
// from the operands' shifts and flips).
static_assert(kShift + 1 == kFlip && kFlip + 1 == kChannels,
              "the layer shift and the rounding flip are the last channels");
// Per-channel arrays in the oracle's arithmetic T (indexed by at(Channel)).
template <class T>
using ChannelArraysT = std::array<std::vector<T>, kChannels>;

// The repeated query rows of one kv head (rule.h, "The row normalization
// in the backward"): rows with the same logit operand row x_tilde (in the
// same kv head and the same visible keys: under a causal mask or a window
// the same visible interval, whatever their positions)
// compute the same logits, row sum, log and addition, so their
// normalization errors are one error, not independent ones. Grouped by a
// hash, each hit checked value by value (a group holds identical rows
// only: its dV term sums their dO with signs), in slots of open
// addressing (a power of two, hash 0 empty). The same rows group in a
// sampled key row's sub-case, which holds every query row's x_tilde.
struct RowGroups {
  std::vector<uint64_t> slot_hash;
  std::vector<int32_t> slot_group, row_group, size;
  std::vector<size_t> rep;  // a group's first row (its x_tilde's offset)
  std::vector<int64_t> rep_pos;
  std::vector<unsigned char> done;  // the group's first row was judged
  template <class LD>
  int32_t group_of(const std::vector<LD>& xt, size_t off, int64_t D,
                   int64_t pos) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(pos);
    for (int64_t d = 0; d < D; ++d) {
      const auto x = static_cast<double>(xt[off + static_cast<size_t>(d)]);
      uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      h = (h ^ bits) * 0x100000001b3ULL;
      h ^= h >> 29;
    }
    h += h == 0;
    const size_t mask = slot_hash.size() - 1;
    for (size_t at = h & mask;; at = (at + 1) & mask) {
      if (slot_hash[at] == 0) {
        slot_hash[at] = h;
        slot_group[at] = static_cast<int32_t>(size.size());
        size.push_back(0);
        rep.push_back(off);
        rep_pos.push_back(pos);
        return slot_group[at];
      }
      if (slot_hash[at] != h) continue;
      const auto g = static_cast<size_t>(slot_group[at]);
      bool same = rep_pos[g] == pos;
      for (int64_t d = 0; same && d < D; ++d)
        same = xt[rep[g] + static_cast<size_t>(d)] ==
               xt[off + static_cast<size_t>(d)];
      if (same) return slot_group[at];
    }
  }
};

// The oracle's scratch arrays in its arithmetic T, kept from call to call
// (OracleWorkspace).
template <class T>
struct OracleArrays {
  std::vector<T> q, k, v, d_o, probs, logits, sdp, av, du_q, du_k, ads_q, ads_k,
      adr_q, adr_k, res_q, res_k, flt_q, flt_k;
  std::vector<double> ties;  // a row's terms (row_tie_excess)
  // per k element, the row normalization's shares before the
  // normalization backward (dk_rowmax_e ... dk_norm_rep_e, in that order)
  std::array<std::vector<T>, 6> zk;
  // one kv head's repeated query rows and their groups' sums of dO
  RowGroups groups;
  std::vector<T> group_do;
  OperandMagsT<T> qm, km;
  ChannelArraysT<T> mq, mk;
  // The result of an oracle narrower than long double before it is
  // widened (OracleAttention): kept, so a sub-case allocates it once.
  OracleValues<T> out;
};
// One set per arithmetic the oracle runs in (OraclePrecision).
struct OracleWorkspace::Arrays {
  OracleArrays<LD> ld;
  OracleArrays<double> f64;
  OracleArrays<float> f32;
  template <class T>
  OracleArrays<T>& in();
};
template <>
inline OracleArrays<LD>& OracleWorkspace::Arrays::in<LD>() {
  return ld;
}
template <>
inline OracleArrays<double>& OracleWorkspace::Arrays::in<double>() {
  return f64;
}
template <>
inline OracleArrays<float>& OracleWorkspace::Arrays::in<float>() {
  return f32;
}

// The whole case's operands of a SharedOperands (oracle.h), in the
// arithmetic use_double picked for the whole case (oracle_dispatch.cc).
struct SharedOperands::Impl {
  bool f64 = false;  // which of the two holds the operands
  OperandMagsT<long double> ld[2];
  OperandMagsT<double> dbl[2];
  std::unique_ptr<CosineRows> cosine;
};

// The whole case's side `side` in arithmetic T, or null (none shared, or
// shared in the other arithmetic).
template <class T>
const OperandMagsT<T>* shared_side(const SharedOperands* s, int side) {
  if (s == nullptr) return nullptr;
  if constexpr (std::is_same_v<T, double>) {
    return s->impl->f64 ? &s->impl->dbl[side] : nullptr;
  } else if constexpr (std::is_same_v<T, long double>) {
    return s->impl->f64 ? nullptr : &s->impl->ld[side];
  } else {
    return nullptr;
  }
}

// The oracle in arithmetic T (oracle_attention.cc; float, double and long
// double): the values and channels into r, the scalars that are not T's
// into out; sub: the whole case's operands to slice (SubCaseOf; shared ==
// nullptr: the case's own normalization).
template <class T>
void oracle_in(const AttentionCase& c, const GivenRows* given,
               const RowCounts& counts, const SubCaseOf& sub,
               OracleArrays<T>& a, OracleValues<T>& r, OracleAttention& out);

// One side's channels (ch_in, per element of the logit operand's gradient
// dx_tilde) through the weight and the normalization backward, per
// normalization row, into dst (per element of dq or dk), *dw and *db (the
// side's weight and bias gradients; may be null), and the maxima of
// channels 0-2 into out_max[0..2]; *dws (may be null): LayerNorm's
// shift-weighted weight channels (OracleValues::dq_weight_sh_ch; emptied
// otherwise). du: the signed gradient of x_tilde; ads,
// adr: s sum |dS| times the other side's operand resolution per element,
// resp. per operand row; terms: the number of terms of each dx_tilde sum;
// s: the logit scale's magnitude. The derivations are in
// oracle_operands.cc.
// One magnitude array (per element of dx_tilde) through the same map into
// *out (per element of dq or dk).
template <class T>
void carry_magnitude(const AttentionProblem& p, const OperandMagsT<T>& m,
                     const std::vector<T>& in, std::vector<T>* out);
template <class T>
void carry_side(const AttentionProblem& p, T s, int sd,
                const OperandMagsT<T>& m, ChannelArraysT<T>& ch_in,
                const std::vector<T>& du, const std::vector<T>& ads,
                const std::vector<T>& adr, int64_t terms,
                const std::array<std::vector<T>*, kChannels>& dst,
                ChannelArraysT<T>* dw, ChannelArraysT<T>* db,
                ChannelArraysT<T>* dws, T* out_max);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_ORACLE_INTERNAL_H_
