/*
 * knn_dedup.c: nodes that are exact copies of each other, searched once.
 *
 * Copies (the same float64 bits in every feature) have the same key to
 * every node, so the engine's order (reported distance, then index) puts
 * a group of copies together, in index order. A search where copies are
 * many sends every copy of a neighbour through the candidate stage and
 * the exact re-rank: a profile repeated 50000 times gives each of its
 * rows 50000 tied candidates. Here the reference's distinct nodes are
 * searched instead, on the same backend (so every key has the bits the
 * whole search would give it), and each row's list is expanded from the
 * groups its search returned: groups in order of reported distance, the
 * members of groups at one distance merged by index. A self search's
 * queries are the distinct nodes too (every copy of a node has its list,
 * less itself); its own group comes back with its own key, as its copies
 * would.
 *
 * A row whose k-th neighbour lies in a run of tied groups that reaches
 * the end of what its search returned may miss groups of that distance
 * past the end (with members of smaller index): those rows are searched
 * again with twice the groups, until none is in doubt or every group is
 * returned.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "knn_backend.h"
#include "knn_dedup.h"
#include "knn_threads.h"

/* Nodes looked at, evenly spaced, to judge whether copies are many; and
 * the copies among them that make the whole pass worth its cost (a hash
 * of every node). The sample is small because every search pays for it:
 * copies that matter (a node's copies outnumbering its k) are common
 * enough to show. Past KNN_DEDUP_KEEP of the nodes distinct, the plain
 * search runs after all. */
#define KNN_DEDUP_SAMPLE 2048
#define KNN_DEDUP_SAMPLE_COPIES 8
#define KNN_DEDUP_KEEP 0.9

/* Leading features of a node that the sample's first look hashes: 64
 * bytes, a cache line. */
#define KNN_DEDUP_PREFIX 8

/* How many sampled nodes ahead the first look asks for its line: the
 * nodes lie far apart, and a miss at a time would leave the sample bound
 * by memory latency. */
#define KNN_DEDUP_AHEAD 16

/* A hash of a node's bits, in four independent streams (so the
 * multiplications overlap). */
static uint64_t knn_node_hash(const double *x, int p)
{
    uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                     0x165667b19e3779f9ull, 0x27d4eb2f165667c5ull};
    int f = 0;
    for (; f + 4 <= p; f += 4) {
        for (int l = 0; l < 4; l++) {
            uint64_t v;
            memcpy(&v, x + f + l, sizeof v);
            h[l] = (h[l] ^ v) * 0xff51afd7ed558ccdull;
            h[l] ^= h[l] >> 33;
        }
    }
    for (; f < p; f++) {
        uint64_t v;
        memcpy(&v, x + f, sizeof v);
        h[0] = (h[0] ^ v) * 0xff51afd7ed558ccdull;
        h[0] ^= h[0] >> 33;
    }
    uint64_t out = (uint64_t)p;
    for (int l = 0; l < 4; l++) {
        out = (out ^ h[l]) * 0xc4ceb9fe1a85ec53ull;
        out ^= out >> 29;
    }
    return out;
}

/* Open addressing over node numbers, equal bits by memcmp. */
typedef struct {
    int *slot;       /* node, or -1 */
    uint64_t *hash;
    size_t mask;
} knn_table;

static int knn_table_alloc(knn_table *t, size_t nodes)
{
    size_t size = 16;
    while (size < 2 * nodes) size <<= 1;
    t->mask = size - 1;
    t->slot = malloc(size * sizeof(int));
    t->hash = malloc(size * sizeof(uint64_t));
    if (!t->slot || !t->hash) {
        free(t->slot);
        free(t->hash);
        return 0;
    }
    memset(t->slot, 0xff, size * sizeof(int));
    return 1;
}

static void knn_table_free(knn_table *t)
{
    free(t->slot);
    free(t->hash);
}

/* The node entered earlier with the bits of node j, or -1 after entering
 * j. */
