/* An example qknorm plug-in in plain C11 (include/qknorm/plugin.h): the
 * paper's QKNorm attention (l2 per head, learned g, sdpa too, masks, GQA)
 * forward and backward, the probabilities hook and ScaleNorm, for f32
 * storage. Every value is computed in double from the f32 inputs and
 * rounded once to f32: slow and simple, and correct, so it passes the
 * suite.
 *
 * Built a second time with -DQKNORM_EXAMPLE_F16_PV it is the kind of kernel
 * the suite exists to catch: O = sum_j P_ij v_j accumulated in f16 (every
 * partial sum rounded to binary16), a precision bug no eye sees in the
 * output. qknorm-check and the property suite FAIL it and name it.
 *
 * Built with -DQKNORM_EXAMPLE_UNSCALED_NORM it computes every norm as
 * sqrtf(sum x^2) in float, unscaled, as torch's F.normalize does in f32: a
 * row with ||x|| > 1.8e19 squares to inf and normalizes to 0. Right on
 * realistic inputs, wrong on the extreme-range rows: qknorm-check FAILs it
 * and diagnoses the norm overflow.
 *
 * Built with -DQKNORM_EXAMPLE_NO_PROBS it has no probabilities hook: it
 * loads and passes qknorm-check, and the property suite's properties that
 * read the hook FAIL it ("no inspection hook"). Built with
 * -DQKNORM_EXAMPLE_NO_GET it exports qknorm_get_plugin instead of
 * qknorm_plugin_get (the loader's missing-symbol test).
 *
 * The ways in of ABI version 2 (plugin.h, "Versions and compatibility"):
 * -DQKNORM_EXAMPLE_FORWARD_ONLY declares the attention forward alone
 * (implements 0: an inference kernel, judged on o and lse);
 * -DQKNORM_EXAMPLE_ATTENTION_ONLY the attention forward and backward
 * without ScaleNorm. Built against the version-1 header
 * (examples/plugin_c/abi_v1/qknorm/plugin.h, the header as version 1
 * shipped it) it is a version-1 plug-in, which the loader still reads.
 * With -DQKNORM_EXAMPLE_F16_PV and -DQKNORM_EXAMPLE_DECLARE_F16_PV the f16
 * P.V accumulation is declared (contract "pv_acc=f16") and judged under the
 * bound that rounding costs: it passes.
 *
 * Two memory bugs, caught by the guards and poison the harness lays around
 * every view (its README, "Guard memory"): -DQKNORM_EXAMPLE_OOB_WRITE
 * stores one element past each row of o (an over-wide tail store); the
 * last row's lands past the sequence end, a guard: qknorm-check FAILs the
 * entry, naming o and the offset. -DQKNORM_EXAMPLE_OOB_READ reads one key
 * past the sequence end in its forward (a loop bound off by one, harmless
 * where a mask hides the key): the NaN poison there reaches o and lse, and
 * qknorm-check diagnoses the out-of-bounds read.
 *
 * -DQKNORM_EXAMPLE_RACE runs its backward on the threads it is given
 * (the arguments' threads) and merges each thread's dK into the shared dK
 * without synchronization: at 1 thread it is exact and passes; at 2 the
 * threads' read-add-write of the same elements lose updates, differently
 * from run to run. One clean run cannot see it; `qknorm-check determinism`
 * FAILs it and names the data race in dk.
 *
 *   qknorm-check --plugin ./libqknorm_example_plugin.so --backend 'plugin:*'
 */
#ifdef QKNORM_EXAMPLE_RACE
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c11 */
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qknorm/plugin.h"

#ifdef QKNORM_EXAMPLE_RACE
#include <pthread.h>
#endif

