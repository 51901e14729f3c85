/*
 * knn_gpu_prepare.cu: turns the uploaded float64 nodes into what the search
 * needs, on the device.
 *
 * Correlation metrics: (Spearman: each value replaced by knn_rank2, one
 * thread per value) then knn_canon_corr per node, one thread per node, in
 * place; from u the same thread writes the float32 fast vector
 * f = (u - sum/p) / sqrt(css/p) (cosine: u / sqrt(css)) and its kappa.
 * Distance metrics: the nodes stay as given, for the exact keys, which
 * scale each pair on its own (knn_key_dist); the fast vectors are the
 * nodes scaled by 2^-e as they are read (e from the largest |value| of ref
 * and all queries; a power of two, so exact) minus the ref feature means
 * (centring shrinks |f| and so the margin, and leaves distances alone),
 * one warp per node. Manhattan has no fast vectors; its panel takes the
 * same frame.
 * Reductions (max |x|, kappa, max |f|) use atomicMax on the bits of
 * non-negative doubles, whose integer order is their numeric order.
 */
#include <math.h>
#include <vector>
#include <cub/device/device_segmented_sort.cuh>
#include "knn_gpu.cuh"

#define KNN_PREP_THREADS 256

/* Column-mean partial sums: this many node blocks, each summed in order, so
 * the means come out the same on every run. */
#define KNN_MEAN_PARTS 256

static unsigned knn_blocks(size_t n)
{
    return (unsigned)((n + KNN_PREP_THREADS - 1) / KNN_PREP_THREADS);
}

__device__ static void knn_atomic_max_nonneg(double *target, double v)
{
    atomicMax((unsigned long long *)target,
              (unsigned long long)__double_as_longlong(v));
}

__global__ static void knn_rank_kernel(const double *x, int p, size_t n_vals,
                                       double *ranks)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vals) return;
    size_t node = t / (size_t)p;
    int f = (int)(t - node * (size_t)p);
    ranks[t] = knn_rank2(x + node * (size_t)p, p, f);
}

/* One thread per node: whether the metric can use it (*degenerate set
 * where not: the engine's test, knn_node_degenerate, on the values
 * before they are overwritten), canonical form in place, fast vector,
 * kappa. */
__global__ static void knn_canon_kernel(knn_metric m, double *u, int p, int n,
                                        double *sum, double *css, float *fast,
                                        int ldf, double *kappa_max,
                                        int *degenerate)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    double *ug = u + (size_t)g * p;
    float *fg = fast + (size_t)g * ldf;
    if (knn_node_degenerate(m, ug, p)) *degenerate = 1;
    double s, c;
    knn_canon_corr(m, ug, p, ug, &s, &c);
    sum[g] = s;
    css[g] = c;
    double mean, scale;
    knn_fast_corr_form(m, p, s, c, &mean, &scale);
    for (int f = 0; f < p; f++) fg[f] = (float)((ug[f] - mean) * scale);
    if (knn_is_centred(m)) knn_atomic_max_nonneg(kappa_max,
                                                 knn_corr_kappa(m, ug, p, c));
}

__global__ static void knn_max_abs_kernel(const double *x, size_t n_vals,
                                          double *out)
{
    double m = 0.0;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
         t < n_vals; t += (size_t)gridDim.x * blockDim.x)
        m = fmax(m, fabs(x[t]));
    for (int o = 16; o > 0; o >>= 1)
        m = fmax(m, __shfl_down_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) knn_atomic_max_nonneg(out, m);
}

/* The frame of the fast vectors: a value divided by 2^e, with ldexp's
 * bits (factor: knn_ldexp_factor(-e)). */
typedef struct {
    int e;
    double factor;
} knn_frame;

__device__ __forceinline__ double knn_in_frame(knn_frame fr, double v)
{
    return fr.factor != 0.0 ? v * fr.factor : ldexp(v, -fr.e);
}

/* Block b sums feature f over its share of the ref nodes, in node order. */
__global__ static void knn_mean_part_kernel(const double *x, int p, int n_ref,
                                            knn_frame fr, double *parts)
{
    int per = (n_ref + KNN_MEAN_PARTS - 1) / KNN_MEAN_PARTS;
    int j0 = blockIdx.x * per, j1 = min(n_ref, j0 + per);
    for (int f = threadIdx.x; f < p; f += blockDim.x) {
        double s = 0.0;
        for (int j = j0; j < j1; j++)
            s += knn_in_frame(fr, x[(size_t)j * p + f]);
        parts[(size_t)blockIdx.x * p + f] = s;
    }
}

__global__ static void knn_mean_final_kernel(double *parts, int p, int n_ref)
{
    int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= p) return;
    double s = 0.0;
    for (int b = 0; b < KNN_MEAN_PARTS; b++) s += parts[(size_t)b * p + f];
    parts[f] = s / n_ref;
}

/* One warp per node, its lanes striding over the features (coalesced
 * reads): f = scaled node - means, |f|^2, |node - means| and their largest
 * over the ref nodes (norm_max of the distance margin). Node g is x's
 * pick[g] where pick is given (a tile's rows in local frames), else its
 * g. */
