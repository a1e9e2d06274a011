// The conformance suite (issue 17): the whole property suite of
// property_tests/ (rapidcheck + GoogleTest, against the long-double oracle
// under the componentwise verdict) registered for YOUR Backend subclass
// inside YOUR GoogleTest binary. Link qknorm::conformance (CMake:
// find_package(qknorm CONFIG REQUIRED)) and call register_suite from main
// before RUN_ALL_TESTS:
//
//   #include <gtest/gtest.h>
//   #include "qknorm/conformance.h"
//
//   int main(int argc, char** argv) {
//     testing::InitGoogleTest(&argc, argv);
//     qknorm::conformance::register_suite(std::make_unique<MyBackend>());
//     return RUN_ALL_TESTS();
//   }
//
// Each property becomes one test, `Conformance.<Property>/<entry>` (the
// entry's name with every character outside [A-Za-z0-9] replaced by '_'),
// e.g. `Conformance.AttentionAgreement/mykernel_f32`, so --gtest_filter
// ('*AttentionAgreement/*', '*/mykernel_*'), --gtest_output=xml:<file>
// (JUnit XML for CI) and sharding work as in any GoogleTest binary. The
// tests are those the registry entries get in qknorm_property_test
// (property_tests/README.md: what each property checks, QKNORM_SOAK for a
// long soak, RC_PARAMS="reproduce=..." to replay a failure), with a fixed
// seed per test by default. Two differences:
//   - an entry whose Backend::available() is false is skipped;
//   - FormulationAgreement and FormulationNonSaturation are skipped, with a
//     message, for an entry whose supports() refuses the qwen3 preset with
//     GQA (an entry implementing only the paper's formulation and sdpa, the
//     Backend default).
// NonSaturation and NegativeControlSdpaSaturates read the entry's
// probabilities: implement Backend::attention_probabilities, or they FAIL.
#ifndef QKNORM_CONFORMANCE_H_
#define QKNORM_CONFORMANCE_H_

#include <memory>
#include <string>
#include <vector>

#include "qknorm/backend.h"

namespace qknorm::conformance {

struct Options {
  // The GoogleTest suite name of the registered tests.
  std::string suite = "Conformance";
};

// Registers one GoogleTest test per property for `entry` (testing::
// RegisterTest: call it before RUN_ALL_TESTS, before or after
// InitGoogleTest). The suite owns the entry until the process exits.
// Throws qknorm::Error if an entry of the same name was registered already.
void register_suite(std::unique_ptr<Backend> entry, const Options& o = {});
// The same for an entry the caller owns: it must outlive RUN_ALL_TESTS.
void register_suite(const Backend& entry, const Options& o = {});

// The property names register_suite registers, in order.
std::vector<std::string> property_names();

}  // namespace qknorm::conformance

#endif  // QKNORM_CONFORMANCE_H_
