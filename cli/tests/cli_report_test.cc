// The report's pass/fail logic: the rule and the derived bounds decide each
// field, a row fails if any case fails, an unavailable entry never fails the
// run, a wrong entry fails it (exit 1). compare: a correct dump passes, a
// deliberately wrong output file FAILs, malformed dumps are input errors
// (exit 3) naming the file. sweep: writes its CSV and PNG.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "cli/compare.h"
#include "cli/cost.h"
#include "cli/options.h"
#include "cli/report.h"
#include "cli/suite.h"
#include "cli/tests/test_util.h"
#include "qknorm/error.h"
#include "validation/forwarding_backend.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace qknorm::cli {
namespace {

using testing::expect_input_error;
using validation::HostTensor;

// reference:f32 with O scaled by (1 + kRelError): a bug far above roundoff.
class WrongOutput final : public validation::ForwardingBackend {
 public:
  static constexpr double kRelError = 1e-3;
  explicit WrongOutput(bool available = true)
      : ForwardingBackend("mutant", "-", Precision::kF32,
                          validation::naive_for(Precision::kF32)),
        available_(available) {}
  bool available() const override { return available_; }
  void attention_forward(const AttentionProblem& p, const ForwardArgs& a,
                         Workspace* ws, const ExecConfig& c) const override {
    ForwardingBackend::attention_forward(p, a, ws, c);
    float* o = static_cast<float*>(a.o.data);
    for (int64_t i = 0; i < a.o.size; ++i)
      o[i] = static_cast<float>(o[i] * (1 + kRelError));
  }