__global__ static void knn_dist_fast_kernel(const double *x, int p, int n,
                                            int n_ref, knn_frame fr,
                                            const double *mean,
                                            float *fast, int ldf,
                                            float *sqnorm, double *norm,
                                            double *norm_max,
                                            const int *pick)
{
    int g = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    if (g >= n) return; /* g is the same for the whole warp */
    const double *xg = x + (size_t)(pick ? pick[g] : g) * p;
    float *fg = fast + (size_t)g * ldf;
    double ss = 0.0, sf = 0.0;
    for (int f = lane; f < p; f += 32) {
        double d = knn_in_frame(fr, xg[f]) - mean[f];
        float v = (float)d;
        fg[f] = v;
        ss += d * d;
        sf += (double)v * v;
    }
    for (int o = 16; o > 0; o >>= 1) {
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
        sf += __shfl_xor_sync(0xffffffffu, sf, o);
    }
    if (lane != 0) return;
    sqnorm[g] = (float)sf;
    norm[g] = sqrt(ss);
    if (g < n_ref) knn_atomic_max_nonneg(norm_max, norm[g]);
}

/* One warp per ref node: adds its knn_translation_term about the means and
 * about the origin to terms[0] and terms[1]. The lanes' partial sums of
 * squares are combined first, as the term needs the whole norm. */
__global__ static void knn_translation_kernel(const double *x, int p,
                                              int n_ref, knn_frame fr,
                                              const double *mean,
                                              double *terms)
{
    int g = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    if (g >= n_ref) return; /* g is the same for the whole warp */
    const double *xg = x + (size_t)g * p;
    double centred = 0.0, origin = 0.0;
    for (int f = lane; f < p; f += 32) {
        double v = knn_in_frame(fr, xg[f]), d = v - mean[f];
        centred += d * d;
        origin += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) {
        centred += __shfl_xor_sync(0xffffffffu, centred, o);
        origin += __shfl_xor_sync(0xffffffffu, origin, o);
    }
    if (lane != 0) return;
    atomicAdd(&terms[0], knn_translation_log(centred));
    atomicAdd(&terms[1], knn_translation_log(origin));
}

__global__ static void knn_margin_corr_kernel(double *margin2, int n, int p,
                                              knn_gemm_units u,
                                              const double *kappa_max,
                                              int cosine)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    double kappa = cosine ? 1.0 : *kappa_max;
    margin2[g] = 2.0 * knn_margin_corr(p, u.in, u.acc, u.tiny, kappa);
}

/* Twice each node's margin, from its norm and the largest ref norm. */
__global__ static void knn_margin_dist_kernel(double *margin2, int n, int p,
                                              knn_gemm_units u,
                                              const double *norm,
                                              const double *norm_max)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    margin2[g] = 2.0 * knn_margin_dist(p, u.in, u.acc, u.tiny, norm[g],
                                       *norm_max);
}

/* A float rounded to the nearest TF32 value (10 mantissa bits; ties away
 * from zero): adding half the dropped unit to the magnitude's bits carries
 * into the kept ones exactly when the dropped part is at least half. The
 * values here are far below the largest float, so nothing overflows. */
__device__ __forceinline__ float knn_round_tf32(float v)
{
    return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
}

/* One thread per value of the fast vectors (padding included, zeros):
 * f = hi + lo, written [hi | hi | lo | hi] per node (knn_gpu_nodes.split). */
__global__ static void knn_split_kernel(const float *fast, int ldf,
                                        size_t n_vals, float *split)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vals) return;
    size_t node = t / (size_t)ldf;
    int f = (int)(t - node * (size_t)ldf);
    float v = fast[t];
    float hi = knn_round_tf32(v);
    float *s = split + node * 4 * ldf;
    s[f] = hi;
    s[ldf + f] = hi;
    s[2 * ldf + f] = knn_round_tf32(v - hi);
    s[3 * ldf + f] = hi;
}

/* One thread per node (distances): the power of two 2^e that puts the
 * node's largest |f| in [2^13, 2^14), e at most 126 (knn_mma says why),
 * and 2^-e, its unscale. */
__global__ static void knn_half_scale_kernel(const float *fast, int ldf,
                                             int p, int n, float *unscale)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n) return;
    const float *fg = fast + (size_t)g * ldf;
    float m = 0.0f;
    for (int f = 0; f < p; f++) m = fmaxf(m, fabsf(fg[f]));
    int ex = 0;
    frexpf(m, &ex); /* m = r 2^ex, r in [0.5, 1); 0 for m = 0 */
    int e = m > 0.0f ? min(14 - ex, 126) : 0;
    unscale[g] = ldexpf(1.0f, -e);
}

/* One thread per value of the fp16 vectors (padding included, zeros):
 * the fast value, times its node's 2^e (distances), rounded to the
 * nearest fp16 (knn_gpu_nodes.half). */
__global__ static void knn_half_kernel(const float *fast, int ldf, int p,
                                       int ldh, size_t n_vals,
                                       const float *unscale, __half *half)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_vals) return;
    size_t node = t / (size_t)ldh;
    int f = (int)(t - node * (size_t)ldh);
    float v = f < p ? fast[node * ldf + f] : 0.0f;
    /* 1 / 2^-e is 2^e exactly, and so is v times it. */
    if (unscale) v = v * (1.0f / unscale[node]);
    half[t] = __float2half_rn(v);
}

/* One warp per node: the fp64 rung's vector, the float64 value of each
 * fast value before its rounding to float32 (the same operations as
 * knn_canon_kernel and knn_dist_fast_kernel: distance nodes read into the
 * fast vectors' frame, fr), and, for distances (centre), its squared
 * norm. */
