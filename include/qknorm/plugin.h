/* The qknorm plug-in ABI (issue 17): plain C11, so a kernel written in any
 * language (C, C++, Rust, a CUDA host wrapper) can be judged by the whole
 * suite: qknorm-check, the property suite, the sweeps, power, compare and the
 * fuzzers load a shared library and register its entries beside ours.
 *
 * A plug-in is a shared library that exports one C function:
 *
 *   const qknorm_plugin* qknorm_plugin_get(void);
 *
 * returning a descriptor that lives as long as the library is loaded. The
 * loader reads abi_version first and refuses any version it does not know
 * with an error naming the library and the versions; it reads nothing else
 * of an unknown descriptor.
 *
 * Versions and compatibility. QKNORM_PLUGIN_ABI_VERSION below is the
 * version this header describes; a plug-in built against it declares it.
 * The loader keeps reading every earlier version, as that version laid its
 * structs out: a plug-in never needs rebuilding for a newer qknorm. A new
 * version only appends fields to qknorm_plugin_entry (the descriptor's
 * layout stays), and its header keeps the older entry layouts
 * (qknorm_plugin_entry_v1, ...) for the loader. An entry of an older
 * version is read as if the new fields held their "as before" values, said
 * at each field.
 *   version 1 (issue 17): attention forward and backward and ScaleNorm,
 *            all required.
 *   version 2 (issue 35): `implements` (the attention backward and ScaleNorm
 *            become optional: forward-only and attention-only entries),
 *            `contract` (the compute contract, per entry) and `built_for`
 *            (the CPU features its code was compiled for).
 *   version 3 (issue 35): `flags` (QKNORM_FLAG_*: an entry whose results
 *            are not bitwise reproducible, one whose calls must not run
 *            concurrently, one whose backward recomputes O and lse).
 *
 * Each entry is one implementation at one storage precision. The suite calls
 * it only with problems it declared (features) and with valid input: shapes
 * and strides checked, no NaN or inf inputs, outputs not aliasing inputs.
 * Tensors are strided views whose last dimension is contiguous; the element
 * type is the dtype tag of the view (always the entry's storage dtype).
 * Parameters, lse, dg and the parameter gradients are dense doubles in every
 * precision, as in the C++ interface (include/qknorm/attention.h, which
 * defines the math and the defined results for extreme input: zero rows,
 * fully masked rows, GQA, each formulation). In short:
 * - Strides and sizes count elements, not bytes: element (b, h, n, d) of a
 *   view is data[b * batch_stride + h * head_stride + n * row_stride + d].
 * - lse is dense [B, H, q_len]: row (b, h, i) at (b * H + h) * q_len + i.
 * - GQA: kv_heads is always set (= heads without GQA, never 0); query head
 *   h reads kv head h / (heads / kv_heads); dK and dV sum over the group.
 * - Masks: causal hides key j from query i when j > i + kv_len - q_len
 *   (bottom-right aligned, with kv_len, not key_lengths[b]); key_lengths
 *   (when not NULL) hides keys j >= key_lengths[b]; both may apply. A row
 *   that sees no key has O = 0, lse = -inf and zero gradients.
 * - The fields of a feature the entry did not declare hold the paper's
 *   defaults (norm l2 per head, no weight, no bias, no fixed scale), and
 *   problems needing an undeclared feature are never sent.
 *
 * Input magnitudes: norms must be overflow-safe. The default run of
 * qknorm-check has `wide` cases (attention cases 1 and 2, ScaleNorm's
 * 33 x 31: cli/README.md) that scale each q and k row (ScaleNorm: each x
 * row) by 10^U[-30, 30], clamped to the storage format (validation/case.cc,
 * max_scale_exponent: row scales up to 1e30 in f64, f32 and bf16, up to
 * 65504 / (32 sqrt(D)) in f16); the property suite draws such rows too
 * (1e-30..1e30, clamped likewise). An f32 sum of squares overflows once
 * ||x|| > 1.8e19, so compute each norm scaled (by the row's largest |x|) or
 * in a wider format (double suffices for 32- and 16-bit input). An entry
 * whose norm overflows FAILs those cases, in the extreme-range input class,
 * with the diagnosis "likely cause: norm overflow", and qknorm-check exits
 * 1; examples/plugin_c built with -DQKNORM_EXAMPLE_UNSCALED_NORM is such an
 * entry (ctest plugin.example_unscaled_norm.fails_extreme_range_only).
 *
 * The verdict (validation/rule.h): every output element within its own
 * bound of the long-double oracle. bf16 and f16 entries are judged as f32
 * compute plus one rounding to the storage format: the bound's u_c is "unit
 * roundoff of the compute format (f32 for the 16-bit modes)", and the stored
 * value may differ by "ulp_fmt(|x_e| + delta_e) / 2, the half-spacing of the
 * field's format". An entry is judged under the compute contract it
 * declares (`contract`, ABI version 2; include/qknorm/contract.h), by
 * default f32-accumulate: a kernel that rounds an intermediate (P, the P.V
 * accumulator, ...) to 16 bits without declaring it FAILs (examples/plugin_c
 * with -DQKNORM_EXAMPLE_F16_PV); declared ("pv_acc=f16"), it is judged
 * under the looser bound that rounding costs, and the report says so.
 *
 * Memory: the views are guarded (validation/buffers.h). Every element of
 * an allocation a view does not address is NaN poison with a fixed payload
 * (f32 0x7fc0005a): the row-pad gaps of strided rows, a poison row after
 * each (batch, head)'s last row (so a head's stride is one row longer than
 * its rows: a sequence followed by unused capacity, as in a K/V cache), and
 * guard regions before and after each view. A call that writes any of
 * them, through an output view or an input's, FAILs the case whatever its
 * values ("likely cause: out-of-bounds write", naming the tensor, the
 * offset and the element it follows); a call that reads them computes NaN,
 * which fails the outputs it reaches, diagnosed "out-of-bounds read" where
 * the poison's payload arrives intact (examples/plugin_c built with
 * -DQKNORM_EXAMPLE_OOB_WRITE and -DQKNORM_EXAMPLE_OOB_READ). Outputs start
 * as NaN, so an element left unwritten fails too.
 *
 * Backward's o and lse are the entry's own forward outputs: the suite runs
 * the forward on the same inputs just before and passes its o and lse as
 * written (validation/run.cc). Where they are no valid backward input (o not
 * finite, or lse not finite on a row that sees a key; -inf on a fully masked
 * row is valid), it passes the oracle's O rounded to storage and lse rounded
 * to the compute format instead, and the report says so. The backward may
 * read them or recompute them from q, k and v: its gradients are judged
 * against the oracle's either way (the example plug-in recomputes). One that
 * recomputes may say so (QKNORM_FLAG_BACKWARD_RECOMPUTES, ABI version 3):
 * it is then given o = 0 and lse = 0, which it must not read.
 *
 * Errors: every function returns 0 on success; on failure a non-zero code
 * and a NUL-terminated message written into err (at most err_size bytes,
 * truncated). The suite reports "plugin <entry>: <message>" for the case.
 * No function may let a C++ exception, a Rust panic or a longjmp cross this
 * boundary. A crash inside a call ends the process (the suite names the
 * entry and the case first); `qknorm-check --isolate` runs each call in a
 * child process instead, so a crash is that entry's FAIL.
 *
 * The probabilities hook gets the forward's arguments; it writes probs and
 * may leave o and lse unwritten (the suite ignores them).
 *
 * Thread safety: calls of one entry run concurrently. qknorm-check judges
 * (case, entry) pairs on --jobs workers (default: one per core), and each
 * judgement makes its own workspace (make_workspace, or NULL without one)
 * that its forward, backward and probabilities calls use in turn. So an
 * entry without make_workspace is called from several threads at once, each
 * call with workspace NULL: it must keep no mutable state in ctx or in
 * globals. A workspace is used by one thread at a time. --jobs 1 and
 * --isolate (one job) call serially. An entry that cannot take concurrent
 * calls declares QKNORM_FLAG_SERIAL_CALLS (ABI version 3): the suite then
 * never runs two of its calls at once.
 * The threads field asks for that many worker threads (0: the entry's
 * choice); results must not depend on it: bitwise identical from run to
 * run and for every thread count, unless the entry declares
 * QKNORM_FLAG_NONDETERMINISTIC. `qknorm-check determinism` runs each entry
 * 3 times at 1 and at 2 threads and compares the runs bitwise (examples/
 * plugin_c built with -DQKNORM_EXAMPLE_RACE: a race in its dK, named).
 */
