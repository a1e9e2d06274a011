// Compare mode: tensors dumped by another framework (.npy files or one
// .safetensors file) checked against the oracle with the suite's metrics and
// tolerance rule, the naive baseline run at the files' dtype.
#ifndef QKNORM_CLI_COMPARE_H_
#define QKNORM_CLI_COMPARE_H_

#include <ostream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/report.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct CompareOptions {
  std::vector<std::string> inputs, outputs;
  std::string causal_flag;  // unused placeholder kept out of the API
};

void add_compare_options(CLI::App& app, CompareOptions& o);

int run_compare(const CompareOptions& o, const SuiteOptions& s,
                const std::string& json, std::ostream& out, std::ostream& err);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COMPARE_H_
