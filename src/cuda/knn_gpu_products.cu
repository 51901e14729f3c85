/*
 * knn_gpu_products.cu: the distance work of a row tile, written into the
 * panel that knn_gpu_select.cu reads (query row r's n_ref values contiguous
 * at panel + r * ld, ld = knn_panel_ld(n_ref)).
 *
 *  - Product metrics: one cuBLAS GEMM, panel = F_rows^T F_ref with the fast
 *    vectors of knn_gpu_prepare.cu, float32 or TF32 inputs (knn_gemm_mode)
 *    with float32 accumulation; or, in split TF32, one GEMM on tensor
 *    cores over (hi, hi, lo).(hi, lo, hi). The caller sets the
 *    handle's math mode and the margins use knn_gemm_units_of.
 *  - Manhattan: a direct float64 kernel. A 16 x 16 thread block computes a
 *    64 x 64 tile of pairs, 4 x 4 per thread, staging 16 features of both
 *    node sets in shared memory at a time. Each pair's sum runs over the
 *    features in order with the same rounded operations as knn_key_dist
 *    (on the nodes as given; a pair whose plain sum is not its key reads
 *    its nodes again for the scaled sum), so the panel holds the
 *    canonical key in the frame of the largest value (divided by
 *    2^scale_exp, as distance nodes' fast vectors are, so every finite
 *    key stays within float32's range) rounded to float32; scaling and
 *    rounding are monotone, so the k-th panel value bounds the exact top
 *    k with no margin.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "knn_gpu.cuh"

#define KNN_MH_TILE 64   /* nodes per tile side */
#define KNN_MH_SIDE 16   /* threads per block side */
#define KNN_MH_PER (KNN_MH_TILE / KNN_MH_SIDE)
#define KNN_MH_FEAT 16   /* features staged per step */


cublasMath_t knn_gemm_math(knn_gemm_mode mode)
{
    return mode == KNN_GEMM_FP32 || mode == KNN_GEMM_FP64
               ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH;
}

/*
 * The units of knn_margin_*: a product of p features errs by at most
 * ((p + 4) unit_acc + 2 unit_in) |f_i| |f_j| (and the margin floor).
 *
 * float32: inputs rounded once from float64 (2^-24), sums rounded to
 * nearest (2^-24).
 *
 * Tensor cores multiply exactly and add with truncation, not rounding to
 * nearest (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021),
 * so their unit_acc is 2^-23. TF32 keeps 10 mantissa bits of each input
 * and may truncate: below 2^-10 relative.
 *
 * Split TF32: hi and lo are rounded to nearest TF32 (knn_nodes_split), so
 * f = hi + lo + e, |f - hi| <= 2^-11 |f|, |e| <= 2^-22 |f|. One GEMM over
 * 3p terms sums hi.hi, hi.lo and lo.hi; it errs by (3p + 4) unit_acc
 * times their absolute sum, at most (1 + 2^-9) |f_i| |f_j|. The dropped
 * terms lo.lo, hi.e, e.f add up to less than 3.01 2^-22 |f_i| |f_j|, 3.51
 * 2^-22 with f's own rounding from float64 (2^-24 on each side). All but
 * (p + 4) unit_acc of that fit in 2 unit_in with unit_in = p 2^-23 +
 * 2^-21 + (3p + 4) 2^-33: three times float32's margin, for a third of
 * the passes over the panel that a GEMM of the small terms added to hi.hi
 * would take (one write, not a write, a read and a write).
 *
 * float64 (DGEMM, on Hopper's FP64 tensor cores, which round every fused
 * multiply-add to nearest as IEEE float64 does): the fast vectors stay the
 * float64 values the float32 ones are rounded from, so inputs add nothing
 * (unit_in 0) and sums err by 2^-53 a term, in any order; its smallest
 * normal number is float64's. These are the CPU's float64 rung's units
 * (knn_cpu.c), for the same vectors.
 */
