// The GoogleTest bodies of the per-entry tests, shared by the registry suite
// (property_test.cc: Registry/EntryProperty.<Property>/<entry>) and the
// conformance library (conformance.cc, include/qknorm/conformance.h:
// Conformance.<Property>/<entry>). Each runs inside the current test.
#ifndef QKNORM_PROPERTY_TESTS_ENTRY_CHECKS_H_
#define QKNORM_PROPERTY_TESTS_ENTRY_CHECKS_H_

#include <string>

#include "qknorm/backend.h"

namespace qknorm::property {

// An entry's name as a GoogleTest name: every character outside
// [A-Za-z0-9] becomes '_' ("simd:AVX2:f32" -> "simd_AVX2_f32").
std::string test_name_of(const std::string& entry);

// Runs the property of entry_properties() named `property` on `b` under
// rapidcheck (run_property: shrinking, RC_PARAMS="reproduce=..." honoured,
// the fixed seed derived from the test's "<suite>/<name>"), failing the
// current test with its report. Skips the test if b is not available(),
// and a formulation property (FormulationAgreement, FormulationNonSaturation)
// on an entry that implements the paper's formulation only
// (implements_formulations() false: a plug-in or a user's Backend declaring
// no formulation), as qknorm-check reports such cases "not implemented".
void check_entry_property(const Backend& b, const std::string& property);

// NegativeControlSdpaSaturates: sdpa with q, k scaled by 16 violates the
// non-saturation bound on b's own probabilities, while qknorm and unscaled
// sdpa on the same inputs satisfy it (the non-saturation check can fail).
void check_sdpa_saturates(const Backend& b);

}  // namespace qknorm::property

#endif  // QKNORM_PROPERTY_TESTS_ENTRY_CHECKS_H_