__global__ static void knn_fp64_kernel(knn_metric m, const double *x, int p,
                                       int n, const double *sum,
                                       const double *css,
                                       const double *centre, knn_frame fr,
                                       double *fast64, int ldf,
                                       double *sqnorm64)
{
    int g = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    if (g >= n) return; /* g is the same for the whole warp */
    const double *xg = x + (size_t)g * p;
    double *fg = fast64 + (size_t)g * ldf;
    double mean = 0.0, scale = 1.0, ss = 0.0;
    if (!centre) knn_fast_corr_form(m, p, sum[g], css[g], &mean, &scale);
    for (int f = lane; f < p; f += 32) {
        double v = centre ? knn_in_frame(fr, xg[f]) - centre[f]
                          : (xg[f] - mean) * scale;
        fg[f] = v;
        ss += v * v;
    }
    if (!sqnorm64) return;
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) sqnorm64[g] = ss;
}

static knn_status knn_alloc(void **ptr, size_t bytes, char *message,
                            cudaStream_t stream)
{
    KNN_CUDA_TRY(message, knn_device_alloc(ptr, bytes, stream));
    return KNN_OK;
}

/* Scratch of the preparation, carved from the nodes' block. */
typedef struct {
    double *scalar;     /* a reduction's result */
    int *degenerate;    /* correlations: a node the metric cannot use */
    double *mean_parts; /* KNN_MEAN_PARTS x p partial column sums */
    double *terms;      /* 2: knn_translation_term sums, mean and origin */
} knn_prep_scratch;

/* The arrays the metric needs: what nodes->block holds. */
static void knn_nodes_carve(knn_metric m, knn_gpu_nodes *nd,
                            knn_prep_scratch *sc, knn_carver *c)
{
    size_t n = (size_t)nd->n_nodes;
    sc->scalar = knn_carve<double>(c, 1);
    nd->margin2 = knn_carve<double>(c, n);
    if (knn_is_correlation(m)) {
        nd->sum = knn_carve<double>(c, n);
        nd->css = knn_carve<double>(c, n);
        sc->degenerate = knn_carve<int>(c, 1);
    }
    if (!knn_uses_product(m)) return;
    nd->margin2_fp32 = knn_carve<double>(c, n);
    nd->fast = knn_carve<float>(c, (size_t)nd->ldf * n);
    if (knn_is_correlation(m)) return;
    nd->sqnorm = knn_carve<float>(c, n);
    nd->norm = knn_carve<double>(c, n);
    nd->norm_max = knn_carve<double>(c, 1);
    sc->mean_parts = knn_carve<double>(c, (size_t)KNN_MEAN_PARTS * nd->p);
    sc->terms = knn_carve<double>(c, 2);
    nd->centre = sc->mean_parts; /* knn_prepare_dist leaves it there */
}

static knn_status knn_prepare_corr(knn_metric m, double *x, knn_gpu_nodes *nd,
                                   const knn_prep_scratch *sc,
                                   char *message, cudaStream_t stream)
{
    size_t n_vals = (size_t)nd->p * nd->n_nodes;
    if (m == KNN_SPEARMAN) {
        KNN_TRY(knn_alloc((void **)&nd->exact, n_vals * sizeof(double),
                          message, stream));
        knn_rank_kernel<<<knn_blocks(n_vals), KNN_PREP_THREADS, 0, stream>>>(
            x, nd->p, n_vals, nd->exact);
        KNN_LAUNCH_TRY(message, "knn_rank_kernel");
    } else {
        nd->exact = x;
    }
    KNN_CUDA_TRY(message,
                 cudaMemsetAsync(sc->scalar, 0, sizeof(double), stream));
    KNN_CUDA_TRY(message,
                 cudaMemsetAsync(sc->degenerate, 0, sizeof(int), stream));
    knn_canon_kernel<<<knn_blocks(nd->n_nodes), KNN_PREP_THREADS, 0,
                       stream>>>(m, nd->exact, nd->p, nd->n_nodes, nd->sum,
                                 nd->css, nd->fast, nd->ldf, sc->scalar,
                                 sc->degenerate);
    KNN_LAUNCH_TRY(message, "knn_canon_kernel");
    nd->kappa_max = sc->scalar;
    return KNN_OK;
}

/* Leaves the means (sc->mean_parts' first p values) as the fast vectors'
 * centre, or zeroes them where the origin is the better translation
 * (knn_translation_term, knn_exact.h: the rule the CPU follows too). */
static knn_status knn_choose_translation(const knn_gpu_nodes *nd,
                                         const double *x, knn_frame fr,
                                         const knn_prep_scratch *sc,
                                         char *message, cudaStream_t stream)
{
    double terms[2];
    KNN_CUDA_TRY(message, cudaMemsetAsync(sc->terms, 0, sizeof terms,
                                          stream));
    knn_translation_kernel<<<knn_blocks((size_t)nd->n_ref * 32),
                             KNN_PREP_THREADS, 0, stream>>>(
        x, nd->p, nd->n_ref, fr, sc->mean_parts, sc->terms);
    KNN_LAUNCH_TRY(message, "knn_translation_kernel");
    KNN_CUDA_TRY(message, cudaMemcpyAsync(terms, sc->terms, sizeof terms,
                                          cudaMemcpyDeviceToHost, stream));
    KNN_CUDA_TRY(message, cudaStreamSynchronize(stream));
    if (terms[1] < terms[0])
        KNN_CUDA_TRY(message, cudaMemsetAsync(sc->mean_parts, 0,
                                              (size_t)nd->p * sizeof(double),
                                              stream));
    return KNN_OK;
}