#if defined(QKNORM_EXAMPLE_F16_PV) && defined(QKNORM_EXAMPLE_DECLARE_F16_PV)
#define PLUGIN_NAME "example_f16_pv_declared"
#elif defined(QKNORM_EXAMPLE_F16_PV) && defined(QKNORM_EXAMPLE_FORWARD_ONLY)
#define PLUGIN_NAME "example_forward_only_f16_pv"
#elif defined(QKNORM_EXAMPLE_F16_PV)
#define PLUGIN_NAME "example_f16_pv"
#elif defined(QKNORM_EXAMPLE_UNSCALED_NORM)
#define PLUGIN_NAME "example_unscaled_norm"
#elif defined(QKNORM_EXAMPLE_CRASH)
#define PLUGIN_NAME "example_crash"
#elif defined(QKNORM_EXAMPLE_NO_PROBS)
#define PLUGIN_NAME "example_no_probs"
#elif defined(QKNORM_EXAMPLE_FORWARD_ONLY)
#define PLUGIN_NAME "example_forward_only"
#elif defined(QKNORM_EXAMPLE_ATTENTION_ONLY)
#define PLUGIN_NAME "example_attention_only"
#elif defined(QKNORM_EXAMPLE_BAD_IMPLEMENTS)
#define PLUGIN_NAME "example_bad_implements"
#elif defined(QKNORM_EXAMPLE_OOB_WRITE)
#define PLUGIN_NAME "example_oob_write"
#elif defined(QKNORM_EXAMPLE_OOB_READ)
#define PLUGIN_NAME "example_oob_read"
#elif defined(QKNORM_EXAMPLE_READS_O)
#define PLUGIN_NAME "example_recomputes_false"
#elif defined(QKNORM_EXAMPLE_DECLARE_RECOMPUTES)
#define PLUGIN_NAME "example_recomputes"
#elif defined(QKNORM_EXAMPLE_RACE) && \
    defined(QKNORM_EXAMPLE_DECLARE_NONDETERMINISTIC)
#define PLUGIN_NAME "example_race_declared"
#elif defined(QKNORM_EXAMPLE_RACE)
#define PLUGIN_NAME "example_race"
#elif QKNORM_PLUGIN_ABI_VERSION == 1
#define PLUGIN_NAME "example_v1"
#elif QKNORM_PLUGIN_ABI_VERSION == 2
#define PLUGIN_NAME "example_v2"
#else
#define PLUGIN_NAME "example"
#endif

/* ---- element access (f32 storage, strided [B, H, N, D]) ------------------ */
static double ld4(const qknorm_const_tensor4* t, int64_t b, int64_t h,
                  int64_t n, int64_t d) {
  const float* p = (const float*)t->data;
  return p[b * t->batch_stride + h * t->head_stride + n * t->row_stride + d];
}
static void st4(const qknorm_tensor4* t, int64_t b, int64_t h, int64_t n,
                int64_t d, double x) {
  float* p = (float*)t->data;
  p[b * t->batch_stride + h * t->head_stride + n * t->row_stride + d] =
      (float)x;
}

#ifdef QKNORM_EXAMPLE_F16_PV
/* x rounded to IEEE binary16 (nearest even; beyond 65520 to infinity). */
static double round_f16(double x) {
  if (x == 0 || !isfinite(x)) return x;
  const double a = fabs(x);
  if (a >= 65520.0) return copysign(INFINITY, x);
  int e;
  frexp(a, &e); /* a in [2^(e-1), 2^e) */
  int ex = e - 1;
  if (ex < -14) ex = -14; /* subnormal spacing 2^-24 */
  const double q = ldexp(1.0, ex - 10);
  return copysign(nearbyint(a / q) * q, x);
}
#define ACC(x) round_f16(x)
#else
#define ACC(x) (x)
#endif

/* What a row's sum of squares accumulates in: double (no f32 row overflows
 * it), or, unscaled, float (inf once ||x|| > 1.8e19, so x_hat = x / inf = 0
 * and the backward's du / ||x|| = 0). */
#ifdef QKNORM_EXAMPLE_UNSCALED_NORM
typedef float SumSq;
#else
typedef double SumSq;
#endif

/* Keys the forward reads past the sequence end: the planted off-by-one of
 * the OOB_READ build (1), none otherwise. */
#ifdef QKNORM_EXAMPLE_OOB_READ
#define KEYS_PAST_END 1
#else
#define KEYS_PAST_END 0
#endif

static int visible(const qknorm_attention_problem* p, int64_t b, int64_t i,
                   int64_t j) {
  if (p->causal && j > i + p->kv_len - p->q_len) return 0;
  if (p->key_lengths != NULL && j >= p->key_lengths[b]) return 0;
  return 1;
}

static int fail(char* err, size_t n, const char* msg) {
  snprintf(err, n, "%s", msg);
  return 1;
}

