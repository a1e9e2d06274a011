// Structured input generators on top of make_attention_case /
// make_scalenorm_case (case.h): the hard-to-hit input structures of the
// property suite (issue 5), reproducible from a seed, for any caller (property
// tests, CLI, fuzzers).
//
// Every structure is applied to the q and k operands only (ScaleNorm: x), in
// double, BEFORE round_inputs(): values that must stay exact after rounding
// (parallel rows, duplicates) are built from exact power-of-two multiples, so
// rounding to any storage format commutes with them as long as the values stay
// in the normal range of that format.
#ifndef QKNORM_VALIDATION_GENERATORS_H_
#define QKNORM_VALIDATION_GENERATORS_H_

#include <cstdint>
#include <string>

#include "qknorm/precision.h"
#include "validation/case.h"
#include "validation/rng.h"

namespace qknorm::validation {

// The structures (enum Structure, validation/case.h):
//   kNone.
//   kRowsBelowEps: about a third of the q and k rows rescaled to a norm of
//     eps * 2^-t, t in [1, 10]: strictly inside the clamp region, at least a
//     factor 2 away from the kink ||x|| = eps (where the gradient is
//     discontinuous, so two correct implementations may legitimately pick
//     different branches).
//   kParallelRows: some key rows are exact positive power-of-two multiples
//     of a query row of the same b and of a query head that reads their kv
//     head (GQA: one of its group): their logits are exactly +g (the edge
//     of the non-saturation bound).
//   kAntiParallelRows: as kParallelRows with negative multiples: logits
//     exactly -g.
//   kDuplicatedKeys: some key rows (and their value rows) are copies of
//     another key row: tied logits, tied maxima.
//   kSubnormalEntries: about a quarter of the q and k elements replaced by
//     random subnormals of the storage format `range` (one row in four is
//     entirely subnormal, so it falls in the clamp region for every eps >=
//     the format's min normal).
inline constexpr Structure kAllStructures[] = {
    Structure::kNone,           Structure::kRowsBelowEps,
    Structure::kParallelRows,   Structure::kAntiParallelRows,
    Structure::kDuplicatedKeys, Structure::kSubnormalEntries};
const char* name(Structure s);

// Applies `s` to c's q and k (in place) with Rng(seed), and records it in
// c->structure (its input class may depend on it). `range` is the
// storage format the case will be rounded to (subnormals are that format's).
void apply_structure(AttentionCase* c, Structure s, uint64_t seed,
                     Precision range);
// ScaleNorm: kRowsBelowEps and kSubnormalEntries act on x; the key-row
// structures make some rows exact +-2^k multiples (|k| <= 2) of rows as
// drawn, so no row exceeds 4x a drawn one (the headroom of the draws).
void apply_structure(ScaleNormCase* c, Structure s, uint64_t seed,
                     Precision range);

// Smallest positive subnormal of p: min_normal(p) * 2u(p).
double min_subnormal(Precision p);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_GENERATORS_H_
