/*
 * knn_prepare.h: nodes as the CPU backend works with them.
 *
 * canon: the canonical form of knn_exact.h from which correlation keys are
 * computed (shifted, scaled u with its sum and css). Distance keys come
 * from the input itself, each pair scaled on its own (knn_key_dist), so
 * distance metrics keep no copy (the O(n p + n k) memory promise).
 * fast: the vectors whose products give the candidate scores (unit-norm
 * centred nodes for correlations, translated scaled nodes for distances),
 * in float64 or rounded to float32 for the float32 rung. They are formed a
 * tile of nodes at a time (knn_nodes_fast), never for all nodes at once.
 * All matrices are p x n, node-contiguous.
 */
#ifndef KNN_PREPARE_H
#define KNN_PREPARE_H

#include "knn.h"
#include "knn_pool.h"

/* A value and where it stands, for sorting values (qsort with
 * knn_ranked_cmp: ascending value; equal values in no set order). */
typedef struct {
    double value;
    int position;
} knn_ranked;

int knn_ranked_cmp(const void *a, const void *b);

/* What all nodes of one search share. */
typedef struct {
    knn_metric metric;
    int p;
    int scale_exp;    /* distance metrics with products: the fast vectors'
                         frame divides nodes by 2^scale_exp; else 0 */
    double scale_factor; /* knn_ldexp_factor(-scale_exp) */
    double *colmean;  /* distance metrics: centre of the fast vectors (p):
                         the column mean, or 0 (knn_translation_term) */
    double kappa;     /* correlation metrics: worst cancellation, >= 1 */
    double norm_max;  /* distance metrics: largest |fast| among references */
} knn_space;

typedef struct {
    int n;
    const double *raw; /* the input, p x n: distance keys */
    double *canon;  /* correlation metrics: p x n, else NULL */
    double *sum;    /* correlation metrics: n, else NULL */
    double *css;
    double *norm2;  /* distance metrics with products: |fast|^2 of the
                       float64 fast vectors, n */
} knn_nodes;

/* Sets the shared scale and centre from the reference and (optional) query
 * matrices. Returns KNN_E_NOMEM on allocation failure (space left empty). */
knn_status knn_space_init(knn_space *space, const knn_request *req);
void knn_space_free(knn_space *space);

/* Prepares n nodes of x (p x n, which must outlive the nodes) with
 * `threads` threads and folds their cancellation and norms into space (as
 * references when is_ref). `products`: the search multiplies fast vectors
 * (distance metrics then keep the fast vectors' norms); a search that
 * does not (the k-d tree, Manhattan) keeps nothing for distance nodes.
 * Polls cb's interrupt callback (cb may be NULL). Returns KNN_E_NOMEM or
 * KNN_E_INTERRUPTED (nodes left empty). */
knn_status knn_nodes_prepare(knn_nodes *nodes, knn_space *space,
                             const double *x, int n, int is_ref, int products,
                             int threads, const knn_callbacks *cb);
void knn_nodes_free(knn_nodes *nodes);

/* Fast vectors of nodes [first, first + count) into out (p x count), as
 * float64 (fp32 == 0) or rounded to float32, on `threads` threads. */
void knn_nodes_fast(const knn_space *space, const knn_nodes *nodes,
                    int first, int count, int fp32, void *out, int threads);

/* Canonical key of query node qi against reference node rj. */
double knn_nodes_key(const knn_space *space, const knn_nodes *query, int qi,
                     const knn_nodes *ref, int rj);

/* The keys of query node qi with reference nodes rj[0..KNN_KEYS), with
 * the bits of knn_nodes_key: each sum is still kept in feature order, but
 * the KNN_KEYS of them overlap in the floating-point pipeline, where one
 * waits on its own additions. */
#define KNN_KEYS 4
void knn_nodes_keys(const knn_space *space, const knn_nodes *query, int qi,
                    const knn_nodes *ref, const int *rj, double *keys);

/* Re-ranks the pool of query node qi (of n_query) by the canonical keys:
 * its entries' scores become their keys, sorted by (reported distance,
 * index), and the first k are written into row qi of out. Never fails. */
void knn_nodes_rerank(const knn_space *space, const knn_nodes *query, int qi,
                      const knn_nodes *ref, knn_pool *pool, int n_query,
                      knn_result *out);

#endif