static int knn_table_copy_of(knn_table *t, const double *x, int p, int j,
                             uint64_t h)
{
    size_t bytes = (size_t)p * sizeof(double);
    for (size_t s = h & t->mask;; s = (s + 1) & t->mask) {
        int e = t->slot[s];
        if (e < 0) {
            t->slot[s] = j;
            t->hash[s] = h;
            return -1;
        }
        if (t->hash[s] == h &&
            memcmp(x + (size_t)e * p, x + (size_t)j * p, bytes) == 0)
            return e;
    }
}

/* Copies among KNN_DEDUP_SAMPLE evenly spaced nodes (all, when fewer).
 * Copies share their first features, so a first look hashes only those
 * (about one cache line of each node) and counts how many sampled nodes
 * share each; only the nodes that share theirs with another are hashed
 * whole and entered, in sample order, so the count is the one of hashing
 * every sampled node whole. On most data no prefix repeats and the sample
 * reads a line of each node instead of all of it: the whole-node hash is
 * what makes the check cost as much as a search of a few thousand nodes.
 * Where prefixes repeat (sparse nodes that start with zeros), those nodes
 * cost what they did before. */
static int knn_sample_copies(const double *x, int p, int n)
{
    int s = n < KNN_DEDUP_SAMPLE ? n : KNN_DEDUP_SAMPLE, copies = 0;
    int head = p < KNN_DEDUP_PREFIX ? p : KNN_DEDUP_PREFIX;
    size_t size = 16;
    while (size < 2 * (size_t)s) size <<= 1;
    uint64_t *key = malloc(size * sizeof(uint64_t));
    int *count = calloc(size, sizeof(int));
    int *slot = malloc((size_t)s * sizeof(int));
    if (!key || !count || !slot) {
        free(key);
        free(count);
        free(slot);
        return 0;
    }
    int shared = 0;
    for (int i = 0; i < s; i++) {
        int j = (int)((int64_t)i * n / s);
        if (i + KNN_DEDUP_AHEAD < s)
            __builtin_prefetch(x + (size_t)((int64_t)(i + KNN_DEDUP_AHEAD) *
                                            n / s) * p);
        uint64_t h = knn_node_hash(x + (size_t)j * p, head);
        size_t e = h & (size - 1);
        while (count[e] && key[e] != h) e = (e + 1) & (size - 1);
        key[e] = h;
        shared += ++count[e] == 2;
        slot[i] = (int)e;
    }
    knn_table t = {NULL, NULL, 0};
    for (int i = 0; shared && i < s; i++) {
        if (count[slot[i]] < 2) continue;
        if (!t.slot && !knn_table_alloc(&t, (size_t)s)) break;
        int j = (int)((int64_t)i * n / s);
        copies += knn_table_copy_of(&t, x, p, j,
                                    knn_node_hash(x + (size_t)j * p, p)) >= 0;
    }
    free(key);
    free(count);
    free(slot);
    knn_table_free(&t);
    return copies;
}

/* The reference's groups of copies: group g's nodes are
 * members[start[g] .. start[g + 1]), ascending; its first is rep[g]. */
typedef struct {
    int n_groups;
    int *group;   /* n: each node's group */
    int *rep;     /* n_groups */
    int *start;   /* n_groups + 1 */
    int *members; /* n */
} knn_groups;

static void knn_groups_free(knn_groups *g)
{
    free(g->group);
    free(g->rep);
    free(g->start);
    free(g->members);
    memset(g, 0, sizeof *g);
}