static knn_status knn_prepare_dist(knn_metric m, double *x, knn_gpu_nodes *nd,
                                   double query_max_abs,
                                   const knn_prep_scratch *sc, char *message,
                                   cudaStream_t stream)
{
    size_t n_vals = (size_t)nd->p * nd->n_nodes;
    nd->exact = x;
    KNN_CUDA_TRY(message,
                 cudaMemsetAsync(sc->scalar, 0, sizeof(double), stream));
    knn_max_abs_kernel<<<1024, KNN_PREP_THREADS, 0, stream>>>(x, n_vals,
                                                              sc->scalar);
    KNN_LAUNCH_TRY(message, "knn_max_abs_kernel");
    double amax;
    KNN_CUDA_TRY(message, cudaMemcpyAsync(&amax, sc->scalar, sizeof amax,
                                          cudaMemcpyDeviceToHost, stream));
    KNN_CUDA_TRY(message, cudaStreamSynchronize(stream));
    nd->scale_exp = knn_exponent(amax > query_max_abs ? amax : query_max_abs);
    if (!knn_uses_product(m)) {
        KNN_CUDA_TRY(message, cudaMemsetAsync(nd->margin2, 0,
                                              nd->n_nodes * sizeof(double),
                                              stream));
        return KNN_OK;
    }
    knn_frame fr = {nd->scale_exp, knn_ldexp_factor(-nd->scale_exp)};

    knn_mean_part_kernel<<<KNN_MEAN_PARTS, KNN_PREP_THREADS, 0, stream>>>(
        x, nd->p, nd->n_ref, fr, sc->mean_parts);
    KNN_LAUNCH_TRY(message, "knn_mean_part_kernel");
    knn_mean_final_kernel<<<knn_blocks(nd->p), KNN_PREP_THREADS, 0,
                            stream>>>(sc->mean_parts, nd->p, nd->n_ref);
    KNN_LAUNCH_TRY(message, "knn_mean_final_kernel");
    KNN_TRY(knn_choose_translation(nd, x, fr, sc, message, stream));
    KNN_CUDA_TRY(message,
                 cudaMemsetAsync(nd->norm_max, 0, sizeof(double), stream));
    knn_dist_fast_kernel<<<knn_blocks((size_t)nd->n_nodes * 32),
                           KNN_PREP_THREADS, 0, stream>>>(
        x, nd->p, nd->n_nodes, nd->n_ref, fr, sc->mean_parts, nd->fast,
        nd->ldf, nd->sqnorm, nd->norm, nd->norm_max, NULL);
    KNN_LAUNCH_TRY(message, "knn_dist_fast_kernel");
    return KNN_OK;
}

/* A tile's frame: one thread per feature, the mean of the scaled values
 * of the nodes rows[0 .. n_rows), summed in row order (the same bits on
 * every run). */
__global__ static void knn_centre_kernel(const double *x, int p,
                                         const int *rows, int n_rows,
                                         knn_frame fr, double *centre)
{
    int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= p) return;
    double s = 0.0;
    for (int r = 0; r < n_rows; r++)
        s += knn_in_frame(fr, x[(size_t)rows[r] * p + f]);
    centre[f] = s / n_rows;
}

knn_status knn_local_vectors(const knn_gpu_nodes *nodes, const int *rows,
                             int n_rows, const int *ref_pick,
                             knn_gpu_nodes *view, double *centre,
                             knn_gemm_mode gemm, char *message,
                             cudaStream_t stream)
{
    int p = nodes->p, n_ref = nodes->n_ref;
    knn_frame fr = {nodes->scale_exp, knn_ldexp_factor(-nodes->scale_exp)};
    knn_centre_kernel<<<knn_blocks(p), KNN_PREP_THREADS, 0, stream>>>(
        nodes->exact, p, rows, n_rows, fr, centre);
    KNN_LAUNCH_TRY(message, "knn_centre_kernel");
    KNN_CUDA_TRY(message, cudaMemsetAsync(view->norm_max, 0, sizeof(double),
                                          stream));
    knn_dist_fast_kernel<<<knn_blocks((size_t)n_ref * 32), KNN_PREP_THREADS,
                           0, stream>>>(
        nodes->exact, p, n_ref, n_ref, fr, centre, view->fast, view->ldf,
        view->sqnorm, view->norm, view->norm_max, ref_pick);
    KNN_LAUNCH_TRY(message, "knn_dist_fast_kernel");
    size_t at = (size_t)n_ref;
    knn_dist_fast_kernel<<<knn_blocks((size_t)n_rows * 32),
                           KNN_PREP_THREADS, 0, stream>>>(
        nodes->exact, p, n_rows, 0, fr, centre, view->fast + at * view->ldf,
        view->ldf, view->sqnorm + at, view->norm + at, view->norm_max, rows);
    KNN_LAUNCH_TRY(message, "knn_dist_fast_kernel");
    knn_margin_dist_kernel<<<knn_blocks(n_rows), KNN_PREP_THREADS, 0,
                             stream>>>(view->margin2 + at, n_rows, p,
                                       knn_gemm_units_of(gemm, p),
                                       view->norm + at, view->norm_max);
    KNN_LAUNCH_TRY(message, "knn_margin_dist_kernel");
    return KNN_OK;
}

