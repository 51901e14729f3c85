/*
 * knn_pool.c: candidate pools (see knn_pool.h). Selection of the k-th score
 * is a three-way quickselect, so pools full of exact ties (duplicated nodes)
 * stay linear rather than quadratic, and such pools are compacted with the
 * canonical keys rather than grown without bound.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "knn_exact.h"
#include "knn_pool.h"

void knn_pool_init(knn_pool *pool, int k, knn_metric metric, int scale_exp,
                   knn_cand *items, double *best)
{
    pool->best = best;
    pool->ranked = 0;
    pool->k = k;
    pool->metric = metric;
    pool->scale_exp = scale_exp;
    pool->size = 0;
    pool->cap = KNN_POOL_FIRST_CAP(k);
    pool->bound = INFINITY;
    pool->margin2 = 0.0;
    pool->items = items;
    pool->owned = 0;
}

void knn_pool_free(knn_pool *pool)
{
    if (pool->owned) free(pool->items);
    pool->items = NULL;
    pool->owned = 0;
}

void knn_pool_reset(knn_pool *pool, int node, double margin, knn_key_fn key,
                    const void *key_ctx)
{
    pool->size = 0;
    pool->ranked = 0;
    pool->bound = INFINITY;
    pool->margin2 = 2.0 * margin;
    pool->row_unit = 0.0;
    pool->compacted = 0.0;
    pool->node = node;
    pool->key = key;
    pool->key_ctx = key_ctx;
}

void knn_pool_bound_by_row(knn_pool *pool, double norm, double unit,
                           double floor)
{
    pool->row_norm = norm;
    pool->row_unit = unit;
    pool->row_floor = floor;
    pool->row_kth = INFINITY;
    pool->row_bound = INFINITY;
}

/* The row's own bound (knn_dist_row_bound, two square roots and a tie
 * search) is computed again only once the k-th best score has fallen by
 * a tenth since it last was: most improvements of a filling pool are
 * small, and the bound it keeps meanwhile, from a larger k-th score, is
 * looser but holds (the bound never rises). */
#define KNN_ROW_BOUND_STEP 0.9

/* Tightens the bound to what a k-th best fast score of kth allows. */
static void knn_pool_tighten(knn_pool *pool, double kth)
{
    double bound = knn_candidate_bound(pool->metric, kth, pool->margin2,
                                       pool->scale_exp);
    if (pool->row_unit > 0.0) {
        if (!(kth >= KNN_ROW_BOUND_STEP * pool->row_kth)) {
            pool->row_bound = knn_dist_row_bound(pool->metric, kth,
                                                 pool->row_norm,
                                                 pool->row_unit,
                                                 pool->row_floor,
                                                 pool->scale_exp);
            pool->row_kth = kth;
        }
        bound = fmin(bound, pool->row_bound);
    }
    if (bound < pool->bound) pool->bound = bound;
}

/* Restores the max-heap best[0..n) after best[0] was lowered. */
static void knn_heap_sift_down(double *best, int n)
{
    int i = 0;
    double v = best[0];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && best[c + 1] > best[c]) c++;
        if (!(best[c] > v)) break;
        best[i] = best[c];
        i = c;
    }
    best[i] = v;
}

/* Pools of up to this many neighbours keep their k best scores sorted
 * (ascending): a better score moves the larger ones up a place, a few
 * steps whose branches the processor predicts, where a heap's every level
 * is a branch it cannot. Beyond, the heap's log k levels cost less than
 * moving k / 2 scores. Either keeps the same k best scores, so the bounds
 * are the same. */
#define KNN_POOL_SORTED_K 32

/* knn_pool_rank for a pool of at most KNN_POOL_SORTED_K neighbours:
 * best[0..ranked) ascending, best[k - 1] the k-th best once full. */
