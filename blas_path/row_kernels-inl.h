// Row kernel bodies of row_kernels.cc, included once per vector width
// (QKNORM_BLAS_VBYTES = 32 or 64) into its own namespace; no include guard.
// Everything here is force-inlined into the exported functions, which fix
// the instruction set (row_kernels.cc). No lambda may take or return a
// vector: a lambda is a function of its own, without the target attribute of
// the function it sits in, so when the compiler does not inline it (Clang at
// -O0, or with ASan/UBSan at -O1) a 64-byte vector crosses a call between an
// AVX-512 caller and a callee compiled for the baseline, each with its own
// ABI for it, and the upper lanes arrive as garbage (issue 14: blas:f32
// NaN gradients in the Clang fuzz build on AVX-512 machines; wrong P for
// every row whose length leaves a tail of more than 4 lanes).
// NOLINT(build/header_guard)

#ifndef QKNORM_BLAS_VBYTES
#error "define QKNORM_BLAS_VBYTES before including row_kernels-inl.h"
#endif

typedef float f32x8 __attribute__((vector_size(QKNORM_BLAS_VBYTES)));
typedef double f64x4 __attribute__((vector_size(QKNORM_BLAS_VBYTES)));
typedef int32_t i32x8 __attribute__((vector_size(QKNORM_BLAS_VBYTES)));
typedef int64_t i64x4 __attribute__((vector_size(QKNORM_BLAS_VBYTES)));

// The vector of T at this width, the integer vector of lanes as wide as T's
// (IE), and the lane count. GCC identifies vector types by element type and
// size, so Lanes<float>::V is f32x8 and Lanes<double>::V is f64x4.
template <class T>
struct Lanes {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  using IE = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef T V __attribute__((vector_size(QKNORM_BLAS_VBYTES)));
  typedef IE I __attribute__((vector_size(QKNORM_BLAS_VBYTES)));
  static constexpr int kN = QKNORM_BLAS_VBYTES / sizeof(T);
};
static_assert(std::is_same_v<Lanes<float>::V, f32x8> &&
              std::is_same_v<Lanes<float>::I, i32x8> &&
              std::is_same_v<Lanes<double>::V, f64x4> &&
              std::is_same_v<Lanes<double>::I, i64x4>);

