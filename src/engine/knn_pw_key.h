/*
 * knn_pw_key.h: the float64 key of a pairwise-complete pair (Pearson,
 * |Pearson| and cosine over the features both nodes have,
 * and bicor over them), included by the C engine (knn_coexpr.c) and by
 * the CUDA backend (knn_gpu_coexpr.cu), so that both key every pair with
 * the same operations in the same order and give the same bits (the rules
 * of knn_exact.h: sequential sums over the features, no fused
 * multiply-add).
 *
 * Nodes are as knn_coexpr.c prepares them: scaled by a power of two, NaN
 * where missing, and a node of integers times one power of two rewritten
 * as the smallest such integers (imax, its largest |integer|; else 0).
 * For bicor each node also has its present features in ascending order
 * of value (ord, len of them), from which the medians over any subset of
 * them are read in one walk. Value (or place) f of a node lies at f *
 * stride from its first: 1 where the node's values are contiguous, the
 * number of nodes where they are stored feature by feature.
 */
#ifndef KNN_PW_KEY_H
#define KNN_PW_KEY_H

#include <math.h>
#include <stddef.h>
#include "knn_exact.h"
#include "knn_metric.h"

/* Whether value x is missing (NaN; the values keyed here are never
 * infinite, knn_pairwise_search refusing them first, so an exponent of
 * all ones means NaN): on a GPU from the exponent's bits on the integer
 * units, which leaves the float64 units to the sums. */
#if defined(__CUDA_ARCH__)
#define KNN_PW_MISSING(x) ((__double2hiint(x) & 0x7ff00000) == 0x7ff00000)
#else
#define KNN_PW_MISSING(x) isnan(x)
#endif

/* Whether two nodes of integers (largest |values| ia, ib; 0: not such a
 * node) over p features take the exact sums: p^2 ia ib < 2^26 keeps S^2
 * and Ca Cb below knn_pw_corr_integers exact too. */
KNN_HD static inline int knn_pw_exact_pair(int p, double ia, double ib)
{
    return ia > 0.0 && ib > 0.0 &&
           KNN_MUL(KNN_MUL(KNN_MUL((double)p, (double)p), ia), ib) <
               67108864.0;
}

/* Pearson (centred) or cosine of two nodes of integers over their n
 * shared features, whose sums sa and sb are given, from sums that are
 * exact: r = sign(S) sqrt(S^2 / (Ca Cb)) with S = n sxy - sx sy and C =
 * n sxx - sx^2 (cosine: sxy, sxx, syy), so correlations equal in exact
 * arithmetic are equal bit for bit. NaN where undefined. */
KNN_HD static inline double knn_pw_corr_integers(const double *a,
                                                 size_t sa_, const double *b,
                                                 size_t sb_, int p,
                                                 int centred, double n,
                                                 double sa, double sb)
{
    double saa = 0.0, sbb = 0.0, sab = 0.0;
    for (int f = 0; f < p; f++) {
        double x = a[(size_t)f * sa_], y = b[(size_t)f * sb_];
        if (KNN_PW_MISSING(x) || KNN_PW_MISSING(y)) continue;
        saa = KNN_ADD(saa, KNN_MUL(x, x));
        sbb = KNN_ADD(sbb, KNN_MUL(y, y));
        sab = KNN_ADD(sab, KNN_MUL(x, y));
    }
    double s = centred ? KNN_SUB(KNN_MUL(n, sab), KNN_MUL(sa, sb)) : sab;
    double ca = centred ? KNN_SUB(KNN_MUL(n, saa), KNN_MUL(sa, sa)) : saa;
    double cb = centred ? KNN_SUB(KNN_MUL(n, sbb), KNN_MUL(sb, sb)) : sbb;
    if (ca == 0.0 || cb == 0.0) return NAN;
    double q = KNN_DIV(KNN_MUL(s, s), KNN_MUL(ca, cb));
    double r = sqrt(q > 1.0 ? 1.0 : q);
    return s < 0.0 ? -r : r;
}

/* Pearson (centred) or cosine of nodes a and b over their shared
 * features: two passes, the means and then the centred products; NaN
 * where it is undefined or fewer than min_shared features are shared.
 * ia, ib: the nodes' imax; two nodes of small integers take
 * knn_pw_corr_integers, so that exact ties stay ties. */
