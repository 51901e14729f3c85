/*
 * knn_exact.h: the canonical float64 arithmetic that defines knngpu's answer.
 *
 * Included by the C engine and by the CUDA backend, so both compute every
 * ranking key with the same IEEE operations in the same order; that is what
 * makes CPU and GPU results identical bit for bit. Rules kept here:
 *   - sums run sequentially over features 0..p-1, one accumulator;
 *   - no fused multiply-add (device code uses the _rn intrinsics, which the
 *     compiler never contracts; the C engine is built without contraction);
 *   - scaling is by powers of two only (frexp/ldexp), which is exact, so
 *     values like 1e200 or 1e-200 neither overflow nor lose ties; each
 *     node (correlations) or pair of nodes (distances) takes its own
 *     power of two, so no node's magnitude changes another's answer.
 *
 * Keys: smaller is closer; results are ordered by the distance reported
 * for a key (knn_key_distance), then by the smaller node index.
 * Correlation metrics rank by the signed squared correlation
 * q = S^2 / (css_i css_j) computed from S = p * (u_i . u_j) - sum_i * sum_j,
 * where u is the node shifted and scaled by a power of two:
 * for integer-valued nodes (or integers times one power of two) the shift
 * is an integer, so every quantity is exact and mathematically tied
 * correlations are tied bit for bit, also between nodes that differ by a
 * power-of-two scale (knn_exact_integers). Distance metrics rank by the
 * reported distance itself, the sum of squared (or absolute) differences
 * of the nodes as given, summed as dist() sums them, or, where that sum
 * overflows or is small enough for underflowing terms to matter, with
 * each pair's terms scaled by the power of two of its largest difference
 * (knn_key_dist): dist()'s bits wherever dist() neither overflows nor
 * underflows, and the scaled exact value where it would. Their fast
 * scores live in a frame scaled by one power of two for all nodes
 * (scale_exp), which only the candidate bounds see.
 *
 * Fast candidate arithmetic (float32 or float64 products) is tied to these
 * keys by the margins at the end of this file: a node whose fast score lies
 * within twice the margin of the k-th best fast score is a candidate, and the
 * true top k under the canonical key is always among the candidates.
 */
#ifndef KNN_EXACT_H
#define KNN_EXACT_H

#include <float.h>
#include <math.h>
#include "knn.h"

#if defined(__CUDA_ARCH__)
#define KNN_ADD(a, b) __dadd_rn((a), (b))
#define KNN_SUB(a, b) __dsub_rn((a), (b))
#define KNN_MUL(a, b) __dmul_rn((a), (b))
#define KNN_DIV(a, b) __ddiv_rn((a), (b))
#else
#define KNN_ADD(a, b) ((a) + (b))
#define KNN_SUB(a, b) ((a) - (b))
#define KNN_MUL(a, b) ((a) * (b))
#define KNN_DIV(a, b) ((a) / (b))
#endif

/* Unit roundoff of float64 and float32. */
#define KNN_U64 1.1102230246251565e-16
#define KNN_U32 5.9604644775390625e-08

/* Nodes whose values are integers below 2^KNN_EXACT_INT_BITS, once
 * scaled by a power of two, take the exact integer shift. */
#define KNN_EXACT_INT_BITS 31

/* Exponent e with |v| / 2^e in [0.5, 1); 0 for v == 0. */
KNN_HD static inline int knn_exponent(double v)
{
    int e = 0;
    if (v != 0.0) frexp(v, &e);
    return e;
}

/* 2^e where x * 2^e has the bits of ldexp(x, e) for every x: where 2^e
 * is a normal double, both are the same single rounding of the same exact
 * product, and a multiplication costs far less than a call of ldexp.
 * 0 where only ldexp gives them. */
KNN_HD static inline double knn_ldexp_factor(int e)
{
    return e >= -1022 && e <= 1023 ? ldexp(1.0, e) : 0.0;
}

/* out[f] = ldexp(x[f], e) for f < n, with the same bits; factor is
 * knn_ldexp_factor(e), computed once by the caller. */
KNN_HD static inline void knn_ldexp_values(const double *x, int n, int e,
                                           double factor, double *out)
{
    if (factor == 0.0) {
        for (int f = 0; f < n; f++) out[f] = ldexp(x[f], e);
        return;
    }
    for (int f = 0; f < n; f++) out[f] = x[f] * factor;
}

