/*
 * knn_pool.c: candidate pools (see knn_pool.h). Selection of the k-th score
 * is a three-way quickselect, so pools full of exact ties (duplicated nodes)
 * stay linear rather than quadratic.
 */
#include <math.h>
#include <stdlib.h>
#include "knn_pool.h"

int knn_pool_init(knn_pool *pool, int k)
{
    pool->k = k;
    pool->size = 0;
    pool->cap = 2 * k + 64;
    pool->bound = INFINITY;
    pool->margin2 = 0.0;
    pool->items = malloc((size_t)pool->cap * sizeof(knn_cand));
    return pool->items ? 0 : -1;
}

void knn_pool_free(knn_pool *pool)
{
    free(pool->items);
    pool->items = NULL;
}

void knn_pool_reset(knn_pool *pool, double margin)
{
    pool->size = 0;
    pool->bound = INFINITY;
    pool->margin2 = 2.0 * margin;
}

static void knn_cand_swap(knn_cand *a, knn_cand *b)
{
    knn_cand t = *a;
    *a = *b;
    *b = t;
}

/* Reorders items[0..n) so that items[r] holds the score of rank r (0-based)
 * with no larger score before it and no smaller after it. */
static void knn_select_rank(knn_cand *items, int n, int r)
{
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        double pivot = items[lo + (hi - lo) / 2].score;
        int lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (items[i].score < pivot) knn_cand_swap(&items[lt++], &items[i++]);
            else if (items[i].score > pivot) knn_cand_swap(&items[i], &items[--gt]);
            else i++;
        }
        if (r < lt) hi = lt;
        else if (r >= gt) lo = gt;
        else return;
    }
}

void knn_pool_prune(knn_pool *pool)
{
    int k = pool->k;
    if (pool->size <= k) return;
    knn_select_rank(pool->items, pool->size, k - 1);
    double bound = pool->items[k - 1].score + pool->margin2;
    if (bound < pool->bound) pool->bound = bound;
    int kept = k;
    for (int i = k; i < pool->size; i++)
        if (pool->items[i].score <= pool->bound)
            pool->items[kept++] = pool->items[i];
    pool->size = kept;
}

int knn_pool_offer(knn_pool *pool, double score, int index)
{
    if (!(score <= pool->bound)) return 0;
    if (pool->size == pool->cap) {
        knn_pool_prune(pool);
        /* Mostly ties: grow instead of pruning again on every offer. */
        if (pool->size > pool->cap / 2) {
            int cap = 2 * pool->cap;
            knn_cand *items = realloc(pool->items, (size_t)cap * sizeof *items);
            if (!items) return -1;
            pool->items = items;
            pool->cap = cap;
        }
    }
    pool->items[pool->size].score = score;
    pool->items[pool->size].index = index;
    pool->size++;
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
