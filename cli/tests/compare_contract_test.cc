// compare --contract (issue 31; qknorm/contract.h): the dump of an eager
// f16 kernel (every intermediate rounded to f16, mutants/contract_entries.h)
// FAILs the default f32-accumulate contract and PASSes `storage`; the entry
// line names the contract and its bound's looseness; `--compute storage` is
// the same verdict, byte for byte; a bad spec or a conflict with --compute
// is a bad option (exit 2).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "cli/tests/test_util.h"
#include "mutants/contract_entries.h"
#include "validation/npy.h"
#include "validation/run.h"

namespace qknorm::cli {
namespace {

using validation::HostTensor;

// Writes the case's inputs and the eager f16 entry's outputs as .npy files.
void write_eager_dump(const std::string& dir) {
  const validation::AttentionCase c =
      testing::gaussian_case(16, 16, 16, g_init(16), Precision::kF16, 11);
  const auto entry = property::make_contract_entry(
      property::ContractKernel::kEagerStorage, Precision::kF16,
      ComputeContract::storage());
  const validation::AttentionResult r = validation::run_attention(*entry, c);
  const AttentionProblem& p = c.problem;
  auto t = [&](const char* name, const std::vector<double>& v, int64_t rows) {
    HostTensor h;
    h.name = name;
    h.dtype = Precision::kF16;
    h.shape = {p.batch, p.heads, rows, p.head_dim};
    h.values = v;
    validation::write_npy_file(dir + "/" + name + ".npy", h);
  };
  t("q", c.q, p.q_len);
  t("k", c.k, p.kv_len);
  t("v", c.v, p.kv_len);
  t("dO", c.d_o, p.q_len);
  t("O", r.o, p.q_len);
  t("dQ", r.dq, p.q_len);
  t("dK", r.dk, p.kv_len);
  t("dV", r.dv, p.kv_len);
  for (const auto& [name, x] :
       {std::pair<const char*, double>{"g", p.g}, {"dg", r.dg}})
    validation::write_npy_file(dir + "/" + name + ".npy",
                               HostTensor{name, Precision::kF64, {}, {x}});
}

std::vector<std::string> args(const std::string& dir,
                              const std::vector<std::string>& extra) {
  return testing::compare_npy_args(dir, {"q", "k", "v", "g", "dO"},
                                   {"O", "dQ", "dK", "dV", "dg"}, extra);
}

// A report byte for byte but its last line's wall time: "compare: FAIL in
// 0.1 s" against "0.0 s" of the same report failed RoundFlagsAreTheSpecsItems
// on a loaded machine (the sanitizer stage of 7e98c1f's CI).
std::string without_wall_time(const std::string& out) {
  static const std::regex wall(" in [0-9.]+ s\n$");
  return std::regex_replace(out, wall, " in - s\n");
}

TEST(CompareContract, EagerDumpPassesOnlyUnderStorageWhichTheReportNames) {
  testing::TempDir dir;
  write_eager_dump(dir.path());
  const testing::CliRun f32 = testing::run(args(dir.path(), {}));
  EXPECT_EQ(f32.code, kExitFail) << f32.out << f32.err;
  const testing::CliRun st =
      testing::run(args(dir.path(), {"--contract", "storage", "--no-timing"}));
  EXPECT_EQ(st.code, kExitPass) << st.out << st.err;
  EXPECT_NE(st.out.find("PASS under storage (o's bound "), std::string::npos)
      << st.out;
  const testing::CliRun alias =
      testing::run(args(dir.path(), {"--compute", "storage", "--no-timing"}));
  EXPECT_EQ(alias.code, kExitPass);
  EXPECT_EQ(without_wall_time(alias.out), without_wall_time(st.out));
}

TEST(CompareContract, BadSpecOrConflictIsABadOption) {
  testing::TempDir dir;
  write_eager_dump(dir.path());
  const testing::CliRun bad =
      testing::run(args(dir.path(), {"--contract", "pv_acc=f17"}));
  EXPECT_EQ(bad.code, kExitUsage) << bad.out << bad.err;
  EXPECT_NE((bad.out + bad.err).find("the format must be"), std::string::npos)
      << bad.out << bad.err;
  const testing::CliRun both = testing::run(
      args(dir.path(), {"--compute", "storage", "--contract", "pv_acc=f16"}));
  EXPECT_EQ(both.code, kExitUsage) << both.out << both.err;
  EXPECT_NE(both.err.find("conflicts with --compute storage"),
            std::string::npos)
      << both.err;
}

// The per-point flags are the spec's items: --round-p f16 --round-pv-acc
// f16 gives --contract pv_acc=f16,p=f16's report byte for byte (a contract
// looser than f32-accumulate's, so the dump's verdict can differ from the
// default's), and a bad format is a bad option naming the point.
TEST(CompareContract, RoundFlagsAreTheSpecsItems) {
  testing::TempDir dir;
  write_eager_dump(dir.path());
  const testing::CliRun spec = testing::run(
      args(dir.path(), {"--contract", "pv_acc=f16,p=f16", "--no-timing"}));
  const testing::CliRun flags =
      testing::run(args(dir.path(), {"--round-p", "f16", "--round-pv-acc",
                                     "f16", "--no-timing"}));
  EXPECT_EQ(flags.code, spec.code) << flags.out << flags.err;
  EXPECT_EQ(without_wall_time(flags.out), without_wall_time(spec.out));
  EXPECT_NE(flags.out.find("under p=f16,pv_acc=f16"), std::string::npos)
      << flags.out;
  const testing::CliRun bad =
      testing::run(args(dir.path(), {"--round-logits", "f8"}));
  EXPECT_EQ(bad.code, kExitUsage) << bad.out << bad.err;
  EXPECT_NE((bad.out + bad.err).find("logits=f8"), std::string::npos)
      << bad.out << bad.err;
}

}  // namespace
}  // namespace qknorm::cli
