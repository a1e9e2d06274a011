// THE VERDICT (issue 15): every element judged on its own scale.
//
// This module (rule.h with its terms, rule_terms.h) is the one place where
// the suite's tolerance lives. Everything that passes or fails a kernel (the
// default qknorm-check run, compare, the property tests, the fuzzers, the
// reference self-check) calls judge_*() (validation/judge.h), which applies
// the tables built here.
//
// The rule. For every element e of a field (O, lse, dQ, dK, dV, dg; ScaleNorm
// y, dx, dg) with oracle value x_e (the reference in double or long double
// on the rounded inputs: validation/oracle.h, OraclePrecision), a correct
// kernel's computed value before its final rounding differs from x_e by at
// most
//   delta_e = u_c * (sum_units(n_e) + softmax_units(A)) * M_e
//           + [gradients] u_s * R_e + ulp_s(0) * So_e + ulp_c(0) * Sc_e
//           + tiny_c * Sp_e + oracle_e
// and its stored value by at most
//   bound_e = delta_e + ulp_fmt(|x_e| + delta_e) / 2,
// the half-spacing of the field's format (round to nearest). The entry passes
// iff |actual_e - x_e| <= bound_e for every element, and every non-finite
// value is the correctly rounded one (below). Names:
//   u_c          unit roundoff of the compute format (f32 for the 16-bit
//                modes), u_s that of the storage format;
//   M_e          the element's magnitude before cancellation: the sum of the
//                absolute values of the terms that make it (|x|.|y| for a dot
//                product, Higham 3.1), from the oracle (OracleAttention):
//                O_id: sum_j P_ij |v_jd|; dV_jd: sum_i P_ij |dO_id|;
//                dQ, dK: the dS terms P_ij (|dO_i|.|v_j| + Del_i) carried
//                through g k_hat (q_hat) and the normalization backward;
//                lse_i: |lse_i| + A;
//   n_e          the number of terms accumulated into the element;
//   sum_units(n) = kSumLambda * sqrt(n) + kOpUnits: the probabilistic
//                rounding-error bound of an n-term sum (Higham & Mary 2019:
//                lambda sqrt(n) u holds with probability >= 1 - 2
//                exp(-lambda^2 / 2) per sum; lambda = 8: 2.5e-14) plus the few
//                roundings around it (division by the row sum, the scale);
//   softmax_units(A) = 2 * dot * A: a correct kernel computes the
//                cosine C = q_hat . k_hat to dot u_c; S = A C moves by
//                A dot u_c, each P_ij by 2 A dot u_c P_ij, and the
//                element by that times M_e. A = |g| (qknorm) or max||q||
//                max||k|| / sqrt(D) (sdpa);
//   dot          the case's cosine units (cosine_units, rule_terms.h):
//                  dot = kDotUnits + lambda_D max_ij max(|C_ij| (s_i + s_j)
//                        / 2 + T_ij, 2 e_ij),
//                  lambda_D = min(kSumLambda sqrt(D), D - 1),
//                  e_ij = max(0, |C_ij| - kChanceCosine / sqrt(D)).
//                kDotUnits covers rows whose partial sums (of ||x||^2 and
//                of q_hat . k_hat) grow gradually: a spread row's norm error
//                reaches C through |C| ~ 1/sqrt(D), and its products' random
//                signs keep the dot's partial sums small. A row concentrated
//                on a few dominant channels (issue 31: trained models'
//                outlier channels, the `channels` distribution) puts each
//                partial sum at full size after its dominant terms, and each
//                of the remaining additions rounds at that size. Split every
//                partial sum into its dominant part (fixed once added) and
//                the rest (growing gradually, as on a spread row: kDotUnits).
//                The dominant part's roundings cost at most lambda_D times
//                its size (the probabilistic bound of sum_units over D
//                additions, or the deterministic D - 1 of Higham 4.2 where
//                smaller): the norm's ||x||^2 by lambda_D s u_c relatively
//                (s the row's dominant share of ||x||^2), ||x|| by half,
//                each logit of the row by |C_ij| lambda_D s / 2 u_c per side;
//                the dot's dominant part is at most T_ij = sum over the two
//                rows' dominant channels of |q_hat_d k_hat_d|, costing
//                lambda_D T_ij u_c. A row's dominant channels: sorted
//                descending by square, the top m <= D / 2 for the largest m
//                whose m-th square is at least kDominantRatio = 64 times the
//                mean of the rest (order-free). A Gaussian row has none but
//                rarely (its largest square over the rest's mean is an
//                F(1, D - 1) = t_{D-1}^2 variable: per row 7e-4 at D = 8,
//                1.4e-5 at D = 16, 2e-9 at D = 64; 32 made the default run's
//                2304-row `wide` case trigger), so Gaussian, uniform, sink and
//                outlier-row cases keep dot = kDotUnits; Student-t rows
//                (heavy: 8% of rows at D = 64) often have one. Rows below
//                the ratio (a channel holding up to 64 / (63 + D) of the
//                row: 0.5 at D = 64, 0.2 at D = 256) are taken as spread,
//                as kDotUnits is measured to cover on Gaussian rows (whose
//                extremes in a large case pass 32 times the rest's mean):
//                an assumption of the rule, not a derivation. The maximum
//                runs over every (q row, k row) pair of a head, masked or
//                not (over more pairs it bounds the visible ones'), of the
//                logit operand rows (the
//                paper's q and k, the formulations' magnitudes x_a, sdpa's
//                q and k); above 2^27 multiply-adds (the sampled verdict's
//                long cases) |C| <= 1, T <= (s_i + s_j) / 2 (Cauchy-
//                Schwarz) and e <= 1 - kChanceCosine / sqrt(D) bound it from
//                the rows alone. Measured (the f32
//                entries' logit errors through their probabilities hook,
//                tests/cosine_test.cc, B=1 H=2 N=64 g=20, 3 seeds, in
//                |g| u_c, D = 16 64 128 256): gaussian 3.1 2.2 2.5 2.2 (dot
//                4), heavy 3.2 3.1 2.6 2.7 (dot 32 72 81 77), sink
//                3.1 2.2 2.5 2.2, outliers 2.5 2.3 2.1 2.3 (dot 4), channels
//                4.7 7.8 10.7 23.7 (dot 34 130 185 258, unchanged by the
//                coherent excess below); reference:f32
//                FAILed two channels cases under dot = kDotUnits (lse 1.10
//                at D = 64; o 1.07 and lse 1.56 at D = 128; 0.08 now).
//                The coherent excess e_ij (issue 33: parallel rows, rows of
//                one sign). kDotUnits also assumes the products' signs are
//                random: a pair's partial sums then drift by at most about
//                |C| ~ 1/sqrt(D) (a sum in any order independent of the
//                values reaches k/D of C after k terms) and the norms'
//                errors reach C scaled by |C|. Products that share a sign
//                make |C| large (parallel rows: C = +-1) and every one of
//                the three sums (||q||^2, ||k||^2 and the dot) grows to full
//                size: f32 dots of parallel Gaussian rows, added in order,
//                err by up to 10 u_c at D = 64, 22 at 256, 28 at 576 (8
//                lanes: 4, 5, 6), growing as sqrt(D) |C|; correct entries
//                FAILed lse and O (tests/cosine_test.cc, SameSignRowsPass:
//                margins up to 2.6; model-drawn property shapes at D = 192
//                to 576; reference:f64 lse 1.03 at D = 64). For unit rows
//                of random signs P(|C| > t) <= 2 exp(-D t^2 / 2)
//                (Hoeffding; the sphere's cap): a random-sign pair's cosine
//                exceeds kChanceCosine / sqrt(D) = 6 / sqrt(D) with
//                probability 3e-8, and below that kDotUnits covers it (an
//                assumption, measured: Gaussian pairs reach |C| ~ 5 /
//                sqrt(D) in the largest cases, the max of ~1e5 normal
//                cosines; kSumLambda's 8 / sqrt(D) would leave parallel
//                rows at D <= 64 to kDotUnits, where they FAIL). The rest,
//                e_ij, shares a sign beyond chance: its partial sums may
//                stand at full size through all D additions, costing
//                lambda_D e_ij in the dot and lambda_D e_ij / 2 through each
//                norm (the dominant channels' argument with s = 1, T = e):
//                2 lambda_D e_ij. Order-free (no kernel's summation order
//                is assumed), and 0 wherever D <= kChanceCosine^2 = 36
//                (|C| <= 1) or the cosines stay at chance: Gaussian,
//                uniform, sink and outlier rows keep dot = kDotUnits at
//                every D; parallel rows get 35.5 units at D = 64, 164 at
//                256 and 292 at 576 (3.5, 7.5 and 10 times the sequential
//                f32 errors above). C_ij is the signed
//                cosine of the logit operand rows (the formulations':
//                x_tilde over the norms of x_a, as A scales it). The two
//                terms bound the same partial sums' full-size part two ways
//                (the dominant channels' products are part of C), so the
//                larger holds; adding them double-counted the channels
//                rows' shared dominant channels (power: nine f32 channels
//                thresholds one grid step worse at D = 64);
//   R_e          the gradient's sensitivity to a relative error u_s in the
//                stored O that the backward reads (delta_i = dO_i . O_i):
//                the terms P_ij |dO_i|.|O_i| carried like M_e;
//   So_e, Sc_e   sensitivities to the absolute resolution ulp(0) of the
//                stored O and of the compute format's subnormal
//                intermediates (OracleAttention: dS, du and its sums, the
//                unit rows q_hat and k_hat, and the formulations' x_hat and
//                logit operands x_tilde: rule_terms.cc, x_hat_resolution
//                and operand_resolution; O and dV carry one ulp_c(0) per
//                visible term; zero effect unless subnormals),
//                plus kOpUnits ulp_c(0) for every element's final operations;
//   tiny_c, Sp_e the compute format's smallest normal and the element's
//                sensitivity to an absolute error of each visible P_ij: an
//                exp may flush results below the normal range to 0, so P is
//                resolved only to tiny_c (O: sum_j |v_jd|; dV: sum_i |dO_id|;
//                dq, dk, dg: |dP_ij - delta_i| through their sums).
// Repeated summands and the row normalization (issue 33: head_dim 1 and
// decode against long kv_len, where correct entries FAILed dV).
//   The row sum's ties. sum_units(n) assumes independent rounding errors.
//   They are not where terms repeat: fl(s + t) - (s + t) depends only on t
//   mod ulp(s) while s stays in a binade (s is a multiple of ulp(s)), so
//   every addition of the same t makes the same error, and terms within
//   ulp(s) of each other make errors within that of each other. At D = 1
//   the logits are +-g and a row sum adds two values Nk times; repeated
//   tokens give identical keys. Per query row i (oracle: row_ties;
//   rule_terms.h, row_tie_excess), on the normalized terms t = P_ij (sum
//   1, partial sums <= 1): t_a and t_b tie where |t_a - t_b| <= u_c (2 +
//   (dot |A| + kOpUnits) (t_a + t_b)), within a partial sum's spacing (2
//   u_c) or within the two terms' own errors in a kernel, which can tie
//   where the oracle's do not (a coarser tie only enlarges the bound).
//   A term's error is also at most the term (s is a candidate of fl(s +
//   t)), so a term weighs w = min(1, t / u_c). X_i = sum over tied ordered
//   pairs a != b of w_a w_b bounds the errors' covariance beyond n
//   independent ones (Var <= u_c^2 (n + X_i)), and
//     tie_sum_units(n, X) = max(sum_units(n), min(kSumLambda sqrt(n + X),
//                           n - 1) + kOpUnits)
//   (n - 1: Higham 4.2's deterministic worst case) replaces sum_units(Nk)
//   in O and lse (they divide by, resp. take the log of, the row sum), and
//   enters dQ (per row) and dg (the case's largest) as the excess E_i =
//   tie_sum_units(Nk, X_i) - sum_units(Nk), twice (P_ij and delta_i = dO_i
//   . O_i both move with the row sum). X_i = 0 (no two terms tie) leaves
//   every one of those bounds bitwise as before.
//   The row normalization in the backward. A kernel's backward reads P_ij =
//   exp(S_ij - lse_i) through its stored lse, which is off by e_i: the row
//   sum's rounding (rho_i), the log's (log Nk) and the addition's (|lse_i|;
//   lse is formed and kept in the compute format, so its storage adds
//   nothing) (sigma_i), the same for every P_ij of the row (the
//   subtraction S_ij - lse_i rounds per element, as the exp does: the
//   softmax terms'). The logits' part of lse's error is in soft already.
//   dQ's own Nk-term units cover it; dV's and dK's sums run over the
//   queries, and at decode (Nq = 1, Nk = 4096, D = 64, g = 0.01)
//   reference:f64's dV was 1.95 bounds off (24 u_c: P's error, dV_j =
//   P_1j dO_1 being one term). Per row, in units of u_c:
//     rho_i: Nk roundings of at most one unit each (the normalized
//       partial sums are at most 1), variance v_i = Nk + X_i (the ties'
//       covariance); at its bound tau_i = min(tie_sum_units(Nk, X_i),
//       sum_{m=2..n} S_(m) + kOpUnits), the second deterministic in any
//       order of additions (each addition rounds by at most u_c times its
//       result, and the r-th largest of a summation tree's n - 1 results
//       holds at most n - r + 1 terms, so at most S_(n - r + 1), the sum
//       of the n - r + 1 largest normalized terms: n - 1 for a dominant
//       term, (n + 1) / 2 for n equal ones; a sampled sub-case, which has
//       part of the row, keeps tie_sum_units);
//     sigma_i: two roundings, c_i = log^2 Nk + lse_i^2 squared units; at
//       its bound l_i = log Nk + |lse_i|.
//   dV_jd = sum_i P_ij dO_id moves by sum_i e_i x_i, x_i = P_ij |dO_id|.
//   Beside the sum's own G Nq additions of at most M each (Hoeffding's a =
//   G Nq M^2, which sum_units(G Nq) already allows), distinct rows round
//   independently: the smallest of the four bounds that take rho and
//   sigma each by Hoeffding jointly with the sum's own or at its bound,
//     R(a, B_rho, B_sigma, L_rho, L_sigma) = min(H(a, B_rho + B_sigma),
//       H(a, B_rho) + L_sigma, L_rho + H(a, B_sigma), L_rho + L_sigma),
//   B_rho = sum_i x_i^2 v_i, B_sigma = sum_i x_i^2 c_i, L_rho = sum_i x_i
//   tau_i, L_sigma = sum_i x_i l_i over the distinct rows, H(a, b) =
//   kSumLambda (sqrt(a + b) - sqrt(a)) (0 for b = 0; each choice holds at
//   the rule's confidence). Repeated rows are not independent: query rows
//   of one kv head with the same logit operand row x_tilde and the same
//   visible keys (under a causal mask or a window: the same visible
//   interval, which rows at different positions share past a padding or
//   under a window wider than the sequence; a padding row,
//   a repeated token) compute the same logits, row sum, log and addition,
//   so a group G of them moves dV_jd by e_G P_Gj sum_{i in G} dO_id: Rep =
//   sum_G P_Gj |sum_{i in G} dO_id| (tau_G + l_G), at its bound (a sampled
//   key row's sub-case has no mask, so there each row of a group enters
//   at its bound: P_ij |dO_id| (tau_i + l_i)). dV adds u_c (R + Rep).
//   dK's terms dS_ij = P_ij (dP_ij - delta_i) move by at most e_i z_ij,
//   z_ij = P_ij (|dP_ij - delta_i| + |delta_i|) (P scales by e_i, and
//   delta_i with it where a kernel forms it from P; dO_i . O_i of the
//   stored O does not move), through g q_hat_i and the normalization
//   backward as dK's magnitude is (oracle: carry_magnitude); per element,
//   z_i is row i's share. The Hoeffding sums are not linear through that
//   map, so sum_i w_i z_i^2 <= max_i w_i z_i sum_i z_i, carried: dK adds
//   u_c (R((G Nq + L) M^2, Yw Z, Yv Z, Yw Z, Lk_rho, Lk_sigma) + Rep_k),
//   Yw = max_i (v_i + c_i) z_i, Yv = max_i v_i z_i, Z = sum_i z_i,
//   Lk_rho = sum_i tau_i z_i, Lk_sigma = sum_i l_i z_i over the distinct
//   rows, Rep_k = sum_i (tau_i + l_i) z_i over the repeated ones (every
//   row of a group at its bound; oracle: dk_rowmax_e ... dk_norm_rep_e; D
//   = 2 decode: reference:f64's dK 1.51 bounds off without it). The row's
//   share was M + T before (2 to 5 times z on Gaussian rows): 13 rows of
//   qknorm-check power one grid step coarser than without the term, 2 now.
//   A sampled key row's sub-case holds part of each query row: its X_i
//   come from the pass in double (GivenRows::ties), its n and lse are the
//   whole row's. Not covered: contracts with a compute point coarser than
//   the compute format tie at the compute format's u_c.
// Formulations (issue 16) add, per element, the parameter gradients' same
// channels, Qwen3's rounding flips (logit_flip) and LayerNorm's mean shift:
// the computed mean of a row is an L-term sum, off by sum_units(L) u_c
// sum|x| / L, and every x_hat of the row moves by that over the divisor
// (x_hat_e near 0 keeps no relative accuracy). OracleAttention carries its
// effect per u_c (*_shift_e, dg_shift, and logit_shift in the softmax term).
// Qwen3's rounding flips, per element (kRoundingFlip, absolute): Qwen3
// rounds x_hat to storage before the weight, x_tilde = fl_s(x_hat) w. Where
// a correct kernel's x_hat lies within its own error of a rounding midpoint
// (rule_terms.cc, flips_x_hat and rounding_flips: the criterion of
// logit_flip), it may round to the other neighbour, moving fl_s(x_hat_e)
// by phi_e = ulp_s(x_hat_e) and x_tilde_e by phi_e |w_e|: 2^-8 relative in
// bf16, not a u_c term. logit_flip covers the logits; the same flip also
// reaches every quantity that reads x_tilde or the rounded x_hat directly,
// at first order:
//   dq, dk: dx_tilde'_d = s sum_j dS_ij x_tilde_jd of the other side moves
//     by a_d = s sum_j |dS_ij| phi_jd |w_jd|, then, as every channel,
//     through the weight and the normalization backward's magnitudes
//     (norm_backward_mag: (|w_d| a_d + |x_hat_d| sum_e |x_hat_e| |w_e| a_e
//     [/ L]) / den; the backward reads the unrounded x_hat: no own-row
//     term);
//   params: the weight gradient sum dx_tilde_e fl_s(x_hat_e) by a_e
//     |x_hat_e| (the other side's flips) + |dx_tilde_e| phi_e (its own);
//     the bias gradient by a_e;
//   dg (a learned scale): sum dS_ij C_ij, C_ij = q_tilde . k_tilde moved by
//     at most operand_flip (logit_flip without s), times sum |dS_ij| <=
//     dg_scale.
// A kernel's error, not the oracle's (no u_o term; the oracle's x_hat is
// kept in long double, oracle_dispatch.cc). 0 elsewhere. Found by the
// property soak (issue 32): qwen3, bf16, wide rows, one q element at
// x_hat = 2.6021e-15, a midpoint to f32's precision; reference:bf16's dk
// 6.2e-16 off where the bound without the term was 5.5e-16 (margin 1.12);
// the term there is 4.7e-16, below the error it covers
// (property_tests/soak_findings_test.cc).
// The weight gradient's product (issue 32; the CI's Zen 3 fuzz run). A
// weight gradient sums, over the R normalization rows r it reaches,
// x_hat_r dx_tilde_r (element e dropped). A kernel forms x_hat_r + a_r and
// dx_tilde_r + b_r, and
//   (x_hat + a)(dx_tilde + b) - x_hat dx_tilde
//     = x_hat b + a dx_tilde + a b.
// The channels bound the first two: |x_hat| |b| through dx_tilde's
// channels weighted by |x_hat_e| (M, T, ... of the weight), |a| |dx_tilde|
// through the shift and flip channels (|dx_tilde_e| shr, |dx_tilde_e|
// phi_e). The third is second order, and negligible beside the first
// wherever |a| is relative to x_hat (the divisors' units, x_hat's own
// rounding: u_c |b| |x_hat| beside |x_hat| |b|). LayerNorm's mean shift is
// not: a_r <= shr_r u_c (shr_r = sum_units(L) (sum |x| / L) / den, per
// u_c: OperandMagsT::shr, operands.h) however small x_hat is, and where
// x_e is its row's mean (x_hat_e = 0 exactly: a row of integers, a
// value repeated) and dx_tilde cancels (|dx_tilde| << its magnitude), the
// first two terms vanish while a b does not. So the weight adds
//   u_c sum_r shr_r b_r,  b_r <= delta(dx_tilde_r),
// dx_tilde_r's bound: the same channel terms as the weight's own, of the
// channels weighted by shr_r instead of |x_hat_e| (OracleValues::
// dq_weight_sh_ch, dk_weight_sh_ch; carry_side, oracle_operands.cc), with
// one row's units (sum_units(n) + kOpUnits + div) and no row-sum counts.
// Its u_o part covers the oracle's own product (u_o <= u_c). 0 without
// LayerNorm, so every other bound is bitwise as before. Found by the CI's
// fixed-seed fuzz run emulating Zen 3: chameleon (layer per head, [H, D]
// weight, bias), f64, A = 9.6e5; a q row of head 1 whose element 4 is its
// mean (x_hat = 0, shr = 13.2), dx_tilde = 4.4e-15 of magnitude 2.5e5:
// reference:f64 and the naive dq_weight -1.5e-28 for 0, bound 6.5e-30
// (margin 23.1; the term: 1.8e-17). Checked:
//   - the biases sum dx_tilde_r alone: no product;
//   - dg = sum dS_ij C_ij scales by dg_scale, whose |C_ij| is taken as
//     max(1, ||q_a|| ||k_a||), never |C_ij|: C's error times dS's is
//     u_c (dot + logit_shift) relative to a term already counted;
//   - Qwen3's flips: a_r = phi_e <= 2 u_s |x_hat_e| is relative to x_hat;
//     a b is at most 2^-7 (bf16), 2^-10 (f16) of the |x_hat| |b| term,
//     which its units' lambda = 8 leave room for (not a derivation: an
//     assumption, as rare as a flip);
//   - x_hat's absolute resolution (own_res ulp_c(0), per row): a b <=
//     own_res ulp_c(0) |b|, and |b| <= M / 4 + O(u_c) M wherever the
//     softmax is resolved (T <= 2 M, soft u_c <= 1/8), beside the
//     resolution term own_res ulp_c(0) M already there for a dx_tilde:
//     at most a quarter more, and only where |dx_tilde| = M (no
//     cancellation) and b is at its bound together; left (an assumption
//     on the counts' slack, not derived).
// The sampled verdict (issue 19, validation/sampled.h) judges a sampled row
// of a long problem on a sub-case of the oracle with the whole case's counts
// and amplitude (OracleAttention::count_*, amplitude), so by these same
// tables (and the whole case's cosine units, OracleAttention::cosine_units);
// its key rows and dg read every query row's lse and delta from a
// pass in double, whose own error joins dk, dv and dg as u_f64 times
// given_units (the magnitudes M_e) and given_soft_units (the softmax terms),
// derived in rule_terms.cc (pass_units).
// The oracle channel oracle_e (issue 32): the oracle is itself a correct
// kernel computing in its own arithmetic (double for f32, bf16 and f16
// storage, long double for f64; OracleAttention::unit_roundoff u_o,
// resolution ulp_o(0), tiny tiny_o), so its value is off the exact one by
// at most the rule's own terms of the compute format with u_c, ulp_c(0)
// and tiny_c replaced by the oracle's: u_o (units M + soft_o T + Sh) +
// ulp_o(0) Sc + tiny_o Sp per field (rows below: the u_c terms' units and
// counts), soft_o = soft without the kernel's rounding flips (logit_flip;
// the oracle rounds no x_hat in double: oracle.h), and ulp_o(0) (kOpUnits
// + the per-term counts of O and dV). Nothing of the entry's storage or
// contract enters it. Double: u_o = 2^-53, ~1e-9 of an f32 entry's u_c
// terms; long double: 2^-64 (2^-11 of an f64 entry's), resolution terms 0
// (below double's range). tests/oracle_precision_test checks that the
// double oracle stays within it of the long-double one and that a float
// oracle claiming 2^-53 does not.
// Where softmax_units(A) u_c > 1/8 the logits are not resolved to better
// than a unit, the format does not determine O, dQ, dK, dV or dg, and every
// finite value of those passes (lse keeps its bound).
// Non-finite values, per element:
//   - x_e = +-inf (lse of a fully masked row): the same infinity passes;
//   - x_e finite: an infinity of sign s passes, counted "not representable
//     in <fmt>", exactly where the interval [x_e - delta_e, x_e + delta_e]
//     of pre-rounding values reaches the format's overflow threshold on that
//     side (x_e + delta_e >= T for +inf, x_e - delta_e <= -T for -inf; T =
//     max_finite + ulp(max_finite) / 2, where round to nearest gives inf),
//     whatever the sign of x_e: an ill-conditioned element's value may
//     round to the infinity opposite to x_e's sign. Where the interval
//     reaches either threshold a finite value is judged as above against
//     x_e clamped to the largest finite (judge_element, validation/judge.h);
//   - anything else non-finite (NaN, an inf where a finite value is defined,
//     e.g. NaN on a fully masked row whose O is defined as 0) FAILs, and the
//     verdict says which.
// The naive same-precision baseline (reference:<prec>) is no part of the
// bound. When given, it is judged by the same tables and its margin is
// reported beside the entry's: a naive margin above 1 means the rule is
// unsound on that case (the reference self-check of qknorm-check FAILs
// reference:<prec> then).
//
// Ill-conditioned elements: kappa_e = M_e / |x_e| (the element's condition
// number as a sum). Elements with kappa_e > kIllConditioned are judged by the
// same rule, but detection thresholds are quoted over the others (see
// qknorm-check power).
//
// The rule as a table: rule.cc builds exactly these rows. The channels are
// Channel of validation/field.h, the oracle's per-element arrays:
//   M kMagnitude, So kStoredOAbs, Sc kSubnormalCount, R kStoredORel,
//   T kSoftmaxTerms, Sp kPResolution, Sh kLayerShift, F kRoundingFlip
// (O's T is o_dev_mag; lse has none: |lse| and A are its scale).
//
//   field   delta_e
//   o       u_c (tie_sum_units(Nk, X_i) M + soft/2 T)
//           + ulp_c(0) (Nk + 2) + tiny_c Sp
//   lse     u_c ((dot + div) |A| + tie_sum_units(Nk, X_i) + 2 |x|
//           + shift) + logit_flip
//   dq, dk  u_c ((sum_units(n + L) + div + N) M + soft T + Sh + K)
//           + u_s R + ulp_s(0) So + ulp_c(0) Sc + tiny_c Sp + s_rel M
//           + u_f64 (given M + given_soft T) + F
//           (N: dq 2 E_i, dk 0; K: dk R(...) + Rep_k as above, dq 0)
//   dv      u_c ((sum_units(G Nq) + soft) M + R(G Nq M^2, ...) + Rep)
//           + tiny_c Sp + ulp_c(0) (G Nq + 2) + u_f64 given_soft M
//   dg      u_c (sum_units(B H Nq Nk) + sum_units(D) + div + soft
//           + 2 E_max) M
//           + u_s R + ulp_s(0) So + ulp_c(0) Sc + tiny_c Sp + u_c Sh
//           + u_f64 (given + given_soft) M + operand_flip M
//                                               (M = dg_scale, scalars)
//   d_sinks "Attention sinks" below (from the O and lse bounds)
//   params  u_c ((sum_units(R_p) + sum_units(n) + kOpUnits + div) M
//           + soft T + Sh) + u_s R + ulp_s(0) So + ulp_c(0) (Sc + R_p + 2)
//           + tiny_c Sp + s_rel M + F
//           + [layer weights] u_c (the same terms of the shift-weighted
//           channels, units sum_units(n) + kOpUnits + div, no R_p + 2)
// and every element adds kOpUnits ulp_c(0) (its final operations), and
// oracle_e (above). Where
// softmax_units(A) u_c > 1/8 every field but lse is unresolved (delta =
// inf). soft = softmax_units(A) + 2 |A| div + 2 logit_flip / u_c + 2 shift,
// shift = logit_shift, div the RMS / LayerNorm divisors' units (0
// otherwise), n the terms of each sum (Nk for q, G Nq for k), G the query
// heads per kv head, L the normalization row's length, R_p the rows a
// parameter element sums over, s_rel the logit scale's relative resolution
// below the compute format's normal range, given* the sampled pass's units
// (0 outside the sampled verdict).
//
// The logit softcap (issue 34; attention.h: S' = cap tanh(S / cap) on the
// visible logits). A correct kernel forms S to |S^ - S| <= A dot u_c (the
// model above), then y = S^ / cap in at most three roundings (the cap
// rounded to the compute format, its reciprocal, the product; or a
// division), tau = tanh(y) to 4 ulp (<= 8 u_c |tau|: Highway's Tanh,
// glibc's tanhf and tanh are within that) and S'^ = fl(cap tau) (the
// rounded cap and the product: two more). tanh is 1-Lipschitz and |tanh y|
// <= |y|, so
//   |S'^ - S'| <= |S^ - S| + 3 u_c |S^| + 8 u_c |S^| + 2 u_c |S^|
//              <= A (dot + kSoftcapLogitUnits) u_c,   kSoftcapLogitUnits = 13
// (|S^| <= A to first order): the cap is a logit error like the cosine's,
// and every use of dot above (soft, soft_o, lse, the ties' term units)
// reads dot + 13 with a cap (RuleScalars::dot_s). The backward multiplies
// dS' = P (dP - delta) by the slope sigma = 1 - t^2, t = S' / cap, which a
// kernel forms from tau or from S'^ / cap, either way to
//   |t^ - t| <= (E / cap + 8) u_c,
// E u_c the logit's whole error the rule grants: soft / 2 (A (dot + 13),
// the RMS / LayerNorm divisors' A div, LayerNorm's shift, Qwen3's flips)
// plus the contract's absolute logit_abs / u_c. So sigma^ = fl(1 - fl(t^
// t^)) is off by at most 2 |t^ - t| + 2 u_c
// (absolute: sigma <= 1 and |t| <= 1), and dS = fl(dS' sigma^) by at most
// sigma err(dS') + |dS'| (that + 2 u_c) (one more rounding for either order
// of the product). sigma <= 1 keeps err(dS') within the terms above; the
// rest is relative to |dS'| <= P_ij (|dP_ij| + |delta_i|), the terms every
// gradient's magnitude M_e already sums: dQ, dK, dg and the parameter
// gradients add
//   slope = softcap_slope_units = 2 E / cap + 20
// to their sums' units (RuleScalars::slope). Their magnitudes keep the
// uncapped terms (sigma <= 1: an upper bound, looser by up to 1 / sigma
// where the cap saturates); the oracle's signed dx_tilde (the LayerNorm
// shift and flip terms read it) sums the true dS' sigma. A cap is 0 or a
// normal number of the compute format (validate.h), so rounding it costs
// u_c relatively. A kernel whose tanh is coarser than 4 ulp (CUDA's
// tanh.approx.f32, about 2^-11 relative) is outside this model until its
// contract can declare it (qknorm/contract.h). The sampled verdict refuses
// a cap (its pass forms uncapped logits).
//
// RoPE (issue 34; attention.h, Rope: each pair (x_a, x_b) of the first
// rotary_dim dims rotated by t = pos inv_freq_e). The oracle rotates
// exactly (its angle, cos and sin in its own arithmetic); a correct kernel
// forms y_a = x_a c - x_b s with, per element (rule_terms.h, rope_units),
//   |y^_a - y_a| <= eps u_c (|x_a| + |x_b|),
//   eps = kRopeRotateUnits (3: two products and the sum, at most u_c
//         (|x_a c| + |x_b s|) each, and the sum's own)
//       + kRopeCosSinUnits (8: cos and sin to 4 ulp, as the softcap's tanh)
//       + u_s / u_c where the entry claims cos_sin_storage (16-bit storage)
//       + u_angle max_e (ln theta x_e + 4) |t_e|max / u_c (the angle t_e
//         = pos theta^(-x_e), x_e = 2e / r: x_e rounded costs ln theta x_e
//         units of theta^x, the power, the reciprocal and the product 4
//         more; a given table 2; u_angle = 2^-24 where the entry claims
//         angle_f32, else 2^-53; |t_e|max at the case's largest |pos|; a
//         rotation by dt moves the pair by |dt| times its norm <= |x_a| +
//         |x_b|. At position 30000 an f32 angle's grant is ~7e-3 rad: the
//         logits move by up to ~0.03 A, and for A >~ 1 the softmax is
//         unresolved (below): such a claim leaves only lse judged)
//       + the oracle's own (the first two and the angle's in u_o) in u_c.
// A pair's error vector is then at most sqrt 2 eps u_c (|x_a| + |x_b|) <= 2
// eps u_c times the pair's norm, and a rotated row moves by 2 eps u_c of its
// norm. After the normalization that norm is ||x_tilde|| <= ||x_a||; before
// it, ||x||, which the l2 and rms normalizations (whose Jacobians scale
// ||dx|| by at most ||x_hat|| / ||x||) carry to 2 eps u_c ||x_hat||. So a
// logit moves by at most 2 eps u_c A per side (Cauchy-Schwarz, as the
// contract's q and kv points): 4 eps joins dot in every use (dot_s: soft,
// soft_o, lse, the ties' term units), as the softcap's units do.
//   The magnitudes. The oracle's sums over keys (dq's) and queries (dk's)
// run in the rotated coordinates the logits use, with the other side's
// rotated magnitude (OperandMags::xar = |c| x_a,a + |s| x_a,b, >= |y|
// element by element; before the normalization and for sdpa the operands
// are the rotated rows themselves). The backward's transpose rotation maps
// a gradient y to R^T y with |(R^T y)_a| <= |y_a| + |y_b|: every channel is
// pair-summed there (both elements of a pair get the pair's sum), before
// the normalization backward (after it, RoPE after the normalization) or
// after it (RoPE before); the signed gradient the LayerNorm and flip terms
// read is unrotated exactly. The cosine units (rule_terms.h) read the
// rotated magnitude rows, whose norms exceed x_a's by up to sqrt 2 per
// side: the units scale by the case's ratio of the largest row norms
// (CosineRows::rope_ratio). Qwen3's flips move x_tilde before the rotation:
// pair-summed in the sums, their logit bound (logit_flip) times sqrt 2 (the
// l1 of a rotated vector).
//   The gradients. After the normalization: the other side's rotated
// operand is off by eps u_c (|x_a| + |x_b|) <= sqrt 2 eps u_c (|y_a| +
// |y_b|) per element, so s sum_j dS_ij y_jd by sqrt 2 eps u_c (M_a + M_b)
// in the rotated coordinates, 2 sqrt 2 eps u_c times the pair-summed
// magnitude after the transpose rotation, whose own rounding (cos, sin,
// angle: eps) adds 1: kRopeGradAfter = 4 eps on dq, dk and the weights'
// magnitudes (which sum x_hat_e times the pair-summed dx_tilde). dg reads
// the logits' C_ij: in soft already. Before it (l2, rms without weight):
// the other side's x_hat = N(R x) is off, per element, by sqrt 2 eps (|u_a|
// + |u_b|) from the rotated row and 2 sqrt 2 eps |u_a| through the norm's
// projection, 3 sqrt 2 eps (|u_a| + |u_b|) (u = x_hat; for rms the mean
// square <= 1); in du that is 3 sqrt 2 eps u_c times the pair-summed
// magnitude, carried exactly by the normalization backward (whose
// magnitude map bounds its action element by element) and the transpose
// rotation: rope_mag = pair_sum(norm_backward_mag(pair_sum(M))). The
// backward's own reads of the perturbed x_hat (3 sqrt 2 twice: the two
// terms of u (u . du)) and divisor (2 eps) and the transpose rotation (1)
// are bounded by the same rope_mag: kRopeGradBefore = 16 eps (>= 9 sqrt 2
// + 3) on rope_mag. Not covered: LayerNorm or a weight before the rotation
// (validate refuses them: a weight makes the partner's error w_a-weighted),
// and the sampled verdict (it refuses RoPE).
//
// Attention sinks (issue 34; attention.h: one learned logit sink_h per
// query head in every row's denominator, a key with no value; lse includes
// it). The oracle forms the sink's term exactly; a kernel forms exp(sink -
// m) from the sink rounded to the compute format (u_c |sink|), the
// subtraction of its row shift m (|sink - m| <= 2 |sink| + |A|: m is a
// visible logit, |S| <= |A|, the sink, or a fixed shift of either's size)
// and the exp's own 4 ulp (kSinkExpUnits = 8, as the softcap's tanh): its
// exponent is off by at most E_s u_c, E_s = sink_logit_units = 3 max_h
// |sink_h| + |A| + 8 (rule_terms.h), where a visible logit's is A dot_s
// u_c, plus sink_shift_units = max(0, max|sink| - |A|) where the row's
// shift is a sink above |A| (each visible exponent S - m then rounds at up
// to |A| + |sink|, beyond the 2 |A| the cosine units allow for; found by a
// helper's review: with a softcap's dot_s 17, A = 10, sink 40, the visible
// logits' error reached 200 units against the 170 granted before). Then
// P_ij moves relatively by dS_ij - sum_k P_ik dS_ik - P_sink
// dsink, at most 2 max(A dot_s + sink_shift_units, E_s) u_c: every use of
// A dot_s (soft, soft_o, lse) reads the larger of the two
// (RuleScalars::logit; bitwise the bounds before sinks without sinks). The
// sink adds a term to each row sum: one more in the row's count and ties
// (it may tie with a key's term; RuleScalars::Nk counts it), and its
// perturbation reaches O_i as
// -P_sink O_i dsink (o_dev_mag += P_sink |O_i|) and delta_i as -P_sink
// delta_i dsink (ds_l1 += P_sink |delta_i|, kSoftmaxTerms).
//   dsinks_h = -sum_{b,i} P_sink,i delta_i, P_sink,i = exp(sink_h - lse_i),
// delta_i = dO_i . O_i, from the lse and O the backward reads, each within
// its own table's bound b_lse, b_O (delta + final operations + half the
// storage spacing; a wrong O or lse FAILs on its own table). Per row, to
// first order: P_sink is off relatively by b_lse,i (in its exponent) plus
// (u_c + u_o) (2 |sink| + |lse_i| + kSinkExpUnits + kOpUnits) (the sink
// rounded, the subtraction, the exp, the product); delta_i by sum_d |dO_id|
// b_O,id plus (u_c + u_o) (sum_units(D) + kOpUnits) |dO_i|.|O_i|; so
//   d_sinks delta_h = sum_{b,i} [P_sink,i (|delta_i| (b_lse,i + units) +
//       sum_d |dO_id| b_O,id + (u_c + u_o) (sum_units(D) + kOpUnits)
//       |dO_i|.|O_i|) + ulp_c(0) (D + 1) P_sink,i + p_res |dO_i|.|O_i|]
//     + (u_c + u_o) sum_units(B Nq) M_h + ulp_c(0) (B Nq + 2),
// M_h = sum P_sink,i |dO_i|.|O_i| (its magnitude and condition), p_res the
// flush of a P_sink below the normal range. Measured: dsinks rounded to
// bf16 FAILs the f32 bound (margin 6.2; tests/sinks_test.cc). Not covered:
// the sampled verdict (it refuses sinks); a kernel that forms P_sink as 1 -
// sum_j P_ij (its P_sink then carries the row sum's absolute error, not a
// relative one: it may FAIL d_sinks where P_sink is below u_c sqrt(Nk)); a
// contract
// whose logits point is coarser than the compute format and rounds the
// sink there too (the sink is taken in the compute format). Loose: E_s
// enters every row at full weight, whatever its sink's share, so one head
// with a huge |sink| loosens every field (|sink| above ~3.5e5 in f32 makes
// the softmax unresolved: only lse is judged). Weighting it by the largest
// share max P_sink (P's relative error <= 2 a + P_sink E_s; O and delta by
// P_sink E_s |O|, |delta|) keeps it sound and restores the teeth: not done.
//
// Compute contracts (issue 31; qknorm/contract.h). An entry declares the
// format of each intermediate it rounds: q at the dot product, k_hat and v
// as the cache stores them, the logits S, P before P.V, O's P.V
// accumulator, the output, and `compute` (all other arithmetic). The rows
// above are the default contract, f32-accumulate: every point in the
// compute format. For any other contract:
//   u_c := max(u_c, u_compute) (the `storage` preset: u_c := u_s in every
//          channel, forward and backward: eager 16-bit PyTorch rounds every
//          op's result);
//   u_X  := the unit roundoff of point X's format where it is coarser than
//          u_c, else 0 (a point no coarser than the compute costs nothing
//          beyond the rows above); u_v := u_kv only where the cache format
//          does not hold every storage value (v is an input, already in
//          storage: exact in the same format, f64, or f32 for 16-bit
//          storage; k_hat is computed, so u_k := u_kv);
// and each point's rounding enters the channels it reaches:
//   logits  a logit moves by e_S = A (u_q + u_k + u_S) + ulp_S(0) / 2 (u_S
//           > 0): q_hat and k_hat rounded relatively, |q_hat . k_hat| <= 1
//           per unit of A (Cauchy-Schwarz; the scale folded into q changes
//           nothing), S rounded relatively, |S| <= A, plus S's subnormal
//           resolution. P's relative error is 2 e_S: O moves by e_S T (the
//           softmax row above: dS enters O as sum_j P_ij dS_ij (v_jd -
//           O_id)), lse by e_S, and the gradients' softmax terms by 2 e_S
//           T (dq, dk, params: ds_mag; dv: its M; dg: dg_scale). The
//           logits are unresolved (delta = inf) where soft u_c + 2 e_S >
//           1/8.
//   p       P rounded relatively: u_P (M + T) on O (a kernel that divides
//           by the row sum of unrounded P moves O by sum_j dP_ij v_jd <=
//           u_P M; one that normalizes the rounded P moves it as a softmax
//           perturbation, <= u_P T; both are covered), u_P on the
//           gradients' softmax terms (dS_ij = P_ij (dP_ij - delta_i): u_P
//           ds_mag) and on dV's M. P is resolved absolutely only to
//           max(tiny_c, ulp_P(0) / 2): a value below half P's smallest
//           subnormal rounds to 0 (the Sp channel; max, not sum: an exp
//           that flushes below tiny_c leaves a value P's rounding flushes
//           anyway).
//   pv_acc O's Nk-term sum accumulated in its format: sum_units(Nk) u_acc
//           M, and max(ulp_c(0), ulp_acc(0)) per term instead of ulp_c(0).
//   kv      v rounded to the cache: u_v M on O; the backward reads k_hat
//   q       and v (dQ_hat = g dS k_hat, dP = dO v^T) and q_hat (dK_hat =
//           g dS^T q_hat): (u_q + u_k + u_v) M on dq, dk, params and dg.
//   out     O rounded before it is stored: u_out (|x| + delta) + ulp_out(0)
//           / 2 on O's delta, and u_out R (the stored O the backward reads)
//           on dq, dk, params and dg.
// The backward recomputes the points q, kv, logits and p (as a flash
// backward or eager autograd does); pv_acc and out act on the forward O
// only; every other backward operation is `compute`.
// The oracle rounds no input for a contract (v in a cache format coarser
// than storage enters as the bound term u_v M, not as a rounded oracle
// input), so one oracle serves every contract; every computed
// intermediate enters as the bound terms above. The `storage` preset is
// the former compute_unit = u_s rule (compare's --compute storage) plus the
// resolution terms of its P and accumulator points: at f16 P's 2.98e-8 and
// ulp_16(0) per term join (bounds looser by 7e-5 relative on a Gaussian
// dump), at bf16 only ulp_bf16(0) = 9e-41 per term replaces ulp_32(0)
// (margins unchanged), at f32 and f64 nothing. Not covered: the subnormal
// range of q_hat and k_hat at a 16-bit q or kv point (absolute ulp(0) / 2
// per element: at most ulp(0) sqrt(D) / (2 u) = 5e-4 of A u_q at f16, D =
// 64, on unit rows), and a bf16 v outside f16's range in an f16 cache.
#ifndef QKNORM_VALIDATION_RULE_H_
#define QKNORM_VALIDATION_RULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "qknorm/contract.h"
#include "qknorm/precision.h"
#include "validation/case.h"
#include "validation/field.h"
#include "validation/oracle.h"
#include "validation/rule_terms.h"