static knn_status knn_groups_build(const double *x, int p, int n,
                                   int threads, knn_groups *g)
{
    memset(g, 0, sizeof *g);
    uint64_t *hash = malloc((size_t)n * sizeof(uint64_t));
    knn_table t = {NULL, NULL, 0};
    g->group = malloc((size_t)n * sizeof(int));
    g->rep = malloc((size_t)n * sizeof(int));
    g->start = calloc((size_t)n + 1, sizeof(int));
    g->members = malloc((size_t)n * sizeof(int));
    if (!hash || !g->group || !g->rep || !g->start || !g->members ||
        !knn_table_alloc(&t, (size_t)n)) {
        free(hash);
        knn_groups_free(g);
        return KNN_E_NOMEM;
    }
    int nt = knn_threads(threads);
    (void)nt; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int j = 0; j < n; j++) hash[j] = knn_node_hash(x + (size_t)j * p, p);
    for (int j = 0; j < n; j++) {
        int e = knn_table_copy_of(&t, x, p, j, hash[j]);
        if (e < 0) {
            g->rep[g->n_groups] = j;
            g->group[j] = g->n_groups++;
        } else {
            g->group[j] = g->group[e];
        }
        g->start[g->group[j] + 1]++;
    }
    free(hash);
    knn_table_free(&t);
    for (int c = 0; c < g->n_groups; c++) g->start[c + 1] += g->start[c];
    int *fill = malloc((size_t)g->n_groups * sizeof(int));
    if (!fill) {
        knn_groups_free(g);
        return KNN_E_NOMEM;
    }
    memcpy(fill, g->start, (size_t)g->n_groups * sizeof(int));
    for (int j = 0; j < n; j++) g->members[fill[g->group[j]]++] = j;
    free(fill);
    return KNN_OK;
}

/* One round's searches: for each unit (a group of a self search, else a
 * query), its k_u nearest groups, row-major. */
typedef struct {
    int k_u, all; /* all: every group is returned */
    int *index;
    double *distance, *weight;
} knn_round;

/* Writes output row `row`'s k neighbours from its round list (index,
 * distance and weight at li, ld, lw), skipping node `self` (-1: none).
 * cursor: scratch of k_u ints. Returns 1 where the row is in doubt
 * (see the file's comment), 0 where it is exact, -1 where the list held
 * too few members (which a correct search cannot give). */
static int knn_expand_row(const knn_groups *g, const knn_round *rd, int k,
                          const int *li, const double *ld, const double *lw,
                          int self, knn_result *out, size_t n_q, size_t row,
                          int *cursor)
{
    int n = 0, t = 0;
    while (n < k && t < rd->k_u) {
        int t2 = t + 1;
        while (t2 < rd->k_u && ld[t2] == ld[t]) t2++;
        for (int c = t; c < t2; c++) cursor[c - t] = g->start[li[c]];
        while (n < k) {
            int best = -1, best_node = INT_MAX;
            for (int c = t; c < t2; c++) {
                int *at = &cursor[c - t], end = g->start[li[c] + 1];
                if (*at < end && g->members[*at] == self) (*at)++;
                if (*at < end && g->members[*at] < best_node) {
                    best_node = g->members[*at];
                    best = c;
                }
            }
            if (best < 0) break;
            cursor[best - t]++;
            size_t to = knn_result_at(out, n_q, k, row, n++);
            out->index[to] = best_node + out->index_base;
            out->distance[to] = ld[best];
            out->weight[to] = lw[best];
        }
        t = t2;
    }
    if (rd->all) return n < k ? -1 : 0;
    return t == rd->k_u;
}

/* What the expansion needs of the request. */
typedef struct {
    const knn_request *req;
    const knn_groups *g;
    int self;
    const double *distinct; /* p x n_groups: each group's first node */
} knn_dedup;

static int knn_unit_rows(const knn_dedup *dd, int unit)
{
    return dd->self ? dd->g->start[unit + 1] - dd->g->start[unit] : 1;
}

static int knn_unit_row(const knn_dedup *dd, int unit, int r)
{
    return dd->self ? dd->g->members[dd->g->start[unit] + r] : unit;
}

static const double *knn_unit_values(const knn_dedup *dd, int unit)
{
    const double *x = dd->self ? dd->distinct : dd->req->query;
    return x + (size_t)unit * dd->req->p;
}

/* The caller's callbacks seen from the units' searches: progress of
 * units as progress of the caller's rows. */
typedef struct {
    const knn_callbacks *cb;
    double scale;
} knn_dedup_calls;

static void knn_dedup_tick(void *ctx, double done, double total)
{
    const knn_dedup_calls *dc = ctx;
    (void)total;
    if (dc->cb->progress)
        dc->cb->progress(dc->cb->ctx, done * dc->scale, 0.0);
}

static int knn_dedup_poll(void *ctx)
{
    const knn_dedup_calls *dc = ctx;
    return knn_interrupted(dc->cb);
}

/* Searches units todo[0 .. n_todo) against the distinct nodes into rd
 * (allocated here). */
