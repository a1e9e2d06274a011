// Ad-hoc probe (development only): one case, one entry, report.
#include <cstdio>
#include <cstdlib>

#include "validation/check.h"
using namespace qknorm;
int main(int argc, char** argv) {
  AttentionProblem p;
  p.batch = atoi(argv[2]);
  p.q_len = atoi(argv[3]);
  p.kv_len = atoi(argv[4]);
  p.head_dim = atoi(argv[5]);
  p.g = atof(argv[6]);
  if (argc > 7 && atoi(argv[7]) >= 0) {
    p.mask.key_lengths.assign(p.batch, atoi(argv[7]));
    p.mask.key_lengths[0] = argc > 8 ? atoi(argv[8]) : atoi(argv[7]);
  }
  uint64_t seed = argc > 9 ? atoi(argv[9]) : 8;
  auto c = validation::make_attention_case(
      p, validation::Distribution::kGaussian, seed);
  auto rep = validation::check_attention(*all_backends().find(argv[1]), c,
                                         ExecConfig{1});
  for (auto& f : rep.fields)
    std::printf("%s: entry %.3e naive %.3e margin %.3e (naive %.3e) %s\n",
                validation::name(f.id), f.entry.max_abs, f.naive.max_abs,
                f.margin, f.naive_margin, f.pass ? "ok" : "FAIL");
}