KNN_HD static inline double knn_pw_corr(const double *a, size_t sa_,
                                        const double *b, size_t sb_, int p,
                                        int centred, int min_shared,
                                        double ia, double ib)
{
    int count = 0;
    double sa = 0.0, sb = 0.0;
    for (int f = 0; f < p; f++) {
        double x = a[(size_t)f * sa_], y = b[(size_t)f * sb_];
        if (KNN_PW_MISSING(x) || KNN_PW_MISSING(y)) continue;
        count++;
        sa = KNN_ADD(sa, x);
        sb = KNN_ADD(sb, y);
    }
    if (count < min_shared || count == 0) return NAN;
    if (knn_pw_exact_pair(p, ia, ib))
        return knn_pw_corr_integers(a, sa_, b, sb_, p, centred,
                                    (double)count, sa, sb);
    double ma = centred ? KNN_DIV(sa, (double)count) : 0.0;
    double mb = centred ? KNN_DIV(sb, (double)count) : 0.0;
    double sab = 0.0, saa = 0.0, sbb = 0.0;
    for (int f = 0; f < p; f++) {
        double x = a[(size_t)f * sa_], y = b[(size_t)f * sb_];
        if (KNN_PW_MISSING(x) || KNN_PW_MISSING(y)) continue;
        double da = KNN_SUB(x, ma), db = KNN_SUB(y, mb);
        sab = KNN_ADD(sab, KNN_MUL(da, db));
        saa = KNN_ADD(saa, KNN_MUL(da, da));
        sbb = KNN_ADD(sbb, KNN_MUL(db, db));
    }
    if (saa == 0.0 || sbb == 0.0) return NAN;
    double r = KNN_DIV(sab, KNN_MUL(sqrt(saa), sqrt(sbb)));
    return r > 1.0 ? 1.0 : r < -1.0 ? -1.0 : r;
}

/* Whether feature f of y is present (y NULL: every feature is). */
KNN_HD static inline int knn_pw_has(const double *y, size_t sy, int f)
{
    return y == NULL || !KNN_PW_MISSING(y[(size_t)f * sy]);
}

/* The n-th and (n - 1)-th smallest (0-based; *below: n = 0 leaves it) of
 * x's values over the features y has, walking x's ascending order. */
KNN_HD static inline double knn_pw_ranked(const double *x, size_t sx,
                                          const double *y, size_t sy,
                                          const int *ord, size_t so, int len,
                                          int n, double *below)
{
    double last = 0.0;
    for (int i = 0; i < len; i++) {
        int f = ord[(size_t)i * so];
        if (!knn_pw_has(y, sy, f)) continue;
        double v = x[(size_t)f * sx];
        if (n-- == 0) {
            *below = last;
            return v;
        }
        last = v;
    }
    return NAN;
}

/* The median as R's median() gives it of the count sorted values whose
 * middle ones are lower and upper. */
KNN_HD static inline double knn_pw_middle(int count, double lower,
                                          double upper)
{
    return count % 2 ? upper : KNN_DIV(KNN_ADD(lower, upper), 2.0);
}

/* The median of x over the count features y has. */
KNN_HD static inline double knn_pw_median(const double *x, size_t sx,
                                          const double *y, size_t sy,
                                          const int *ord, size_t so, int len,
                                          int count)
{
    double lower = 0.0;
    double upper = knn_pw_ranked(x, sx, y, sy, ord, so, len, count / 2,
                                 &lower);
    return knn_pw_middle(count, lower, upper);
}

/* The median of |x - med| over the count features y has: the deviations
 * of the values at or below med, walked down from med, and of those above
 * it, walked up, each in ascending order, merged. */
KNN_HD static inline double knn_pw_mad(const double *x, size_t sx,
                                       const double *y, size_t sy,
                                       const int *ord, size_t so, int len,
                                       double med, int count)
{
    int up = 0;
    while (up < len && !(x[(size_t)ord[(size_t)up * so] * sx] > med)) up++;
    int down = up - 1, half = count / 2;
    double lower = 0.0, upper = 0.0;
    for (int taken = 0; taken <= half; taken++) {
        while (down >= 0 && !knn_pw_has(y, sy, ord[(size_t)down * so]))
            down--;
        while (up < len && !knn_pw_has(y, sy, ord[(size_t)up * so])) up++;
        double dd = down >= 0
            ? fabs(KNN_SUB(x[(size_t)ord[(size_t)down * so] * sx], med))
            : INFINITY;
        double du = up < len
            ? fabs(KNN_SUB(x[(size_t)ord[(size_t)up * so] * sx], med))
            : INFINITY;
        lower = upper;
        if (dd <= du) {
            upper = dd;
            down--;
        } else {
            upper = du;
            up++;
        }
    }
    return knn_pw_middle(count, lower, upper);
}