#ifndef QKNORM_PLUGIN_H_
#define QKNORM_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version this header describes (above: versions and compatibility).
 * Bump on any layout change. */
#define QKNORM_PLUGIN_ABI_VERSION 3u

typedef enum {
  QKNORM_DTYPE_F64 = 0,
  QKNORM_DTYPE_F32 = 1,
  QKNORM_DTYPE_BF16 = 2, /* bfloat16 bits, uint16_t storage */
  QKNORM_DTYPE_F16 = 3   /* IEEE binary16 bits, uint16_t storage */
} qknorm_dtype;

/* Features an entry declares (bit mask). The paper's QKNorm (l2 per head,
 * learned scalar g, no weight) is always required; the suite never sends a
 * problem needing a feature the entry did not declare. */
enum {
  QKNORM_FEATURE_SDPA = 1u << 0,         /* variant sdpa (q.k / sqrt(D)) */
  QKNORM_FEATURE_GQA = 1u << 1,          /* kv_heads < heads */
  QKNORM_FEATURE_MASK = 1u << 2,         /* causal and key_lengths */
  QKNORM_FEATURE_RMS = 1u << 3,          /* norm_kind rms */
  QKNORM_FEATURE_LAYER = 1u << 4,        /* norm_kind layer */
  QKNORM_FEATURE_NO_NORM = 1u << 5,      /* norm_kind none */
  QKNORM_FEATURE_ALL_HEADS = 1u << 6,    /* norm_axis all heads */
  QKNORM_FEATURE_WEIGHT = 1u << 7,       /* weight [D] or [H_x, D] */
  QKNORM_FEATURE_ONE_PLUS_W = 1u << 8,   /* Gemma's 1 + w */
  QKNORM_FEATURE_BIAS = 1u << 9,         /* beta */
  QKNORM_FEATURE_SHARED_W = 1u << 10,    /* nGPT: one weight for q and k */
  QKNORM_FEATURE_ROUND_FIRST = 1u << 11, /* Qwen3: x_hat to storage first */
  QKNORM_FEATURE_FIXED_SCALE = 1u << 12  /* fixed logit scale, dg = 0 */
};