/* The logit operands of one (b, h): x_hat = x / max(||x||, eps) for qknorm
 * (nrm receives ||x||), x itself for sdpa. out: [N, D]. */
static void operand(const qknorm_attention_problem* p,
                    const qknorm_const_tensor4* t, int64_t b, int64_t h,
                    int64_t N, double* out, double* nrm) {
  const int64_t D = p->head_dim;
  for (int64_t n = 0; n < N; ++n) {
    SumSq s = 0;
    for (int64_t d = 0; d < D; ++d) {
      const double x = ld4(t, b, h, n, d);
      out[n * D + d] = x;
      s += (SumSq)x * (SumSq)x;
    }
    nrm[n] = sqrt(s);
    if (p->variant == QKNORM_VARIANT_QKNORM) {
      const double den = nrm[n] > p->eps ? nrm[n] : p->eps;
      for (int64_t d = 0; d < D; ++d) out[n * D + d] /= den;
    }
  }
}

static double logit_scale(const qknorm_attention_problem* p) {
  return p->variant == QKNORM_VARIANT_QKNORM ? p->g
                                             : 1.0 / sqrt((double)p->head_dim);
}

/* Row i of P (0 for masked keys); returns the log-sum-exp, -inf for a fully
 * masked row. */
static double probs_row(const qknorm_attention_problem* p, const double* qh,
                        const double* kh, int64_t b, int64_t i, int64_t Nk,
                        double* P) {
  const int64_t D = p->head_dim;
  const double sc = logit_scale(p);
  double m = -INFINITY;
  for (int64_t j = 0; j < Nk; ++j) {
    P[j] = 0;
    if (!visible(p, b, i, j)) continue;
    double c = 0;
    for (int64_t d = 0; d < D; ++d) c += qh[i * D + d] * kh[j * D + d];
    P[j] = sc * c;
    if (P[j] > m) m = P[j];
  }
  if (m == -INFINITY) return -INFINITY;
  double l = 0;
  for (int64_t j = 0; j < Nk; ++j)
    if (visible(p, b, i, j)) l += exp(P[j] - m);
  for (int64_t j = 0; j < Nk; ++j)
    P[j] = visible(p, b, i, j) ? exp(P[j] - m) / l : 0;
  return m + log(l);
}

typedef struct {
  double *qh, *kh, *qn, *kn, *P;
} Scratch;

static int scratch(const qknorm_attention_problem* p, Scratch* s) {
  const int64_t D = p->head_dim;
  s->qh = malloc(sizeof(double) * (size_t)(p->q_len * D));
  const int64_t Nk = p->kv_len + KEYS_PAST_END;
  s->kh = malloc(sizeof(double) * (size_t)(Nk * D));
  s->qn = malloc(sizeof(double) * (size_t)p->q_len);
  s->kn = malloc(sizeof(double) * (size_t)Nk);
  s->P = malloc(sizeof(double) * (size_t)Nk);
  return s->qh && s->kh && s->qn && s->kn && s->P;
}
static void release(Scratch* s) {
  free(s->qh);
  free(s->kh);
  free(s->qn);
  free(s->kn);
  free(s->P);
}

/* Forward; probs (may be NULL) receives P, dense [B, H, Nq, Nk]. */
static int forward(const qknorm_attention_problem* p,
                   const qknorm_forward_args* a, double* probs, char* err,
                   size_t n) {
  if (a->q.dtype != QKNORM_DTYPE_F32) return fail(err, n, "f32 storage only");
  const int64_t B = p->batch, H = p->heads, Nq = p->q_len, Nk = p->kv_len,
                D = p->head_dim, group = p->heads / p->kv_heads;
  Scratch s;
  if (!scratch(p, &s)) {
    release(&s);
    return fail(err, n, "out of memory");
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      operand(p, &a->q, b, h, Nq, s.qh, s.qn);
      operand(p, &a->k, b, hk, Nk + KEYS_PAST_END, s.kh, s.kn);
      for (int64_t i = 0; i < Nq; ++i) {
        const double lse =
            probs_row(p, s.qh, s.kh, b, i, Nk + KEYS_PAST_END, s.P);
        if (probs != NULL)
          memcpy(probs + ((b * H + h) * Nq + i) * Nk, s.P,
                 sizeof(double) * (size_t)Nk);
        a->lse[(b * H + h) * Nq + i] = lse;
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < Nk; ++j)
            if (s.P[j] != 0) o = ACC(o + ACC(s.P[j] * ld4(&a->v, b, hk, j, d)));
          st4(&a->o, b, h, i, d, o);
#ifdef QKNORM_EXAMPLE_OOB_WRITE
          if (d == D - 1) st4(&a->o, b, h, i, D, o); /* one past the row */
#endif
        }
      }
    }
  release(&s);
  return 0;
}

