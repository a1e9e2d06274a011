#include "qknorm/error.h"

#include <utility>

namespace qknorm {
namespace {
std::string format_message(const std::string& tensor,
                           const std::vector<int64_t>& index,
                           const std::string& rule) {
  std::string m = "qknorm: " + tensor;
  if (!index.empty()) {
    m += "[";
    for (size_t i = 0; i < index.size(); ++i) {
      if (i) m += ",";
      m += std::to_string(index[i]);
    }
    m += "]";
  }
  return m + ": " + rule;
}
}  // namespace

Error::Error(std::string tensor, std::vector<int64_t> index, std::string rule)
    : std::invalid_argument(format_message(tensor, index, rule)),
      tensor_(std::move(tensor)),
      index_(std::move(index)),
      rule_(std::move(rule)) {}

}  // namespace qknorm