/* What an entry implements besides the attention forward, which every
 * entry implements (bit mask, qknorm_plugin_entry::implements; ABI version
 * 2). An entry without QKNORM_IMPLEMENTS_ATTENTION_BACKWARD is forward only,
 * as inference kernels are: every way in judges its o and lse, its gradient
 * fields read "not judged: forward only", the property suite skips the
 * properties that compare gradients (naming why), and qknorm-check's
 * verdict says "forward only". One without QKNORM_IMPLEMENTS_SCALENORM has
 * no ScaleNorm rows and skips the ScaleNorm properties. */
enum {
  QKNORM_IMPLEMENTS_ATTENTION_BACKWARD = 1u << 0, /* attention_backward */
  QKNORM_IMPLEMENTS_SCALENORM = 1u << 1 /* scalenorm_forward and _backward */
};

/* Properties of an entry's calls (ABI version 3, `flags`; earlier
 * versions: none). */
enum {
  /* Results may differ from run to run or between thread counts (atomics
   * in a reduction): `qknorm-check determinism` reports the run-to-run
   * spread beside the bound instead of failing on a difference. Without
   * it an entry must be bitwise reproducible. */
  QKNORM_FLAG_NONDETERMINISTIC = 1u << 0,
  /* Calls must not run concurrently (state in ctx or globals): the suite
   * serializes every call of the entry. Without it calls of one entry run
   * concurrently, each with its own workspace or NULL. */
  QKNORM_FLAG_SERIAL_CALLS = 1u << 1,
  /* attention_backward recomputes O and lse from q, k and v and reads
   * neither: the suite then gives it o = 0 and lse = 0 (valid, wrong), so
   * a backward that reads them after all FAILs its gradients, and it runs
   * even where the entry's own forward output is no valid backward input.
   * Without it the backward gets the entry's own forward o and lse (see
   * "Backward's o and lse" above). */
  QKNORM_FLAG_BACKWARD_RECOMPUTES = 1u << 2
};

typedef enum {
  QKNORM_VARIANT_QKNORM = 0,
  QKNORM_VARIANT_SDPA = 1
} qknorm_variant;
typedef enum {
  QKNORM_NORM_L2 = 0,
  QKNORM_NORM_RMS = 1,
  QKNORM_NORM_LAYER = 2,
  QKNORM_NORM_NONE = 3
} qknorm_norm_kind;
typedef enum {
  QKNORM_AXIS_HEAD = 0,
  QKNORM_AXIS_ALL_HEADS = 1
} qknorm_norm_axis;
typedef enum {
  QKNORM_PARAM_NONE = 0,
  QKNORM_PARAM_DIM = 1,     /* [head_dim], shared by heads */
  QKNORM_PARAM_HEAD_DIM = 2 /* [heads_x, head_dim] */
} qknorm_param_shape;