KNN_HD static inline double knn_max_abs(const double *x, int p)
{
    double m = 0.0;
    for (int f = 0; f < p; f++) {
        double a = fabs(x[f]);
        if (a > m) m = a;
    }
    return m;
}

/* Largest |value| of n nodes of p features (p x n, node-contiguous). */
static inline double knn_nodes_max_abs(const double *x, int p, int n)
{
    double m = 0.0;
    for (int j = 0; j < n; j++) {
        double a = knn_max_abs(x + (size_t)j * p, p);
        if (a > m) m = a;
    }
    return m;
}

KNN_HD static inline double knn_sum(const double *x, int p)
{
    double s = 0.0;
    for (int f = 0; f < p; f++) s = KNN_ADD(s, x[f]);
    return s;
}

/* One feature's term added to a canonical sum s: a dot product's, and a
 * squared distance's. Every canonical sum is these terms in feature
 * order, however many sums are kept at once. */
KNN_HD static inline double knn_dot_term(double s, double a, double b)
{
    return KNN_ADD(s, KNN_MUL(a, b));
}

KNN_HD static inline double knn_sqdiff_term(double s, double a, double b)
{
    double d = KNN_SUB(a, b);
    return KNN_ADD(s, KNN_MUL(d, d));
}

/* The dot product s continued over a[0..n), b[0..n): computed in pieces,
 * in feature order, it has the bits of one computed whole. */
KNN_HD static inline double knn_dot_more(const double *a, const double *b,
                                         int n, double s)
{
    for (int f = 0; f < n; f++) s = knn_dot_term(s, a[f], b[f]);
    return s;
}

KNN_HD static inline double knn_dot(const double *a, const double *b, int p)
{
    return knn_dot_more(a, b, p, 0.0);
}

/* Trailing zero bits of a nonzero integer. */
KNN_HD static inline int knn_trailing_zeros(unsigned long long v)
{
#if defined(__CUDA_ARCH__)
    return __ffsll((long long)v) - 1;
#else
    return __builtin_ctzll(v);
#endif
}

/* Whether a node's p values x are integers below 2^KNN_EXACT_INT_BITS
 * times one power of two; if so, writes those integers, the smallest such
 * (the power of two divided out), to y (which may be x). Two nodes that
 * differ by a power-of-two scale get the same y, so their correlations
 * with every node tie bit for bit, as they do in exact arithmetic. amax
 * is the largest |x|. x is read in full before y is written. */
KNN_HD static inline int knn_exact_integers(const double *x, int p,
                                            double amax, double *y)
{
    int up = KNN_EXACT_INT_BITS - knn_exponent(amax);
    double factor = knn_ldexp_factor(up);
    unsigned long long bits = 0;
    for (int f = 0; f < p; f++) {
        double v = factor != 0.0 ? x[f] * factor : ldexp(x[f], up);
        if (v != floor(v) || (v == 0.0 && x[f] != 0.0)) return 0;
        bits |= (unsigned long long)fabs(v);
    }
    int down = bits ? knn_trailing_zeros(bits) : 0;
    knn_ldexp_values(x, p, up - down, knn_ldexp_factor(up - down), y);
    return 1;
}

/* Twice the average rank (ties share their mean rank, as R's rank() and
 * cor(method = "spearman") do) of feature f among the node's p values: an
 * integer, so Spearman inherits the exact integer path. */
KNN_HD static inline double knn_rank2(const double *x, int p, int f)
{
    int less = 0, equal = 0;
    for (int g = 0; g < p; g++) {
        less += x[g] < x[f];
        equal += x[g] == x[f];
    }
    return 2.0 * less + equal + 1.0;
}

/* Whether a node (p values) is one the metric cannot use: constant for
 * the centred correlations, all zero for cosine; never for the distance
 * metrics, nor where a value is NA, NaN or Inf (knn_nonfinite_nodes'
 * to report). Both tests stop at the first value that clears the node,
 * which on real data is among its first few; a row of NaN compares
 * unequal to anything, a row of Inf is constant to them, so a node that
 * looks degenerate is one only if it is finite, which costs nothing on
 * the nodes that pass. A node's knn_rank2 values are constant exactly
 * where its values are, so Spearman's ranks answer as the values do. */