knn_gemm_units knn_gemm_units_of(knn_gemm_mode mode, int p)
{
    knn_gemm_units u;
    u.tiny = mode == KNN_GEMM_FP64 ? KNN_TINY64 : KNN_TINY32;
    if (mode == KNN_GEMM_FP64) {
        u.in = 0.0;
        u.acc = KNN_U64;
    } else if (mode == KNN_GEMM_FP32) {
        u.in = KNN_U32;
        u.acc = KNN_U32;
    } else if (mode == KNN_GEMM_TF32) {
        u.in = 0x1p-10;
        u.acc = 0x1p-23;
    } else {
        u.in = p * 0x1p-23 + 0x1p-21 + (3.0 * p + 4.0) * 0x1p-33;
        u.acc = 0x1p-23;
    }
    return u;
}

static const char *knn_gemm_name(knn_gemm_mode mode)
{
    switch (mode) {
    case KNN_GEMM_TF32: return "tf32";
    case KNN_GEMM_TF32X3: return "tf32x3";
    case KNN_GEMM_FP64: return "fp64";
    default: return "fp32";
    }
}

void knn_gemm_precision(knn_metric metric, knn_gemm_mode mode,
                        unsigned before, int refined, int half_products,
                        char *out, size_t size)
{
    if (!knn_uses_product(metric)) {
        snprintf(out, size, "fp64 direct candidates + fp64 exact re-rank");
        return;
    }
    /* The climbs' order: TF32, then split TF32 or float32, then float64. */
    const knn_gemm_mode order[] = {KNN_GEMM_TF32, KNN_GEMM_TF32X3,
                                   KNN_GEMM_FP32};
    size_t used = 0;
    out[0] = '\0';
    for (knn_gemm_mode m : order)
        if ((before & knn_gemm_bit(m)) && m != mode && used < size)
            used += snprintf(out + used, size - used, "%s, then ",
                             knn_gemm_name(m));
    if (used < size)
        snprintf(out + used, size - used, "%s GEMM candidates%s + fp64 "
                 "exact re-rank%s", knn_gemm_name(mode),
                 mode == KNN_GEMM_TF32 && refined ? ", fp32 rescored" : "",
                 half_products ? " (tf32 tiles: fp16 fused products)" : "");
}

/* panel = ref^T rows over `depth` values of vectors ldf floats apart. */
static knn_status knn_sgemm(cublasHandle_t blas, const float *ref,
                            const float *rows_f, int ldf, int depth,
                            int n_ref, int rows, float *panel, size_t ld,
                            char *message)
{
    const float one = 1.0f, zero = 0.0f;
    KNN_BLAS_TRY(message, cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, n_ref,
                                      rows, depth, &one, ref, ldf, rows_f,
                                      ldf, &zero, panel, (int)ld));
    return KNN_OK;
}

knn_status knn_panel_gemm_rows(cublasHandle_t blas,
                               const knn_gpu_nodes *nodes,
                               const float *rows_fast, int rows,
                               float *panel, size_t ld, char *message)
{
    return knn_sgemm(blas, nodes->fast, rows_fast, nodes->ldf, nodes->ldf,
                     nodes->n_ref, rows, panel, ld, message);
}

/* panel = ref^T rows in float64, from the fast vectors' float64 values
 * (knn_nodes_fp64). */
static knn_status knn_dgemm(cublasHandle_t blas, const knn_gpu_nodes *nodes,
                            int node0, int rows, double *panel, size_t ld,
                            char *message)
{
    const double one = 1.0, zero = 0.0;
    int ldf = nodes->ldf;
    KNN_BLAS_TRY(message, cublasDgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N,
                                      nodes->n_ref, rows, ldf, &one,
                                      nodes->fast64, ldf,
                                      nodes->fast64 + (size_t)node0 * ldf,
                                      ldf, &zero, panel, (int)ld));
    return KNN_OK;
}

knn_status knn_panel_gemm(cublasHandle_t blas, const knn_gpu_nodes *nodes,
                          knn_gemm_mode mode, int node0, int rows,
                          void *panel, size_t ld, char *message)
{
    int ldf = nodes->ldf, n_ref = nodes->n_ref;
    if (mode == KNN_GEMM_FP64)
        return knn_dgemm(blas, nodes, node0, rows, (double *)panel, ld,
                         message);
    if (mode != KNN_GEMM_TF32X3)
        return knn_sgemm(blas, nodes->fast, nodes->fast + (size_t)node0 * ldf,
                         ldf, ldf, n_ref, rows, (float *)panel, ld, message);
    /* [hi | hi | lo | hi] per node: the ref's first three quarters against
     * the rows' last three pair hi.hi, hi.lo and lo.hi. */
    int lds = 4 * ldf;
    return knn_sgemm(blas, nodes->split,
                     nodes->split + (size_t)node0 * lds + ldf, lds, 3 * ldf,
                     n_ref, rows, (float *)panel, ld, message);
}

