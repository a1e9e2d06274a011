// The proof that the property suite can fail (issue 5, "Mutants"): every
// property of the table runs on every mutant (mutants.h) until one fails;
// each mutant must be caught. Prints the kill table and the mutation score,
// which must be 100%. The unmutated copies must pass the whole table.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "property_tests/mutants.h"
#include "property_tests/support.h"

namespace qknorm::property {
namespace {

std::string first_line(const std::string& s, size_t max_len = 160) {
  // The rapidcheck report starts with "Falsifiable after ..."; the property's
  // own message follows it.
  size_t at = s.find("entry ");
  if (at == std::string::npos) at = 0;
  std::string line = s.substr(at, s.find('\n', at) - at);
  return line.size() > max_len ? line.substr(0, max_len) + "..." : line;
}

TEST(Mutants, EveryMutantIsCaught) {
  int caught = 0, total = 0;
  std::string table;
  for (const Backend* m : mutant_registry().entries()) {
    ++total;
    const auto t0 = std::chrono::steady_clock::now();
    std::string killer, why;
    int cases = 0;
    for (const Property& p : entry_properties()) {
      // No shrinking (speed) and no reproduce map: each mutant is a fresh,
      // seeded run of the same table the registry entries get.
      const RunResult r =
          run_property(p, *m, "Mutants/" + m->name() + "/" + p.name,
                       /*shrink=*/false, /*honour_reproduce=*/false);
      cases += r.cases_run;
      if (!r.pass) {
        killer = p.name;
        why = first_line(r.message);
        break;
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "  %-40s %-8s %-22s after %4d cases %6.2fs  %s\n",
                  m->name().c_str(), killer.empty() ? "SURVIVED" : "caught",
                  killer.c_str(), cases, secs, why.c_str());
    table += buf;
    if (!killer.empty()) ++caught;
    EXPECT_FALSE(killer.empty())
        << "mutant " << m->name() << " survived every property of the table";
  }
  std::printf(
      "Mutation test (%d mutants, property table of %zu properties):\n%s",
      total, entry_properties().size(), table.c_str());
  std::printf("mutation score: %d/%d = %.1f%%\n", caught, total,
              100.0 * caught / total);
  EXPECT_EQ(caught, total);
}

// The unmutated copy passes every property at every precision.
TEST(Mutants, ControlCopiesPassEveryProperty) {
  for (const Backend* c : control_registry().entries())
    for (const Property& p : entry_properties()) {
      const RunResult r =
          run_property(p, *c, "Control/" + c->name() + "/" + p.name,
                       /*shrink=*/true, /*honour_reproduce=*/false);
      EXPECT_TRUE(r.pass) << r.message;
    }
}

}  // namespace
}  // namespace qknorm::property
