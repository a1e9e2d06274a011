// Seeded, platform-independent random source for tests, the CLI and fuzzers.
// xoshiro256** seeded through splitmix64; normals by the Marsaglia polar
// method on our own uniforms (std::normal_distribution differs between
// standard libraries, so it is never used). The same seed gives the same
// stream on every platform with IEEE doubles and a correctly rounded sqrt
// (glibc's log is used for the polar method's log; it is < 1 ulp).
#ifndef QKNORM_VALIDATION_RNG_H_
#define QKNORM_VALIDATION_RNG_H_

#include <cstdint>

namespace qknorm::validation {

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t next_u64();
  double uniform();                             // [0, 1), 53 random bits
  double uniform(double lo, double hi);         // [lo, hi)
  int64_t uniform_int(int64_t lo, int64_t hi);  // [lo, hi], inclusive
  double normal();                              // N(0, 1)
  double student_t3();  // heavy-tailed: Student t, 3 dof

 private:
  uint64_t seed_;
  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_RNG_H_