/* The attention problem (include/qknorm/attention.h, AttentionProblem). */
typedef struct {
  int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  int32_t variant; /* qknorm_variant */
  double g, eps;
  int32_t causal;             /* bottom-right aligned causal mask */
  const int64_t* key_lengths; /* NULL, or one per batch */
  int64_t key_lengths_size;
  int32_t norm_kind, norm_axis, weight_shape; /* qknorm_norm_kind, ... */
  int32_t one_plus_weight, bias, shared_qk_weight, round_before_weight;
  int32_t fixed_scale;
  double scale;
} qknorm_attention_problem;

/* [B, H, N, D] view: element (b, h, n, d) at
 * b * batch_stride + h * head_stride + n * row_stride + d. size: elements
 * the buffer holds. */
typedef struct {
  const void* data;
  int64_t size, batch_stride, head_stride, row_stride;
  int32_t dtype; /* qknorm_dtype */
} qknorm_const_tensor4;
typedef struct {
  void* data;
  int64_t size, batch_stride, head_stride, row_stride;
  int32_t dtype;
} qknorm_tensor4;
/* [rows, dim] view (ScaleNorm). */
typedef struct {
  const void* data;
  int64_t size, row_stride;
  int32_t dtype;
} qknorm_const_tensor2;
typedef struct {
  void* data;
  int64_t size, row_stride;
  int32_t dtype;
} qknorm_tensor2;

/* Learned parameters and their gradients: dense doubles, NULL when empty. */
typedef struct {
  const double *q_weight, *k_weight, *q_bias, *k_bias;
  int64_t q_weight_size, k_weight_size, q_bias_size, k_bias_size;
} qknorm_params;
typedef struct {
  double *q_weight, *k_weight, *q_bias, *k_bias;
  int64_t q_weight_size, k_weight_size, q_bias_size, k_bias_size;
} qknorm_param_grads;

typedef struct {
  qknorm_const_tensor4 q, k, v;
  qknorm_tensor4 o;
  double* lse; /* [B, H, q_len] */
  int64_t lse_size;
  qknorm_params params;
  int32_t threads;
} qknorm_forward_args;

typedef struct {
  qknorm_const_tensor4 q, k, v, o, d_o;
  const double* lse;
  int64_t lse_size;
  qknorm_tensor4 dq, dk, dv;
  double* dg;
  qknorm_params params;
  qknorm_param_grads d_params;
  int32_t threads;
} qknorm_backward_args;

typedef struct {
  int64_t rows, dim;
  double g, eps;
} qknorm_scalenorm_problem;
typedef struct {
  qknorm_const_tensor2 x;
  qknorm_tensor2 y;
  int32_t threads;
} qknorm_scalenorm_forward_args;
typedef struct {
  qknorm_const_tensor2 x, dy;
  qknorm_tensor2 dx;
  double* dg;
  int32_t threads;
} qknorm_scalenorm_backward_args;

typedef int (*qknorm_attention_forward_fn)(void* entry_ctx, void* workspace,
                                           const qknorm_attention_problem* p,
                                           const qknorm_forward_args* a,
                                           char* err, size_t err_size);
typedef int (*qknorm_attention_backward_fn)(void* entry_ctx, void* workspace,
                                            const qknorm_attention_problem* p,
                                            const qknorm_backward_args* a,
                                            char* err, size_t err_size);
/* The probabilities the forward computes, dense [B, H, q_len, kv_len]
 * doubles, 0 for masked keys (include/qknorm/backend.h,
 * attention_probabilities). NULL loads, and qknorm-check's runs never call
 * it (the fuzzers skip their non-saturation check without it); but the
 * property suite's NonSaturation and KeySignFlip (and
 * FormulationNonSaturation for an entry implementing the formulations, the
 * control NegativeControlSdpaSaturates for one declaring QKNORM_FEATURE_SDPA)
 * read it and FAIL an entry without it ("no inspection hook"): required to
 * pass the property suite. */
typedef int (*qknorm_probabilities_fn)(void* entry_ctx, void* workspace,
                                       const qknorm_attention_problem* p,
                                       const qknorm_forward_args* a,
                                       double* probs, char* err,
                                       size_t err_size);
typedef int (*qknorm_scalenorm_forward_fn)(
    void* entry_ctx, void* workspace, const qknorm_scalenorm_problem* p,
    const qknorm_scalenorm_forward_args* a, char* err, size_t err_size);
typedef int (*qknorm_scalenorm_backward_fn)(
    void* entry_ctx, void* workspace, const qknorm_scalenorm_problem* p,
    const qknorm_scalenorm_backward_args* a, char* err, size_t err_size);