static int attention_forward(void* ctx, void* ws,
                             const qknorm_attention_problem* p,
                             const qknorm_forward_args* a, char* err,
                             size_t n) {
  (void)ctx, (void)ws;
  return forward(p, a, NULL, err, n);
}

#ifndef QKNORM_EXAMPLE_NO_PROBS
static int attention_probabilities(void* ctx, void* ws,
                                   const qknorm_attention_problem* p,
                                   const qknorm_forward_args* a, double* probs,
                                   char* err, size_t n) {
  (void)ctx, (void)ws;
  return forward(p, a, probs, err, n);
}
#endif

/* dx of x_hat = x / max(||x||, eps) from du (in place, one row). */
static void unit_backward(const double* u, double nrm, double eps, int64_t D,
                          double* du) {
  if (nrm > eps) {
    double c = 0;
    for (int64_t d = 0; d < D; ++d) c += u[d] * du[d];
    for (int64_t d = 0; d < D; ++d) du[d] = (du[d] - u[d] * c) / nrm;
  } else {
    for (int64_t d = 0; d < D; ++d) du[d] /= eps;
  }
}

/* One thread's share of the backward: the query rows i with i % nthreads ==
 * tid of every (b, h). With `rest`, dq rows (stored here), dV and dg,
 * summed into its own accumulators dv, dg; with `dk`, dK into its own dk. */
typedef struct {
  const qknorm_attention_problem* p;
  const qknorm_backward_args* a;
  int tid, nthreads;
  int rest, want_dk; /* what it computes */
  double *dk, *dv;   /* [B, kv_heads, Nk, D] */
  double dg;
  int ok;
#ifdef QKNORM_EXAMPLE_RACE
  double* dk_shared; /* every thread's dk is added here */
  pthread_barrier_t* barrier;
#endif
} Part;

static void* backward_part(void* arg) {
  Part* t = (Part*)arg;
  const qknorm_attention_problem* p = t->p;
  const qknorm_backward_args* a = t->a;
  const int64_t B = p->batch, H = p->heads, Hk = p->kv_heads, Nq = p->q_len,
                Nk = p->kv_len, D = p->head_dim, group = H / Hk;
  const int qk = p->variant == QKNORM_VARIANT_QKNORM;
  const double sc = logit_scale(p);
  Scratch s;
  double* dq = malloc(sizeof(double) * (size_t)(Nq * D));
  double* O = malloc(sizeof(double) * (size_t)D);
  t->ok = scratch(p, &s) && dq && O;
  for (int64_t b = 0; t->ok && b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      double* dkh = t->dk + (b * Hk + hk) * Nk * D;
      double* dvh = t->rest ? t->dv + (b * Hk + hk) * Nk * D : NULL;
      operand(p, &a->q, b, h, Nq, s.qh, s.qn);
      operand(p, &a->k, b, hk, Nk, s.kh, s.kn);
      for (int64_t i = t->tid; i < Nq; i += t->nthreads) {
        double* dqi = dq + i * D;
        for (int64_t d = 0; d < D; ++d) dqi[d] = 0;
        if (probs_row(p, s.qh, s.kh, b, i, Nk, s.P) == -INFINITY) continue;
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) {
          O[d] = 0;
          for (int64_t j = 0; j < Nk; ++j)
            O[d] += s.P[j] * ld4(&a->v, b, hk, j, d);
#ifdef QKNORM_EXAMPLE_READS_O
          O[d] = ld4(&a->o, b, h, i, d); /* the given o, not its own */
#endif
          delta += ld4(&a->d_o, b, h, i, d) * O[d];
        }
        for (int64_t j = 0; j < Nk; ++j) {
          if (s.P[j] == 0) continue;
          double dp = 0, c = 0;
          for (int64_t d = 0; d < D; ++d) {
            const double doid = ld4(&a->d_o, b, h, i, d);
            dp += doid * ld4(&a->v, b, hk, j, d);
            if (t->rest) dvh[j * D + d] += s.P[j] * doid;
            c += s.qh[i * D + d] * s.kh[j * D + d];
          }
          const double ds = s.P[j] * (dp - delta);
#ifdef QKNORM_EXAMPLE_CRASH
          if (i == Nq - 1 && j == 0) *(volatile int*)NULL = 0; /* --isolate test */
#endif
          if (t->rest) {
            t->dg += ds * c;
            for (int64_t d = 0; d < D; ++d) dqi[d] += sc * ds * s.kh[j * D + d];
          }
          if (t->want_dk)
            for (int64_t d = 0; d < D; ++d)
              dkh[j * D + d] += sc * ds * s.qh[i * D + d];
        }
      }
      for (int64_t i = t->tid; t->rest && i < Nq; i += t->nthreads) {
        if (qk) unit_backward(s.qh + i * D, s.qn[i], p->eps, D, dq + i * D);
        for (int64_t d = 0; d < D; ++d) st4(&a->dq, b, h, i, d, dq[i * D + d]);
      }
    }
  release(&s);
  free(dq), free(O);
