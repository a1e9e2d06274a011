// The user's test binary: the whole qknorm conformance suite on the user's
// own backend (naive_backend.h), one GoogleTest test per property,
// Conformance.<Property>/naive_f64. Accepts every GoogleTest flag, e.g.
//   ./naive_conformance --gtest_filter='*AttentionAgreement*'
//   ./naive_conformance --gtest_output=xml:conformance.xml
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "naive_backend.h"
#include "qknorm/conformance.h"
#include "validation/check.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  auto entry = std::make_unique<naive::NaiveF64>();

  // qknorm::validation directly: one case judged against the oracle.
  qknorm::AttentionProblem p;
  p.batch = 2, p.heads = 3, p.q_len = 7, p.kv_len = 9, p.head_dim = 16;
  p.g = qknorm::g_init(72);
  p.mask.causal = true;
  const auto report = qknorm::validation::check_attention(
      *entry, qknorm::validation::make_attention_case(
                  p, qknorm::validation::Distribution::kGaussian, 42));
  std::printf("%s on %s: %s, worst margin %.3g (%s)\n", entry->name().c_str(),
              report.case_desc.c_str(), report.pass ? "PASS" : "FAIL",
              report.margin, report.worst_field.c_str());

  // The conformance suite: register_suite owns the entry from here on.
  qknorm::conformance::register_suite(std::move(entry));
  return RUN_ALL_TESTS();
}