KNN_HD static inline int knn_node_degenerate(knn_metric m, const double *x,
                                             int p)
{
    if (!knn_is_correlation(m)) return 0;
    if (m == KNN_COSINE) {
        for (int f = 0; f < p; f++)
            if (x[f] != 0.0) return 0;
    } else {
        for (int f = 1; f < p; f++)
            if (x[f] != x[0]) return 0;
    }
    for (int f = 0; f < p; f++)
        if (!isfinite(x[f])) return 0;
    return 1;
}

/* Canonical form of one node for a correlation metric: writes u (p values)
 * and its sum and css (p * sum(u^2) - sum^2; for cosine sum(u^2)). x holds
 * the node's values (for Spearman, its knn_rank2 values). A degenerate node
 * (constant, or all zero for cosine) gives css == 0. */
KNN_HD static inline void knn_canon_corr(knn_metric m, const double *x, int p,
                                         double *u, double *sum, double *css)
{
    double amax = knn_max_abs(x, p);
    if (knn_is_centred(m) && knn_exact_integers(x, p, amax, u)) {
        double shift = floor(KNN_DIV(knn_sum(u, p), (double)p) + 0.5);
        for (int f = 0; f < p; f++) u[f] = KNN_SUB(u[f], shift);
    } else {
        int e = knn_exponent(amax);
        knn_ldexp_values(x, p, -e, knn_ldexp_factor(-e), u);
        if (knn_is_centred(m)) {
            double mean = KNN_DIV(knn_sum(u, p), (double)p);
            for (int f = 0; f < p; f++) u[f] = KNN_SUB(u[f], mean);
        }
    }
    int e = knn_exponent(knn_max_abs(u, p));
    knn_ldexp_values(u, p, -e, knn_ldexp_factor(-e), u);

    double uu = knn_dot(u, u, p);
    if (knn_is_centred(m)) {
        *sum = knn_sum(u, p);
        *css = KNN_SUB(KNN_MUL((double)p, uu), KNN_MUL(*sum, *sum));
    } else {
        *sum = 0.0;
        *css = uu;
    }
}

/* The fast vector of a correlation node from its canonical form (u, sum,
 * css): f = (u - mean) * scale, so that f_i . f_j = r (cosine: mean 0).
 * Both backends form it so (in float64 here, float32 on the GPU). */
KNN_HD static inline void knn_fast_corr_form(knn_metric m, int p, double sum,
                                             double css, double *mean,
                                             double *scale)
{
    *mean = knn_is_centred(m) ? sum / p : 0.0;
    *scale = knn_is_centred(m) ? 1.0 / sqrt(css / p) : 1.0 / sqrt(css);
}

/* A correlation node's cancellation p * sum(u^2) / css (1 for cosine,
 * which does not centre), the kappa of knn_margin_corr. */
KNN_HD static inline double knn_corr_kappa(knn_metric m, const double *u,
                                           int p, double css)
{
    return knn_is_centred(m) ? p * knn_dot(u, u, p) / css : 1.0;
}

/* Canonical key of a pair of correlation-metric nodes from the dot
 * product of their canonical forms (knn_dot). */
KNN_HD static inline double knn_key_corr_of_dot(knn_metric m, double dot,
                                                int p, double sum_i,
                                                double css_i, double sum_j,
                                                double css_j)
{
    double s = knn_is_centred(m)
        ? KNN_SUB(KNN_MUL((double)p, dot), KNN_MUL(sum_i, sum_j)) : dot;
    double q = KNN_DIV(KNN_MUL(s, s), KNN_MUL(css_i, css_j));
    if (q > 1.0) q = 1.0;
    if (m == KNN_ABSPEARSON) return -q;
    return s < 0.0 ? q : -q;
}

/* Canonical key of a pair of correlation-metric nodes. */
KNN_HD static inline double knn_key_corr(knn_metric m, const double *ui,
                                         const double *uj, int p,
                                         double sum_i, double css_i,
                                         double sum_j, double css_j)
{
    return knn_key_corr_of_dot(m, knn_dot(ui, uj, p), p, sum_i, css_i,
                               sum_j, css_j);
}