/* A node's bicor form (WGCNA's prepareColBicor, maxPOutliers = 1, with
 * its fallback to Pearson where the median absolute deviation is zero)
 * over the features it shares with another node: the form's value at
 * feature f is knn_pw_form_value(form, x_f) / norm. */
typedef struct {
    int pearson;   /* the MAD is zero: the Pearson form */
    double centre; /* the median; the mean for the Pearson form */
    double denom;  /* 9 MAD */
    double norm;   /* the root of the form's sum of squares; 0: the form
                      is undefined (the node is constant there) */
} knn_pw_form;

/* The form's value at a feature of value x, before its scaling: the
 * centred value, times (1 - u^2)^2 with u = (x - median) / (9 MAD) (0
 * where |u| >= 1) unless it is the Pearson form. */
KNN_HD static inline double knn_pw_form_value(const knn_pw_form *form,
                                              double x)
{
    double d = KNN_SUB(x, form->centre);
    if (form->pearson) return d;
    double u = KNN_DIV(d, form->denom);
    if (fabs(u) > 1.0) u = 1.0;
    double w = KNN_SUB(1.0, KNN_MUL(u, u));
    return KNN_MUL(d, KNN_MUL(w, w));
}

/* x's bicor form over the count >= 1 features of p that y has (y NULL:
 * all of x's present features). */
KNN_HD static inline knn_pw_form knn_pw_form_of(const double *x, size_t sx,
                                                const double *y, size_t sy,
                                                const int *ord, size_t so,
                                                int len, int p, int count)
{
    knn_pw_form form;
    form.centre = knn_pw_median(x, sx, y, sy, ord, so, len, count);
    double mad = knn_pw_mad(x, sx, y, sy, ord, so, len, form.centre, count);
    form.pearson = mad == 0.0;
    form.denom = KNN_MUL(9.0, mad);
    if (form.pearson) {
        double sum = 0.0;
        for (int f = 0; f < p; f++) {
            double v = x[(size_t)f * sx];
            if (!KNN_PW_MISSING(v) && knn_pw_has(y, sy, f))
                sum = KNN_ADD(sum, v);
        }
        form.centre = KNN_DIV(sum, (double)count);
    }
    double ss = 0.0;
    for (int f = 0; f < p; f++) {
        double v = x[(size_t)f * sx];
        if (KNN_PW_MISSING(v) || !knn_pw_has(y, sy, f)) continue;
        double w = knn_pw_form_value(&form, v);
        ss = KNN_ADD(ss, KNN_MUL(w, w));
    }
    form.norm = ss == 0.0 ? 0.0 : sqrt(ss);
    return form;
}

/* bicor of nodes a and b over their shared features (WGCNA's bicor(use =
 * "p")): each node's form over them, then the sum of their products; NaN
 * where a form is undefined or fewer than min_shared features are
 * shared. */
KNN_HD static inline double knn_pw_bicor(const double *a, size_t sa_,
                                         const int *ord_a, size_t soa,
                                         int len_a, const double *b,
                                         size_t sb_, const int *ord_b,
                                         size_t sob, int len_b, int p,
                                         int min_shared)
{
    int count = 0;
    for (int f = 0; f < p; f++) {
        count += !KNN_PW_MISSING(a[(size_t)f * sa_]) &&
                 !KNN_PW_MISSING(b[(size_t)f * sb_]);
    }
    if (count < min_shared || count == 0) return NAN;
    knn_pw_form fa = knn_pw_form_of(a, sa_, b, sb_, ord_a, soa, len_a, p,
                                    count);
    if (fa.norm == 0.0) return NAN;
    knn_pw_form fb = knn_pw_form_of(b, sb_, a, sa_, ord_b, sob, len_b, p,
                                    count);
    if (fb.norm == 0.0) return NAN;
    double s = 0.0;
    for (int f = 0; f < p; f++) {
        double x = a[(size_t)f * sa_], y = b[(size_t)f * sb_];
        if (KNN_PW_MISSING(x) || KNN_PW_MISSING(y)) continue;
        s = KNN_ADD(s, KNN_MUL(KNN_DIV(knn_pw_form_value(&fa, x), fa.norm),
                               KNN_DIV(knn_pw_form_value(&fb, y), fb.norm)));
    }
    return s > 1.0 ? 1.0 : s < -1.0 ? -1.0 : s;
}

/* The reported distance of correlation v (NaN: the pair has no key):
 * 1 - v, or 1 - |v| for |Pearson|. */
KNN_HD static inline double knn_pw_distance(double v, int absolute)
{
    return KNN_SUB(1.0, absolute ? fabs(v) : v);
}

#endif