/* Group b of knn_group_boxes: a thread per feature. */
__global__ static void knn_group_box_kernel(const double *x, int p,
                                            const int *pick, int n,
                                            int group, int groups,
                                            double *lo, double *hi)
{
    int b = blockIdx.x, first = b * group, m = min(group, n - first);
    for (int f = threadIdx.x; f < p; f += blockDim.x) {
        double least = INFINITY, most = -INFINITY;
        for (int i = 0; i < m; i++) {
            double v = x[(size_t)pick[first + i] * p + f];
            least = fmin(least, v);
            most = fmax(most, v);
        }
        lo[(size_t)f * groups + b] = least;
        hi[(size_t)f * groups + b] = most;
    }
}

knn_status knn_group_boxes(const knn_gpu_nodes *nodes, const int *pick,
                           int n, int group, double *lo, double *hi,
                           char *message, cudaStream_t stream)
{
    int groups = (n + group - 1) / group;
    if (groups == 0) return KNN_OK;
    knn_group_box_kernel<<<groups, 64, 0, stream>>>(
        nodes->exact, nodes->p, pick, n, group, groups, lo, hi);
    KNN_LAUNCH_TRY(message, "knn_group_box_kernel");
    return KNN_OK;
}

/* A thread per group of knn_group_max. */
__global__ static void knn_group_max_kernel(const double *v, int n,
                                            int group, double *out)
{
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if ((size_t)b * group >= (size_t)n) return;
    int end = min(n, (b + 1) * group);
    double m = 0.0;
    for (int i = b * group; i < end; i++) m = fmax(m, v[i]);
    out[b] = m;
}

knn_status knn_group_max(const double *norm, int n, int group, double *out,
                         char *message, cudaStream_t stream)
{
    int groups = (n + group - 1) / group;
    if (groups == 0) return KNN_OK;
    knn_group_max_kernel<<<knn_blocks(groups), KNN_PREP_THREADS, 0,
                           stream>>>(norm, n, group, out);
    KNN_LAUNCH_TRY(message, "knn_group_max_kernel");
    return KNN_OK;
}

/* Nodes sampled (evenly) to choose a k-d split's axis. */
#define KNN_KD_SAMPLE 1024

/* Segment s of a level of knn_kd_refine (order[begin[s] .. end[s])): the
 * feature of largest variance over an even sample of its nodes into
 * axis[s] (the first of equal ones); a thread per feature, the sums
 * taken about the first sampled value. */
