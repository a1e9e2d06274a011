// The single exception type raised for bad input anywhere in qknorm.
#ifndef QKNORM_ERROR_H_
#define QKNORM_ERROR_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace qknorm {

// Raised by every validating entry point (validate_*, checked_*, file readers,
// the CLI) when an input breaks a documented rule. what() reads
//   "qknorm: <tensor>[<index>]: <rule>"
// e.g. "qknorm: q[0,1,2,5]: element is NaN" or "qknorm: eps: must be finite
// and > 0 (got 0)". tensor(), index() and rule() give the parts separately so
// tests and tools can check them without parsing the message.
class Error : public std::invalid_argument {
 public:
  Error(std::string tensor, std::vector<int64_t> index, std::string rule);

  const std::string& tensor() const { return tensor_; }
  const std::vector<int64_t>& index() const { return index_; }
  const std::string& rule() const { return rule_; }

 private:
  std::string tensor_;
  std::vector<int64_t> index_;
  std::string rule_;
};

}  // namespace qknorm

#endif  // QKNORM_ERROR_H_