/* A pair's distance sum as it runs over the features: s * 2^(w e), w = 2
 * for squares and 1 for Manhattan, where every difference so far is below
 * 2^e in magnitude. Terms are the differences scaled by 2^-e, so no term
 * overflows and none that matters underflows; when a larger difference
 * comes, s moves to its power of two, a scaling by a power of two, exact
 * where s stays normal (and otherwise too small to move the sum). The
 * bits are those of a sum scaled by the largest difference from the
 * start, and so of the unscaled sum wherever that has no overflow or
 * subnormal term. */
typedef struct {
    double s;
    int e;
    double top;    /* 2^e (INFINITY past the doubles), 0 before any term */
    double factor; /* knn_ldexp_factor(-e) */
} knn_dist_sum;

#define KNN_DIST_SUM_E0 (-1100)

KNN_HD static inline void knn_dist_sum_init(knn_dist_sum *acc)
{
    acc->s = 0.0;
    acc->e = KNN_DIST_SUM_E0;
    acc->top = 0.0;
    acc->factor = 0.0;
}

KNN_HD static inline double knn_dist_sum_term(knn_metric m, double s,
                                              double x)
{
    return m == KNN_MANHATTAN ? KNN_ADD(s, fabs(x))
                              : KNN_ADD(s, KNN_MUL(x, x));
}

/* The slow path of knn_dist_sum_add: a zero, a difference of a new power
 * of two, or one past the largest double (halved first). */
KNN_HD static inline void knn_dist_sum_wide(knn_dist_sum *acc, knn_metric m,
                                            double a, double b, double d)
{
    if (d == 0.0) return;
    int shift = 0;
    if (!(fabs(d) <= DBL_MAX)) {
        d = KNN_SUB(KNN_MUL(a, 0.5), KNN_MUL(b, 0.5));
        shift = 1;
    }
    int e = knn_exponent(d) + shift;
    if (e > acc->e) {
        int w = m == KNN_MANHATTAN ? 1 : 2;
        acc->s = ldexp(acc->s, w * (acc->e - e));
        acc->e = e;
        acc->top = e <= 1023 ? ldexp(1.0, e) : INFINITY;
        acc->factor = knn_ldexp_factor(-e);
    }
    acc->s = knn_dist_sum_term(m, acc->s, ldexp(d, shift - acc->e));
}

/* Adds the term of one feature, values a and b. */
KNN_HD static inline void knn_dist_sum_add(knn_dist_sum *acc, knn_metric m,
                                           double a, double b)
{
    double d = KNN_SUB(a, b);
    if (fabs(d) < acc->top) {
        double x = acc->factor != 0.0 ? KNN_MUL(d, acc->factor)
                                      : ldexp(d, -acc->e);
        acc->s = knn_dist_sum_term(m, acc->s, x);
        return;
    }
    knn_dist_sum_wide(acc, m, a, b, d);
}

/* The distance a finished sum stands for, rounded once from the scaled
 * sum: Euclidean sqrt(s) 2^e, squared Euclidean s 4^e, Manhattan s 2^e
 * (INFINITY past the largest double, subnormal or 0 below the smallest
 * normal). */
KNN_HD static inline double knn_dist_sum_value(knn_metric m,
                                               const knn_dist_sum *acc)
{
    if (acc->s == 0.0) return 0.0;
    if (m == KNN_EUCLIDEAN) return ldexp(sqrt(acc->s), acc->e);
    if (m == KNN_SQEUCLIDEAN) return ldexp(acc->s, 2 * acc->e);
    return ldexp(acc->s, acc->e);
}

/* A pair's distance key, scaled exactly: the sum of knn_dist_sum over
 * every feature. */
KNN_HD static inline double knn_key_dist_scaled(knn_metric m, const double *a,
                                                const double *b, int p)
{
    knn_dist_sum acc;
    knn_dist_sum_init(&acc);
    for (int f = 0; f < p; f++) knn_dist_sum_add(&acc, m, a[f], b[f]);
    return knn_dist_sum_value(m, &acc);
}

/* The plain sum of a pair's terms as it runs: dist()'s arithmetic. */
typedef struct {
    double s;
} knn_dist_acc;

/* The smallest plain sum that is a key: a term below the normal doubles
 * (a difference below 2^-511 squared, or a subnormal one) is lost from
 * the plain sum by at most 2^-1074, and p of them, at least 2^-900 below
 * the sum, lie far under its rounding. */