static void knn_pool_rank_sorted(knn_pool *pool, double score)
{
    double *best = pool->best;
    int k = pool->k, i = pool->ranked;
    if (i == k) {
        if (!(score < best[k - 1])) return;
        i = k - 1;
    } else {
        pool->ranked++;
    }
    for (; i > 0 && best[i - 1] > score; i--) best[i] = best[i - 1];
    best[i] = score;
    if (pool->ranked == k) knn_pool_tighten(pool, best[k - 1]);
}

/* Adds a score to the k best seen, tightening the bound once there are
 * k of them: whatever the pool drops later, k nodes with scores at most
 * the k-th best were offered, so the k-th best key is within the margin
 * of it. */
static void knn_pool_rank(knn_pool *pool, double score)
{
    double *best = pool->best;
    if (pool->k <= KNN_POOL_SORTED_K) {
        knn_pool_rank_sorted(pool, score);
        return;
    }
    if (pool->ranked < pool->k) {
        int i = pool->ranked++;
        while (i > 0 && best[(i - 1) / 2] < score) {
            best[i] = best[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        best[i] = score;
        if (pool->ranked < pool->k) return;
    } else if (score < best[0]) {
        best[0] = score;
        knn_heap_sift_down(best, pool->k);
    } else {
        return;
    }
    knn_pool_tighten(pool, best[0]);
}

void knn_pool_prune(knn_pool *pool)
{
    int kept = 0;
    for (int i = 0; i < pool->size; i++)
        if (pool->items[i].score <= pool->bound)
            pool->items[kept++] = pool->items[i];
    pool->size = kept;
}

typedef struct {
    double key;
    knn_cand cand;
} knn_keyed;

static int knn_keyed_cmp(const void *a, const void *b)
{
    const knn_keyed *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->cand.index > y->cand.index) - (x->cand.index < y->cand.index);
}

/* Keeps the exact best k entries (order value, then index), with their
 * fast scores. Whatever is dropped is beaten exactly by k kept entries, and
 * the bound stays valid because it only ever decreases. Returns 0 or -1. */
static int knn_pool_compact(knn_pool *pool)
{
    knn_keyed *keyed = malloc((size_t)pool->size * sizeof *keyed);
    if (!keyed) return -1;
    for (int c = 0; c < pool->size; c++) {
        keyed[c].cand = pool->items[c];
        keyed[c].key = pool->key(pool->key_ctx, pool->node,
                                 pool->items[c].index);
    }
    qsort(keyed, (size_t)pool->size, sizeof *keyed, knn_keyed_cmp);
    for (int c = 0; c < pool->k; c++) pool->items[c] = keyed[c].cand;
    pool->compacted += pool->size - pool->k;
    pool->size = pool->k;
    free(keyed);
    return 0;
}

/* Makes room for one more entry: prune, then compact exact ties, or grow a
 * pool too small to compact. Returns 0 or -1 when out of memory. */
static int knn_pool_make_room(knn_pool *pool)
{
    knn_pool_prune(pool);
    if (pool->size <= pool->cap / 2) return 0;
    if (pool->key && pool->size > 4 * pool->k) return knn_pool_compact(pool);
    int cap = 2 * pool->cap;
    size_t bytes = (size_t)cap * sizeof(knn_cand);
    knn_cand *items = pool->owned ? realloc(pool->items, bytes)
                                  : malloc(bytes);
    if (!items) return -1;
    if (!pool->owned)
        memcpy(items, pool->items, (size_t)pool->size * sizeof(knn_cand));
    pool->items = items;
    pool->owned = 1;
    pool->cap = cap;
    return 0;
}

int knn_pool_offer(knn_pool *pool, double score, int index)
{
    if (!(score <= pool->bound)) return 0;
    if (pool->size == pool->cap && knn_pool_make_room(pool) != 0) return -1;
    pool->items[pool->size].score = score;
    pool->items[pool->size].index = index;
    pool->size++;
    knn_pool_rank(pool, score);
    return 0;
}

static int knn_cand_cmp(const void *a, const void *b)
{
    const knn_cand *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

void knn_pool_sort(knn_pool *pool)
{
    qsort(pool->items, (size_t)pool->size, sizeof(knn_cand), knn_cand_cmp);
}