static knn_status knn_round_search(const knn_dedup *dd,
                                   const knn_knobs *knobs,
                                   knn_backend backend, const int *todo,
                                   int n_todo, int first, knn_round *rd,
                                   knn_report *report)
{
    const knn_request *req = dd->req;
    size_t lists = (size_t)n_todo * rd->k_u, p = (size_t)req->p;
    double *queries = NULL;
    if (!first) {
        queries = malloc((size_t)n_todo * p * sizeof(double));
        if (!queries) return KNN_E_NOMEM;
        for (int t = 0; t < n_todo; t++)
            memcpy(queries + (size_t)t * p, knn_unit_values(dd, todo[t]),
                   p * sizeof(double));
    }
    rd->index = malloc(lists * sizeof(int));
    rd->distance = malloc(lists * sizeof(double));
    rd->weight = malloc(lists * sizeof(double));
    if (!rd->index || !rd->distance || !rd->weight) {
        free(queries);
        return KNN_E_NOMEM;
    }
    knn_request sub = *req;
    sub.ref = dd->distinct;
    sub.n_ref = dd->g->n_groups;
    sub.query = first ? knn_unit_values(dd, 0) : queries;
    sub.n_query = n_todo;
    sub.k = rd->k_u;
    /* Only the first round's progress is the caller's rows'. */
    knn_dedup_calls calls = {&req->cb, first ? (double)(req->query
        ? req->n_query : req->n_ref) / n_todo : 0.0};
    sub.cb.interrupted = knn_dedup_poll;
    sub.cb.progress = first ? knn_dedup_tick : NULL;
    sub.cb.ctx = &calls;
    knn_result part = {rd->index, rd->distance, rd->weight, 1, 0};
    knn_report rep;
    memset(&rep, 0, sizeof rep);
    knn_status st = knn_search_blocks(&sub, knobs, backend, &part, &rep);
    free(queries);
    if (st != KNN_OK) {
        snprintf(report->message, sizeof report->message, "%s", rep.message);
        return st;
    }
    if (first) {
        *report = rep;
    } else {
        report->seconds_search += rep.seconds_search;
        report->seconds_rerank += rep.seconds_rerank;
        report->seconds_prepare += rep.seconds_prepare;
    }
    return KNN_OK;
}

/* Expands the lists of units todo[0 .. n_todo) into the caller's rows;
 * doubt[t]: 1 where unit t's rows need more groups, else 0. */
static knn_status knn_round_expand(const knn_dedup *dd, const knn_round *rd,
                                   const int *todo, int n_todo,
                                   knn_result *out, int *doubt,
                                   knn_report *report)
{
    const knn_request *req = dd->req;
    size_t n_q = (size_t)(req->query ? req->n_query : req->n_ref);
    int nt = knn_threads(req->threads), failed = 0, short_list = 0;
    (void)nt; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel num_threads(nt)
    {
        int *cursor = malloc((size_t)rd->k_u * sizeof(int));
        if (!cursor) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 64)
        for (int t = 0; t < n_todo; t++) {
            if (!cursor) continue;
            size_t at = (size_t)t * rd->k_u;
            int unit = todo[t], worst = 0;
            for (int r = 0; r < knn_unit_rows(dd, unit); r++) {
                int row = knn_unit_row(dd, unit, r);
                int d = knn_expand_row(dd->g, rd, req->k, rd->index + at,
                                       rd->distance + at, rd->weight + at,
                                       dd->self ? row : -1, out, n_q,
                                       (size_t)row, cursor);
                if (d < 0) {
                    #pragma omp atomic write
                    short_list = 1;
                }
                if (d > 0) worst = 1;
            }
            doubt[t] = worst;
        }
        free(cursor);
    }
    if (failed) {
        snprintf(report->message, sizeof report->message,
                 "out of host memory expanding copies' lists");
        return KNN_E_NOMEM;
    }
    if (short_list) {
        snprintf(report->message, sizeof report->message,
                 "a row's distinct neighbours held fewer than k nodes");
        return KNN_E_INVALID;
    }
    return KNN_OK;
}