#define KNN_PLAIN_MIN 0x1p-900

/* The plain sum continued over features a[0..n), b[0..n): computed in
 * pieces, in feature order, it has the bits of one computed whole. */
KNN_HD static inline void knn_key_dist_more(knn_metric m, const double *a,
                                            const double *b, int n,
                                            knn_dist_acc *acc)
{
    double s = acc->s;
    if (m == KNN_MANHATTAN) {
        for (int f = 0; f < n; f++) s = KNN_ADD(s, fabs(KNN_SUB(a[f], b[f])));
    } else {
        for (int f = 0; f < n; f++) s = knn_sqdiff_term(s, a[f], b[f]);
    }
    acc->s = s;
}

/* Whether a finished plain sum is the key: from KNN_PLAIN_MIN to the
 * largest double. */
KNN_HD static inline int knn_key_dist_plain(double s)
{
    return s >= KNN_PLAIN_MIN && s <= DBL_MAX;
}

/* The key from a finished plain sum s of the whole of a and b: s where
 * knn_key_dist_plain, else the exactly scaled sum. */
KNN_HD static inline double knn_key_dist_finish(knn_metric m, double s,
                                                const double *a,
                                                const double *b, int p)
{
    if (!knn_key_dist_plain(s)) return knn_key_dist_scaled(m, a, b, p);
    return m == KNN_EUCLIDEAN ? sqrt(s) : s;
}

/* Canonical key of a pair of distance-metric nodes, as given: the
 * distance reported for the pair. Where the plain sum (dist()'s own
 * arithmetic, in feature order) is from KNN_PLAIN_MIN to the largest
 * double, that sum; elsewhere (it overflowed, or is tiny enough that
 * underflowing terms could matter) each term scaled by the power of two
 * of the pair's largest difference (knn_dist_sum). No other node changes
 * either. */
KNN_HD static inline double knn_key_dist(knn_metric m, const double *a,
                                         const double *b, int p)
{
    knn_dist_acc acc = {0.0};
    knn_key_dist_more(m, a, b, p, &acc);
    return knn_key_dist_finish(m, acc.s, a, b, p);
}

/* Distance reported for a key: 1 - r for correlations; a distance
 * metric's key is its distance. It never decreases as the key grows, but
 * distinct correlation keys can round to one distance, so results are
 * ordered by this value and then by the node index: the tie rule then
 * holds on what users see, k-th place included. */
KNN_HD static inline double knn_key_distance(knn_metric m, double key)
{
    if (knn_is_correlation(m)) {
        double r = key <= 0.0 ? sqrt(-key) : -sqrt(key);
        return KNN_SUB(1.0, r);
    }
    return key;
}

/* The distance a fast score stands for in the frame of the fast vectors,
 * where distance-metric nodes are divided by 2^scale_exp (Manhattan's
 * scores are keys: scale_exp 0). For candidate bounds only. */
KNN_HD static inline double knn_frame_distance(knn_metric m, double score,
                                               int scale_exp)
{
    if (knn_is_correlation(m)) return knn_key_distance(m, score);
    if (m == KNN_EUCLIDEAN) return ldexp(sqrt(score), scale_exp);
    if (m == KNN_SQEUCLIDEAN) return ldexp(score, 2 * scale_exp);
    return ldexp(score, scale_exp);
}

/* Whether a distance metric's score, in the frame scaled by
 * 2^scale_exp, reports a normal distance for certain: within these
 * bounds the distance lies between 2^-964 and 2^964 for every metric, so
 * knn_key_tie_top needs no square root or scaling to know it. Candidate
 * bounds tighten once per better offer, and this is their common case. */
KNN_HD static inline int knn_score_far_from_range_edges(double key,
                                                        int scale_exp)
{
    return key >= 0x1p-900 && key <= 0x1p900 && scale_exp >= -32 &&
           scale_exp <= 32;
}

/* The largest score, in the frame of the fast vectors, whose exact value
 * can report the distance that `key` (a score there) does: beyond it the
 * reported distance is larger. Rounding makes this a band: sqrt and 1 - r
 * round distinct values together (relative 4 units for the square root,
 * 8 absolute for correlations, doubled here), and where the reported
 * distance underflows (to subnormals or zero) or overflows, a whole range
 * of scores reports one value (rows at 1e-300, squared distances past
 * 1e308); that range's edge gets a factor of 4 to spare for the rounding
 * at the subnormal boundary. */