 private:
  bool available_;
};

Suite small_suite() {
  SuiteOptions o;
  o.shapes = {"1x2x9x8"};
  o.g = {20};
  o.masks = {"causal"};
  o.dists = {"gaussian"};
  o.scalenorm = {"4x8"};
  return build_suite(o);
}

TEST(ReportLogic, CorrectEntriesPassAndWrongOneFails) {
  const WrongOutput wrong;
  const Backend* ref = all_backends().find("reference:f32");
  ASSERT_NE(ref, nullptr);
  RunOptions opt;
  opt.time_forward = false;
  Report rep;
  rep.rows = run_suite({ref, &wrong}, small_suite(), opt);
  finalize(&rep);
  ASSERT_EQ(rep.rows.size(), 4u);  // attention + scalenorm for each
  EXPECT_TRUE(rep.rows[0].pass);
  EXPECT_EQ(rep.rows[0].rule, "componentwise");
  EXPECT_EQ(rep.rows[2].name, "mutant:f32");
  EXPECT_FALSE(rep.rows[2].pass);  // attention: O is wrong
  EXPECT_GT(rep.rows[2].worst.margin, 1);
  EXPECT_EQ(rep.rows[2].worst.field, validation::Field::kO);
  EXPECT_GT(rep.rows[2].ratio, 10);
  EXPECT_TRUE(rep.rows[3].pass);  // scalenorm is untouched
  EXPECT_FALSE(rep.pass);
  std::ostringstream table;
  print_table(table, rep);
  EXPECT_NE(table.str().find("FAIL"), std::string::npos);
  EXPECT_NE(table.str().find("field o: "), std::string::npos) << table.str();
}

// One row's verdict, field by field (what the report prints of it).
std::string verdict_of(const EntryRow& row) {
  std::ostringstream s;
  s.precision(17);
  s << row.name << " " << row.kind << " pass=" << row.pass
    << " ratio=" << row.ratio << " worst=" << row.worst.field_name() << ":"
    << row.worst.where << ":" << row.worst.margin;
  for (const FieldSummary& f : row.fields)
    s << " | " << f.key << " " << f.pass << " " << f.ratio << " "
      << f.worst_element.where << " " << f.worst_element.margin << " "
      << f.failures;
  return s.str();
}

// SharedOracles (qknorm-check mutants): entries judged in calls of their own,
// from two threads at once, against one cache, get the verdicts of a single
// call, with both precisions' oracles and the naive baseline in the cache.
TEST(ReportLogic, SharedOraclesGiveTheVerdictsOfOneCall) {
  const WrongOutput wrong;
  const Backend* ref32 = all_backends().find("reference:f32");
  const Backend* ref64 = all_backends().find("reference:f64");
  ASSERT_NE(ref32, nullptr);
  ASSERT_NE(ref64, nullptr);
  SuiteOptions so;
  so.shapes = {"1x2x9x8"};
  so.g = {20};
  so.masks = {"causal", "none"};
  so.dists = {"gaussian"};
  const Suite suite = build_suite(so);
  const std::vector<const Backend*> entries = {ref32, &wrong, ref64};
  RunOptions opt;
  opt.time_forward = false;
  const std::vector<EntryRow> together = run_suite(entries, suite, opt);

  SharedOracles oracles;
  std::vector<std::vector<EntryRow>> alone(entries.size());
  auto judge = [&](size_t i) {
    RunOptions o = opt;
    o.oracles = &oracles;
    alone[i] = run_suite({entries[i]}, suite, o);
  };
  std::thread other(judge, 1);
  judge(0);
  judge(2);
  other.join();
  size_t k = 0;
  for (size_t i = 0; i < entries.size(); ++i)
    for (const EntryRow& row : alone[i]) {
      ASSERT_LT(k, together.size());
      EXPECT_EQ(verdict_of(row), verdict_of(together[k])) << "row " << k;
      ++k;
    }
  EXPECT_EQ(k, together.size());
  EXPECT_FALSE(together[2].pass);  // the wrong entry's attention row
  opt.oracles = &oracles;
  EXPECT_THROW(run_suite({ref32}, small_suite(), opt), std::logic_error);
}

TEST(ReportLogic, UnavailableEntryDoesNotFailTheRun) {
  const WrongOutput off(/*available=*/false);
  RunOptions opt;
  opt.time_forward = false;
  Report rep;
  rep.rows = run_suite({&off}, small_suite(), opt);
  finalize(&rep);
  ASSERT_FALSE(rep.rows.empty());
  EXPECT_FALSE(rep.rows[0].available);
  EXPECT_TRUE(rep.pass);
}

TEST(ReportLogic, CaseResultCarriesTheVerdictsWorstElement) {
  validation::AgreementReport rep;
  rep.entry_name = "x:f64";
  validation::FieldVerdict f;
  f.id = validation::Field::kO;
  f.margin = 3;
  f.failures = 2;
  f.worst_where = "[0,1,2,3]";
  f.worst_expected = 1;
  f.worst_actual = 1.5;
  f.worst_bound = 0.1;
  f.pass = false;
  rep.fields = {f};
  rep.pass = false;
  const CaseResult r = from_report(rep);
  EXPECT_FALSE(r.pass);
  ASSERT_EQ(r.fields.size(), 1u);
  EXPECT_EQ(r.fields[0].field, validation::Field::kO);
  EXPECT_EQ(r.fields[0].key, "o");
  EXPECT_EQ(r.fields[0].where, "[0,1,2,3]");
  EXPECT_DOUBLE_EQ(r.fields[0].margin, 3);
  EXPECT_NE(r.failure.find("2 of"), std::string::npos) << r.failure;
}

TEST(ReportLogic, SummaryTakesMaximaAndAnyFailure) {
  EntryRow row;
  CaseResult a, b;
  FieldResult fa, fb;
  fa.field = fb.field = validation::Field::kO;
  fa.key = fb.key = "o";
  fa.entry.max_abs = 1e-6;
  fa.naive.max_abs = 1e-6;
  fa.margin = 0.25;
  fa.has_naive = fb.has_naive = true;
  fa.pass = true;
  fb.entry.max_abs = 3e-6;
  fb.naive.max_abs = 1e-6;
  fb.margin = 1.5;
  fb.where = "[0,0,1,2]";
  fb.pass = false;
  a.fields = {fa};
  a.pass = true;
  b.fields = {fb};
  b.pass = false;
  row.cases = {a, b};
  summarize(&row);
  ASSERT_EQ(row.fields.size(), 1u);
  EXPECT_DOUBLE_EQ(row.fields[0].worst.max_abs, 3e-6);
  EXPECT_DOUBLE_EQ(row.ratio, 3);
  EXPECT_DOUBLE_EQ(row.worst.margin, 1.5);
  EXPECT_EQ(row.worst.case_index, 1);
  EXPECT_EQ(row.worst.where, "[0,0,1,2]");
  EXPECT_FALSE(row.pass);
}

// Writes a QKNorm case and reference:<prec>'s outputs as .npy files (or one
// .safetensors) into `dir`, optionally corrupting one element of O.
void dump_case(const std::string& dir, Precision prec, bool safetensors,
               int64_t corrupt = -1) {
  const validation::AttentionCase c =
      testing::gaussian_case(7, 9, 8, g_init(72), prec, 5);
  const AttentionProblem& p = c.problem;
  validation::AttentionResult r =
      validation::run_attention(validation::naive_for(prec), c);
  if (corrupt >= 0) r.o[static_cast<size_t>(corrupt)] += 0.25;
  auto t = [&](const std::string& name, const std::vector<double>& v,
               int64_t rows) {
    HostTensor h;
    h.name = name;
    h.dtype = prec;
    h.shape = {p.batch, p.heads, rows, p.head_dim};
    h.values = v;
    return h;
  };
  HostTensor g{"g", Precision::kF64, {}, {p.g}},
      dg{"dg", Precision::kF64, {}, {r.dg}};
  std::vector<HostTensor> all = {
      t("q", c.q, p.q_len),    t("k", c.k, p.kv_len),
      t("v", c.v, p.kv_len),   g,
      t("dO", c.d_o, p.q_len), t("O", r.o, p.q_len),
      t("dQ", r.dq, p.q_len),  t("dK", r.dk, p.kv_len),
      t("dV", r.dv, p.kv_len), dg};
  if (safetensors) {
    validation::write_safetensors_file(dir + "/dump.safetensors", all);
  } else {
    for (const HostTensor& h : all)
      validation::write_npy_file(dir + "/" + h.name + ".npy", h);
  }
}

std::vector<std::string> npys(const std::string& dir,
                              std::vector<std::string> names) {
  for (auto& n : names) n = dir + "/" + n + ".npy";
  return names;
}

std::vector<std::string> compare_args(const std::string& dir) {
  std::vector<std::string> a = {"compare", "--inputs"};
  for (const auto& f : npys(dir, {"q", "k", "v", "g", "dO"})) a.push_back(f);
  a.push_back("--outputs");
  for (const auto& f : npys(dir, {"O", "dQ", "dK", "dV", "dg"})) a.push_back(f);
  return a;
}

TEST(Compare, CorrectNpyDumpPasses) {
  for (Precision p : {Precision::kF64, Precision::kF32, Precision::kF16}) {
    testing::TempDir dir;
    dump_case(dir.path(), p, false);
    const testing::CliRun r = testing::run(compare_args(dir.path()));
    EXPECT_EQ(r.code, kExitPass) << name(p) << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("files:" + std::string(name(p))), std::string::npos);
  }
}