#ifdef QKNORM_EXAMPLE_RACE
  /* The planted race: once every thread is done, each adds its dK into the
   * shared dK: it reads the shared dK, and writes back what it read plus
   * its own, with nothing ordering its write after another thread's read.
   * Every thread reads before any writes (the barrier stands in for the
   * timing that makes this likely in a real kernel), so the last writer of
   * an element wins and the others' share of it is lost. The threads write
   * in opposite directions: where the last writer changes depends on their
   * timing, so the runs differ. */
  if (t->dk_shared == NULL) return NULL; /* not a dK thread */
  const int64_t n = B * Hk * Nk * D;
  double* seen = malloc(sizeof(double) * (size_t)n);
  pthread_barrier_wait(t->barrier);
  for (int64_t e = 0; seen && e < n; ++e) seen[e] = t->dk_shared[e];
  pthread_barrier_wait(t->barrier);
  for (int64_t k = 0; seen && k < n; ++k) {
    const int64_t e = t->tid % 2 == 0 ? k : n - 1 - k;
    ((volatile double*)t->dk_shared)[e] = seen[e] + t->dk[e];
  }
  if (!seen) t->ok = 0;
  free(seen);
#endif
  return NULL;
}

static int attention_backward(void* ctx, void* ws,
                              const qknorm_attention_problem* p,
                              const qknorm_backward_args* a, char* err,
                              size_t n) {
  (void)ctx, (void)ws;
  if (a->q.dtype != QKNORM_DTYPE_F32) return fail(err, n, "f32 storage only");
  const int64_t B = p->batch, Hk = p->kv_heads, Nk = p->kv_len,
                D = p->head_dim;
  const int qk = p->variant == QKNORM_VARIANT_QKNORM;
  const size_t kv = (size_t)(B * Hk * Nk * D);
  /* dK, dV of every kv head, summed over its group of query heads. */
  double* dk = calloc(kv, sizeof(double));
  double* dv = calloc(kv, sizeof(double));
  Scratch s;
  int ok = scratch(p, &s) && dk && dv;
  /* dq, dV and dg on this thread; dK too, except in the racing build. */
  Part part = {.p = p, .a = a, .nthreads = 1, .rest = 1, .want_dk = 1,
               .dk = dk, .dv = dv};
#ifdef QKNORM_EXAMPLE_RACE
  part.want_dk = 0;
#endif
  if (ok) backward_part(&part);
  ok = ok && part.ok;
  const double dg = part.dg;
#ifdef QKNORM_EXAMPLE_RACE
  /* dK on the threads it is given (0: one), each summing its rows' share
   * into its own dk, then adding it into the shared one (backward_part). */
  const int nthreads = a->threads > 1 ? (a->threads < 16 ? a->threads : 16) : 1;
  Part parts[16];
  pthread_t th[16];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
  for (int k = 0; k < nthreads; ++k) {
    parts[k] = (Part){.p = p, .a = a, .tid = k, .nthreads = nthreads,
                      .want_dk = 1, .dk = calloc(kv, sizeof(double)),
                      .dk_shared = dk, .barrier = &barrier};
    if (!parts[k].dk) ok = 0;
  }
  for (int k = 0; ok && k < nthreads; ++k)
    pthread_create(&th[k], NULL, backward_part, &parts[k]);
  for (int k = 0; k < nthreads; ++k) {
    if (ok) pthread_join(th[k], NULL);
    ok = ok && parts[k].ok;
    free(parts[k].dk);
  }
  pthread_barrier_destroy(&barrier);
#endif
  if (!ok) {
    release(&s);
    free(dk), free(dv);
    return fail(err, n, "out of memory");
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hk; ++hk) {
      double* dkh = dk + (b * Hk + hk) * Nk * D;
      double* dvh = dv + (b * Hk + hk) * Nk * D;
      if (qk) operand(p, &a->k, b, hk, Nk, s.kh, s.kn);
      for (int64_t j = 0; j < Nk; ++j) {
        if (qk) unit_backward(s.kh + j * D, s.kn[j], p->eps, D, dkh + j * D);
        for (int64_t d = 0; d < D; ++d) {
          st4(&a->dk, b, hk, j, d, dkh[j * D + d]);
          st4(&a->dv, b, hk, j, d, dvh[j * D + d]);
        }
      }
    }
  *a->dg = qk ? dg : 0;
  release(&s);
  free(dk), free(dv);
  return 0;
}

