/*
 * knn_blas.h: the one BLAS routine the CPU backend uses, declared here so the
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

/* c (m x n) = t(a) %*% b, where a is p x m and b is p x n (column-major,
 * node-contiguous): the dot products of every pair of nodes. */
static inline void knn_gemm_tn(int m, int n, int p, const double *a,
                               const double *b, double *c)
{
    const double one = 1.0, zero = 0.0;
    dgemm_("T", "N", &m, &n, &p, &one, a, &p, b, &p, &zero, c, &m, 1, 1);
}

#endif
