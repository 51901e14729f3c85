/*
 * knn_prepare.h: nodes in the two forms the CPU backend works with.
 *
 * canon: the canonical form of knn_exact.h (correlations: shifted, scaled u
 * with its sum and css; distances: nodes divided by 2^scale_exp), from which
 * every final key is computed. fast: the float64 vectors whose products give
 * the candidate scores (unit-norm centred nodes for correlations, column-
 * centred scaled nodes for distances); fast32: the same rounded to float32,
 * for the float32 rung; each NULL where the search does not ask for it,
 * and both for Manhattan, which has no product form. All matrices are
 * p x n, node-contiguous.
 */
#ifndef KNN_PREPARE_H
#define KNN_PREPARE_H

#include "knn.h"

/* What all nodes of one search share. */
typedef struct {
    knn_metric metric;
    int p;
    int scale_exp;    /* distance metrics: nodes are divided by 2^scale_exp */
    double *colmean;  /* distance metrics: centre of the fast vectors (p):
                         the column mean, or 0 (knn_translation_term) */
    double kappa;     /* correlation metrics: worst cancellation, >= 1 */
    double norm_max;  /* distance metrics: largest |fast| among references */
} knn_space;

typedef struct {
    int n;
    double *canon;  /* p x n */
    double *sum;    /* correlation metrics: n, else NULL */
    double *css;
    double *fast;   /* p x n, or NULL (see above) */
    float *fast32;  /* p x n, or NULL */
    double *norm2;  /* distance metrics with a fast form: |fast|^2, n (of
                       the float64 vectors, whichever form is kept) */
} knn_nodes;

/* Which fast forms knn_nodes_prepare makes (the canonical one always). */
enum { KNN_FORM_FAST64 = 1, KNN_FORM_FAST32 = 2 };

/* Sets the shared scale and centre from the reference and (optional) query
 * matrices. Returns KNN_E_NOMEM on allocation failure (space left empty). */
knn_status knn_space_init(knn_space *space, const knn_request *req);
void knn_space_free(knn_space *space);

/* Prepares n nodes of x (p x n) with `threads` threads and folds their
 * cancellation and norms into space (as references when is_ref). `forms`
 * (KNN_FORM_* bits) says which fast forms to keep: a search that never
 * multiplies (the k-d tree) asks for none and spares their time and
 * memory; ignored for Manhattan. Returns KNN_E_NOMEM (nodes left empty). */
knn_status knn_nodes_prepare(knn_nodes *nodes, knn_space *space,
                             const double *x, int n, int is_ref, int forms,
                             int threads);
void knn_nodes_free(knn_nodes *nodes);

/* Canonical key of query node qi against reference node rj. */
double knn_nodes_key(const knn_space *space, const knn_nodes *query, int qi,
                     const knn_nodes *ref, int rj);

#endif