TEST(Compare, Bf16SafetensorsDumpPasses) {
  testing::TempDir dir;
  dump_case(dir.path(), Precision::kBF16, true);
  const std::string f = dir.file("dump.safetensors");
  const testing::CliRun r =
      testing::run({"compare", "--inputs", f, "--outputs", f});
  EXPECT_EQ(r.code, kExitPass) << r.out << r.err;
  EXPECT_NE(r.out.find("files:bf16"), std::string::npos);
}

TEST(Compare, DeliberatelyWrongOutputFileFails) {
  testing::TempDir dir;
  const int64_t bad = 37;
  dump_case(dir.path(), Precision::kF32, false, bad);
  const testing::CliRun r = testing::run(compare_args(dir.path()));
  EXPECT_EQ(r.code, kExitFail) << r.out << r.err;
  EXPECT_NE(r.out.find("FAIL"), std::string::npos);
  EXPECT_NE(r.out.find("field o:"), std::string::npos);
  EXPECT_NE(r.out.find("worst[" + std::to_string(bad) + "]"), std::string::npos)
      << r.out;
  // Forward only (no gradients given) fails the same way.
  const testing::CliRun f = testing::run(
      {"compare", "--inputs", dir.file("q.npy"), dir.file("k.npy"),
       dir.file("v.npy"), dir.file("g.npy"), "--outputs", dir.file("O.npy")});
  EXPECT_EQ(f.code, kExitFail) << f.out << f.err;
}

TEST(Compare, NameEqualsPathAndGOverride) {
  testing::TempDir dir;
  dump_case(dir.path(), Precision::kF32, false);
  std::filesystem::rename(dir.file("q.npy"), dir.file("query_dump.npy"));
  const testing::CliRun r =
      testing::run({"compare", "--g", std::to_string(g_init(72)), "--inputs",
                    "q=" + dir.file("query_dump.npy"), dir.file("k.npy"),
                    dir.file("v.npy"), "--outputs", dir.file("O.npy")});
  EXPECT_EQ(r.code, kExitPass) << r.out << r.err;
}

