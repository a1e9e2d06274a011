#include <algorithm>
#include <cmath>

#include "reference/reference.h"
#include "validation/operands.h"
#include "validation/oracle.h"

namespace qknorm::validation {

OracleScaleNorm oracle_scalenorm(const ScaleNormCase& c) {
  const ScaleNormProblem& p = c.problem;
  OracleScaleNorm r;
  auto x = widen(c.x), dy = widen(c.dy);
  r.y.resize(x.size());
  r.dx.resize(x.size());
  reference::scalenorm_forward<LD>(p, x.data(), r.y.data());
  reference::scalenorm_backward<LD>(p, x.data(), dy.data(), r.dx.data(), &r.dg);
  // y / g = u; sum |dy_i u_i| is the magnitude of dg's terms.
  for (int64_t r0 = 0; r0 < p.rows; ++r0) {
    const LD* xr = x.data() + r0 * p.dim;
    LD n = reference::nrm2<LD>(xr, p.dim);
    LD den = std::max(n, static_cast<LD>(p.eps));
    for (int64_t i = 0; i < p.dim; ++i)
      r.dg_scale +=
          std::fabs(dy[static_cast<size_t>(r0 * p.dim + i)] * xr[i] / den);
  }
  return r;
}

}  // namespace qknorm::validation