__global__ static void knn_kd_axis_kernel(const double *x, int p,
                                          const int *order, const int *begin,
                                          const int *end, int *axis)
{
    __shared__ double best[KNN_PREP_THREADS];
    __shared__ int best_f[KNN_PREP_THREADS];
    int s = blockIdx.x, b = begin[s], n = end[s] - b;
    int m = min(n, KNN_KD_SAMPLE);
    double top = -1.0;
    int top_f = 0;
    for (int f = threadIdx.x; f < p; f += blockDim.x) {
        double v0 = x[(size_t)order[b] * p + f], sum = 0.0, sq = 0.0;
        for (int i = 0; i < m; i++) {
            double v = x[(size_t)order[b + (long long)i * n / m] * p + f] -
                       v0;
            sum += v;
            sq += v * v;
        }
        double spread = sq - sum * sum / m;
        if (spread > top) {
            top = spread;
            top_f = f;
        }
    }
    best[threadIdx.x] = top;
    best_f[threadIdx.x] = top_f;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        int t = threadIdx.x;
        if (t < h && (best[t + h] > best[t] ||
                      (best[t + h] == best[t] && best_f[t + h] < best_f[t]))) {
            best[t] = best[t + h];
            best_f[t] = best_f[t + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) axis[s] = best_f[0];
}

/* Segment s's nodes' values on its axis into key, by position. */
__global__ static void knn_kd_key_kernel(const double *x, int p,
                                         const int *order, const int *begin,
                                         const int *end, const int *axis,
                                         double *key)
{
    int s = blockIdx.x, a = axis[s];
    for (int i = begin[s] + threadIdx.x; i < end[s]; i += blockDim.x)
        key[i] = x[(size_t)order[i] * p + a];
}

/* The sorted segments back into order (positions outside them, leaves
 * already, keep their nodes). */
__global__ static void knn_kd_back_kernel(const int *sorted,
                                          const int *begin, const int *end,
                                          int *order)
{
    int s = blockIdx.x;
    for (int i = begin[s] + threadIdx.x; i < end[s]; i += blockDim.x)
        order[i] = sorted[i];
}

/* The segments of each level of knn_kd_refine, from the first level's
 * starts: a segment of more than `leaf` nodes is sorted on its level and
 * parts into the half of its leaves (rounded down) and the rest. */
static void knn_kd_levels(const int *starts, int n_starts, int n, int leaf,
                          std::vector<std::vector<int> > &begin,
                          std::vector<std::vector<int> > &end)
{
    std::vector<int> b(starts, starts + n_starts), e(b.begin() + 1, b.end());
    e.push_back(n);
    while (true) {
        std::vector<int> lb, le, nb, ne;
        for (size_t s = 0; s < b.size(); s++) {
            if (e[s] - b[s] <= leaf) continue;
            lb.push_back(b[s]);
            le.push_back(e[s]);
            int leaves = (e[s] - b[s] + leaf - 1) / leaf;
            int half = leaves / 2 * leaf;
            nb.push_back(b[s]);
            ne.push_back(b[s] + half);
            nb.push_back(b[s] + half);
            ne.push_back(e[s]);
        }
        if (lb.empty()) return;
        begin.push_back(lb);
        end.push_back(le);
        b.swap(nb);
        e.swap(ne);
    }
}

knn_status knn_kd_refine(const knn_gpu_nodes *nodes, int *order, int n,
                         const int *starts, int n_starts, int leaf,
                         char *message, cudaStream_t stream)
{
    std::vector<std::vector<int> > begin, end;
    try {
        knn_kd_levels(starts, n_starts, n, leaf, begin, end);
    } catch (const std::bad_alloc &) {
        return knn_gpu_fail(message, KNN_E_NOMEM, "k-d order",
                            "out of host memory", __FILE__, __LINE__);
    }
    if (begin.empty()) return KNN_OK;
    size_t segs = 0, temp = 0;
    for (size_t l = 0; l < begin.size(); l++) {
        size_t bytes = 0;
        KNN_CUDA_TRY(message, cub::DeviceSegmentedSort::SortPairs(
            (void *)NULL, bytes, (const double *)NULL, (double *)NULL,
            (const int *)NULL, (int *)NULL, n, (int)begin[l].size(),
            (const int *)NULL, (const int *)NULL));
        if (bytes > temp) temp = bytes;
        segs += begin[l].size();
    }
    knn_carver c = {NULL, 0};
    void *block = NULL;
    double *key = NULL, *key_out = NULL;
    int *order_out = NULL, *seg = NULL, *axis = NULL;
    void *sort_temp = NULL;
    for (int pass = 0; pass < 2; pass++) {
        c.used = 0;
        key = knn_carve<double>(&c, (size_t)n);
        key_out = knn_carve<double>(&c, (size_t)n);
        order_out = knn_carve<int>(&c, (size_t)n);
        seg = knn_carve<int>(&c, 2 * segs);
        axis = knn_carve<int>(&c, segs);
        sort_temp = knn_carve<char>(&c, temp);
        if (pass == 0 && knn_device_alloc(&block, c.used, stream) !=
                             cudaSuccess) {
            cudaGetLastError();
            return knn_gpu_fail(message, KNN_E_NOMEM, "k-d order",
                                "out of GPU memory", __FILE__, __LINE__);
        }
        c.block = (char *)block;
    }
    std::vector<int> h_seg(2 * segs);
    size_t at = 0;
    for (size_t l = 0; l < begin.size(); l++) {
        std::copy(begin[l].begin(), begin[l].end(), h_seg.begin() + at);
        std::copy(end[l].begin(), end[l].end(),
                  h_seg.begin() + segs + at);
        at += begin[l].size();
    }
    knn_status st = KNN_OK;
    cudaError_t err = cudaMemcpyAsync(seg, h_seg.data(),
                                      h_seg.size() * sizeof(int),
                                      cudaMemcpyHostToDevice, stream);
    at = 0;
    for (size_t l = 0; l < begin.size() && err == cudaSuccess; l++) {
        int count = (int)begin[l].size();
        const int *b = seg + at, *e = seg + segs + at;
        knn_kd_axis_kernel<<<count, KNN_PREP_THREADS, 0, stream>>>(
            nodes->exact, nodes->p, order, b, e, axis + at);
        knn_kd_key_kernel<<<count, KNN_PREP_THREADS, 0, stream>>>(
            nodes->exact, nodes->p, order, b, e, axis + at, key);
        err = cudaGetLastError();
        size_t bytes = temp;
        if (err == cudaSuccess)
            err = cub::DeviceSegmentedSort::SortPairs(
                sort_temp, bytes, key, key_out, order, order_out, n, count,
                b, e, stream);
        if (err == cudaSuccess) {
            knn_kd_back_kernel<<<count, KNN_PREP_THREADS, 0, stream>>>(
                order_out, b, e, order);
            err = cudaGetLastError();
        }
        at += count;
    }
    if (err != cudaSuccess)
        st = knn_gpu_fail(message, KNN_E_DEVICE, "k-d order",
                          cudaGetErrorString(err), __FILE__, __LINE__);
    if (st == KNN_OK) {
        err = cudaStreamSynchronize(stream);
        if (err != cudaSuccess)
            st = knn_gpu_fail(message, KNN_E_DEVICE, "k-d order",
                              cudaGetErrorString(err), __FILE__, __LINE__);
    }
    knn_device_free(block);
    return st;
}

/* order[j] = j. */
__global__ static void knn_iota_kernel(int *order, int n)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) order[j] = j;
}

/* pos[order[j]] = j. */
__global__ static void knn_inverse_kernel(const int *order, int n, int *pos)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) pos[order[j]] = j;
}

knn_status knn_kd_columns(const knn_gpu_nodes *nodes, int leaf,
                          int *col_node, int *col_pos, char *message,
                          cudaStream_t stream)
{
    int n = nodes->n_ref, start = 0;
    knn_iota_kernel<<<knn_blocks(n), KNN_PREP_THREADS, 0, stream>>>(
        col_node, n);
    KNN_LAUNCH_TRY(message, "knn_iota_kernel");
    KNN_TRY(knn_kd_refine(nodes, col_node, n, &start, 1, leaf, message,
                          stream));
    knn_inverse_kernel<<<knn_blocks(n), KNN_PREP_THREADS, 0, stream>>>(
        col_node, n, col_pos);
    KNN_LAUNCH_TRY(message, "knn_inverse_kernel");
    return KNN_OK;
}

/* Rows set apart: node rows[i]'s fast vector, and for distances its
 * squared norm and norm, into place i of the gathered arrays; its
 * float32 margin into margin2[i]. A thread per value of a fast vector. */