__device__ static void knn_mh_stage(double (*dst)[KNN_MH_TILE + 1],
                                    const double *x, int p, int n, int node0,
                                    int f0, int tid)
{
    for (int l = tid; l < KNN_MH_TILE * KNN_MH_FEAT;
         l += KNN_MH_SIDE * KNN_MH_SIDE) {
        int node = l / KNN_MH_FEAT, f = l % KNN_MH_FEAT;
        bool in = node0 + node < n && f0 + f < p;
        dst[f][node] = in ? x[(size_t)(node0 + node) * p + f0 + f] : 0.0;
    }
}

__global__ static void __launch_bounds__(KNN_MH_SIDE * KNN_MH_SIDE)
knn_manhattan_kernel(const double *x_rows, const double *x_ref, int p,
                     int rows, int n_ref, int scale_exp, float *panel,
                     size_t ld)
{
    __shared__ double sr[KNN_MH_FEAT][KNN_MH_TILE + 1];
    __shared__ double sc[KNN_MH_FEAT][KNN_MH_TILE + 1];
    int tx = threadIdx.x, ty = threadIdx.y, tid = ty * KNN_MH_SIDE + tx;
    int row0 = blockIdx.y * KNN_MH_TILE, col0 = blockIdx.x * KNN_MH_TILE;
    knn_dist_acc acc[KNN_MH_PER][KNN_MH_PER];
#pragma unroll
    for (int i = 0; i < KNN_MH_PER; i++)
#pragma unroll
        for (int j = 0; j < KNN_MH_PER; j++) acc[i][j] = {0.0};

    for (int f0 = 0; f0 < p; f0 += KNN_MH_FEAT) {
        knn_mh_stage(sr, x_rows, p, rows, row0, f0, tid);
        knn_mh_stage(sc, x_ref, p, n_ref, col0, f0, tid);
        __syncthreads();
        int nf = min(KNN_MH_FEAT, p - f0);
        for (int f = 0; f < nf; f++) {
#pragma unroll
            for (int i = 0; i < KNN_MH_PER; i++) {
                double a = sr[f][ty + KNN_MH_SIDE * i];
#pragma unroll
                for (int j = 0; j < KNN_MH_PER; j++)
                    knn_key_dist_more(KNN_MANHATTAN, &a,
                                      &sc[f][tx + KNN_MH_SIDE * j], 1,
                                      &acc[i][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < KNN_MH_PER; i++) {
        int r = row0 + ty + KNN_MH_SIDE * i;
#pragma unroll
        for (int j = 0; j < KNN_MH_PER; j++) {
            int c = col0 + tx + KNN_MH_SIDE * j;
            if (r < rows && c < n_ref)
                panel[(size_t)r * ld + c] = (float)ldexp(
                    knn_key_dist_finish(KNN_MANHATTAN, acc[i][j].s,
                                        x_rows + (size_t)r * p,
                                        x_ref + (size_t)c * p, p),
                    -scale_exp);
        }
    }
}

knn_status knn_panel_manhattan(const double *x_rows, const double *x_ref,
                               int p, int rows, int n_ref, int scale_exp,
                               float *panel, size_t ld, char *message,
                               cudaStream_t stream)
{
    dim3 block(KNN_MH_SIDE, KNN_MH_SIDE);
    dim3 grid((n_ref + KNN_MH_TILE - 1) / KNN_MH_TILE,
              (rows + KNN_MH_TILE - 1) / KNN_MH_TILE);
    knn_manhattan_kernel<<<grid, block, 0, stream>>>(x_rows, x_ref, p, rows,
                                                     n_ref, scale_exp, panel,
                                                     ld);
    KNN_LAUNCH_TRY(message, "knn_manhattan_kernel");
    return KNN_OK;
}
