// Stub implementation (API first, issue 33); the real model follows.
#include "validation/coverage.h"

namespace qknorm::validation::coverage {

const char* name(Dim d) {
  switch (d) {
    case Dim::kHeadDim:
      return "head_dim";
    case Dim::kBatch:
      return "batch";
    case Dim::kHeads:
      return "heads";
    case Dim::kQLen:
      return "q_len";
    case Dim::kKvLen:
      return "kv_len";
    case Dim::kMask:
      return "mask";
  }
  return "?";
}
const char* name(MaskKind) { return "?"; }
std::string full_name(const Cell& c) {
  return std::string(name(c.dim)) + ":" + c.label;
}
std::optional<AttentionProblem> realize(const Choice&, double) { return {}; }
double cost(const AttentionProblem&) { return 0; }
Model::Model(const ModelOptions& o) : opt_(o) {}
int Model::index(Dim, std::string_view) const { return -1; }
std::vector<int> Model::reached(const AttentionProblem&) const { return {}; }
bool Model::feasible(int, int) const { return false; }
void Model::derive_feasibility() {}
unsigned supported_needs(const Backend&) { return 0; }
std::vector<int64_t> declared_blocks(const Backend&) { return {}; }
Model model_for(const Backend&, int threads) {
  ModelOptions o;
  o.threads = threads;
  return Model(o);
}
unsigned needs_of(const AttentionProblem&) { return 0; }
std::vector<AttentionProblem> covering_array(const Model&, double) {
  return {};
}
Tally::Tally(const Model& m, unsigned n) : m_(&m), needs_(n) {}
void Tally::add(const AttentionProblem&) {}
int Tally::singles_feasible() const { return 0; }
int Tally::singles_reached() const { return 0; }
int Tally::pairs_feasible() const { return 0; }
int Tally::pairs_reached() const { return 0; }
std::vector<int> Tally::unreached_singles() const { return {}; }
std::vector<std::pair<int, int>> Tally::unreached_pairs() const { return {}; }
std::string Tally::summary() const { return {}; }

}  // namespace qknorm::validation::coverage