static void knn_round_free(knn_round *rd)
{
    free(rd->index);
    free(rd->distance);
    free(rd->weight);
    rd->index = NULL;
    rd->distance = rd->weight = NULL;
}

int knn_dedup_suits(const knn_request *req, const knn_knobs *knobs)
{
    if (knobs->duplicates == KNN_DUPLICATES_EACH) return 0;
    if (knobs->duplicates == KNN_DUPLICATES_ONCE) return 1;
    return knn_sample_copies(req->ref, req->p, req->n_ref) >=
           KNN_DEDUP_SAMPLE_COPIES;
}

/* Rounds of searches and expansions until no unit is in doubt. */
static knn_status knn_dedup_rounds(const knn_dedup *dd,
                                   const knn_knobs *knobs,
                                   knn_backend backend, knn_result *out,
                                   knn_report *report)
{
    const knn_request *req = dd->req;
    int n_units = dd->self ? dd->g->n_groups : req->n_query;
    int n_groups = dd->g->n_groups;
    int *todo = malloc((size_t)n_units * sizeof(int));
    int *doubt = malloc((size_t)n_units * sizeof(int));
    if (!todo || !doubt) {
        free(todo);
        free(doubt);
        snprintf(report->message, sizeof report->message,
                 "out of host memory for the copies' groups");
        return KNN_E_NOMEM;
    }
    for (int t = 0; t < n_units; t++) todo[t] = t;
    int n_todo = n_units, first = 1;
    int k_u = req->k + dd->self < n_groups ? req->k + dd->self : n_groups;
    knn_status st = KNN_OK;
    while (n_todo > 0 && st == KNN_OK) {
        knn_round rd = {k_u, k_u == n_groups, NULL, NULL, NULL};
        st = knn_round_search(dd, knobs, backend, todo, n_todo, first, &rd,
                              report);
        if (st == KNN_E_NOMEM && !report->message[0])
            snprintf(report->message, sizeof report->message,
                     "out of host memory for the copies' lists");
        if (st == KNN_OK && first)
            st = knn_result_allocate(out, report->message,
                                     sizeof report->message);
        if (st == KNN_OK)
            st = knn_round_expand(dd, &rd, todo, n_todo, out, doubt, report);
        knn_round_free(&rd);
        int kept = 0;
        for (int t = 0; t < n_todo; t++)
            if (doubt[t]) todo[kept++] = todo[t];
        n_todo = kept;
        first = 0;
        k_u = k_u < n_groups / 2 ? 2 * k_u : n_groups;
    }
    free(todo);
    free(doubt);
    return st;
}

knn_status knn_dedup_search(const knn_request *req, const knn_knobs *knobs,
                            knn_backend backend, knn_result *out,
                            knn_report *report, int *done)
{
    *done = 0;
    double started = knn_seconds();
    knn_groups g;
    if (knn_groups_build(req->ref, req->p, req->n_ref, req->threads, &g) !=
        KNN_OK)
        return KNN_OK; /* the plain search needs no groups */
    if (knobs->duplicates != KNN_DUPLICATES_ONCE &&
        g.n_groups > KNN_DEDUP_KEEP * req->n_ref) {
        knn_groups_free(&g);
        return KNN_OK;
    }
    size_t p = (size_t)req->p;
    double *distinct = malloc((size_t)g.n_groups * p * sizeof(double));
    if (!distinct) {
        knn_groups_free(&g);
        return KNN_OK;
    }
    for (int c = 0; c < g.n_groups; c++)
        memcpy(distinct + (size_t)c * p, req->ref + (size_t)g.rep[c] * p,
               p * sizeof(double));
    double grouping = knn_seconds() - started;
    knn_dedup dd = {req, &g, req->query == NULL, distinct};
    knn_status st = knn_dedup_rounds(&dd, knobs, backend, out, report);
    free(distinct);
    if (st == KNN_OK) {
        size_t used = strlen(report->precision);
        snprintf(report->precision + used, sizeof report->precision - used,
                 " (copies searched once: %d distinct of %d nodes)",
                 g.n_groups, req->n_ref);
        report->seconds_prepare += grouping;
        *done = 1;
    }
    knn_groups_free(&g);
    return st;
}
