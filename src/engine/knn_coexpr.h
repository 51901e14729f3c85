/*
 * knn_coexpr.h: the co-expression measures of WGCNA users (plain C11, no
 * R headers).
 *
 * bicor: WGCNA's biweight midcorrelation, maxPOutliers = 1, with its
 * fallback to Pearson for a node whose median absolute deviation is zero.
 * It is a per-node transform followed by dot products: knn_bicor_nodes()
 * computes the transform once in float64, and the engine's cosine search
 * (knn_search) ranks the transformed nodes with its exact keys, on either
 * backend.
 *
 * Pairwise-complete correlations (use = "pairwise.complete.obs"): missing
 * values are NaN, and each pair is correlated over the features both of its
 * nodes have, as stats::cor(use = "pairwise.complete.obs") and WGCNA's
 * bicor(use = "p") define it: Pearson, |Pearson| and cosine of the two
 * nodes restricted to their shared features; bicor of them, its medians
 * and deviations taken over the shared features. Keys are float64, two
 * passes over the shared features (exact sums for nodes of small
 * integers, so that exact ties stay ties; knn_pw_key.h). On the CPU,
 * Pearson, |Pearson| and cosine candidates come first from one float32
 * matrix product per tile of rows with proven bounds (knn_coexpr.c), and
 * only they get keys; bicor computes every pair's key. On a GPU
 * (knn_gpu_pw_open, knn_backend.h) every pair is keyed, with the same
 * key, so the bits are the CPU's.
 *
 * Layout as in knn.h: p x n, column-major, node-contiguous.
 */
#ifndef KNN_COEXPR_H
#define KNN_COEXPR_H

#include <limits.h>
#include <stdio.h>
#include "knn.h"

/* The index of a result slot with no neighbour (a node with fewer than k
 * partners that share enough features): R's NA_integer_. Its distance and
 * weight are NaN. */
#define KNN_NO_NODE INT_MIN

/* Writes the bicor transform of the n nodes of x (p x n, all values
 * finite) into out (p x n): the node less its median, times the biweight
 * (1 - u^2)^2 with u = (x - median) / (9 MAD) (0 where |u| >= 1), scaled
 * to unit length; a node whose MAD is zero gets the Pearson form (centred,
 * unit length). A node constant over its features gets zeros, and its
 * 0-based number is written to `bad` (capacity max_bad). Returns the
 * number of such nodes. Uses up to `threads` threads; x is left
 * untouched; never fails but for memory (-1, out unspecified). */
int knn_bicor_nodes(const double *x, int p, int n, double *out, int *bad,
                    int max_bad, int threads);

/* The measure of a pairwise-complete search. */
typedef enum {
    KNN_PAIRWISE_PEARSON = 0,
    KNN_PAIRWISE_ABSPEARSON,
    KNN_PAIRWISE_COSINE,
    KNN_PAIRWISE_BICOR
} knn_pairwise_measure;

typedef struct {
    knn_pairwise_measure measure;
    int p;                /* features per node, >= 1 */
    int k;                /* neighbours per query */
    const double *ref;    /* p x n_ref, NaN where missing; read only */
    int n_ref;
    const double *query;  /* p x n_query, or NULL: self search of ref */
    int n_query;
    int min_shared;       /* a pair sharing fewer features has no key */
    int threads;          /* <= 0: the OpenMP default */
    knn_backend backend;  /* GPU: the keys on a GPU */
    double memory_bytes;  /* GPU: device memory for them; <= 0: free */
    int n_devices;        /* GPU: the first of devices; 0: the first */
    int devices[KNN_MAX_DEVICES];
    knn_callbacks cb;
} knn_pairwise_request;

/* Bytes of device memory per node of a search on a GPU (knn_gpu_pw_open)
 * over p features: the float64 values and imax, and for bicor the order
 * and count of the present features. */
static inline double knn_pw_node_bytes(int p, int bicor)
{
    return bicor ? 12.0 * p + 12.0 : 8.0 * p + 8.0;
}

/* Rows per device chunk of a search on a GPU: the nodes (the reference
 * twice, node by node and feature by feature; the query's n_query nodes,
 * 0 for a self search) stay in `bytes` of device memory, and each row of
 * a chunk takes n_ref keys and three times k picks; 4 KB cover the
 * alignment of the arrays. At most block_rows; 0 where not one row
 * fits. */
static inline int knn_pw_chunk_rows(double bytes, int p, int bicor,
                                    int n_ref, int n_query, int k,
                                    int block_rows)
{
    double nodes = (2.0 * n_ref + n_query) * knn_pw_node_bytes(p, bicor);
    double rows = (bytes - nodes - 4096.0) / (8.0 * n_ref + 24.0 * k);
    if (!(rows >= 1.0)) return 0;
    return rows >= block_rows ? block_rows : (int)rows;
}

/* Why knn_pw_chunk_rows found no row, into message (size bytes). */
static inline void knn_pw_no_fit(char *message, size_t size, double bytes,
                                 int p, int bicor, int n_ref, int n_query,
                                 int k)
{
    snprintf(message, size, "the nodes (%.1f MB) and one row of keys "
             "(%.1f KB) do not fit the %.1f MB of GPU memory allowed: raise "
             "options(knngpu.gpu.memory), free GPU memory, or use device = "
             "\"cpu\"",
             (2.0 * n_ref + n_query) * knn_pw_node_bytes(p, bicor) /
                 1048576.0,
             (8.0 * n_ref + 24.0 * k) / 1024.0, bytes / 1048576.0);
}

/* Finds each query node's k best reference nodes by the pairwise-complete
 * measure: ordered by the reported distance (1 - r, or 1 - |r|), then by
 * the smaller index. A pair with fewer than min_shared shared features,
 * or whose measure is undefined on them (a node constant there), has no
 * key; a query node with fewer than k partners fills its last slots with
 * KNN_NO_NODE. Writes out's index, distance and weight (n_query x k, in
 * out's layout and index base; out->from and out->rank are not written).
 * Returns KNN_OK; KNN_E_NONFINITE for an infinite value, KNN_E_NOMEM, or
 * KNN_E_INTERRUPTED; on the GPU also KNN_E_NOGPU, KNN_E_INVALID and
 * KNN_E_DEVICE (report->message set, out unspecified, everything freed). */
knn_status knn_pairwise_search(const knn_pairwise_request *req,
                               knn_result *out, knn_report *report);

#endif