TEST(Compare, MalformedDumpsAreInputErrorsNamingTheFile) {
  testing::TempDir dir;
  dump_case(dir.path(), Precision::kF32, false);
  // Wrong dtype: k in f64 while O is f32 (an input wider than O's format).
  HostTensor k = validation::read_npy_file(dir.file("k.npy"));
  k.dtype = Precision::kF64;
  validation::write_npy_file(dir.file("k64.npy"), k);
  expect_input_error(
      {"compare", "--inputs", dir.file("q.npy"), "k=" + dir.file("k64.npy"),
       dir.file("v.npy"), dir.file("g.npy"), "--outputs", dir.file("O.npy")},
      "k: dtype f64 is not exact in O's f32");
  // Wrong shape: O of another length.
  HostTensor o = validation::read_npy_file(dir.file("O.npy"));
  o.shape[2] -= 1;
  o.values.resize(static_cast<size_t>(o.numel()));
  validation::write_npy_file(dir.file("O_short.npy"), o);
  expect_input_error({"compare", "--inputs", dir.file("q.npy"),
                      dir.file("k.npy"), dir.file("v.npy"), dir.file("g.npy"),
                      "--outputs", "O=" + dir.file("O_short.npy")},
                     "differs from q's");
}

// Mixed storage (issue 35): q and O in f32, k and v stored in f16 (an
// inference engine's K/V cache). A kernel computing in f32 on those values
// passes, judged in O's f32, the report naming each input's format; the
// same O with one element moved FAILs; k in f16 beside an f16 O whose q is
// f32 is refused (q is not exact in f16).
TEST(Compare, MixedInputFormatsAreJudgedInOsFormat) {
  testing::TempDir dir;
  validation::AttentionCase c =
      testing::gaussian_case(7, 9, 8, g_init(72), Precision::kF32, 5);
  for (auto* x : {&c.k, &c.v})
    for (double& e : *x) e = round_to(Precision::kF16, e);
  const AttentionProblem& p = c.problem;
  const validation::AttentionResult r = validation::run_attention_forward(
      validation::naive_for(Precision::kF32), c);
  auto t = [&](const std::string& nm, Precision d, const std::vector<double>& v,
               int64_t rows) {
    HostTensor h;
    h.name = nm;
    h.dtype = d;
    h.shape = {p.batch, p.heads, rows, p.head_dim};
    h.values = v;
    validation::write_npy_file(dir.file(nm + ".npy"), h);
  };
  t("q", Precision::kF32, c.q, p.q_len);
  t("k", Precision::kF16, c.k, p.kv_len);
  t("v", Precision::kF16, c.v, p.kv_len);
  t("O", Precision::kF32, r.o, p.q_len);
  std::vector<double> moved = r.o;
  moved[3] += 1e-3;
  t("O_moved", Precision::kF32, moved, p.q_len);
  validation::write_npy_file(dir.file("g.npy"),
                             HostTensor{"g", Precision::kF64, {}, {p.g}});
  const std::vector<std::string> in = {"compare",         "--inputs",
                                       dir.file("q.npy"), dir.file("k.npy"),
                                       dir.file("v.npy"), dir.file("g.npy"),
                                       "--outputs"};
  auto with = [&](const std::string& o) {
    std::vector<std::string> a = in;
    a.push_back("O=" + dir.file(o));
    return a;
  };
  const testing::CliRun ok = testing::run(with("O.npy"));
  EXPECT_EQ(ok.code, kExitPass) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("(q f32, k f16, v f16, judged in O's f32)"),
            std::string::npos)
      << ok.out;
  const testing::CliRun bad = testing::run(with("O_moved.npy"));
  EXPECT_EQ(bad.code, kExitFail) << bad.out << bad.err;
  t("O16", Precision::kF16, r.o, p.q_len);
  expect_input_error(with("O16.npy"), "q: dtype f32 is not exact in O's f16");
  // Truncated file.
  const std::string bytes = validation::read_file_bytes(dir.file("v.npy"));
  validation::write_file_bytes(dir.file("v_cut.npy"),
                               bytes.substr(0, bytes.size() - 3));
  expect_input_error({"compare", "--inputs", dir.file("q.npy"),
                      dir.file("k.npy"), "v=" + dir.file("v_cut.npy"),
                      dir.file("g.npy"), "--outputs", dir.file("O.npy")},
                     dir.file("v_cut.npy") + ": truncated data");
  // Bad header.
  const char junk[] = "\x93NUMPY\x01\x00\x04\x00{{{{";
  validation::write_file_bytes(dir.file("junk.npy"),
                               std::string_view(junk, sizeof junk - 1));
  expect_input_error(
      {"compare", "--inputs", dir.file("q.npy"), dir.file("k.npy"),
       dir.file("v.npy"), "g=" + dir.file("junk.npy"), "--outputs",
       dir.file("O.npy")},
      dir.file("junk.npy") + ": bad header");
  // Missing tensor and unknown names.
  expect_input_error({"compare", "--inputs", dir.file("q.npy"),
                      dir.file("k.npy"), "--outputs", dir.file("O.npy")},
                     "no tensor named v");
  expect_input_error(
      {"compare", "--inputs", dir.file("q.npy"), dir.file("k.npy"),
       dir.file("v.npy"), dir.file("O.npy"), "--outputs", dir.file("O.npy")},
      "not one of the --inputs");
  expect_input_error({"compare", "--inputs", dir.file("nope.npy"), "--outputs",
                      dir.file("O.npy")},
                     "cannot open");
}

