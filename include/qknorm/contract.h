// Compute contracts (issue 31): the formats in which an entry rounds the
// intermediates of its attention, as rounding points. The rule
// (validation/rule.h, THE VERDICT) derives each bound from these points: a
// point the entry rounds more coarsely than its compute format adds that
// format's unit roundoff (and its absolute resolution) to the channels the
// intermediate reaches.
//
// The points, with their keys in describe() / parse_contract():
//   q        q as the logits' dot product reads it (q_hat times whatever
//            scale the kernel folds into it);
//   kv       k_hat and v as the cache stores them (after the norm and the
//            weight);
//   logits   the logits S;
//   p        the probabilities P before P.V;
//   pv_acc   the P.V accumulator of O;
//   out      O before it is stored (then rounded to the storage format);
//   compute  every other intermediate: the arithmetic of the norm, the dot
//            products, the softmax and every backward operation. It is the
//            rule's u_c.
// A point's value: a format (f64, f32, bf16, f16), `storage` (the entry's
// storage format) or `compute` (unset: the compute format of the entry's
// precision, compute_format(): f32 for f32/bf16/f16 entries, f64 for f64).
// A point finer than the compute format costs nothing (the kernel's
// arithmetic is in the compute format anyway).
//
// Presets:
//   f32-accumulate  every point unset: the suite's f32-compute rule (the
//                   default; its tables are the rule's tables of issue 15);
//   storage         every point, compute included, in the storage format:
//                   eager 16-bit PyTorch, which rounds every op's result to
//                   bf16 (compare's former `--compute storage`: u_c := u_s).
// A spec is a comma-separated list: an optional preset first, then
// key=value items that override it, e.g. "pv_acc=f16",
// "q=f16,kv=f16,p=f16", "storage,out=f32".
#ifndef QKNORM_CONTRACT_H_
#define QKNORM_CONTRACT_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "qknorm/precision.h"

namespace qknorm {

enum class RoundingPoint { kQ, kKv, kLogits, kP, kPvAcc, kOut, kCompute };
inline constexpr int kRoundingPoints = 7;
// "q", "kv", "logits", "p", "pv_acc", "out", "compute".
std::string_view key(RoundingPoint r);

// A point's declared format.
enum class PointFormat : uint8_t {
  kCompute,
  kStorage,
  kF64,
  kF32,
  kBF16,
  kF16
};

struct ComputeContract {
  std::array<PointFormat, kRoundingPoints> at{};  // all kCompute

  static ComputeContract f32_accumulate() { return {}; }
  static ComputeContract storage();

  PointFormat& operator[](RoundingPoint r) { return at[static_cast<int>(r)]; }
  PointFormat operator[](RoundingPoint r) const {
    return at[static_cast<int>(r)];
  }
  bool is_default() const { return *this == ComputeContract{}; }
  // The format point r rounds to for an entry of storage precision s.
  Precision format(RoundingPoint r, Precision s) const;
  // "f32-accumulate", "storage", or the set points "q=f16,pv_acc=f16"
  // (parse_contract(describe()) gives the same contract).
  std::string describe() const;
  bool operator==(const ComputeContract&) const = default;
};

// Parses a preset name or a spec (above). On failure returns false and sets
// *error (when given) to what is wrong.
bool parse_contract(std::string_view spec, ComputeContract* out,
                    std::string* error = nullptr);

}  // namespace qknorm

#endif  // QKNORM_CONTRACT_H_
