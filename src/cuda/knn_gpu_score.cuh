/*
 * knn_gpu_score.cuh: the device arithmetic that every candidate path shares
 * (the panel's selection kernels, knn_gpu_select.cu, and the fused kernel,
 * knn_gpu_fused.cu): a product's fast score, the order-preserving bits of
 * a float, and a row's candidate bound from its k-th best fast score. One
 * definition, so every path sees the same score bits and the same bound.
 */
#ifndef KNN_GPU_SCORE_CUH
#define KNN_GPU_SCORE_CUH

#include "knn_gpu.cuh"

/* A shared walk's node j misses candidates (its list lost entries, or
 * its own row's survivors overflowed): its lost bit set, and counted
 * once. */
__device__ __forceinline__ void knn_pairs_lose(const knn_pairs &p, int j)
{
    unsigned bit = 1u << (j & 31);
    if (!(atomicOr(&p.lost[j >> 5], bit) & bit)) atomicAdd(p.lost_nodes, 1);
}

/* Rounded operations of float32 and float64 scores, by overload. */
__device__ __forceinline__ float knn_fma_rn(float a, float b, float c)
{
    return __fmaf_rn(a, b, c);
}
__device__ __forceinline__ double knn_fma_rn(double a, double b, double c)
{
    return __fma_rn(a, b, c);
}
__device__ __forceinline__ float knn_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double knn_abs(double a) { return fabs(a); }
__device__ __forceinline__ float knn_add_rn(float a, float b)
{
    return __fadd_rn(a, b);
}
__device__ __forceinline__ double knn_add_rn(double a, double b)
{
    return __dadd_rn(a, b);
}

/* The fast score of product v for a row of squared fast norm row_sq and a
 * node of col_sq (distances only); smaller is closer. T is float, or
 * double on the fp64 rung. Rounded operations: every pass and path must
 * see the same score bits. */
template <int KIND, typename T>
__device__ __forceinline__ T knn_score_from(T v, T row_sq, T col_sq)
{
    if (KIND == KNN_SCORE_NEG) return -v;
    if (KIND == KNN_SCORE_NEGABS) return -knn_abs(v);
    /* (row_sq + col_sq) - 2v, rounded twice: 2v is exact (a power of two
     * times a value far from overflow), so one fused multiply-add gives
     * the bits of the subtraction of the rounded product. */
    if (KIND == KNN_SCORE_DIST)
        return knn_fma_rn((T)-2, v, knn_add_rn(row_sq, col_sq));
    return v;
}

template <int KIND>
__device__ __forceinline__ float knn_fast_score(float v, int j,
                                                const knn_select_args &a,
                                                float row_sq)
{
    return knn_score_from<KIND>(v, row_sq,
                              KIND == KNN_SCORE_DIST ? a.col_sqnorm[j]
                                                     : 0.0f);
}

/* Unsigned bits whose integer order is the float order (no NaNs here). */
__device__ __forceinline__ unsigned knn_order_bits(float v)
{
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float knn_order_float(unsigned u)
{
    return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

/* The same for a double, -0 counted as +0 (adding +0 makes it so). */
__device__ __forceinline__ uint64_t knn_order_bits64(double v)
{
    uint64_t u = (uint64_t)__double_as_longlong(__dadd_rn(v, 0.0));
    return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

__device__ __forceinline__ double knn_order_double(uint64_t u)
{
    return __longlong_as_double(
        (long long)((u >> 63) ? (u & 0x7fffffffffffffffull) : ~u));
}

/* Row setup shared by every kernel (the fused one has no panel). */
struct knn_row {
    const float *vals;
    int self;
    float sq;
    double margin2;
    double norm;  /* distances: the row's fast norm, else 0 */
    int begin, slots;
};

/* Row r's own node in a self search, else -1. */
__device__ __forceinline__ int knn_row_self(const knn_select_args &a, int r)
{
    return a.row_self ? a.row_self[r]
                      : a.self_first >= 0 ? a.self_first + r : -1;
}

__device__ __forceinline__ knn_row knn_row_of(const knn_select_args &a, int r)
{
    knn_row w;
    w.vals = a.panel ? a.panel + (size_t)r * a.ld : NULL;
    w.self = knn_row_self(a, r);
    w.sq = a.kind == KNN_SCORE_DIST ? a.row_sqnorm[r] : 0.0f;
    w.margin2 = a.row_margin2[r];
    w.norm = a.row_norm ? a.row_norm[r] : 0.0;
    w.begin = a.offsets[r];
    w.slots = a.offsets[r + 1] - w.begin;
    return w;
}

/* The row's candidate bound from its k-th best fast score: the smaller of
 * two proven bounds, from the largest norm (knn_candidate_bound) and, for
 * distances, from the row's own neighbourhood (knn_dist_row_bound), which
 * keeps rows of small norm among nodes of large ones near k candidates.
 * margin2 and unit are those of the arithmetic that gave the scores. */
__device__ __forceinline__ double knn_row_bound_in(const knn_select_args &a,
                                                   const knn_row &w,
                                                   double margin2,
                                                   double unit, double kth)
{
    double bound = knn_candidate_bound(a.metric, kth, margin2, a.scale_exp);
    if (!a.row_norm) return bound;
    return fmin(bound, knn_dist_row_bound(a.metric, kth, w.norm, unit,
                                          a.margin_floor, a.scale_exp));
}

/* The bound for the tile's own arithmetic. */
__device__ __forceinline__ double knn_row_bound(const knn_select_args &a,
                                                const knn_row &w, double kth)
{
    return knn_row_bound_in(a, w, w.margin2, a.margin_unit, kth);
}

__device__ __forceinline__ void knn_row_done(const knn_select_args &a, int r,
                                             const knn_row &w, int found)
{
    a.count[r] = found;
    a.seg_end[r] = w.begin + min(found, w.slots);
    if (a.wide) a.wide[r] = found;
}

#endif