namespace qknorm::validation {

// ulp_fmt(|x| + delta) / 2: the storage rounding of a value within delta of x.
double half_spacing(Precision fmt, double x, double delta);

// One field's table: the oracle value, the per-element bound and the
// element's condition number, for a tensor of shape [B, H, rows, cols]
// (scalars: all 1).
struct ToleranceTable {
  Field field = Field::kO;
  Precision fmt = Precision::kF64;  // the format the field is stored in
  int64_t B = 1, H = 1, rows = 1, cols = 1;
  std::vector<long double> expected;
  std::vector<double> delta;  // compute error bound before the final rounding
  std::vector<double> cond;   // kappa_e (inf where x_e = 0 and M_e > 0)
  // Optional per-element note for diagnoses ("row fully masked").
  std::vector<unsigned char> masked_row;
  // Optional: element i's index in the whole [B, H, rows, cols] tensor (a
  // sampled verdict's table gathers a few elements of a long problem).
  std::vector<int64_t> index_of;
  std::string index_text(int64_t i) const;  // "[b,h,n,d]"
};

// A table of no elements for field f in format fmt, shaped [B, H, rows,
// cols] (a sampled verdict gathers its elements; validation/sampled.h).
ToleranceTable empty_table(Field f, Precision fmt, int64_t B, int64_t H,
                           int64_t rows, int64_t cols);

// Tables for o, lse, dq, dk, dv, dg (forward_only: o, lse) of a case whose
// inputs are already in the entry's precision s, for an entry that declares
// `contract` (above, "Compute contracts"; default f32-accumulate). The
// `storage` preset declares a framework that rounds every intermediate to
// the 16-bit storage format, as PyTorch's bfloat16 CPU autograd does.
std::vector<ToleranceTable> attention_tolerances(
    const AttentionCase& c, Precision s, const OracleAttention& oracle,
    bool forward_only, const ComputeContract& contract = {});
// dg's table alone, from dg and its channels in `oracle` (the sampled
// oracle's pass sets them; validation/sampled.h).
ToleranceTable attention_dg_tolerance(const AttentionCase& c, Precision s,
                                      const OracleAttention& oracle,
                                      const ComputeContract& contract = {});
// For bounds that hold by one unit roundoff rather than the tables' channels
// (the sampled verdict's O(n D) properties, validation/sampled_judge.cc):
// the contract's coarsest unit roundoff (u_c or any declared point's; u_c
// itself for f32-accumulate), P's absolute resolution beyond tiny_c (ulp_P(0)
// / 2 where it exceeds tiny_c, else 0) and the logits' (ulp_S(0) / 2 at a
// coarser logits point, else 0).
struct ContractUnits {
  double u = 0, p_res = 0, logit_res = 0;
};
ContractUnits contract_units(const ComputeContract& contract, Precision s);
// Tables for y, dx, dg.
std::vector<ToleranceTable> scalenorm_tolerances(const ScaleNormCase& c,
                                                 Precision s,
                                                 const OracleScaleNorm& oracle);

}  // namespace qknorm::validation

#endif  // QKNORM_VALIDATION_RULE_H_
