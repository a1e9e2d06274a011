// Compare mode: tensors dumped by another framework (.npy files or one
// .safetensors file) checked against the oracle with the suite's metrics and
// tolerance rule, the naive baseline run at the files' dtype.
//
// Tensor names (file stems for .npy, keys for .safetensors; case-insensitive,
// or forced with NAME=PATH): inputs q, k, v [B,H,N,D] (leading dims may be
// dropped: [H,N,D] or [N,D]), g (scalar; --g overrides), optional dO; outputs
// O and optionally dQ, dK, dV, dg. The user's O, dQ, dK, dV, dg are judged
// exactly as a registry entry's would be (validation/harness.h), against
// reference:<dtype of q>; a gradient that is not given is not judged.
#ifndef QKNORM_CLI_COMPARE_H_
#define QKNORM_CLI_COMPARE_H_

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/report.h"
#include "validation/tensor_io.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct CompareOptions {
  std::vector<std::string> inputs, outputs;
};

void add_compare_options(CLI::App& app, CompareOptions& o);

// Reads every file (NAME=PATH, *.npy or *.safetensors) into canonical names
// q, k, v, g, dO, O, dQ, dK, dV, dg. Throws qknorm::Error naming the file.
std::map<std::string, validation::HostTensor> load_tensors(
    const std::vector<std::string>& specs, const std::string& flag);

// The judgement of the loaded tensors (throws qknorm::Error on missing
// tensors, wrong dtypes or shapes). `s` supplies g (if set), eps, variant
// and at most one mask.
EntryRow compare_tensors(
    const std::map<std::string, validation::HostTensor>& in,
    const std::map<std::string, validation::HostTensor>& out,
    const SuiteOptions& s, std::string* case_desc);

int run_compare(const CompareOptions& o, const SuiteOptions& s,
                const std::string& json, std::ostream& out, std::ostream& err);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COMPARE_H_