TEST(Compare, SafetensorsHeaderClaimingMoreDataIsAnInputError) {
  testing::TempDir dir;
  dump_case(dir.path(), Precision::kBF16, true);
  std::string bytes = validation::read_file_bytes(dir.file("dump.safetensors"));
  const std::string cut = dir.file("cut.safetensors");
  validation::write_file_bytes(cut, bytes.substr(0, bytes.size() - 10));
  expect_input_error({"compare", "--inputs", cut, "--outputs", cut},
                     "past the data block");
}

TEST(Sweep, WritesCsvAndPng) {
  testing::TempDir dir;
  const std::string prefix = dir.file("s");
  const testing::CliRun r = testing::run(
      {"sweep", "--over", "magnitude", "--points", "3", "--shape", "1x1x8x8",
       "--backend", "reference", "--precision", "f32", "--out", prefix});
  if (r.code == kExitTool) GTEST_SKIP() << "gnuplot unavailable: " << r.err;
  ASSERT_EQ(r.code, kExitPass) << r.err;
  std::ifstream csv(prefix + ".csv");
  std::string line;
  int lines = 0;
  bool sdpa = false;
  while (std::getline(csv, line)) {
    ++lines;
    sdpa |= line.find(",sdpa,") != std::string::npos;
  }
  EXPECT_EQ(lines, 1 + 3 * 2);  // header + 3 points x (qknorm, sdpa)
  EXPECT_TRUE(sdpa);
  ASSERT_TRUE(std::filesystem::exists(prefix + ".png"));
  EXPECT_GT(std::filesystem::file_size(prefix + ".png"), 1000u);
}

// Every sweep estimates its work first and stops before starting past the
// budget (the top-level --max-seconds), as --over tiles does
// (TileSweep.EstimateFirstAndBudgetStop); within it, it runs.
TEST(Sweep, EstimateFirstAndBudgetStop) {
  testing::TempDir dir;
  const std::string prefix = dir.file("s");
  for (const char* over : {"seq", "g", "magnitude"}) {
    SCOPED_TRACE(over);
    const testing::CliRun r = testing::run(
        {"--max-seconds", "0.001", "sweep", "--over", over, "--backend",
         "reference", "--precision", "f32", "--out", prefix, "--no-plot"});
    EXPECT_EQ(r.code, kExitUsage) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("qknorm-check sweep: estimated work: ", 0), 0u)
        << r.err;
    EXPECT_NE(r.err.find("stopped before starting: the estimate"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("exceeds --max-seconds 0."), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("largest: reference:f32 ~"), std::string::npos)
        << r.err;
    EXPECT_FALSE(std::filesystem::exists(prefix + ".csv"));
  }
  const testing::CliRun small = testing::run(
      {"sweep", "--over", "seq", "--from", "8", "--to", "16", "--backend",
       "reference", "--precision", "f32", "--out", prefix, "--no-plot"});
  EXPECT_EQ(small.code, kExitPass) << small.out << small.err;
  EXPECT_NE(small.err.find("estimated work: 4 attention cases x 1 entries"),
            std::string::npos)  // 2 lengths x (qknorm, sdpa)
      << small.err;
  EXPECT_TRUE(std::filesystem::exists(prefix + ".csv"));
}

