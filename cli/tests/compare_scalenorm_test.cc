// compare on ScaleNorm dumps (issue 17, part 5): x, g, dy in; y, dx, dg out,
// judged by validation::judge_scalenorm like any entry's results. Each test
// writes a reference run (reference:<prec>, the naive baseline, which the
// suite itself passes) with the suite's own npy/safetensors writers and runs
// the real command line:
// - correct dumps PASS: f32 .npy (3-D x, rows from the leading dims), bf16
//   .safetensors, forward only (x, g -> y), NAME=PATH with --g;
// - one wrong dx element FAILs and the report names it; a NaN in y FAILs;
// - malformed input is an input error (exit 3) naming the tensor and rule:
//   NaN in x or dy, shapes or dtypes unlike x's, missing tensors, attention
//   options, attention and ScaleNorm tensors mixed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cli/compare.h"
#include "cli/tests/test_util.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace qknorm::cli {
namespace {

using testing::expect_input_error;
using validation::HostTensor;

// A reference run of ScaleNorm on rows x dim Gaussian inputs (already in
// `prec`), stored under the tensor names compare reads. `shape` is x's shape
// in the files (its element count rows * dim).
struct SnDump {
  Precision prec = Precision::kF32;
  std::vector<int64_t> shape;
  validation::ScaleNormCase c;
  validation::ScaleNormResult r;
};

SnDump make_dump(Precision prec, std::vector<int64_t> shape,
                 uint64_t seed = 3) {
  SnDump d;
  d.prec = prec;
  d.shape = std::move(shape);
  ScaleNormProblem p;
  p.dim = d.shape.back();
  p.rows = 1;
  for (size_t i = 0; i + 1 < d.shape.size(); ++i) p.rows *= d.shape[i];
  p.g = scalenorm_g_init(p.dim);
  d.c = validation::round_inputs(
      validation::make_scalenorm_case(p, validation::Distribution::kGaussian,
                                      seed, prec),
      prec);
  d.r = validation::run_scalenorm(validation::naive_for(prec), d.c);
  return d;
}

std::vector<HostTensor> tensors(const SnDump& d) {
  auto t = [&](const char* name, const std::vector<double>& v) {
    return HostTensor{name, d.prec, d.shape, v};
  };
  return {
      t("x", d.c.x),   HostTensor{"g", Precision::kF64, {}, {d.c.problem.g}},
      t("dy", d.c.dy), t("y", d.r.y),
      t("dx", d.r.dx), HostTensor{"dg", Precision::kF64, {}, {d.r.dg}}};
}

void write_npys(const std::string& dir, const SnDump& d) {
  for (const HostTensor& h : tensors(d))
    validation::write_npy_file(dir + "/" + h.name + ".npy", h);
}

std::vector<std::string> sn_args(const std::string& dir,
                                 std::vector<std::string> extra = {}) {
  return testing::compare_npy_args(dir, {"x", "g", "dy"}, {"y", "dx", "dg"},
                                   extra);
}

TEST(CompareScaleNorm, CorrectF32NpyDumpPasses) {
  testing::TempDir dir;
  // 3-D x: the leading dims [2, 6] are 12 rows of dim 40.
  const SnDump d = make_dump(Precision::kF32, {2, 6, 40});
  write_npys(dir.path(), d);
  const testing::CliRun r = testing::run(sn_args(dir.path()));
  EXPECT_EQ(r.code, kExitPass) << r.out << r.err;
  EXPECT_NE(r.out.find("files:f32"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scalenorm rows=12 dim=40"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  // In-process: y, dx and dg are judged, the naive baseline beside them.
  SuiteOptions s;
  std::string desc;
  const EntryRow row = compare_tensors(
      load_tensors({dir.file("x.npy"), dir.file("g.npy"), dir.file("dy.npy")},
                   "--inputs"),
      load_tensors({dir.file("y.npy"), dir.file("dx.npy"), dir.file("dg.npy")},
                   "--outputs"),
      s, &desc);
  EXPECT_EQ(row.kind, "scalenorm");
  EXPECT_TRUE(row.pass);
  ASSERT_EQ(row.cases.size(), 1u);
  std::vector<validation::Field> fields;
  for (const FieldResult& f : row.cases[0].fields) fields.push_back(f.field);
  EXPECT_EQ(fields, (std::vector<validation::Field>{
                        validation::Field::kY, validation::Field::kDx,
                        validation::Field::kScaleNormDg}));
  // The JSON report names the kind.
  const testing::CliRun j = testing::run(sn_args(dir.path(), {"--json", "-"}));
  EXPECT_EQ(j.code, kExitPass) << j.out << j.err;
  EXPECT_NE(j.out.find("\"kind\": \"scalenorm\""), std::string::npos) << j.out;
}

TEST(CompareScaleNorm, CorrectBf16SafetensorsDumpPasses) {
  testing::TempDir dir;
  const SnDump d = make_dump(Precision::kBF16, {16, 64}, 5);
  const std::string f = dir.file("sn.safetensors");
  validation::write_safetensors_file(f, tensors(d));
  const testing::CliRun r =
      testing::run({"compare", "--inputs", f, "--outputs", f});
  EXPECT_EQ(r.code, kExitPass) << r.out << r.err;
  EXPECT_NE(r.out.find("files:bf16"), std::string::npos) << r.out;
  // --kind scalenorm says the same explicitly.
  const testing::CliRun k = testing::run(
      {"compare", "--kind", "scalenorm", "--inputs", f, "--outputs", f});
  EXPECT_EQ(k.code, kExitPass) << k.out << k.err;
}

TEST(CompareScaleNorm, ForwardOnlyAndNameEqualsPathWithGOverride) {
  testing::TempDir dir;
  const SnDump d = make_dump(Precision::kF32, {9, 33}, 7);
  write_npys(dir.path(), d);
  const testing::CliRun f =
      testing::run({"compare", "--inputs", dir.file("x.npy"), dir.file("g.npy"),
                    "--outputs", dir.file("y.npy")});
  EXPECT_EQ(f.code, kExitPass) << f.out << f.err;
  // Arbitrary file names, g from --g, dy under an alias.
  const testing::CliRun n = testing::run(
      {"compare", "--g", fmt::format("{:.17g}", d.c.problem.g), "--inputs",
       "x=" + dir.file("x.npy"), "grad_y=" + dir.file("dy.npy"), "--outputs",
       "y=" + dir.file("y.npy"), "dx=" + dir.file("dx.npy")});
  EXPECT_EQ(n.code, kExitPass) << n.out << n.err;
  // A wrong --g overrides the file's g, and y FAILs.
  const testing::CliRun w =
      testing::run({"compare", "--g", "1", "--inputs", dir.file("x.npy"),
                    dir.file("g.npy"), "--outputs", dir.file("y.npy")});
  EXPECT_EQ(w.code, kExitFail) << w.out << w.err;
}

TEST(CompareScaleNorm, OneWrongDxElementFailsAndIsNamed) {
  testing::TempDir dir;
  SnDump d = make_dump(Precision::kF32, {12, 40});
  const size_t bad = 3 * 40 + 7;  // dx[3,7]
  ASSERT_NE(d.r.dx[bad], 0.0);
  d.r.dx[bad] = round_to(Precision::kF32, d.r.dx[bad] * 1.01);
  write_npys(dir.path(), d);
  const testing::CliRun r = testing::run(sn_args(dir.path()));
  EXPECT_EQ(r.code, kExitFail) << r.out << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const std::string needle :
       {"FAIL", "field dx: 1 of 480 elements fail", "worst dx[3,7]"})
    EXPECT_NE(r.out.find(needle), std::string::npos)
        << "no '" << needle << "' in\n"
        << r.out;
  // The forward alone still passes: the wrong element is in dx.
  const testing::CliRun f =
      testing::run({"compare", "--inputs", dir.file("x.npy"), dir.file("g.npy"),
                    "--outputs", dir.file("y.npy")});
  EXPECT_EQ(f.code, kExitPass) << f.out << f.err;
  // A NaN output is the verdict's to classify: FAIL, not an input error.
  SnDump n = make_dump(Precision::kF32, {12, 40});
  n.r.y[5] = std::numeric_limits<double>::quiet_NaN();
  write_npys(dir.path(), n);
  const testing::CliRun y = testing::run(sn_args(dir.path()));
  EXPECT_EQ(y.code, kExitFail) << y.out << y.err;
  EXPECT_NE(y.out.find("y[0,5] is NaN where"), std::string::npos) << y.out;
}

TEST(CompareScaleNorm, MalformedInputIsAnInputErrorNamingTheRule) {
  testing::TempDir dir;
  const SnDump good = make_dump(Precision::kF32, {12, 40});
  write_npys(dir.path(), good);
  // "NAME=PATH" of a copy of NAME.npy changed by `edit`.
  int copies = 0;
  auto edited = [&](const std::string& nm, auto edit) {
    HostTensor t = validation::read_npy_file(dir.file(nm + ".npy"));
    edit(t);
    const std::string f = dir.file(nm + std::to_string(++copies) + ".npy");
    validation::write_npy_file(f, t);
    return nm + "=" + f;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::string x = dir.file("x.npy"), g = dir.file("g.npy"),
                    dy = dir.file("dy.npy"), y = dir.file("y.npy"),
                    dx = dir.file("dx.npy");
  // Non-finite inputs, named by element in the file's shape.
  expect_input_error(
      {"compare", "--inputs",
       edited("x", [&](HostTensor& t) { t.values[3 * 40 + 5] = nan; }), g,
       "--outputs", y},
      "x[3,5]: element is NaN (finite input required)");
  expect_input_error({"compare", "--inputs", x, g,
                      edited("dy", [&](HostTensor& t) { t.values[40] = -inf; }),
                      "--outputs", y, dx},
                     "dy[1,0]: element is -Inf (finite input required)");
  // Shapes and dtypes must be x's; g one value; x at least 1-D.
  expect_input_error({"compare", "--inputs", x, g, dy, "--outputs", y,
                      edited("dx",
                             [](HostTensor& t) {
                               t.shape = {40, 12};
                             })},
                     "dx: shape [40, 12] differs from x's [12, 40]");
  expect_input_error(
      {"compare", "--inputs", x, g, "--outputs",
       edited("y", [](HostTensor& t) { t.dtype = Precision::kF64; })},
      "y: dtype f64 differs from x's f32");
  expect_input_error({"compare", "--inputs", x,
                      edited("g",
                             [](HostTensor& t) {
                               t.shape = {2};
                               t.values = {1, 2};
                             }),
                      "--outputs", y},
                     "g: must hold one value (shape [2])");
  expect_input_error({"compare", "--inputs",
                      edited("x",
                             [](HostTensor& t) {
                               t.shape = {};
                               t.values = {1};
                             }),
                      g, "--outputs", y},
                     "x: shape [] must be [..., dim]");
  // Missing tensors.
  expect_input_error({"compare", "--inputs", x, g, "--outputs", dx},
                     "no tensor named y");
  expect_input_error({"compare", "--inputs", x, g, "--outputs", y, dx},
                     "no tensor named dy");
  expect_input_error({"compare", "--inputs", x, "--outputs", y},
                     "no tensor named g");
  // Attention options and tensors; a bad eps.
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--mask", "causal"}, "--mask: does not apply to a ScaleNorm dump"},
      {{"--compute", "storage"},
       "--compute: storage is not available for ScaleNorm dumps"},
      {{"--kind", "attention"}, "no tensor named q"},
      {{"--eps", "0"}, "eps: must be finite and > 0"}};
  for (const auto& [flags, needle] : bad) {
    std::vector<std::string> a = {"compare"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--inputs", x, g, "--outputs", y});
    expect_input_error(a, needle);
  }
  expect_input_error({"compare", "--inputs", x, "q=" + x, g, "--outputs", y},
                     "choose one with --kind");
}

}  // namespace
}  // namespace qknorm::cli