/* ---- ScaleNorm: y = g x / max(||x||, eps) per row ------------------------ */
static int scalenorm_forward(void* ctx, void* ws,
                             const qknorm_scalenorm_problem* p,
                             const qknorm_scalenorm_forward_args* a, char* err,
                             size_t n) {
  (void)ctx, (void)ws;
  if (a->x.dtype != QKNORM_DTYPE_F32) return fail(err, n, "f32 storage only");
  const float* x = a->x.data;
  float* y = a->y.data;
  for (int64_t r = 0; r < p->rows; ++r) {
    const float* xr = x + r * a->x.row_stride;
    SumSq s = 0;
    for (int64_t d = 0; d < p->dim; ++d) s += (SumSq)xr[d] * xr[d];
    const double nrm = sqrt(s), den = nrm > p->eps ? nrm : p->eps;
    for (int64_t d = 0; d < p->dim; ++d)
      y[r * a->y.row_stride + d] = (float)(p->g * (xr[d] / den));
  }
  return 0;
}

static int scalenorm_backward(void* ctx, void* ws,
                              const qknorm_scalenorm_problem* p,
                              const qknorm_scalenorm_backward_args* a,
                              char* err, size_t n) {
  (void)ctx, (void)ws;
  if (a->x.dtype != QKNORM_DTYPE_F32) return fail(err, n, "f32 storage only");
  const float* x = a->x.data;
  const float* dy = a->dy.data;
  float* dx = a->dx.data;
  double dg = 0;
  for (int64_t r = 0; r < p->rows; ++r) {
    const float* xr = x + r * a->x.row_stride;
    const float* dyr = dy + r * a->dy.row_stride;
    SumSq s = 0;
    double c = 0;
    for (int64_t d = 0; d < p->dim; ++d) s += (SumSq)xr[d] * xr[d];
    const double nrm = sqrt(s), den = nrm > p->eps ? nrm : p->eps;
    for (int64_t d = 0; d < p->dim; ++d) c += (xr[d] / den) * dyr[d];
    dg += c;
    for (int64_t d = 0; d < p->dim; ++d) {
      const double u = xr[d] / den;
      const double v =
          nrm > p->eps ? p->g * (dyr[d] - u * c) / nrm : p->g * dyr[d] / p->eps;
      dx[r * a->dx.row_stride + d] = (float)v;
    }
  }
  *a->dg = dg;
  return 0;
}

/* What this build implements (ABI version 2's `implements`), and the
 * functions it hands over accordingly. */
