/*
 * knn_blas.h: the BLAS routines the CPU backend uses, declared here so the
 * engine needs no R header. The trailing lengths are the hidden character
 * arguments of the Fortran ABI (gfortran); C BLAS libraries ignore them.
 */
#ifndef KNN_BLAS_H
#define KNN_BLAS_H

#include <stddef.h>

void dgemm_(const char *transa, const char *transb, const int *m,
            const int *n, const int *k, const double *alpha, const double *a,
            const int *lda, const double *b, const int *ldb,
            const double *beta, double *c, const int *ldc, size_t la,
            size_t lb);

void sgemm_(const char *transa, const char *transb, const int *m,
            const int *n, const int *k, const float *alpha, const float *a,
            const int *lda, const float *b, const int *ldb,
            const float *beta, float *c, const int *ldc, size_t la,
            size_t lb);

/* Each thread that calls the BLAS takes a buffer of its own from it:
 * OpenBLAS maps 128 MB of address space per thread, and where a limit
 * (ulimit -v) refuses the mapping it retries for ever. Under a limit the
 * threads are as many as half of the address space left holds buffers
 * for; one thread leaves the BLAS its own threads, which share one. */
#define KNN_BLAS_BUFFER (128.0 * 1024 * 1024)
#define KNN_BLAS_SHARE 0.5

/* Brackets every product the engine asks of the BLAS (below): OpenBLAS
 * keeps a buffer for each product that ran at once with others, for the
 * rest of the process, so the most products at once so far is how many
 * buffers it holds already (knn_threads_reserve counts the others). */
void knn_blas_enter(void);
void knn_blas_leave(void);

/* The most products the engine had running at once so far: the BLAS
 * buffers already in this process's address space (R's own products,
 * which are not counted, may hold one more). Never fails. */
int knn_blas_buffers(void);

/* c (m x n) = t(a) %*% b, where a is p x m and b is p x n (column-major,
 * node-contiguous): the dot products of every pair of nodes. */
static inline void knn_gemm_tn(int m, int n, int p, const double *a,
                               const double *b, double *c)
{
    const double one = 1.0, zero = 0.0;
    knn_blas_enter();
    dgemm_("T", "N", &m, &n, &p, &one, a, &p, b, &p, &zero, c, &m, 1, 1);
    knn_blas_leave();
}

/* The same in float32 (inputs rounded, sums in float32: the margins of
 * knn_exact.h with unit_in = unit_acc = 2^-24 cover it, whatever order
 * or fused operations the BLAS uses). */
static inline void knn_sgemm_tn(int m, int n, int p, const float *a,
                                const float *b, float *c)
{
    const float one = 1.0f, zero = 0.0f;
    knn_blas_enter();
    sgemm_("T", "N", &m, &n, &p, &one, a, &p, b, &p, &zero, c, &m, 1, 1);
    knn_blas_leave();
}

/* Holds the BLAS to one thread of its own, so that the engine's threads
 * may each call it on their rows (knn_blas.c). Returns the BLAS's thread
 * count before, for knn_blas_release, or 0 where the BLAS's threads
 * cannot be set (then products are one call on the BLAS's threads).
 * Never fails. */
int knn_blas_hold_one_thread(void);

/* Gives the BLAS back the `before` threads knn_blas_hold_one_thread
 * returned; nothing for 0. Never fails. */
void knn_blas_release(int before);

#endif