typedef struct {
  /* Entry name: 1 to 64 of letters, digits, '_', '-', '.'. The pair (name,
   * storage) is unique within the plug-in: one name may serve several
   * storage dtypes, each its own entry. The suite names it
   * "plugin:<plugin name>.<entry name>:<precision>"; the loader refuses a
   * plug-in with a repeated pair, or whose full entry names are already
   * registered (another plug-in of the same name). */
  const char* name;
  int32_t storage; /* qknorm_dtype */
  uint32_t features;
  void* ctx; /* passed back to every call */
  /* Optional (NULL: no workspace): scratch for one thread's calls. */
  void* (*make_workspace)(void* ctx);
  void (*free_workspace)(void* ctx, void* workspace);
  qknorm_attention_forward_fn attention_forward; /* required */
  /* Non-NULL exactly when `implements` has ATTENTION_BACKWARD. */
  qknorm_attention_backward_fn attention_backward;
  qknorm_probabilities_fn attention_probabilities; /* see above */
  /* Both non-NULL exactly when `implements` has SCALENORM. */
  qknorm_scalenorm_forward_fn scalenorm_forward;
  qknorm_scalenorm_backward_fn scalenorm_backward;
  /* ---- ABI version 2 ---- */
  /* QKNORM_IMPLEMENTS_* bits (version 1: both). The loader refuses an entry
   * whose functions disagree with them. */
  uint32_t implements;
  /* The compute contract the entry is judged under (include/qknorm/
   * contract.h): a preset ("f32-accumulate", "storage") or a spec
   * ("pv_acc=f16", "storage,out=f32"), the same text `compare --contract`
   * takes. NULL (and version 1): "f32-accumulate". An entry that rounds an
   * intermediate more coarsely than it declares FAILs; the loader refuses a
   * spec it cannot parse. */
  const char* contract;
  /* The CPU features the entry's code was compiled for, as its author names
   * them ("x86-64-v3", "AVX512-FP16 AVX512-BF16", "-march=native on Zen 4");
   * NULL (and version 1): not said. qknorm-check prints it under its own
   * machine line and in the JSON row (`built_for`): a kernel's results can
   * change with the instructions it was built for (ggml with AVX512-FP16). */
  const char* built_for;
  /* ---- ABI version 3 ---- */
  /* QKNORM_FLAG_* bits (earlier versions: 0). The loader refuses unknown
   * bits. */
  uint32_t flags;
} qknorm_plugin_entry;

/* The entries' layout of ABI version 2, which the loader still reads: the
 * fields of qknorm_plugin_entry up to built_for. */
typedef struct {
  const char* name;
  int32_t storage;
  uint32_t features;
  void* ctx;
  void* (*make_workspace)(void* ctx);
  void (*free_workspace)(void* ctx, void* workspace);
  qknorm_attention_forward_fn attention_forward;
  qknorm_attention_backward_fn attention_backward;
  qknorm_probabilities_fn attention_probabilities;
  qknorm_scalenorm_forward_fn scalenorm_forward;
  qknorm_scalenorm_backward_fn scalenorm_backward;
  uint32_t implements;
  const char* contract;
  const char* built_for;
} qknorm_plugin_entry_v2;

/* The entries' layout of ABI version 1, which the loader still reads: the
 * fields of qknorm_plugin_entry up to scalenorm_backward, every function
 * required. A new plug-in uses qknorm_plugin_entry. */
typedef struct {
  const char* name;
  int32_t storage;
  uint32_t features;
  void* ctx;
  void* (*make_workspace)(void* ctx);
  void (*free_workspace)(void* ctx, void* workspace);
  qknorm_attention_forward_fn attention_forward;
  qknorm_attention_backward_fn attention_backward;
  qknorm_probabilities_fn attention_probabilities;
  qknorm_scalenorm_forward_fn scalenorm_forward;
  qknorm_scalenorm_backward_fn scalenorm_backward;
} qknorm_plugin_entry_v1;

typedef struct {
  uint32_t abi_version; /* QKNORM_PLUGIN_ABI_VERSION; always first */
  const char* name;     /* the plug-in's name (same charset as entries) */
  int32_t entry_count;
  /* entry_count entries in abi_version's layout (version 1:
   * qknorm_plugin_entry_v1, version 2: qknorm_plugin_entry_v2). */
  const qknorm_plugin_entry* entries;
} qknorm_plugin;

typedef const qknorm_plugin* (*qknorm_plugin_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* QKNORM_PLUGIN_H_ */
