#include "property_tests/shape_coverage.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "property_tests/entry_checks.h"

namespace qknorm::property {

// entry_checks.h (here, in qknorm_property_support, for the report's
// per-entry directories).
std::string test_name_of(const std::string& entry) {
  std::string s = entry;
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

int model_threads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(2, cores);
}

const coverage::Model& model_of(const Backend& b) {
  static std::mutex mu;
  static auto* models =
      new std::map<std::string, std::unique_ptr<coverage::Model>>;
  const std::lock_guard<std::mutex> lock(mu);
  auto& m = (*models)[b.name()];
  if (m == nullptr)
    m = std::make_unique<coverage::Model>(
        coverage::model_for(b, model_threads()));
  return *m;
}

namespace {
thread_local ShapeContext t_context;
thread_local std::vector<AttentionProblem> t_record;
}  // namespace

const ShapeContext& shape_context() { return t_context; }

ShapeContextScope::ShapeContextScope(const Backend& b) : saved_(t_context) {
  t_context.model = &model_of(b);
  t_context.needs = coverage::supported_needs(b);
}
ShapeContextScope::~ShapeContextScope() { t_context = saved_; }

void record_problem(const AttentionProblem& p) { t_record.push_back(p); }
const std::vector<AttentionProblem>& recorded_problems() { return t_record; }
void clear_recorded_problems() { t_record.clear(); }

namespace {

// One line per shape: the fields coverage::Model::reached reads.
std::string shape_line(const AttentionProblem& p) {
  std::ostringstream s;
  s << (p.variant == Variant::kSDPA ? "sdpa" : "qknorm") << ' ' << p.batch
    << ' ' << p.heads << ' ' << kv_heads_of(p) << ' ' << p.q_len << ' '
    << p.kv_len << ' ' << p.head_dim << ' ' << (p.mask.causal ? 1 : 0) << ' '
    << p.mask.key_lengths.size();
  for (int64_t l : p.mask.key_lengths) s << ' ' << l;
  return s.str();
}

bool parse_shape(const std::string& line, AttentionProblem* p) {
  std::istringstream s(line);
  std::string variant;
  int64_t kvh = 0, causal = 0;
  size_t n = 0;
  if (!(s >> variant >> p->batch >> p->heads >> kvh >> p->q_len >> p->kv_len >>
        p->head_dim >> causal >> n))
    return false;
  p->variant = variant == "sdpa" ? Variant::kSDPA : Variant::kQKNorm;
  p->kv_heads = kvh;
  p->mask.causal = causal != 0;
  p->mask.key_lengths.resize(n);
  for (int64_t& l : p->mask.key_lengths)
    if (!(s >> l)) return false;
  return true;
}

const char* coverage_dir() {
  const char* d = std::getenv("QKNORM_COVERAGE_OUT");
  return d != nullptr && *d != '\0' ? d : nullptr;
}

}  // namespace

void write_recorded_problems(const Backend& b, const std::string& property) {
  const char* dir = coverage_dir();
  if (dir == nullptr) return;
  const std::filesystem::path d =
      std::filesystem::path(dir) / test_name_of(b.name());
  std::filesystem::create_directories(d);
  std::set<std::string> lines;
  for (const AttentionProblem& p : t_record) lines.insert(shape_line(p));
  std::ofstream out(d / (property + ".shapes"));
  out << "# entry " << b.name() << "\n";
  for (const std::string& l : lines) out << l << "\n";
}

namespace {

// The smallest candidate >= want, else the largest: the walk's base is of
// modest size (lengths and head_dim 16: a full tile of the smallest block,
// several vector widths), not the degenerate 1 x 1 problem.
int64_t base_of(const std::vector<int64_t>& v, int64_t want) {
  int64_t best = -1;
  for (int64_t x : v)
    if (x >= want && (best < 0 || x < best)) best = x;
  if (best < 0 && !v.empty()) best = *std::max_element(v.begin(), v.end());
  return std::max<int64_t>(best, 1);
}

// The walk's base sizes (see base_of): head_dim 16 is no cell of its own
// (the head_dim cells are walked one by one) and keeps the length and mask
// problems 4x cheaper than the model's smallest power of two, 64.
constexpr int64_t kWalkBaseLen = 16;
constexpr int64_t kWalkBaseDim = 16;
// A length problem also sets the other length to its value where the
// problem's B H Nq Nk D stays within this (the full verdict's range in
// ShapeCoverage): q_len L and kv_len L reach both lengths' cells at once.
constexpr int64_t kWalkMirrorMaxWork = int64_t{1} << 20;

}  // namespace

std::vector<AttentionProblem> walk_problems(const coverage::Model& m,
                                            unsigned needs, double g) {
  const coverage::Candidates& cd = m.candidates();
  const std::vector<coverage::Cell>& cells = m.cells();
  coverage::Choice base;
  base.head_dim = kWalkBaseDim;
  base.batch = base_of(cd.batches, 1);
  base.q_len = base_of(cd.q_lens, kWalkBaseLen);
  base.kv_len = base_of(cd.kv_lens, kWalkBaseLen);
  base.heads = base.kv_heads = 1;
  for (const auto& [h, kv] : cd.heads)
    if (h == kv) {
      base.heads = base.kv_heads = h;
      break;
    }
  std::vector<char> done(cells.size(), 0);
  for (size_t i = 0; i < cells.size(); ++i)
    if ((cells[i].needs & ~needs) != 0) done[i] = 1;
  std::vector<AttentionProblem> out;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (done[i]) continue;
    std::optional<AttentionProblem> best;
    double best_cost = 0;
    auto consider = [&](const coverage::Choice& c) {
      const std::optional<AttentionProblem> p = coverage::realize(c, g);
      if (!p || (coverage::needs_of(*p) & ~needs) != 0) return;
      const std::vector<int> r = m.reached(*p);
      if (!std::binary_search(r.begin(), r.end(), static_cast<int>(i))) return;
      const double k = coverage::cost(*p);
      if (!best || k < best_cost) best = p, best_cost = k;
    };
    coverage::Choice c = base;
    switch (cells[i].dim) {
      case coverage::Dim::kHeadDim:
        for (int64_t d : cd.head_dims) c.head_dim = d, consider(c);
        break;
      case coverage::Dim::kBatch:
        for (int64_t b : cd.batches) c.batch = b, consider(c);
        break;
      case coverage::Dim::kHeads:
        for (const auto& [h, kv] : cd.heads)
          c.heads = h, c.kv_heads = kv, consider(c);
        break;
      case coverage::Dim::kQLen:
        for (int64_t q : cd.q_lens) c.q_len = q, consider(c);
        break;
      case coverage::Dim::kKvLen:
        for (int64_t k : cd.kv_lens) c.kv_len = k, consider(c);
        break;
      case coverage::Dim::kMask:
        // A mask cell depends on the lengths too (a long row, q_len vs
        // kv_len): the cheapest lengths that realize it.
        for (coverage::MaskKind mk : cd.masks)
          for (int64_t q : cd.q_lens)
            for (int64_t k : cd.kv_lens)
              c.mask = mk, c.q_len = q, c.kv_len = k, consider(c);
        break;
    }
    if (!best) continue;  // the walk's own test reports the cell
    const coverage::Dim dim = cells[i].dim;
    if (dim == coverage::Dim::kQLen || dim == coverage::Dim::kKvLen) {
      AttentionProblem mirror = *best;
      mirror.q_len = mirror.kv_len =
          dim == coverage::Dim::kQLen ? best->q_len : best->kv_len;
      if (mirror.batch * mirror.heads * mirror.q_len * mirror.kv_len *
              mirror.head_dim <=
          kWalkMirrorMaxWork)
        best = mirror;
    }
    for (int r : m.reached(*best)) done[static_cast<size_t>(r)] = 1;
    out.push_back(*best);
  }
  return out;
}

