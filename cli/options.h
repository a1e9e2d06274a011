// Parsing of the suite options shared by the default run and the sweep
// (shapes, masks, distributions, precisions, entry filters) and building the
// suite they describe. Every malformed value throws qknorm::Error naming the
// option and the rule.
#ifndef QKNORM_CLI_OPTIONS_H_
#define QKNORM_CLI_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cli/suite.h"
#include "qknorm/backend.h"

namespace qknorm::cli {

enum class Covering { kNone, kBudget, kFull };

struct SuiteOptions {
  std::vector<std::string> shapes;     // "BxHxNxD" or "BxHxNqxNkxD"
  std::vector<double> g;               // empty: {g_init(72), 20}
  std::vector<std::string> masks;      // none|causal|pad|causal+pad
  std::vector<std::string> dists;      // validation::name(Distribution)
  std::vector<std::string> scalenorm;  // "ROWSxDIM"
  double eps = kDefaultQKNormEps;
  std::string variant = "qknorm";
  // Formulations (issue 16): presets by name (repeatable; empty: the
  // paper's, or sdpa), then the free flags override single fields of each.
  std::vector<std::string> formulations;
  // --model: a model preset (qknorm/formulation.h, apply_model), applied
  // after the formulation preset and before the free flags.
  std::string model;
  int64_t kv_heads = 0;  // 0: = heads
  // The default run's covering cases (issue 33, cli/coverage.h): by
  // default the budgeted array (every single, the pairs that fit
  // validation::coverage::kDefaultBudget); --covering: the full array
  // (~8x the default suite's time, cli/README.md "Shape coverage");
  // --no-covering: none (the default suite alone, as before issue 33).
  Covering covering = Covering::kBudget;
  std::string norm;        // l2, rms, layer, none
  std::string norm_axis;   // head, all-heads
  std::string weight;      // none, dim, head-dim
  std::string flags;       // comma list: one-plus-weight, bias,
                           // shared-qk-weight, round-before-weight
  double scale = 0;        // > 0 or < 0: fixed logit scale; 0: as preset
  double softcap = 0;      // > 0: logit softcap (attention.h); 0: off
  std::string rope;        // --rope: RoPE (qknorm/formulation.h rope_spec)
  std::string sinks;       // --sinks: one value, or one per query head
  bool eps_given = false;  // --eps given: overrides the preset's eps
  uint64_t seed = 42;
  // --classes: only the cases of these input classes (validation/case.h
  // InputClass names) run and count; empty: every class.
  std::vector<std::string> classes;
  // Entry selection (globs on the entry name and on target(); precisions by
  // name). Empty: everything.
  std::vector<std::string> backends, targets, precisions;
};

// The input classes --classes names (comma lists, repeatable; throws
// naming the option on an unknown name), in kAllInputClasses order; empty
// if none is given (every class).
std::vector<validation::InputClass> parse_classes(
    const std::vector<std::string>& names);

// True if any attention suite option was given (then the suite is the
// Cartesian product shapes x g x masks x dists, missing lists taking the
// defaults below); false: default_suite().
// --sinks SPEC (qknorm/formulation.h, parse_sinks) into p: one value for
// every query head (p's heads set first), or one per head.
void apply_sinks(const std::string& spec, AttentionProblem* p);
bool custom_suite(const SuiteOptions& o);
// The suite the options describe, restricted to the --classes selected.
Suite build_suite(const SuiteOptions& o);

// From this length on (q_len or kv_len of a --shape), a run without --dist
// judges the gaussian distribution only (issue 19's decision): each case is
// a whole O(n^2 D) problem per entry and an oracle pass per storage
// precision, and at 1x4x32768x128 the two default distributions took the
// run past its 10-minute budget on 2 cores.
inline constexpr int64_t kLongSeq = 8192;
// The run header's line saying so ("" when no shape is that long, or --dist
// was given): why, and how to get the other distributions.
std::string long_run_note(const SuiteOptions& o);

// "2x8x72x64" (q_len = kv_len) or "1x2x33x47x31".
AttentionProblem parse_shape(const std::string& s);
// Applies the formulation options (preset name, then the free flags) to p
// (its shape already set); throws naming the option on a bad value.
void apply_formulation(const SuiteOptions& o, const std::string& preset,
                       AttentionProblem* p);

// Applies mask text to p: "none", "causal", "pad" (batch b keeps
// kv_len - b * kv_len / (2B) keys, so every batch differs and none is
// empty), "causal+pad", or "pad:L1,L2,..." (explicit per-batch lengths).
void apply_mask(const std::string& s, AttentionProblem* p);
validation::Distribution parse_dist(const std::string& s);
Precision parse_prec(const std::string& s);

// Registry entries passing the filters, in registry order. Throws if the
// filters select nothing (a typo must not silently check nothing).
std::vector<const Backend*> select_entries(const Registry& r,
                                           const SuiteOptions& o);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_OPTIONS_H_