#if defined(QKNORM_EXAMPLE_FORWARD_ONLY)
#define IMPLEMENTS 0u
#define BACKWARD NULL
#define SCALENORM_FORWARD NULL
#define SCALENORM_BACKWARD NULL
#elif defined(QKNORM_EXAMPLE_BAD_IMPLEMENTS)
#define IMPLEMENTS QKNORM_IMPLEMENTS_ATTENTION_BACKWARD /* but no function */
#define BACKWARD NULL
#define SCALENORM_FORWARD NULL
#define SCALENORM_BACKWARD NULL
#elif defined(QKNORM_EXAMPLE_ATTENTION_ONLY)
#define IMPLEMENTS QKNORM_IMPLEMENTS_ATTENTION_BACKWARD
#define BACKWARD attention_backward
#define SCALENORM_FORWARD NULL
#define SCALENORM_BACKWARD NULL
#else
#define IMPLEMENTS \
  (QKNORM_IMPLEMENTS_ATTENTION_BACKWARD | QKNORM_IMPLEMENTS_SCALENORM)
#define BACKWARD attention_backward
#define SCALENORM_FORWARD scalenorm_forward
#define SCALENORM_BACKWARD scalenorm_backward
#endif
/* ABI version 3's flags: none (bitwise reproducible, concurrent calls
 * allowed, the backward may read o and lse); built with
 * -DQKNORM_EXAMPLE_DECLARE_NONDETERMINISTIC, the first two declarations (the
 * suite reports the run-to-run spread and serializes the entry's calls);
 * with -DQKNORM_EXAMPLE_DECLARE_RECOMPUTES, that the backward recomputes O
 * and lse (true: it does; with -DQKNORM_EXAMPLE_READS_O too, its backward
 * takes delta = rowsum(dO o) from the o it is given, and the declaration is
 * false: the suite gives o = 0 and the gradients FAIL). */
#if defined(QKNORM_EXAMPLE_DECLARE_NONDETERMINISTIC)
#define FLAGS (QKNORM_FLAG_NONDETERMINISTIC | QKNORM_FLAG_SERIAL_CALLS)
#elif defined(QKNORM_EXAMPLE_DECLARE_RECOMPUTES)
#define FLAGS QKNORM_FLAG_BACKWARD_RECOMPUTES
#else
#define FLAGS 0u
#endif
/* The functions a build does not hand over stay in the file (one file for
 * every build); referenced here, they are not unused. */
static const qknorm_attention_backward_fn kAttentionBackward =
    attention_backward;
static const qknorm_scalenorm_forward_fn kScaleNormForward = scalenorm_forward;
static const qknorm_scalenorm_backward_fn kScaleNormBackward =
    scalenorm_backward;

static const qknorm_plugin_entry kEntries[] = {{
    "naive",
    QKNORM_DTYPE_F32,
    QKNORM_FEATURE_SDPA | QKNORM_FEATURE_GQA | QKNORM_FEATURE_MASK,
    NULL,
    NULL,
    NULL,
    attention_forward,
    BACKWARD,
#ifdef QKNORM_EXAMPLE_NO_PROBS
    NULL,
#else
    attention_probabilities,
#endif
    SCALENORM_FORWARD,
    SCALENORM_BACKWARD,
#if QKNORM_PLUGIN_ABI_VERSION >= 2
    IMPLEMENTS,
#ifdef QKNORM_EXAMPLE_DECLARE_F16_PV
    "pv_acc=f16", /* what the f16 P.V accumulation does, declared */
#else
    NULL, /* contract: f32-accumulate (every intermediate in double here) */
#endif
    "x86-64 baseline (C11, double arithmetic)", /* built_for */
#endif
#if QKNORM_PLUGIN_ABI_VERSION >= 3
    FLAGS,
#endif
}};

static const qknorm_plugin kPlugin = {QKNORM_PLUGIN_ABI_VERSION, PLUGIN_NAME,
                                      1, kEntries};

#ifdef QKNORM_EXAMPLE_ABI_VERSION
/* For the loader's own test: a descriptor of an ABI version it must refuse. */
static const qknorm_plugin kFuture = {QKNORM_EXAMPLE_ABI_VERSION, "future", 1,
                                      kEntries};
const qknorm_plugin* qknorm_plugin_get(void) { return &kFuture; }
#elif defined(QKNORM_EXAMPLE_NO_GET)
/* For the loader's own test: the entry point under a wrong name (as a C++
 * plug-in without extern "C" exports a mangled one). */
const qknorm_plugin* qknorm_get_plugin(void);
const qknorm_plugin* qknorm_get_plugin(void) { return &kPlugin; }
#else
const qknorm_plugin* qknorm_plugin_get(void) { return &kPlugin; }
#endif