AttentionProblem long_anchor(unsigned needs, double g) {
  AttentionProblem p;
  p.batch = 2;
  p.heads = 1;  // GQA: the walk (a second head would double the cost)
  // 64 mod 128 (the cuDNN report's dQ NaN). 192 would add a full block of
  // 128 before the tail but costs 3x: ~2.5 s per copy in the mutation test,
  // which runs the walk on 36 mutants and 17 controls.
  p.q_len = 64;
  p.kv_len = 401;    // above 400: 25 blocks of 16 and one key (+1 mod 16)
  p.head_dim = 256;  // with batch 2 (TransformerEngine #3216)
  p.g = g;
  // Batch element 1 sees 257 keys: 144 padded keys, a masked run longer than
  // coverage::kLongRun in rows that still see keys.
  if ((needs & coverage::kNeedMask) != 0) p.mask.key_lengths = {401, 257};
  return p;
}

std::vector<std::string> write_report(
    const std::string& dir, const std::vector<const Backend*>& entries,
    std::vector<std::string>* missing) {
  namespace fs = std::filesystem;
  nlohmann::json report = nlohmann::json::array();
  std::vector<std::string> lines;
  for (const Backend* b : entries) {
    const fs::path d = fs::path(dir) / test_name_of(b->name());
    if (!fs::is_directory(d)) continue;
    const coverage::Model& m = model_of(*b);
    coverage::Tally tally(m, coverage::supported_needs(*b));
    coverage::Tally walk(m, coverage::supported_needs(*b));
    std::vector<std::string> properties;
    int64_t shapes = 0;
    for (const auto& f : fs::directory_iterator(d)) {
      if (f.path().extension() != ".shapes") continue;
      const std::string prop = f.path().stem().string();
      properties.push_back(prop);
      std::ifstream in(f.path());
      std::string line;
      while (std::getline(in, line)) {
        AttentionProblem p;
        if (line.empty() || line[0] == '#' || !parse_shape(line, &p)) continue;
        tally.add(p);
        if (prop == "ShapeCoverage") walk.add(p);
        ++shapes;
      }
    }
    std::sort(properties.begin(), properties.end());
    const bool walked = std::find(properties.begin(), properties.end(),
                                  "ShapeCoverage") != properties.end();
    if (walked && walk.singles_reached() < walk.singles_feasible())
      missing->push_back(b->name());
    nlohmann::json e;
    e["entry"] = b->name();
    e["properties"] = properties;
    e["distinct_shapes"] = shapes;
    e["singles_reached"] = tally.singles_reached();
    e["singles_feasible"] = tally.singles_feasible();
    e["pairs_reached"] = tally.pairs_reached();
    e["pairs_feasible"] = tally.pairs_feasible();
    std::vector<std::string> cells_reached, cells_unreached, pairs_unreached;
    const auto un = tally.unreached_singles();
    for (size_t i = 0; i < m.cells().size(); ++i) {
      if ((m.cells()[i].needs & ~tally.supported_needs()) != 0) continue;
      const std::string n = coverage::full_name(m.cells()[i]);
      (std::find(un.begin(), un.end(), static_cast<int>(i)) == un.end()
           ? cells_reached
           : cells_unreached)
          .push_back(n);
    }
    for (const auto& [a, c] : tally.unreached_pairs())
      pairs_unreached.push_back(coverage::pair_name(m, a, c));
    e["cells_reached"] = cells_reached;
    e["cells_not_reached"] = cells_unreached;
    e["pairs_not_reached"] = pairs_unreached;
    e["walk_singles_reached"] = walk.singles_reached();
    report.push_back(e);
    lines.push_back("property-suite coverage " + b->name() + ": " +
                    tally.summary() + " (" + std::to_string(properties.size()) +
                    " properties, " + std::to_string(shapes) + " shapes" +
                    (cells_unreached.empty()
                         ? std::string()
                         : ", not reached: " + cells_unreached.front() +
                               (cells_unreached.size() > 1 ? ", ..." : "")) +
                    ")");
  }
  std::ofstream(fs::path(dir) / "report.json") << report.dump(1) << "\n";
  return lines;
}

}  // namespace qknorm::property