__global__ static void knn_apart_kernel(knn_gpu_nodes nd, const int *rows,
                                        int n_rows, float *fast,
                                        float *sqnorm, double *norm,
                                        double *margin2)
{
    size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t i = g / nd.ldf, f = g % nd.ldf;
    if (i >= (size_t)n_rows) return;
    size_t node = (size_t)rows[i];
    fast[i * nd.ldf + f] = nd.fast[node * nd.ldf + f];
    if (f != 0) return;
    margin2[i] = nd.margin2_fp32[node];
    if (sqnorm) {
        sqnorm[i] = nd.sqnorm[node];
        norm[i] = nd.norm[node];
    }
}

knn_status knn_apart_vectors(const knn_gpu_nodes *nodes, const int *rows,
                             int n_rows, float *fast, float *sqnorm,
                             double *norm, double *margin2, char *message,
                             cudaStream_t stream)
{
    size_t n = (size_t)n_rows * nodes->ldf;
    knn_apart_kernel<<<knn_blocks(n), KNN_PREP_THREADS, 0, stream>>>(
        *nodes, rows, n_rows, fast, sqnorm, norm, margin2);
    KNN_LAUNCH_TRY(message, "knn_apart_kernel");
    return KNN_OK;
}

/* Twice each node's margin for the arithmetic `gemm` into out. */
static knn_status knn_margins_into(double *out, knn_metric metric,
                                   const knn_gpu_nodes *nodes,
                                   knn_gemm_mode gemm, char *message,
                                   cudaStream_t stream)
{
    knn_gemm_units u = knn_gemm_units_of(gemm, nodes->p);
    if (knn_is_correlation(metric)) {
        knn_margin_corr_kernel<<<knn_blocks(nodes->n_nodes),
                                 KNN_PREP_THREADS, 0, stream>>>(
            out, nodes->n_nodes, nodes->p, u, nodes->kappa_max,
            metric == KNN_COSINE);
        KNN_LAUNCH_TRY(message, "knn_margin_corr_kernel");
        return KNN_OK;
    }
    knn_margin_dist_kernel<<<knn_blocks(nodes->n_nodes), KNN_PREP_THREADS, 0,
                             stream>>>(out, nodes->n_nodes, nodes->p, u,
                                       nodes->norm, nodes->norm_max);
    KNN_LAUNCH_TRY(message, "knn_margin_dist_kernel");
    return KNN_OK;
}

knn_status knn_nodes_remargin(knn_metric metric, knn_gpu_nodes *nodes,
                              knn_gemm_mode gemm, char *message,
                              cudaStream_t stream)
{
    if (!knn_uses_product(metric))
        return knn_gpu_fail(message, KNN_E_INVALID, "knn_nodes_remargin",
                            "only the product metrics have margins to "
                            "recompute", __FILE__, __LINE__);
    return knn_margins_into(nodes->margin2, metric, nodes, gemm, message,
                            stream);
}

knn_status knn_nodes_half(knn_metric metric, knn_gpu_nodes *nodes,
                          char *message, cudaStream_t stream)
{
    if (nodes->half) return KNN_OK;
    nodes->ldh = (nodes->p + 7) / 8 * 8;
    size_t n = (size_t)nodes->n_nodes, n_vals = (size_t)nodes->ldh * n;
    int dist = !knn_is_correlation(metric);
    /* The unscales first: 16-byte aligned halves follow them. */
    size_t unscale_bytes = dist ? (n * sizeof(float) + 15) / 16 * 16 : 0;
    char *block = NULL;
    if (knn_device_alloc((void **)&block,
                         unscale_bytes + n_vals * sizeof(__half),
                         stream) != cudaSuccess) {
        cudaGetLastError();
        return knn_gpu_fail(message, KNN_E_NOMEM, "fp16 vectors",
                            "out of GPU memory", __FILE__, __LINE__);
    }
    nodes->half_unscale = dist ? (float *)block : NULL;
    nodes->half = (__half *)(block + unscale_bytes);
    nodes->half_block = block;
    return knn_half_fill(nodes, n, message, stream);
}

knn_status knn_half_fill(const knn_gpu_nodes *nodes, size_t n,
                         char *message, cudaStream_t stream)
{
    size_t n_vals = (size_t)nodes->ldh * n;
    if (nodes->half_unscale) {
        knn_half_scale_kernel<<<knn_blocks(n), KNN_PREP_THREADS, 0,
                                stream>>>(nodes->fast, nodes->ldf, nodes->p,
                                          (int)n, nodes->half_unscale);
        KNN_LAUNCH_TRY(message, "knn_half_scale_kernel");
    }
    knn_half_kernel<<<knn_blocks(n_vals), KNN_PREP_THREADS, 0, stream>>>(
        nodes->fast, nodes->ldf, nodes->p, nodes->ldh, n_vals,
        nodes->half_unscale, nodes->half);
    KNN_LAUNCH_TRY(message, "knn_half_kernel");
    return KNN_OK;
}

knn_status knn_nodes_split(knn_gpu_nodes *nodes, char *message,
                           cudaStream_t stream)
{
    size_t n_vals = (size_t)nodes->ldf * nodes->n_nodes;
    if (knn_device_alloc((void **)&nodes->split, 4 * n_vals * sizeof(float),
                         stream) != cudaSuccess) {
        cudaGetLastError();
        nodes->split = NULL;
        return knn_gpu_fail(message, KNN_E_NOMEM, "split TF32 arrays",
                            "out of GPU memory", __FILE__, __LINE__);
    }
    knn_split_kernel<<<knn_blocks(n_vals), KNN_PREP_THREADS, 0, stream>>>(
        nodes->fast, nodes->ldf, n_vals, nodes->split);
    KNN_LAUNCH_TRY(message, "knn_split_kernel");
    return KNN_OK;
}