template <class T>
QKNORM_BLAS_INLINE typename Lanes<T>::V load(const T* p) {
  typename Lanes<T>::V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T>
QKNORM_BLAS_INLINE void store(T* p, typename Lanes<T>::V v) {
  std::memcpy(p, &v, sizeof(v));
}
template <class T>
QKNORM_BLAS_INLINE typename Lanes<T>::V splat(T x) {
  typename Lanes<T>::V v;
  for (int l = 0; l < Lanes<T>::kN; ++l) v[l] = x;
  return v;
}
template <class T>
QKNORM_BLAS_INLINE typename Lanes<T>::V iota() {
  typename Lanes<T>::V v;
  for (int l = 0; l < Lanes<T>::kN; ++l) v[l] = static_cast<T>(l);
  return v;
}
// Horizontal sum; the order is fixed by the source, not by the ISA.
template <class T>
QKNORM_BLAS_INLINE T hsum(typename Lanes<T>::V v) {
  // Pairwise tree in a fixed order (lane l + half onto lane l): log2(kN)
  // dependent adds instead of kN - 1, which matters for rows of ~100 keys.
  T t[Lanes<T>::kN];
  for (int l = 0; l < Lanes<T>::kN; ++l) t[l] = v[l];
  for (int half = Lanes<T>::kN / 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) t[l] += t[l + half];
  return t[0];
}

// x[0..n) in the low lanes, zeros above (0 <= n < the lane count).
template <class T>
QKNORM_BLAS_INLINE typename Lanes<T>::V load_tail(const T* x, int64_t n) {
  typename Lanes<T>::V v = splat(T(0));
  for (int64_t l = 0; l < n; ++l) v[l] = x[l];
  return v;
}

// Taylor coefficients ln2^k / k!, k = 0..7 (rounded to float).
constexpr float kC0 = 1.0f, kC1 = 0.6931471805599453f,
                kC2 = 0.2402265069591007f, kC3 = 0.055504108664821576f,
                kC4 = 0.009618129107628477f, kC5 = 0.0013333558146428441f,
                kC6 = 0.00015403530393381606f, kC7 = 1.5252733804059838e-05f;
// 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer.
constexpr float kRoundMagic = 12582912.0f;

QKNORM_BLAS_INLINE f32x8 expbv(f32x8 x) {
  const f32x8 lo = splat(-127.0f), hi = splat(127.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const f32x8 t = x + splat(kRoundMagic);
  const f32x8 n = t - splat(kRoundMagic);
  const f32x8 r = x - n;  // exact, |r| <= 1/2
  f32x8 p = splat(kC7);
  p = p * r + kC6;
  p = p * r + kC5;
  p = p * r + kC4;
  p = p * r + kC3;
  p = p * r + kC2;
  p = p * r + kC1;
  p = p * r + kC0;
  // Integer part n from t's low mantissa bits; 2^n from its exponent bits.
  // __builtin_bit_cast, not std::bit_cast: the latter is a function of its
  // own (not inlined at -O0) taking and returning a vector (see the top).
  const i32x8 ni =
      __builtin_bit_cast(i32x8, t) - __builtin_bit_cast(int32_t, kRoundMagic);
  const i32x8 bits = (ni + 127) << 23;
  return p * __builtin_bit_cast(f32x8, bits);
}
QKNORM_BLAS_INLINE f64x4 expbv(f64x4 x) {
  f64x4 y;
  for (int l = 0; l < Lanes<double>::kN; ++l) y[l] = std::exp(x[l]);
  return y;
}

// x if it wins over y (kMax: the larger), lane by lane for vectors.
template <bool kMax, class X>
QKNORM_BLAS_INLINE X pick(X x, X y) {
  if constexpr (kMax)
    return x > y ? x : y;
  else
    return x < y ? x : y;
}
// x strictly better than y (kMax: larger), lane by lane for vectors.
template <bool kMax, class X>
QKNORM_BLAS_INLINE auto wins(X x, X y) {
  if constexpr (kMax)
    return x > y;
  else
    return x < y;
}

// max (kMax) or min of s[0..m), m >= 1.
template <bool kMax, class T>
QKNORM_BLAS_INLINE T row_extreme_impl(const T* s, int64_t m) {
  using V = typename Lanes<T>::V;
  constexpr int N = Lanes<T>::kN;
  T best = s[0];
  int64_t j = 0;
  if (m >= N) {
    V a = load(s);
    for (j = N; j + N <= m; j += N) a = pick<kMax>(load(s + j), a);
    for (int l = 0; l < N; ++l) best = pick<kMax, T>(a[l], best);
  }
  for (; j < m; ++j) best = pick<kMax>(s[j], best);
  return best;
}

// Index of a maximum (kMax) or minimum of s[0..m), m >= 1: the smallest
// index among the lanes' winners, so the result depends only on the data.
template <bool kMax, class T>
QKNORM_BLAS_INLINE int64_t row_arg_extreme_impl(const T* s, int64_t m) {
  using V = typename Lanes<T>::V;
  using I = typename Lanes<T>::I;
  constexpr int N = Lanes<T>::kN;
  int64_t best = 0;
  int64_t j = 0;
  if (m >= N) {
    I lane;
    for (int l = 0; l < N; ++l) lane[l] = l;
    V a = load(s);
    I ai = lane;
    for (j = N; j + N <= m; j += N) {
      const V x = load(s + j);
      const auto w = wins<kMax>(x, a);
      a = w ? x : a;
      ai = w ? lane + static_cast<typename Lanes<T>::IE>(j) : ai;
    }
    best = ai[0];
    for (int l = 1; l < N; ++l)
      if (wins<kMax, T>(a[l], s[best]) || (a[l] == s[best] && ai[l] < best))
        best = ai[l];
  }
  for (; j < m; ++j)
    if (wins<kMax>(s[j], s[best])) best = j;
  return best;
}

// Two accumulators hide the add latency; the order is fixed by the source.
template <class T>
QKNORM_BLAS_INLINE T exp_affine_row_impl(T* s, int64_t m, int64_t ncols,
                                         T alpha, T shift) {
  using V = typename Lanes<T>::V;
  constexpr int N = Lanes<T>::kN;
  const V al = splat(alpha), sh = splat(shift);
  V acc0 = splat(T(0)), acc1 = splat(T(0));
  int64_t j = 0;
  for (; j + 2 * N <= m; j += 2 * N) {
    const V e0 = expbv(load(s + j) * al - sh);
    const V e1 = expbv(load(s + j + N) * al - sh);
    store(s + j, e0);
    store(s + j + N, e1);
    acc0 += e0;
    acc1 += e1;
  }
  for (; j + N <= m; j += N) {
    const V e0 = expbv(load(s + j) * al - sh);
    store(s + j, e0);
    acc0 += e0;
  }
  if (j < m) {
    // Tail through the same vector code on a zero-padded copy.
    V x = splat(T(0));
    for (int64_t l = 0; l < m - j; ++l) x[l] = s[j + l];
    const V e = expbv(x * al - sh);
    const auto keep = iota<T>() < splat(static_cast<T>(m - j));
    const V e0 = keep ? e : splat(T(0));
    for (int64_t l = 0; l < m - j; ++l) s[j + l] = e0[l];
    acc1 += e0;
  }
  for (j = m; j < ncols; ++j) s[j] = 0;
  return hsum<T>(acc0 + acc1);
}

template <class T>
QKNORM_BLAS_INLINE T softmax_backward_row_impl(T* c, T* dp, int64_t m,
                                               int64_t ncols, T alpha2, T scale,
                                               T sink, T* sink_delta) {
  using V = typename Lanes<T>::V;
  constexpr int N = Lanes<T>::kN;
  const bool sinked = sink_delta != nullptr;
  if (m == 1 && !sinked) {  // softmax of one logit: P = 1 and dS = 0 exactly
    c[0] = 1;
    for (int64_t j = 1; j < ncols; ++j) c[j] = 0;
    for (int64_t j = 0; j < ncols; ++j) dp[j] = 0;
    return 0;
  }
  // The key r of the largest logit: shift and dP reference. An attention
  // sink above it takes both roles, with dp = 0 (a key with no value).
  const int64_t r = alpha2 >= 0 ? row_arg_extreme_impl<true>(c, m)
                                : row_arg_extreme_impl<false>(c, m);
  const T top = alpha2 * c[r];
  const bool sink_top = sinked && sink > top;
  const T shift = sink_top ? sink : top, dref = sink_top ? T(0) : dp[r];
  const V a2 = splat(alpha2), sh = splat(shift), dr = splat(dref);
  const int64_t body = m / N * N;
  const auto keep = iota<T>() < splat(static_cast<T>(m - body));
  // Pass 1: sigma = sum_j e_j (>= 1, e_r = 1) and sum_j e_j (dp_j - dp_r).
  V se = splat(T(0)), sd = splat(T(0));
  for (int64_t j = 0; j < body; j += N) {
    const V e = expbv(load(c + j) * a2 - sh);
    se += e;
    sd += e * (load(dp + j) - dr);
  }
  if (body < m) {
    const V e0 = expbv(load_tail(c + body, m - body) * a2 - sh);
    const V e = keep ? e0 : splat(T(0));
    se += e;
    sd += e * (load_tail(dp + body, m - body) - dr);
  }
  T sigma = hsum<T>(se), sdr = hsum<T>(sd);
  T e_sink = 0;
  if (sinked) {
    // The sink's e (1 exactly when it is the shift) and its term
    // e_sink (0 - dp_ref) of sum_k e_k (dp_k - dp_ref).
    e_sink = expbv(splat(sink) - sh)[0];
    sigma += e_sink;
    sdr -= e_sink * dref;
  }
  const V vinv = splat(T(1) / sigma);
  const T de_s = sdr / sigma;  // delta - dp_ref
  // p_ref = 1 / sigma. A dominant key (p_ref > 1/2) takes the reference
  // form; otherwise dp_j - delta directly (one rounding fewer per element).
  // A dominant sink's dp_ref is 0: both forms are then dp_j - delta.
  const bool ref = sigma < T(2);
  const V de = splat(ref ? de_s : dref + de_s), d0 = splat(ref ? dref : T(0));
  // The sink's share p_sink delta (its dS is -p_sink delta).
  if (sinked) *sink_delta = e_sink / sigma * (dref + de_s);
  // Pass 2 (the row is in L1 now): P, dS and the dg share. For the direct
  // form d0 = 0 and (dp_j - 0) - delta is dp_j - delta exactly.
  const V sc = splat(scale);
  V acc = splat(T(0));
  int64_t j = 0;
  for (; j < body; j += N) {
    const V cj = load(c + j);
    const V p = expbv(cj * a2 - sh) * vinv;
    const V ds = p * ((load(dp + j) - d0) - de);
    store(c + j, p);
    store(dp + j, ds * sc);
    acc += ds * cj;
  }
  if (body < m) {
    const V cj = load_tail(c + body, m - body),
            dpj = load_tail(dp + body, m - body);
    const V p = keep ? expbv(cj * a2 - sh) * vinv : splat(T(0));
    const V ds = p * ((dpj - d0) - de), sds = ds * sc;
    for (int64_t l = 0; l < m - body; ++l)
      c[body + l] = p[l], dp[body + l] = sds[l];
    acc += ds * cj;
  }
  for (j = m; j < ncols; ++j) c[j] = 0, dp[j] = 0;
  return hsum<T>(acc);
}

template <class T>
QKNORM_BLAS_INLINE void divide_row_impl(T* x, int64_t n, T a) {
  for (int64_t i = 0; i < n; ++i) x[i] /= a;
}
