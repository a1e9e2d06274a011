// The verdict per input class (issue 31): every case carries its class, the
// summary gives each entry one line with one verdict per class, JSON and CSV
// carry the class per case and the per-class summaries, and --classes runs
// and counts only the selected classes' cases. The entry that tells the
// classes apart is mutant:far_norm_rsqrt_estimate:f32 (mutants/mutants.h):
// its backward divides by a 12-bit rsqrt estimate of ||x|| above 2^64, so it
// is wrong on extreme-range rows only.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli/options.h"
#include "cli/report.h"
#include "cli/suite.h"
#include "cli/tests/test_util.h"
#include "mutants/mutants.h"
#include "qknorm/error.h"

namespace qknorm::cli {
namespace {

using validation::InputClass;

// Four small cases, one ScaleNorm: gaussian and wide under a causal mask and
// under a key length of 0 (every query row fully masked).
SuiteOptions four_cases() {
  SuiteOptions o;
  o.shapes = {"1x2x9x8"};
  o.g = {20};
  o.masks = {"causal", "pad:0"};
  o.dists = {"gaussian", "wide"};
  o.scalenorm = {"4x8"};
  return o;
}

const Backend& far_norm_mutant() {
  const Backend* b =
      property::mutant_registry().find("mutant:far_norm_rsqrt_estimate:f32");
  EXPECT_NE(b, nullptr);
  return *b;
}

std::vector<std::string> lines_with(const std::string& text,
                                    const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(needle) != std::string::npos) out.push_back(l);
  return out;
}

TEST(InputClasses, SuiteCasesCarryTheirClass) {
  const Suite s = build_suite(four_cases());
  ASSERT_EQ(s.attention.size(), 4u);
  EXPECT_EQ(input_class(s.attention[0]), InputClass::kRealistic);
  EXPECT_EQ(input_class(s.attention[1]), InputClass::kExtremeRange);
  EXPECT_EQ(input_class(s.attention[2]), InputClass::kDegenerate);
  // wide and fully masked: extreme-range first (validation/case.h).
  EXPECT_EQ(input_class(s.attention[3]), InputClass::kExtremeRange);
  // The default suite: every class, and the activation statistics.
  const Suite d = default_suite(42);
  std::set<InputClass> classes;
  std::set<validation::Distribution> dists;
  for (const AttentionSpec& a : d.attention) {
    classes.insert(input_class(a));
    dists.insert(a.dist);
  }
  EXPECT_EQ(classes.size(), 3u);
  for (validation::Distribution want :
       {validation::Distribution::kSink, validation::Distribution::kChannels,
        validation::Distribution::kHeavyTailed})
    EXPECT_TRUE(dists.count(want)) << validation::name(want);
}

// The mutant FAILs extreme-range only: one verdict per class, the worst
// element named where the class FAILs; the run fails unless the classes
// selected leave extreme-range out.
TEST(InputClasses, VerdictPerClassAndSelection) {
  RunOptions opt;
  opt.time_forward = false;
  const Suite suite = build_suite(four_cases());
  Report rep;
  rep.rows = run_suite({&far_norm_mutant()}, suite, opt);
  finalize(&rep);
  ASSERT_EQ(rep.rows.size(), 2u);
  const EntryRow& attn = rep.rows[0];
  ASSERT_EQ(attn.classes.size(), 3u);
  EXPECT_EQ(attn.classes[0].input_class, InputClass::kRealistic);
  EXPECT_TRUE(attn.classes[0].pass);
  EXPECT_EQ(attn.classes[0].cases, 1);
  EXPECT_EQ(attn.classes[1].input_class, InputClass::kExtremeRange);
  EXPECT_FALSE(attn.classes[1].pass);
  EXPECT_EQ(attn.classes[1].cases, 2);
  EXPECT_GT(attn.classes[1].worst.margin, 1);
  EXPECT_TRUE(attn.classes[1].worst.case_index == 1 ||
              attn.classes[1].worst.case_index == 3);
  EXPECT_EQ(attn.classes[2].input_class, InputClass::kDegenerate);
  EXPECT_TRUE(attn.classes[2].pass);
  EXPECT_LE(attn.classes[2].worst.margin, 1);
  const std::string line = class_line(attn);
  const size_t r = line.find("PASS realistic"),
               x = line.find("FAIL extreme-range"),
               g = line.find("PASS degenerate");
  ASSERT_NE(r, std::string::npos) << line;
  ASSERT_NE(x, std::string::npos) << line;
  ASSERT_NE(g, std::string::npos) << line;
  EXPECT_LT(r, x);
  EXPECT_LT(x, g);
  EXPECT_NE(line.find(fmt::format(
                "{}{} in case c{})", attn.classes[1].worst.field_name(),
                attn.classes[1].worst.where, attn.classes[1].worst.case_index)),
            std::string::npos)
      << line;
  EXPECT_FALSE(rep.pass);
  std::ostringstream table;
  print_table(table, rep);
  // One line per (entry, kind) with every class of its cases.
  const auto lines = lines_with(table.str(), "mutant:far_norm_rsqrt_estimate");
  int with_classes = 0;
  for (const std::string& l : lines)
    if (l.find("PASS realistic") != std::string::npos) {
      ++with_classes;
      if (l.find("attention") != std::string::npos) {
        EXPECT_NE(l.find(line), std::string::npos) << l;
      }
    }
  EXPECT_EQ(with_classes, 2) << table.str();
  EXPECT_NE(table.str().find("[extreme-range] "), std::string::npos)
      << "the failures name their class:\n"
      << table.str();

  // Without extreme-range the same entry passes.
  SuiteOptions o = four_cases();
  o.classes = {"realistic,degenerate"};
  const Suite some = build_suite(o);
  EXPECT_EQ(some.attention.size(), 2u);
  EXPECT_EQ(some.scalenorm.size(), 1u);
  Report sel;
  sel.rows = run_suite({&far_norm_mutant()}, some, opt);
  finalize(&sel);
  EXPECT_TRUE(sel.pass);
  ASSERT_EQ(sel.rows[0].classes.size(), 2u);
  EXPECT_EQ(class_line(sel.rows[0]).find("extreme-range"), std::string::npos);
}

TEST(InputClasses, ParseClasses) {
  EXPECT_TRUE(parse_classes({}).empty());
  const auto k = parse_classes({"degenerate,realistic", "degenerate"});
  ASSERT_EQ(k.size(), 2u);
  EXPECT_EQ(k[0], InputClass::kRealistic);
  EXPECT_EQ(k[1], InputClass::kDegenerate);
  EXPECT_THROW(parse_classes({"realistic,extreme"}), Error);
}

// The command line: --classes runs only the selected classes' cases, says
// so in the header, and the exit status counts only them.
TEST(InputClasses, CommandLine) {
  const std::vector<std::string> base = {
      "--backend", "reference:f64", "--shape", "1x2x9x8", "--g",
      "20",        "--mask",        "causal",  "--mask",  "pad:0",
      "--dist",    "gaussian",      "--dist",  "wide",    "--no-timing"};
  testing::CliRun all = testing::run(base);
  EXPECT_EQ(all.code, kExitPass) << all.out << all.err;
  auto line_of = [](const std::string& out) {
    for (const std::string& l : lines_with(out, "  reference:f64 "))
      if (l.find(" attention ") != std::string::npos &&
          l.find("realistic") != std::string::npos)
        return l;
    return std::string();
  };
  const std::string every = line_of(all.out);
  EXPECT_NE(every.find("PASS realistic"), std::string::npos) << all.out;
  EXPECT_NE(every.find("PASS extreme-range"), std::string::npos) << all.out;
  EXPECT_NE(every.find("PASS degenerate"), std::string::npos) << all.out;
  EXPECT_EQ(all.out.find("--classes"), std::string::npos);

  std::vector<std::string> sel = base;
  sel.insert(sel.end(), {"--classes", "realistic,degenerate", "--json", "-"});
  testing::CliRun s = testing::run(sel);
  EXPECT_EQ(s.code, kExitPass) << s.err;
  const nlohmann::json j = nlohmann::json::parse(s.out);
  EXPECT_EQ(j["classes_selected"],
            nlohmann::json::array({"realistic", "degenerate"}));
  ASSERT_EQ(j["cases"].size(), 3u);  // 2 attention + 1 ScaleNorm
  EXPECT_EQ(j["case_classes"],
            nlohmann::json::array({"realistic", "degenerate", "realistic"}));
  const auto& e = j["entries"][0];
  ASSERT_EQ(e["classes"].size(), 2u);
  EXPECT_EQ(e["classes"][0]["class"], "realistic");
  EXPECT_EQ(e["classes"][1]["class"], "degenerate");
  EXPECT_EQ(e["cases"][1]["class"], "degenerate");

  std::vector<std::string> table = base;
  table.insert(table.end(), {"--classes", "realistic,degenerate"});
  testing::CliRun t = testing::run(table);
  EXPECT_NE(t.out.find("input classes realistic, degenerate only"),
            std::string::npos)
      << t.out;
  EXPECT_EQ(line_of(t.out).find("extreme-range"), std::string::npos) << t.out;

  testing::TempDir dir;
  std::vector<std::string> csv = base;
  csv.insert(csv.end(), {"--csv", dir.file("r.csv")});
  ASSERT_EQ(testing::run(csv).code, kExitPass);
  std::ifstream in(dir.file("r.csv"));
  std::string header, l;
  std::getline(in, header);
  EXPECT_NE(header.find(",class,case"), std::string::npos) << header;
  int class_rows = 0, case_rows = 0;
  while (std::getline(in, l)) {
    if (l.find(",extreme-range,all") != std::string::npos) ++class_rows;
    if (l.find(",degenerate,c2") != std::string::npos) ++case_rows;
  }
  EXPECT_EQ(class_rows, 2);  // attention and ScaleNorm rows of reference:f64
  EXPECT_EQ(case_rows, 1);

  std::vector<std::string> bad = base;
  bad.insert(bad.end(), {"--classes", "realistic,extreme"});
  testing::CliRun b = testing::run(bad);
  EXPECT_EQ(b.code, kExitUsage);
  EXPECT_NE(b.err.find("unknown input class 'extreme'"), std::string::npos)
      << b.err;
  EXPECT_EQ(
      testing::run({"--classes", "realistic", "sweep", "--over", "g"}).code,
      kExitUsage);
}

// The exit status follows the selection: `mutants` on the far-norm mutant
// catches it (exit 0) with every class, and misses it (exit 1: a precision
// mutant not caught) when extreme-range is left out.
TEST(InputClasses, SelectionChangesTheExitStatus) {
  const std::vector<std::string> base = {
      "mutants", "--backend", "mutant:far_norm_rsqrt_estimate:f32",
      "--shape", "1x2x9x8",   "--g",
      "20",      "--mask",    "causal",
      "--dist",  "gaussian",  "--dist",
      "wide"};
  testing::CliRun all = testing::run(base);
  EXPECT_EQ(all.code, kExitPass) << all.out << all.err;
  std::vector<std::string> sel = base;
  sel.insert(sel.end(), {"--classes", "realistic"});
  testing::CliRun s = testing::run(sel);
  EXPECT_EQ(s.code, kExitFail) << s.out << s.err;
}

}  // namespace
}  // namespace qknorm::cli