knn_status knn_nodes_fp64(knn_metric metric, knn_gpu_nodes *nodes,
                          char *message, cudaStream_t stream)
{
    size_t n = (size_t)nodes->n_nodes, n_vals = (size_t)nodes->ldf * n;
    int dist = !knn_is_correlation(metric);
    knn_carver c = {NULL, 0};
    knn_carve<double>(&c, n_vals);
    knn_carve<double>(&c, dist ? n : 0);
    if (knn_device_alloc(&nodes->block64, c.used, stream) != cudaSuccess) {
        cudaGetLastError();
        nodes->block64 = NULL;
        return knn_gpu_fail(message, KNN_E_NOMEM, "fp64 arrays",
                            "out of GPU memory", __FILE__, __LINE__);
    }
    c.block = (char *)nodes->block64;
    c.used = 0;
    nodes->fast64 = knn_carve<double>(&c, n_vals);
    nodes->sqnorm64 = dist ? knn_carve<double>(&c, n) : NULL;
    /* Zero padding adds nothing to the products. */
    KNN_CUDA_TRY(message, cudaMemsetAsync(nodes->fast64, 0,
                                          n_vals * sizeof(double), stream));
    knn_frame fr = {nodes->scale_exp, knn_ldexp_factor(-nodes->scale_exp)};
    knn_fp64_kernel<<<knn_blocks(n * 32), KNN_PREP_THREADS, 0, stream>>>(
        metric, nodes->exact, nodes->p, nodes->n_nodes, nodes->sum,
        nodes->css, dist ? nodes->centre : NULL, fr, nodes->fast64,
        nodes->ldf, nodes->sqnorm64);
    KNN_LAUNCH_TRY(message, "knn_fp64_kernel");
    return KNN_OK;
}

knn_status knn_prepare_nodes(knn_metric metric, double *x, int p, int n_ref,
                             int n_nodes, double query_max_abs,
                             knn_gemm_mode gemm, knn_gpu_nodes *nodes,
                             char *message,
                             cudaStream_t stream)
{
    nodes->p = p;
    nodes->ldf = (p + 3) / 4 * 4;
    nodes->n_ref = n_ref;
    nodes->n_nodes = n_nodes;
    knn_prep_scratch sc = {NULL, NULL, NULL, NULL};
    knn_carver c = {NULL, 0};
    knn_nodes_carve(metric, nodes, &sc, &c);
    KNN_TRY(knn_alloc(&nodes->block, c.used, message, stream));
    c.block = (char *)nodes->block;
    c.used = 0;
    knn_nodes_carve(metric, nodes, &sc, &c);
    /* Zero padding of the fast vectors adds nothing to the products. */
    if (nodes->fast != NULL)
        KNN_CUDA_TRY(message,
                     cudaMemsetAsync(nodes->fast, 0,
                                     (size_t)nodes->ldf * n_nodes *
                                         sizeof(float),
                                     stream));
    if (knn_is_correlation(metric))
        KNN_TRY(knn_prepare_corr(metric, x, nodes, &sc, message, stream));
    else
        KNN_TRY(knn_prepare_dist(metric, x, nodes, query_max_abs, &sc,
                                 message, stream));
    if (knn_uses_product(metric)) {
        KNN_TRY(knn_nodes_remargin(metric, nodes, gemm, message, stream));
        KNN_TRY(knn_margins_into(nodes->margin2_fp32, metric, nodes,
                                 KNN_GEMM_FP32, message, stream));
        if (gemm == KNN_GEMM_TF32X3)
            KNN_TRY(knn_nodes_split(nodes, message, stream));
        if (gemm == KNN_GEMM_FP64)
            KNN_TRY(knn_nodes_fp64(metric, nodes, message, stream));
    }
    int degenerate = 0;
    if (sc.degenerate != NULL)
        KNN_CUDA_TRY(message, cudaMemcpyAsync(&degenerate, sc.degenerate,
                                              sizeof degenerate,
                                              cudaMemcpyDeviceToHost,
                                              stream));
    KNN_CUDA_TRY(message, cudaStreamSynchronize(stream));
    if (degenerate)
        return knn_gpu_fail(message, KNN_E_DEGENERATE, "preparation",
                            "a node is constant (or all zero, for cosine)",
                            __FILE__, __LINE__);
    return KNN_OK;
}

void knn_nodes_free(knn_gpu_nodes *nodes)
{
    knn_device_free(nodes->exact);
    knn_device_free(nodes->block);
    knn_device_free(nodes->half_block);
    knn_device_free(nodes->split);
    knn_device_free(nodes->block64);
    nodes->half_block = NULL;
    nodes->half = NULL;
    nodes->half_unscale = NULL;
    nodes->split = NULL;
    nodes->block64 = NULL;
    nodes->fast64 = nodes->sqnorm64 = nodes->centre = NULL;
    nodes->exact = nodes->sum = nodes->css = nodes->margin2 = NULL;
    nodes->margin2_fp32 = NULL;
    nodes->fast = nodes->sqnorm = NULL;
    nodes->norm = nodes->norm_max = nodes->kappa_max = NULL;
    nodes->block = NULL;
}
