// Helpers shared by the qknorm-check tests.
#ifndef QKNORM_CLI_TESTS_TEST_UTIL_H_
#define QKNORM_CLI_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli/app.h"

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
