/*
 * knn_pool.h: the candidate pool of one query node.
 *
 * Offers arrive tile by tile with a fast score. The pool keeps every offer
 * whose score is within twice the margin of the k-th best score seen so far;
 * anything further cannot be in the exact top k (knn_exact.h), so the pool
 * stays near k entries while still holding every true neighbour, exact ties
 * included. The k best scores seen are kept beside the entries (sorted,
 * or a heap for large k), so the bound tightens with every offer that
 * improves them: far fewer offers get in than with a bound that waits for
 * the pool to fill. When exact ties keep it large (many duplicated
 * nodes), it is compacted to the exact best k seen so far, by order value
 * (the reported distance of the canonical key) and index. At the end the
 * caller replaces scores by order values and sorts: the first k entries
 * are the answer.
 */
#ifndef KNN_POOL_H
#define KNN_POOL_H

#include "knn.h"

typedef struct {
    double score;
    int index;
} knn_cand;

/* Exact order value (see knn_key_distance) of the pool's node and
 * candidate `index`. */
typedef double (*knn_key_fn)(const void *ctx, int node, int index);

typedef struct {
    knn_cand *items;  /* the caller's first KNN_POOL_FIRST_CAP(k) entries
                         (a slab shared by many pools), or the pool's own
                         allocation once it has grown (owned) */
    int owned;
    int size;
    int cap;
    double compacted; /* entries dropped by compaction since the reset:
                         candidates too, whose keys were computed */
    int k;
    double *best;    /* the `ranked` (<= k) best scores seen, sorted
                        (small k) or a max-heap (knn_pool.c) */
    int ranked;
    double bound;    /* offers above this cannot be in the top k */
    double margin2;  /* twice the margin of the fast scores */
    int node;        /* the query node, for key */
    knn_key_fn key;
    const void *key_ctx;
    knn_metric metric;  /* for knn_candidate_bound */
    int scale_exp;
    double row_norm;    /* distance metrics: the node's fast norm and */
    double row_unit;    /* knn_margin_dist_unit and knn_margin_floor, for */
    double row_floor;   /* knn_dist_row_bound; row_unit 0: not used */
    double row_kth;     /* the k-th best score row_bound was computed at */
    double row_bound;   /* knn_dist_row_bound there (INFINITY: none yet) */
} knn_pool;

/* Entries a pool starts with: room for k and as many more within the
 * margin before the first prune; pools that need more grow on their own. */
#define KNN_POOL_FIRST_CAP(k) (2 * (k) + 16)

/* Sets up a pool for k neighbours under a metric whose distance-metric
 * nodes are scaled by 2^-scale_exp, in `items`: KNN_POOL_FIRST_CAP(k)
 * entries, and `best`: k scores, that stay the caller's (one allocation
 * serves every pool). */
void knn_pool_init(knn_pool *pool, int k, knn_metric metric, int scale_exp,
                   knn_cand *items, double *best);
/* Frees what the pool allocated itself (not the caller's items). */
void knn_pool_free(knn_pool *pool);

/* Empties the pool for query node `node`, whose fast scores are within
 * `margin` of its canonical keys; key(key_ctx, node, index) gives the exact
 * order value used to compact ties. */
void knn_pool_reset(knn_pool *pool, int node, double margin, knn_key_fn key,
                    const void *key_ctx);

/* Lets the pool of a distance-metric node also bound its candidates by
 * its own neighbourhood (knn_dist_row_bound): `norm` is the node's fast
 * norm, `unit` and `floor` knn_margin_dist_unit and knn_margin_floor of
 * the arithmetic its scores come from. Call after knn_pool_reset, which
 * turns it off. */
void knn_pool_bound_by_row(knn_pool *pool, double norm, double unit,
                           double floor);

/* Offers a candidate. Returns 0, or -1 when out of memory (pool intact). */
int knn_pool_offer(knn_pool *pool, double score, int index);

/* Drops every entry that can no longer be in the top k. */
void knn_pool_prune(knn_pool *pool);

/* Sorts the entries by (score, index), ascending. */
void knn_pool_sort(knn_pool *pool);

#endif
