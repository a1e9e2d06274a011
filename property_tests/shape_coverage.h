// The property suite and the shape-coverage model (issue 33,
// validation/coverage.h): the model of the entry a property runs on (for
// the generators), the walk of the model's single cells (the ShapeCoverage
// property), and the record of every problem a property judged an entry on,
// merged into the suite's coverage report.
//
// Where the report goes: each (property, entry) test writes the shapes it
// judged to $QKNORM_COVERAGE_OUT/<entry>/<property>.shapes (ctest sets
// QKNORM_COVERAGE_OUT to <build>/property_tests/coverage); the test
// PropertyCoverage.Report, which ctest runs after every property test
// (fixture property_coverage), merges them per entry into the model's
// Tally, prints one summary line per entry and writes
// $QKNORM_COVERAGE_OUT/report.json (per entry: cells reached and not
// reached, pairs reached of feasible). Without QKNORM_COVERAGE_OUT nothing
// is written.
#ifndef QKNORM_PROPERTY_TESTS_SHAPE_COVERAGE_H_
#define QKNORM_PROPERTY_TESTS_SHAPE_COVERAGE_H_

#include <string>
#include <vector>

#include "qknorm/attention.h"
#include "qknorm/backend.h"
#include "validation/coverage.h"

namespace qknorm::property {

namespace coverage = validation::coverage;

// The threads the model's batch cell "more than the threads" is counted
// against: the properties run entries with ExecConfig{} (threads 0: every
// core), and Determinism with 1 and 2 (the most of the two).
int model_threads();

// The model of entry b (its declared blocks, model_threads()), built once
// per entry and process.
const coverage::Model& model_of(const Backend& b);

// The shape context of the running property (run_property sets it): the
// entry's model and the needs it supports. Null / 0 outside a property.
struct ShapeContext {
  const coverage::Model* model = nullptr;
  unsigned needs = coverage::kAllNeeds;
};
const ShapeContext& shape_context();
class ShapeContextScope {
 public:
  explicit ShapeContextScope(const Backend& b);
  ~ShapeContextScope();

 private:
  ShapeContext saved_;
};

// The record of the problems the running property judged (build_case and
// the properties that build their own cases call record_problem). The
// record is per thread and cleared by ShapeContextScope.
void record_problem(const AttentionProblem& p);
void clear_recorded_problems();
const std::vector<AttentionProblem>& recorded_problems();
// Writes the record to $QKNORM_COVERAGE_OUT/<entry>/<property>.shapes (no-op
// without QKNORM_COVERAGE_OUT). One line per distinct shape.
void write_recorded_problems(const Backend& b, const std::string& property);

// The walk: problems that together reach every single cell of model m
// whose needs are within `needs`, each cell by the cheapest realization
// (coverage::cost) that varies the cell's dimension (and the lengths, for a
// mask cell) from a base of modest size, in the paper's formulation with
// scale g. Deterministic.
std::vector<AttentionProblem> walk_problems(const coverage::Model& m,
                                            unsigned needs, double g);

// The long anchor (item 3): head_dim 256, batch 2, one head, q_len
// 64 (64 mod 128) and kv_len 401 with batch element 1 padded by 144 keys
// (a long masked run) where the entry implements masks. Judged by the
// sampled verdict.
AttentionProblem long_anchor(unsigned needs, double g);

// The suite's report from the shapes files under `dir`: per entry of
// `entries`, the merged Tally; writes dir/report.json and returns one
// summary line per entry. *missing gets the entries whose ShapeCoverage
// record exists but misses a single cell (the report's failure).
std::vector<std::string> write_report(
    const std::string& dir, const std::vector<const Backend*>& entries,
    std::vector<std::string>* missing);

}  // namespace qknorm::property

#endif  // QKNORM_PROPERTY_TESTS_SHAPE_COVERAGE_H_