KNN_HD static inline double knn_key_tie_top(knn_metric m, double key,
                                            int scale_exp)
{
    if (knn_is_correlation(m)) return key + 16.0 * KNN_U64;
    double normal = m == KNN_EUCLIDEAN ? key * (1.0 + 8.0 * KNN_U64) : key;
    if (knn_score_far_from_range_edges(key, scale_exp)) return normal;
    double d = knn_frame_distance(m, key > 0.0 ? key : 0.0, scale_exp);
    if (d > DBL_MAX) return INFINITY;
    if (d >= DBL_MIN) return normal;
    double low = ldexp(DBL_MIN, -(m == KNN_SQEUCLIDEAN ? 2 : 1) * scale_exp);
    double top = m == KNN_EUCLIDEAN ? 4.0 * low * low : 4.0 * low;
    return key > top ? key : top;
}

/* The candidate bound of a query whose k-th best fast score is kth, its
 * fast scores within margin2 / 2 of its keys: a node whose fast score
 * exceeds it cannot take a place in the top k, ties in the reported
 * distance included (the k-th best key is at most kth + margin2 / 2). */
KNN_HD static inline double knn_candidate_bound(knn_metric m, double kth,
                                                double margin2,
                                                int scale_exp)
{
    double bound = kth + margin2;
    if (!(bound < INFINITY)) return bound;
    double tie = knn_key_tie_top(m, kth + 0.5 * margin2, scale_exp);
    return fmax(bound, tie + 0.5 * margin2);
}

/* Weight and distance reported for a key (see knn_key_distance). */
KNN_HD static inline void knn_key_output(knn_metric m, double key,
                                         double *distance, double *weight)
{
    *distance = knn_key_distance(m, key);
    if (knn_is_correlation(m)) *weight = key <= 0.0 ? sqrt(-key) : -sqrt(key);
    else *weight = KNN_DIV(1.0, KNN_ADD(1.0, *distance));
}

/*
 * Margins. unit_in: relative rounding of the candidate arithmetic's inputs
 * (2^-24 for float32, 2^-11 for TF32, 0 when inputs stay float64); unit_acc:
 * its accumulation unit (2^-24 for float32 sums). The fast vectors are
 * f = (u - mean) / |u - mean| for correlations (so f_i . f_j = r) and the
 * column-centred scaled nodes for distances, computed in float64 first.
 * Each bound covers |fast - exact| + |canonical - exact| with a factor of
 * two to spare; kappa = max over nodes of p * sum(u^2) / css >= 1 measures
 * the cancellation in the canonical S.
 *
 * Those relative bounds fail where values or products fall below the
 * arithmetic's normal range: nodes of tiny norm beside large ones (the
 * 2^-e scaling is one for all) have float32 products that underflow, or
 * are flushed to zero by tensor cores, and err by up to the smallest
 * normal number each, whatever their size. knn_margin_floor bounds that
 * absolute part: (p + 4) such errors per product, p more from inputs
 * rounded in the subnormal range (|values| <= 2 after scaling and
 * centring), doubled in the distance form and to spare. `tiny` is the
 * smallest normal number of the candidate arithmetic (KNN_TINY32 or
 * KNN_TINY64).
 */
#define KNN_TINY32 0x1p-126
#define KNN_TINY64 0x1p-1022

KNN_HD static inline double knn_margin_floor(int p, double tiny)
{
    return 8.0 * (2.0 * p + 4.0) * tiny;
}

KNN_HD static inline double knn_margin_corr(int p, double unit_in,
                                            double unit_acc, double tiny,
                                            double kappa)
{
    double fast = (p + 4.0) * unit_acc + 2.0 * unit_in;
    double canon = 8.0 * (p + 10.0) * KNN_U64 * (kappa + p);
    return 2.0 * (fast + canon) + knn_margin_floor(p, tiny);
}

KNN_HD static inline double knn_margin_dist(int p, double unit_in,
                                            double unit_acc, double tiny,
                                            double norm_i, double norm_max)
{
    double reach = (norm_i + norm_max) * (norm_i + norm_max);
    double fast = (p + 4.0) * unit_acc + 2.0 * unit_in;
    double canon = 4.0 * (p + 10.0) * KNN_U64;
    return 2.0 * (fast + canon) * reach + knn_margin_floor(p, tiny);
}