// The sweep's estimate grows with its points' work: the lengths' n^2, the
// sdpa lines, more entries.
TEST(Sweep, EstimateScalesWithThePoints) {
  SuiteOptions s;
  s.backends = {"reference"};
  s.precisions = {"f32"};
  const std::vector<const Backend*> one = select_entries(all_backends(), s);
  CostRates r;
  r.entry = {1e-9};
  r.entry_elem = {0};
  r.oracle = 1e-8;
  r.naive = 2e-9;
  r.probs = 1e-9;
  AttentionProblem p = parse_shape("1x2x64x64");
  AttentionProblem q = parse_shape("1x2x128x64");
  const CostEstimate a = estimate_sweep(r, one, {p}, false);
  const CostEstimate b = estimate_sweep(r, one, {q}, false);
  const CostEstimate c = estimate_sweep(r, one, {q}, true);
  EXPECT_NEAR(b.total() / a.total(), 4.0, 0.5);  // setup is O(n D)
  EXPECT_GT(c.total(), 1.9 * b.total());         // sdpa: another oracle
  EXPECT_GT(c.naive_s, 0);
  EXPECT_EQ(c.attention_cases, 2);
  EXPECT_DOUBLE_EQ(b.oracle_s, r.probs * 1 * 2 * 128 * 128 * 64 +
                                   r.oracle * 1 * 2 * 128 * 128 * 64);
}

// The estimate's wall time simulates the pool (cost.h simulate_schedule):
// steps share the cores, wait for their dependencies, and a worker takes
// one step at a time. Each figure below is worked out by hand.
TEST(CostSchedule, SharesCoresAndWaitsForDependencies) {
  // Two independent one-thread steps of 10 core-seconds: 10 s on two
  // workers and two cores, 20 s on one worker or on one core.
  const std::vector<SimStep> two = {{{{10, 1}}, {}}, {{{10, 1}}, {}}};
  EXPECT_NEAR(simulate_schedule(two, 2, 2), 10, 1e-9);
  EXPECT_NEAR(simulate_schedule(two, 1, 2), 20, 1e-9);
  EXPECT_NEAR(simulate_schedule(two, 2, 1), 20, 1e-9);
  // A two-thread step of 20 core-seconds beside a one-thread step of 10:
  // three threads on two cores, 2/3 of a core each, both done at 15 s.
  const std::vector<SimStep> mixed = {{{{20, 2}}, {}}, {{{10, 1}}, {}}};
  EXPECT_NEAR(simulate_schedule(mixed, 2, 2), 15, 1e-9);
  // An oracle (1 s on one thread, then 8 core-seconds on two) before its
  // entry (4 s on one thread), beside an independent step of 3 s: the
  // oracle's serial phase and the other step share the cores (1 s), the
  // two-thread phase then shares them with the other step's last 2 s (3
  // threads: 2/3 each, 3 s, 4 of its 8 core-seconds), then runs alone (2 s),
  // then the entry alone (4 s): 1 + 3 + 2 + 4 = 10 s.
  const std::vector<SimStep> dep = {
      {{{1, 1}, {8, 2}}, {}}, {{{4, 1}}, {0}}, {{{3, 1}}, {}}};
  EXPECT_NEAR(simulate_schedule(dep, 2, 2), 10, 1e-9);
  // One worker runs them in plan order, whatever the cores: 1 + 4 + 4 + 3.
  EXPECT_NEAR(simulate_schedule(dep, 1, 2), 12, 1e-9);
}

// At jobs > 1 the pool plans a case's entries costliest first, so that
// the slowest entry's chain does not start last (at 1x4x32768x128 causal it
// left one core idle for the last ~100 s); at one job, or without an
// estimate, in the serial order.
TEST(CostSchedule, EntriesCostliestFirstOnSeveralJobs) {
  const std::vector<double> costs = {1, 3, 2, 3};
  EXPECT_EQ(entry_order(&costs, 4, 2), (std::vector<size_t>{1, 3, 2, 0}));
  EXPECT_EQ(entry_order(&costs, 4, 1), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(entry_order(nullptr, 4, 2), (std::vector<size_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace qknorm::cli
