// Compare mode: tensors dumped by another framework (.npy files or one
// .safetensors file) judged against the oracle by the suite's componentwise
// verdict (validation/rule.h), exactly as a registry entry's results are.
//
// Tensor names (file stems for .npy, keys for .safetensors; case-insensitive,
// or forced with NAME=PATH): inputs q, k, v [B,H,N,D] (leading dims may be
// dropped: [H,N,D] or [N,D]), g (scalar; --g overrides), optional dO; outputs
// O and optionally dQ, dK, dV, dg.
//
// ScaleNorm dumps (issue 17): inputs x [..., dim] (the leading dims are the
// rows), g (scalar; --g overrides), optional dy; outputs y and optionally dx,
// dg; x, dy, y, dx share x's shape and dtype. They make a
// validation::ScaleNormCase judged by validation::judge_scalenorm, restricted
// to y and the gradients given, with the naive reference:<dtype of x> beside
// it; eps is ScaleNorm's 1e-5 unless --eps is given. --kind auto (default)
// tells the two apart by the tensor names.
//
// No stand-in backend: the inputs, as the files hold them (no rounding), make
// the validation::AttentionCase; its oracle is computed once; the files'
// outputs are the validation::AttentionResult judged by
// validation::judge_attention, restricted to the fields the files give (O
// always, dQ/dK/dV/dg when given, never lse). The naive baseline
// reference:<dtype of q> runs on the same inputs for the report's statistics
// and its own margin only; it is no part of the verdict.
//
// The report names the case's input class (validation/case.h input_class),
// found from the files' q and k rows (x rows) and the mask option, as a file
// carries no distribution: extreme-range if a row's norm leaves the range
// of an unscaled f32 norm, degenerate if a row is zero or a query row fully
// masked, realistic otherwise.
//
// Non-finite values: in an output they are the verdict's to classify (an
// infinity where the oracle rounds to it in the dtype passes as "not
// representable"; NaN or inf where a finite or defined value exists, e.g.
// NaN on a fully masked row whose O is 0, FAILs with that diagnosis: exit 1).
// In an input they are an input error (exit 3), like a malformed file:
// "q[b,h,n,d]: element is NaN (finite input required)", "g: must be finite".
#ifndef QKNORM_CLI_COMPARE_H_
#define QKNORM_CLI_COMPARE_H_

#include <array>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "cli/options.h"
#include "cli/report.h"
#include "qknorm/contract.h"
#include "validation/tensor_io.h"

namespace CLI {
class App;
}

namespace qknorm::cli {

struct CompareOptions {
  std::vector<std::string> inputs, outputs;
  // "f32" (default): the framework computes in f32 (f64 for f64 files) and
  // rounds only its outputs, our entries' contract. "storage": it rounds its
  // intermediates to the files' dtype too (PyTorch's bfloat16 autograd on
  // CPU); the verdict's compute unit becomes the storage unit roundoff.
  // An alias of --contract f32-accumulate / --contract storage.
  std::string compute = "f32";
  // The compute contract the framework declares (qknorm/contract.h): a
  // preset (f32-accumulate, storage) or a spec of rounding points,
  // "q=f16,kv=f16,logits=f32,p=f16,pv_acc=f16,out=f32,compute=f32"; empty:
  // --compute's. resolved_contract() resolves both (throws qknorm::Error on
  // a bad spec or a conflict; run_compare exits kExitUsage).
  std::string contract;
  // One flag per rounding point (--round-q f16, --round-pv-acc f16, ...),
  // in RoundingPoint order q, kv, logits, p, pv_acc, out: each sets that
  // point on top of --contract / --compute (empty: unset).
  std::array<std::string, 6> round_points;
  ComputeContract resolved_contract() const;
  // "attention", "scalenorm" or "auto" (dump_kind()).
  std::string kind = "auto";
};

void add_compare_options(CLI::App& app, CompareOptions& o);

// Reads every file (NAME=PATH, *.npy or *.safetensors) into canonical names
// q, k, v, g, dO, O, dQ, dK, dV, dg. Throws qknorm::Error naming the file.
std::map<std::string, validation::HostTensor> load_tensors(
    const std::vector<std::string>& specs, const std::string& flag);

// "attention" or "scalenorm": `kind` if it names one, else (auto) from the
// names: any of x, dy (inputs) or y, dx (outputs) and no attention-only
// tensor is ScaleNorm; both kinds present throws, asking for --kind.
std::string dump_kind(const std::map<std::string, validation::HostTensor>& in,
                      const std::map<std::string, validation::HostTensor>& out,
                      const std::string& kind = "auto");

// The judgement of the loaded tensors (throws qknorm::Error on missing
// tensors, wrong dtypes or shapes). `s` supplies g (if set), eps, variant
// and at most one mask (attention; ScaleNorm takes g and eps only). The
// row's kind is dump_kind(in, out, kind).
EntryRow compare_tensors(
    const std::map<std::string, validation::HostTensor>& in,
    const std::map<std::string, validation::HostTensor>& out,
    const SuiteOptions& s, std::string* case_desc,
    const ComputeContract& contract = {}, const std::string& kind = "auto");

int run_compare(const CompareOptions& o, const SuiteOptions& s,
                const std::string& json, std::ostream& out, std::ostream& err);

}  // namespace qknorm::cli

#endif  // QKNORM_CLI_COMPARE_H_