/* The factor M of knn_margin_dist's relative part as a function of the
 * pair's norms: knn_margin_dist(p, unit_in, unit_acc, tiny, a, b) =
 * M (a + b)^2 + knn_margin_floor(p, tiny). */
KNN_HD static inline double knn_margin_dist_unit(int p, double unit_in,
                                                 double unit_acc)
{
    return knn_margin_dist(p, unit_in, unit_acc, 0.0, 0.5, 0.5);
}

/*
 * The translation of the distance metrics' fast vectors. Distances do not
 * change when every node moves by one vector t, but the margins scale with
 * the nodes' norms |x - t|, so t decides how many candidates pass. The
 * column mean minimises the sum of squared norms: right for data around a
 * common level (log-expression near 8 in every sample). Nodes at very
 * different levels (a gene's row is its level times a profile) are better
 * left at the origin: there the mean, set by the highest levels, dwarfs
 * every low-level node's norm, while its neighbours are as close as its
 * own level makes them. The rule takes the translation with the smaller
 * geometric mean of the reference nodes' squared norms (a proxy of each
 * node's norm over its neighbour distance), through this per-node term;
 * the floor keeps an all-zero node from deciding alone. Any t keeps the
 * answer exact (the margins hold for any translation); it only costs or
 * saves candidates.
 */
KNN_HD static inline double knn_translation_log(double sqnorm)
{
    return log(sqnorm + 1e-30);
}

KNN_HD static inline double knn_translation_term(const double *x,
                                                 const double *t, int p)
{
    double s = 0.0;
    for (int f = 0; f < p; f++) {
        double d = t ? x[f] - t[f] : x[f];
        s += d * d;
    }
    return knn_translation_log(s);
}

/*
 * A distance row's candidate bound from its own neighbourhood instead of
 * the largest norm (knn_margin_dist with norm_max), for rows whose
 * neighbours have norms far below the largest (nodes at very different
 * levels). kth: an upper bound of the row's k-th smallest fast score;
 * norm_i: the row's fast norm; unit: knn_margin_dist_unit; floor:
 * knn_margin_floor of the same arithmetic. Returns a bound
 * every node of the exact top k (ties in the reported distance included)
 * meets, or INFINITY where none is found here (the caller keeps its own).
 *
 * Why it holds: with e = 1e-6 (far above the float64 rounding of the fast
 * vectors' centring and of the canonical keys), a node l's fast norm is at
 * most (n_i + sqrt(key_il)) (1 + e) (triangle inequality), and
 * |s_il - key_il| <= unit (n_i + n_l)^2 + floor. The k nodes whose fast
 * scores are at most kth therefore have x = sqrt(key) with
 * x^2 <= kth + floor + a (2 n_i + x)^2, a = unit (1 + e)^2, so x <= X,
 * the root of that quadratic, and the exact k-th key is at most X^2.
 * Nodes of the exact top k have keys at most top = knn_key_tie_top(X^2),
 * hence norms at most r = (n_i + sqrt(top)) (1 + e), and fast scores at
 * most top + unit (n_i + r)^2 + floor. Each step is rounded up by a
 * relative 2^-40.
 */
KNN_HD static inline double knn_dist_row_bound(knn_metric m, double kth,
                                               double norm_i, double unit,
                                               double floor, int scale_exp)
{
    const double e = 1e-6, up = 1.0 + 0x1p-40;
    double a = unit * (1.0 + e) * (1.0 + e);
    if (!(a < 0.25) || !(kth < INFINITY) || !(norm_i < INFINITY))
        return INFINITY;
    double s = (kth > 0.0 ? kth : 0.0) + floor;
    double x = (2.0 * a * norm_i +
                sqrt(4.0 * a * a * norm_i * norm_i +
                     (1.0 - a) * (s + 4.0 * a * norm_i * norm_i) * up)) /
               (1.0 - a) * up * up;
    double top = knn_key_tie_top(m, x * x * up, scale_exp);
    if (!(top < INFINITY)) return INFINITY;
    double r = (norm_i + sqrt(top) * up) * (1.0 + e) * up;
    return (top + unit * (norm_i + r) * (norm_i + r) * up + floor) * up;
}

#endif
