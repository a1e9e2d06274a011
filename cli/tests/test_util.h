// Helpers shared by the qknorm-check tests.
#ifndef QKNORM_CLI_TESTS_TEST_UTIL_H_
#define QKNORM_CLI_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "cli/app.h"
#include "validation/case.h"

namespace qknorm::cli::testing {

struct CliRun {
  int code = -1;
  std::string out, err;
};

// Runs the real command line in-process.
inline CliRun run(std::vector<std::string> args) {
  args.insert(args.begin(), "qknorm-check");
  std::ostringstream out, err;
  CliRun r;
  r.code = run_cli(args, out, err, false);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The command line exits with kExitInput and its stderr contains `needle`.
inline void expect_input_error(const std::vector<std::string>& args,
                               const std::string& needle) {
  const CliRun r = run(args);
  EXPECT_EQ(r.code, kExitInput) << r.out << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos)
      << "stderr lacks '" << needle << "':\n"
      << r.err;
}

// A Gaussian case of one batch and two heads with these lengths and g, its
// inputs rounded to `prec` (what an entry of that precision reads).
inline validation::AttentionCase gaussian_case(int64_t q_len, int64_t kv_len,
                                               int64_t head_dim, double g,
                                               Precision prec, uint64_t seed) {
  AttentionProblem p;
  p.heads = 2;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.head_dim = head_dim;
  p.g = g;
  return validation::round_inputs(
      validation::make_attention_case(p, validation::Distribution::kGaussian,
                                      seed, prec),
      prec);
}

// `compare [extra] --inputs dir/<input>.npy ... --outputs dir/<output>.npy
// ...`: the command line of a dump written as .npy files into `dir`.
inline std::vector<std::string> compare_npy_args(
    const std::string& dir, std::initializer_list<const char*> inputs,
    std::initializer_list<const char*> outputs,
    const std::vector<std::string>& extra) {
  std::vector<std::string> a = {"compare"};
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back("--inputs");
  for (const char* n : inputs) a.push_back(dir + "/" + n + ".npy");
  a.push_back("--outputs");
  for (const char* n : outputs) a.push_back(dir + "/" + n + ".npy");
  return a;
}

// A fresh directory under the test's temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "qknorm_cli_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace qknorm::cli::testing

#endif  // QKNORM_CLI_TESTS_TEST_UTIL_H_
