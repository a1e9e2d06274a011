// The proof that the property suite can fail (issue 5, "Mutants"; issue 15,
// precision mutants): every property of the table runs on every mutant
// (mutants.h); each mutant must be caught. Prints the kill table and the
// mutation score, which must be 100%. Every control (the unmutated copy and
// its legitimate arithmetic variants) must pass the whole table; its table
// is printed too.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "property_tests/mutants.h"
#include "property_tests/support.h"

namespace qknorm::property {
namespace {

// The mutation test runs each property with 1/kCaseDivisor of its default
// cases: every mutant is caught within a few cases (the table shows it), and
// the whole kill matrix then costs about one registry entry's full run.
constexpr int kCaseDivisor = 4;

// The property's own failure line(s) from a rapidcheck report: the line that
// starts with "entry " (the RC_FAIL message or the agreement report) and the
// first "  field ..." line after it, if any.
std::string first_line(const std::string& s, size_t max_len = 220) {
  size_t at = s.find("\nentry ");
  if (at == std::string::npos) at = s.find("\nqknorm: ");  // an exception
  if (at == std::string::npos) return s.substr(0, std::min(s.size(), max_len));
  ++at;
  std::string line = s.substr(at, s.find('\n', at) - at);
  const size_t f = s.find("\n  field ", at);
  if (f != std::string::npos)
    line += " |" + s.substr(f + 1, s.find('\n', f + 1) - f - 1);
  return line.size() > max_len ? line.substr(0, max_len) + "..." : line;
}

// The kind of a mutant entry (mutants.h), from its registry target.
const char* kind_of(const Backend& m) {
  for (const MutantInfo& i : mutant_list())
    if (m.target() == i.name) return name(i.kind);
  return "?";
}

TEST(Mutants, EveryMutantIsCaught) {
  int caught = 0, total = 0, precision_caught = 0, precision_total = 0;
  std::string table;
  std::vector<int> kills(entry_properties().size(), 0);
  for (const Backend* m : mutant_registry().entries()) {
    ++total;
    const auto t0 = std::chrono::steady_clock::now();
    std::string killers, why;
    for (size_t k = 0; k < entry_properties().size(); ++k) {
      const Property& p = entry_properties()[k];
      // The whole table runs on every mutant (the kill matrix shows which
      // properties bite which bug), each property with a quarter of its
      // default cases, no shrinking and no reproduce map: a fresh, seeded
      // run of the same properties the registry entries get.
      const RunResult r =
          run_property(p, *m, "Mutants/" + m->name() + "/" + p.name,
                       /*shrink=*/false, /*honour_reproduce=*/false,
                       std::max(1, p.cases / kCaseDivisor));
      if (!r.pass) {
        killers += std::string(killers.empty() ? "" : ",") + p.name;
        if (why.empty()) why = first_line(r.message);
        ++kills[k];
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    char buf[1024];
    std::snprintf(
        buf, sizeof buf, "  %-36s %-11s %-8s %5.2fs  by %s\n      first: %s\n",
        m->name().c_str(), kind_of(*m), killers.empty() ? "SURVIVED" : "caught",
        secs, killers.empty() ? "-" : killers.c_str(), why.c_str());
    table += buf;
    if (!killers.empty()) ++caught;
    if (std::string(kind_of(*m)) == name(MutantKind::kPrecision)) {
      ++precision_total;
      if (!killers.empty()) ++precision_caught;
    }
    EXPECT_FALSE(killers.empty())
        << "mutant " << m->name() << " survived every property of the table";
  }
  std::printf("Mutation test (%d mutants x %zu properties):\n%s", total,
              entry_properties().size(), table.c_str());
  std::printf("Mutants caught per property:\n");
  for (size_t k = 0; k < kills.size(); ++k)
    std::printf("  %-24s %d\n", entry_properties()[k].name, kills[k]);
  std::printf("mutation score: %d/%d = %.1f%% (precision mutants %d/%d)\n",
              caught, total, 100.0 * caught / total, precision_caught,
              precision_total);
  EXPECT_EQ(caught, total);
  // And no property is one that cannot fail: each catches some mutant.
  for (size_t k = 0; k < kills.size(); ++k)
    EXPECT_GT(kills[k], 0) << "property " << entry_properties()[k].name
                           << " caught no mutant";
}

// Every control (mutants.h: the unmutated copy, reversed, pairwise and
// blocked sums, FMA, a 2-ulp exp, f32 accumulators for 16-bit storage)
// passes every property with its default case count: the verdict accepts
// legitimate arithmetic, and the mutants are caught for their bugs.
TEST(Mutants, ControlCopiesPassEveryProperty) {
  std::string table;
  int passing = 0;
  for (const Backend* c : control_registry().entries()) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string failed;
    for (const Property& p : entry_properties()) {
      const RunResult r =
          run_property(p, *c, "Control/" + c->name() + "/" + p.name,
                       /*shrink=*/true, /*honour_reproduce=*/false);
      EXPECT_TRUE(r.pass) << r.message;
      if (!r.pass) failed += std::string(failed.empty() ? "" : ",") + p.name;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    char buf[512];
    std::snprintf(buf, sizeof buf, "  %-26s %-4s %6.2fs  %s\n",
                  c->name().c_str(), failed.empty() ? "PASS" : "FAIL", secs,
                  failed.empty() ? "every property" : failed.c_str());
    table += buf;
    if (failed.empty()) ++passing;
  }
  std::printf("Controls (%zu x %zu properties, default case counts):\n%s",
              control_registry().entries().size(), entry_properties().size(),
              table.c_str());
  std::printf("controls passing: %d/%zu\n", passing,
              control_registry().entries().size());
}

}  // namespace
}  // namespace qknorm::property
