/*
 * knn_cpu.c: the CPU backend. Plan -> tiles -> merge:
 *   for each tile of query nodes, for each tile of reference nodes, the
 *   tile's scores are filled (one BLAS product of the fast vectors, or, for
 *   Manhattan, the canonical keys computed directly) and offered to the
 *   nodes' candidate pools (knn_pool.c) in parallel; when a query tile has
 *   seen every reference, its pools are re-ranked with the canonical keys of
 *   knn_exact.h and written out.
 * Products run on the cheapest rung of the precision policy first (float32
 * BLAS, whose proven margins cover its rounding), and climb to float64 BLAS
 * for the rest of the search once a row tile's candidates show the margin
 * is too wide for the data (knn_rung_too_wide); the request can force
 * either. Distance pools also bound their candidates by their own node's
 * neighbourhood (knn_dist_row_bound), so nodes at very different levels
 * do not widen each other's margins.
 * Where the BLAS can be held to one thread, each thread multiplies its own
 * rows against a stretch of columns at a time and scans the products while
 * they are in its cache (streamed). A self search of many features also
 * uses the symmetry of the metric: a row tile only meets the columns from
 * its own first node on, and each score also goes to the pool of the
 * column node, which halves the arithmetic. That needs a pool for every
 * node at once, so it is used when those fit in the memory budget.
 * Streamed and shared, the threads take turns over the columns so that no
 * two of them offer to one pool at once (knn_cpu_share_rounds).
 * Memory is the input, O(n) per-node numbers, the tile and the fast vectors
 * of its rows and columns (formed as the tile needs them), and the pools;
 * no copy of the whole input (knn_prepare.h), and never the n x n matrix.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "knn_backend.h"
#include "knn_blas.h"
#include "knn_cpu.h"
#include "knn_exact.h"
#include "knn_pool.h"
#include "knn_prepare.h"
#include "knn_threads.h"

#define KNN_CPU_DEFAULT_BYTES (64.0 * 1024 * 1024)
/* Share of the budget the pools of a shared search may take: the rest
 * holds fast vectors, a column block at a time. */
#define KNN_CPU_SHARE_POOLS 0.75
/* Few, large tiles: where the BLAS runs on its own threads, each call ends
 * with them spinning for work, which steals cores from the parallel scan
 * that follows it (knn_blas.c holds OpenBLAS to one thread for that). */
#define KNN_CPU_MIN_ROW_TILE 256.0
#define KNN_CPU_MAX_ROW_TILE 4096.0
/* Work per tile and thread bounds how long Ctrl-C waits: about 0.1 s of
 * float32 products (0.2 s of float64) on one AVX-512 core, on one thread
 * as on many (a forked child runs on one). Scanning a score costs about
 * as much as this many of its products (a streamed 50000 x 50 graph
 * spends twice as long scanning as multiplying). */
#define KNN_CPU_PRODUCT_WORK 4e9
#define KNN_CPU_SCAN_WORK 64.0
/* An offer a pool takes (a heap update and its cache misses) costs about
 * as much as this many products: with large k, most of a row's first
 * offers are taken, and a tile planned by its products alone runs far
 * longer between polls than KNN_CPU_PRODUCT_WORK says. */
#define KNN_CPU_TAKE_WORK 4000.0
/* Features from which a self search shares products (knn_cpu_plan). */
#define KNN_CPU_SHARE_MIN_FEATURES 16
/* A row tile's re-rank runs in parts of about this much work per thread
 * (a candidate costs its key, p steps, and its share of the sort),
 * between which Ctrl-C is polled: with large k, one tile's re-rank is
 * long (the interrupt tests of test-knnSearch.R hold it to a second). */
#define KNN_CPU_RERANK_WORK 2e7
#define KNN_CPU_RERANK_SORT 16.0
#define KNN_CPU_DIRECT_WORK 5e7

/* Fast vectors of a block of nodes, formed when a tile needs them
 * (knn_nodes_fast): the columns' block is formed once per row tile, or
 * once for the whole search where one block holds every reference. */
typedef struct {
    void *values;  /* p x cap, float64 or float32 */
    int first, count, fp32;  /* what values holds; count 0: nothing */
} knn_fast_block;

typedef struct {
    const knn_request *req;
    knn_space space;
    knn_nodes ref, query_nodes;
    const knn_nodes *query;  /* &ref for a self search */
    int self;
    knn_score_kind score;    /* how tile values become fast scores */
    knn_precision rung;      /* products of the next tile: FP32 or FP64 */
    int adaptive;            /* may still climb from FP32 to FP64 */
    int climbed;             /* did */
    int tile_fp32;           /* the tile holds float32 products */
    int streamed;            /* each thread multiplies its rows against a
                                stretch of columns at a time and scans it
                                from the cache: no whole tile */
    void *scratch;           /* streamed: one stretch of products per
                                thread, KNN_CPU_STRETCH values each */
    float *halves;           /* distances: knn_cpu_halves, per node */
    int blas_before;         /* > 0: the BLAS is held to one thread (and
                                had this many, knn_blas_release) */
    int symmetric;           /* self search sharing each score both ways */
    int n_query;
    int threads;
    double budget;           /* bytes the tiles may take (knn_cpu_budget) */
    int row_tile, col_tile;
    void *tile;              /* col_tile x row_tile values: double, or
                                float where tile_fp32; NULL if streamed */
    knn_fast_block ref_fast, query_fast;  /* fast vectors of the tile's
                                             columns and rows */
    knn_pool *pools;         /* one per node when symmetric, else per row */
    knn_cand *pool_items;    /* the pools' first entries, one allocation */
    double *pool_best;       /* the pools' k best scores, one allocation */
    double *column_bound;    /* symmetric, not streamed: col_tile pool */
    float *column_floor;     /* bounds and closeness floors, scratch */
    float *pool_floor;       /* each pool's closeness floor (knn_cpu_floor) */
    double *pool_floored;    /* the bound it is of (NaN: none since reset) */
    int n_pools;
    double seconds_rerank;   /* spent in knn_cpu_finish, all row tiles */
} knn_cpu;

/* Rows of a tile per task where each thread multiplies its own rows:
 * enough for an efficient product, few enough to stay in the cache; a
 * streamed search multiplies them against this many columns at a time,
 * whose products (256 KB in float32) are scanned from the cache. A shared
 * search multiplies up to KNN_CPU_SHARE_ROWS rows at once: the BLAS packs
 * each stretch of columns once per call, so more rows share that cost
 * (512 KB of float32 products, still within a core's 1 MB L2 here). */
#define KNN_CPU_ROWS_PER_TASK 128
#define KNN_CPU_COLS_PER_TASK 512
#define KNN_CPU_SHARE_ROWS 256
#define KNN_CPU_STRETCH (KNN_CPU_SHARE_ROWS * KNN_CPU_COLS_PER_TASK)

/* A shared row tile multiplies its own block of columns whole, both
 * halves: it is kept to this fraction of the nodes (3% more products),
 * but gives each thread at least one task's rows. */
#define KNN_CPU_SHARED_DIAGONAL 32.0
static double knn_cpu_shared_rows(const knn_cpu *cpu)
{
    return fmax(cpu->req->n_ref / KNN_CPU_SHARED_DIAGONAL,
                (double)cpu->threads * KNN_CPU_ROWS_PER_TASK);
}

/* Tile shape from the memory budget, which holds the tile, the fast
 * vectors of its columns and rows (p values each, where the search
 * multiplies) and the pools of a search that shares products: as many
 * reference columns as leave room for a useful row tile, then as many rows
 * as memory and the work bound allow. A streamed search has no tile, so
 * the budget goes to the fast vectors alone. */
/* Under an address-space limit (ulimit -v), the share of what the limit
 * leaves, less the threads' stacks and BLAS buffers, that the tiles may
 * take: the rest is for the result, which R allocates after the search,
 * and for R itself. */
#define KNN_CPU_LIMIT_SHARE 0.5

/* Bytes the search's tiles may take: the request's budget (or the
 * default), shrunk to what an address-space limit leaves once the nodes
 * are prepared. A budget too small for the smallest tile fails its
 * allocation, which then names what to lower. */
static double knn_cpu_budget(const knn_cpu *cpu)
{
    const knn_request *req = cpu->req;
    double bytes = req->memory_bytes > 0 ? req->memory_bytes
                                         : KNN_CPU_DEFAULT_BYTES;
    double room = KNN_CPU_LIMIT_SHARE *
        (knn_address_space_left() -
         knn_threads_reserve(cpu->threads, knn_uses_product(req->metric)));
    return room < bytes ? fmax(room, 0.0) : bytes;
}

static void knn_cpu_plan(knn_cpu *cpu)
{
    const knn_request *req = cpu->req;
    int product = knn_uses_product(req->metric);
    double bytes = cpu->budget = knn_cpu_budget(cpu);
    double pool_bytes = (double)req->n_ref *
                        (KNN_POOL_FIRST_CAP(req->k) * sizeof(knn_cand) +
                         req->k * sizeof(double));
    /* Sharing each product both ways halves the products; the shared
     * scores are scanned from the cache too (knn_cpu_share_rounds), so it
     * pays from about 16 features (inst/bench/shapes.R on the CPU, 20000
     * nodes of 8, 32 and 50 features). Sharing needs a pool for every
     * node, within KNN_CPU_SHARE_POOLS of the budget. */
    cpu->symmetric = cpu->self &&
                     pool_bytes <= KNN_CPU_SHARE_POOLS * bytes &&
                     (req->p >= KNN_CPU_SHARE_MIN_FEATURES ||
                      !product || cpu->blas_before == 0);
    cpu->streamed = product && cpu->blas_before > 0;
    if (cpu->symmetric) bytes -= pool_bytes;
    double work = cpu->threads * (product ? KNN_CPU_PRODUCT_WORK
                                          : KNN_CPU_DIRECT_WORK);
    double p = product ? req->p : 0.0;
    double row_min = cpu->streamed ? 0.0 : KNN_CPU_MIN_ROW_TILE;
    double cols = fmin(req->n_ref,
                       fmin(bytes / (8.0 * (row_min + p)),
                            cpu->streamed ? bytes / (16.0 * p) : INFINITY));
    cols = fmax(cols, fmin(req->n_ref, 64.0));
    double per_score = product ? req->p + KNN_CPU_SCAN_WORK : req->p;
    /* Offers a row's pool takes from a tile: the k first, then about k / i
     * of the i-th (random order). */
    double taken = fmin(cols, req->k * (1.0 + log(fmax(1.0, cols / req->k))));
    double rows = fmin((bytes - 8.0 * cols * p) /
                           (8.0 * ((cpu->streamed ? 0.0 : cols) + p)),
                       work / (cols * per_score + taken * KNN_CPU_TAKE_WORK));
    if (cpu->symmetric && cpu->streamed)
        rows = fmin(rows, knn_cpu_shared_rows(cpu));
    rows = fmin(fmax(rows, 64.0), KNN_CPU_MAX_ROW_TILE);
    cpu->row_tile = rows >= cpu->n_query ? cpu->n_query : (int)rows;
    cpu->col_tile = (int)cols;
    cpu->n_pools = cpu->symmetric ? req->n_ref : cpu->row_tile;
}

static void knn_cpu_free(knn_cpu *cpu)
{
    if (cpu->pools)
        for (int i = 0; i < cpu->n_pools; i++) knn_pool_free(&cpu->pools[i]);
    free(cpu->pools);
    free(cpu->pool_items);
    free(cpu->pool_best);
    free(cpu->pool_floor);
    free(cpu->pool_floored);
    free(cpu->tile);
    free(cpu->scratch);
    free(cpu->halves);
    free(cpu->ref_fast.values);
    free(cpu->query_fast.values);
    free(cpu->column_bound);
    free(cpu->column_floor);
    knn_nodes_free(&cpu->ref);
    knn_nodes_free(&cpu->query_nodes);
    knn_space_free(&cpu->space);
    knn_blas_release(cpu->blas_before);
    cpu->blas_before = 0;
}

/* The rung a search starts on: the one forced, else float32, which may
 * climb. */
static void knn_cpu_choose_rung(knn_cpu *cpu, knn_precision precision)
{
    cpu->rung = precision == KNN_PRECISION_FP64 ? KNN_PRECISION_FP64
                                                : KNN_PRECISION_FP32;
    cpu->adaptive = precision == KNN_PRECISION_AUTO &&
                    knn_uses_product(cpu->req->metric);
}

/* The largest float32 at most x. */
static float knn_f32_floor(double x)
{
    float f = (float)x;
    return (double)f > x ? nextafterf(f, -INFINITY) : f;
}

/* Beyond this many features the distance pre-test is off (knn_cpu_pretest). */
#define KNN_PRETEST_MAX_FEATURES 1048576

/* The distance test's h_j of every reference node (see knn_cpu_pretest);
 * NULL for correlations and where the test is off. */
static knn_status knn_cpu_halves(knn_cpu *cpu)
{
    if (cpu->score != KNN_SCORE_DIST || !knn_uses_product(cpu->req->metric) ||
        cpu->req->p > KNN_PRETEST_MAX_FEATURES)
        return KNN_OK;
    int n = cpu->req->n_ref;
    cpu->halves = malloc((size_t)n * sizeof(float));
    if (!cpu->halves) return KNN_E_NOMEM;
    for (int j = 0; j < n; j++)
        cpu->halves[j] = knn_f32_floor(cpu->ref.norm2[j] * 0.5 *
                                       (1.0 - 0x1p-20));
    return KNN_OK;
}

int knn_cpu_threads(const knn_request *req)
{
    int threads = knn_threads(req->threads);
    return knn_uses_product(req->metric)
        ? knn_threads_fitting(threads, KNN_BLAS_BUFFER, KNN_BLAS_SHARE)
        : threads;
}

/* What the search is: the request, its threads, its scores and its
 * first rung. */
static void knn_cpu_begin(knn_cpu *cpu, const knn_request *req,
                          int threads)
{
    cpu->req = req;
    cpu->self = req->query == NULL;
    cpu->n_query = cpu->self ? req->n_ref : req->n_query;
    cpu->threads = threads;
    cpu->score = knn_score_of(req->metric);
    knn_cpu_choose_rung(cpu, req->precision);
}

knn_status knn_cpu_prepare_nodes(const knn_request *req, int threads,
                                 knn_space *space, knn_nodes *ref,
                                 knn_nodes *query)
{
    knn_status st = knn_space_init(space, req);
    if (st == KNN_OK)
        st = knn_nodes_prepare(ref, space, req->ref, req->n_ref, 1, 1,
                               threads, &req->cb);
    if (st == KNN_OK && req->query)
        st = knn_nodes_prepare(query, space, req->query, req->n_query, 0, 1,
                               threads, &req->cb);
    return st;
}

/* Everything else the scan takes, once its nodes are prepared. */
static knn_status knn_cpu_setup(knn_cpu *cpu)
{
    const knn_request *req = cpu->req;
    knn_status st = knn_cpu_halves(cpu);
    if (st != KNN_OK) return st;
    cpu->query = cpu->self ? &cpu->ref : &cpu->query_nodes;

    /* One engine thread (as in a forked child, knn_threads.c) gains
     * nothing from it, and OpenBLAS's pool in a forked child is best left
     * as OpenBLAS's own fork handler made it. */
    if (knn_uses_product(req->metric) && cpu->threads > 1)
        cpu->blas_before = knn_blas_hold_one_thread();
    knn_cpu_plan(cpu);
    size_t first_cap = KNN_POOL_FIRST_CAP(req->k);
    cpu->pools = calloc((size_t)cpu->n_pools, sizeof(knn_pool));
    cpu->pool_items = malloc((size_t)cpu->n_pools * first_cap *
                             sizeof(knn_cand));
    cpu->pool_best = malloc((size_t)cpu->n_pools * req->k * sizeof(double));
    cpu->pool_floor = malloc((size_t)cpu->n_pools * sizeof(float));
    cpu->pool_floored = malloc((size_t)cpu->n_pools * sizeof(double));
    if (!cpu->pools || !cpu->pool_items || !cpu->pool_best ||
        !cpu->pool_floor || !cpu->pool_floored)
        return KNN_E_NOMEM;
    for (int i = 0; i < cpu->n_pools; i++) cpu->pool_floored[i] = NAN;
    for (int i = 0; i < cpu->n_pools; i++)
        knn_pool_init(&cpu->pools[i], req->k, req->metric,
                      cpu->space.scale_exp, cpu->pool_items + i * first_cap,
                      cpu->pool_best + (size_t)i * req->k);
    if (cpu->streamed) {
        cpu->scratch = malloc((size_t)cpu->threads * KNN_CPU_STRETCH *
                              sizeof(double));
        if (!cpu->scratch) return KNN_E_NOMEM;
    } else {
        size_t cells = (size_t)cpu->row_tile * cpu->col_tile;
        cpu->tile = malloc(cells * sizeof(double));
        if (!cpu->tile) return KNN_E_NOMEM;
    }
    if (knn_uses_product(req->metric)) {
        size_t width = (size_t)req->p * sizeof(double);
        cpu->ref_fast.values = malloc(width * cpu->col_tile);
        cpu->query_fast.values = malloc(width * cpu->row_tile);
        if (!cpu->ref_fast.values || !cpu->query_fast.values)
            return KNN_E_NOMEM;
    }
    if (cpu->symmetric && !cpu->streamed) {
        cpu->column_bound = malloc((size_t)cpu->col_tile * sizeof(double));
        cpu->column_floor = malloc((size_t)cpu->col_tile * sizeof(float));
        if (!cpu->column_bound || !cpu->column_floor) return KNN_E_NOMEM;
    }
    /* What the threads take once the search runs must fit now: OpenBLAS
     * retries a buffer that the limit refuses for ever, where a failed
     * allocation here is an error that names what to lower. */
    return knn_threads_reserve_fits(cpu->threads,
                                    knn_uses_product(req->metric))
        ? KNN_OK : KNN_E_NOMEM;
}

/* Rounding units of the current rung's inputs and sums (knn_exact.h). */
static double knn_cpu_unit_in(const knn_cpu *cpu)
{
    return cpu->rung == KNN_PRECISION_FP32 ? KNN_U32 : 0.0;
}

static double knn_cpu_unit_acc(const knn_cpu *cpu)
{
    return cpu->rung == KNN_PRECISION_FP32 ? KNN_U32 : KNN_U64;
}

static double knn_cpu_tiny(const knn_cpu *cpu)
{
    return cpu->rung == KNN_PRECISION_FP32 ? KNN_TINY32 : KNN_TINY64;
}

/* Bound on |fast score - canonical key| for query node qi, in score units. */
static double knn_cpu_margin(const knn_cpu *cpu, int qi)
{
    const knn_space *sp = &cpu->space;
    if (!knn_uses_product(sp->metric)) return 0.0;
    double unit_in = knn_cpu_unit_in(cpu), unit_acc = knn_cpu_unit_acc(cpu);
    double tiny = knn_cpu_tiny(cpu);
    if (knn_is_correlation(sp->metric))
        return knn_margin_corr(sp->p, unit_in, unit_acc, tiny, sp->kappa);
    return knn_margin_dist(sp->p, unit_in, unit_acc, tiny,
                           sqrt(cpu->query->norm2[qi]), sp->norm_max);
}

static double knn_cpu_key(const knn_cpu *cpu, int qi, int rj)
{
    return knn_nodes_key(&cpu->space, cpu->query, qi, &cpu->ref, rj);
}

/* What results are ordered by (then by index): the reported distance. */
static double knn_cpu_order_value(const void *ctx, int qi, int rj)
{
    const knn_cpu *cpu = ctx;
    return knn_key_distance(cpu->space.metric, knn_cpu_key(cpu, qi, rj));
}

static void knn_cpu_reset_pool(const knn_cpu *cpu, knn_pool *pool, int qi)
{
    knn_pool_reset(pool, qi, knn_cpu_margin(cpu, qi), knn_cpu_order_value,
                   cpu);
    cpu->pool_floored[pool - cpu->pools] = NAN;
    if (cpu->score == KNN_SCORE_DIST)
        knn_pool_bound_by_row(pool, sqrt(cpu->query->norm2[qi]),
                              knn_margin_dist_unit(cpu->space.p,
                                                   knn_cpu_unit_in(cpu),
                                                   knn_cpu_unit_acc(cpu)),
                              knn_margin_floor(cpu->space.p,
                                               knn_cpu_tiny(cpu)));
}

static knn_pool *knn_cpu_pool(const knn_cpu *cpu, int node, int q0)
{
    return &cpu->pools[cpu->symmetric ? node : node - q0];
}

/* Makes block hold the fast vectors of nodes [first, first + count) on
 * the current rung, unless it does already, and returns where they start.
 * A new block is filled to its capacity `cap` (nodes from `first` on), so
 * the columns of a self search's later row tiles, which start further on,
 * are mostly found in it. */
static const void *knn_cpu_form_fast(const knn_cpu *cpu,
                                     const knn_nodes *nodes, int first,
                                     int count, int cap,
                                     knn_fast_block *block)
{
    int fp32 = cpu->rung == KNN_PRECISION_FP32;
    size_t width = (size_t)cpu->space.p * (fp32 ? sizeof(float)
                                                : sizeof(double));
    int held = block->fp32 == fp32 && first >= block->first &&
               first + count <= block->first + block->count;
    if (!held) {
        block->first = first;
        block->count = nodes->n - first < cap ? nodes->n - first : cap;
        block->fp32 = fp32;
        knn_nodes_fast(&cpu->space, nodes, first, block->count, fp32,
                       block->values, cpu->threads);
    }
    return (const char *)block->values + (first - block->first) * width;
}

/* Dot products of nr row nodes' fast vectors (rows) with nc column
 * nodes' (cols), from knn_cpu_form_fast, on the current rung: one BLAS
 * call into out, nc x nr (row i's values contiguous). */
static void knn_cpu_products(const knn_cpu *cpu, const void *cols,
                             const void *rows, int nr, int nc, void *out)
{
    int p = cpu->space.p;
    if (cpu->tile_fp32) knn_sgemm_tn(nc, nr, p, cols, rows, out);
    else knn_gemm_tn(nc, nr, p, cols, rows, out);
}

/* Where value `offset` of an array of the current rung's values (fast
 * vectors, products) is. */
static void *knn_cpu_values_at(const knn_cpu *cpu, const void *values,
                               size_t offset)
{
    size_t size = cpu->tile_fp32 ? sizeof(float) : sizeof(double);
    return (char *)values + offset * size;
}

/* Manhattan's tile: the canonical keys themselves. */
static void knn_cpu_direct(const knn_cpu *cpu, int q0, int nr, int c0,
                           int nc)
{
    double *tile = cpu->tile;
    #pragma omp parallel for num_threads(cpu->threads) schedule(static)
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++)
            tile[(size_t)i * nc + j] =
                knn_nodes_key(&cpu->space, cpu->query, q0 + i, &cpu->ref,
                              c0 + j);
}

/* Tiles are scanned in blocks of this many scores: a block that cannot
 * beat any pool bound (the common case once pools have filled) is rejected
 * with arithmetic the compiler vectorises, without touching the pools.
 * Whole blocks go through code inlined with this constant length, which
 * is what lets the compiler vectorise it; only a row's last block is
 * shorter. */
#define KNN_BLOCK 16

/* The float32 test runs first on groups of this many scores (a few
 * blocks), so that the mask of a group that holds none that can pass
 * (nearly all of them) is reduced to one flag once, not once a block;
 * a group that may pass is scanned block by block, as it would be
 * alone. */
#define KNN_GROUP (4 * KNN_BLOCK)

#if defined(__GNUC__)
#define KNN_INLINE static inline __attribute__((always_inline))
#else
#define KNN_INLINE static inline
#endif

/* The scans run once per score, as often as the product's multiply-adds
 * divided by p: they are built for the vector units the machine has
 * (AVX-512, AVX2, or the baseline), chosen when the package loads, since
 * R builds packages for the baseline x86-64 only. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__clang__)
#define KNN_SCAN static __attribute__((target_clones("avx512f", "avx2", \
                                                     "default")))
#else
#define KNN_SCAN static
#endif

/* Values [at, at + n) of a tile (tile_fp32: float32 products) as
 * float64. */
KNN_INLINE void knn_tile_values(const knn_cpu *cpu, const void *tile,
                                size_t at, int n, double *g)
{
    if (cpu->tile_fp32) {
        const float *t = (const float *)tile + at;
        for (int j = 0; j < n; j++) g[j] = t[j];
    } else {
        const double *t = (const double *)tile + at;
        for (int j = 0; j < n; j++) g[j] = t[j];
    }
}

/* Fast scores (smaller is closer) of one block from its tile values g, as
 * knn_score_kind defines them (base, add: squared norms of the two nodes
 * for distances). */
KNN_INLINE void knn_block_scores(knn_score_kind kind, double base,
                                 const double *add, const double *g, int n,
                                 double *s)
{
    switch (kind) {
    case KNN_SCORE_IDENT:
        for (int j = 0; j < n; j++) s[j] = g[j];
        break;
    case KNN_SCORE_NEGABS:
        for (int j = 0; j < n; j++) s[j] = -fabs(g[j]);
        break;
    case KNN_SCORE_NEG:
        for (int j = 0; j < n; j++) s[j] = -g[j];
        break;
    case KNN_SCORE_DIST:
        for (int j = 0; j < n; j++) s[j] = base + add[j] - 2.0 * g[j];
    }
}

KNN_INLINE int knn_block_hits(const double *s, int n, double bound)
{
    int hit = 0;
    for (int j = 0; j < n; j++) hit |= s[j] <= bound;
    return hit;
}

/* Squared norms for the distance form, NULL for the others. */
static const double *knn_cpu_norms(const knn_nodes *nodes, int first)
{
    return nodes->norm2 ? nodes->norm2 + first : NULL;
}

static double knn_cpu_norm(const knn_nodes *nodes, int node)
{
    return nodes->norm2 ? nodes->norm2[node] : 0.0;
}

/* Most blocks of a float32 tile hold no score that can pass, so a block
 * is tested first in float32, one subtraction and compare per product,
 * and scored in float64 only when some product may pass. The test is on
 * closeness, which grows as the score falls, against a floor below which
 * no score within the bound lies:
 *  - correlations: the negated score (exactly the product, its magnitude,
 *    or its negation) against the negated bound rounded down to float32;
 *  - distances, score (n_i + n_j) - 2 g: the product less h_j, the
 *    column's squared norm halved, less 2^-20 of it (knn_cpu_halves),
 *    against (n_i - bound) / 2 less 2^-22 n_i, rounded down. The roundings
 *    of the score in float64 and of the test in float32 are within those
 *    shrinkages (both relative to the norms, as |g| <= n_i + n_j, and one
 *    float32 unit of underflow), so every score within the bound passes.
 *    A shared search tests a column's pool the same way, roles swapped.
 * Where p is beyond 2^20 features the products' own error could exceed
 * |g| <= n_i + n_j, and distances are scored in float64 at once. */
static int knn_cpu_pretest(const knn_cpu *cpu)
{
    return cpu->tile_fp32 && (cpu->score != KNN_SCORE_DIST ||
                              cpu->halves != NULL);
}

/* Closeness floor of a pool's bound, its node's squared norm norm2 (for
 * distances). */
static float knn_cpu_floor(const knn_cpu *cpu, double norm2, double bound)
{
    if (cpu->score != KNN_SCORE_DIST) return knn_f32_floor(-bound);
    return knn_f32_floor((norm2 - bound) * 0.5 - 0x1p-22 * norm2 -
                         0x1p-40 * fabs(bound) - 0x1p-148);
}

/* The closeness floor of a pool's current bound, its node's squared norm
 * norm2: computed again only when the bound has moved since (the scans
 * ask at every stretch of every row and column, the bound moves far less
 * often). A pool's node, and so norm2, stays until its reset, which
 * forgets the floor. */
static float knn_cpu_pool_floor(const knn_cpu *cpu, const knn_pool *pool,
                                double norm2)
{
    size_t i = (size_t)(pool - cpu->pools);
    if (cpu->pool_floored[i] == pool->bound) return cpu->pool_floor[i];
    float floor = knn_cpu_floor(cpu, norm2, pool->bound);
    cpu->pool_floor[i] = floor;
    cpu->pool_floored[i] = pool->bound;
    return floor;
}

/* Whether some product t[0..n) of a float32 tile may be as close as its
 * row's floor (for distances, less the columns' halves[j]). Each kind has
 * its own loop, with no load that depends on the kind, so that the
 * compiler vectorises it. */
KNN_INLINE int knn_row_may_pass(knn_score_kind kind, const float *t, int n,
                                float floor, const float *halves)
{
    int hit = 0;
    switch (kind) {
    case KNN_SCORE_NEG:
        for (int j = 0; j < n; j++) hit |= t[j] >= floor;
        break;
    case KNN_SCORE_NEGABS:
        for (int j = 0; j < n; j++) hit |= fabsf(t[j]) >= floor;
        break;
    case KNN_SCORE_DIST:
        for (int j = 0; j < n; j++) hit |= t[j] - halves[j] >= floor;
        break;
    case KNN_SCORE_IDENT:
        for (int j = 0; j < n; j++) hit |= -t[j] >= floor;
    }
    return hit;
}

/* The same for the columns' pools: product j against floors[j] (for
 * distances, less the row's half). */
KNN_INLINE int knn_columns_may_pass(knn_score_kind kind, const float *t,
                                    int n, const float *floors, float half)
{
    int hit = 0;
    switch (kind) {
    case KNN_SCORE_NEG:
        for (int j = 0; j < n; j++) hit |= t[j] >= floors[j];
        break;
    case KNN_SCORE_NEGABS:
        for (int j = 0; j < n; j++) hit |= fabsf(t[j]) >= floors[j];
        break;
    case KNN_SCORE_DIST:
        for (int j = 0; j < n; j++) hit |= t[j] - half >= floors[j];
        break;
    case KNN_SCORE_IDENT:
        for (int j = 0; j < n; j++) hit |= -t[j] >= floors[j];
    }
    return hit;
}

/* Offers one block of a row, reference nodes [c, c + n) at offset `at`
 * of tile, to the row's pool, skipping `itself`; *floor is the closeness
 * floor of the pool's bound, kept current. */
KNN_INLINE int knn_cpu_offer_block(const knn_cpu *cpu, const void *tile,
                                   knn_pool *pool, float *floor, double base,
                                   int itself, size_t at, int c, int n)
{
    if (knn_cpu_pretest(cpu) &&
        !knn_row_may_pass(cpu->score, (const float *)tile + at, n, *floor,
                          cpu->halves ? cpu->halves + c : NULL))
        return 0;
    double g[KNN_BLOCK], s[KNN_BLOCK];
    knn_tile_values(cpu, tile, at, n, g);
    knn_block_scores(cpu->score, base, knn_cpu_norms(&cpu->ref, c), g, n, s);
    if (!knn_block_hits(s, n, pool->bound)) return 0;
    int failed = 0;
    for (int j = 0; j < n; j++)
        if (s[j] <= pool->bound && c + j != itself)
            failed |= knn_pool_offer(pool, s[j], c + j);
    *floor = knn_cpu_pool_floor(cpu, pool, base);
    return failed;
}

/* Offers query node qi (of the row tile from q0) the scores of reference
 * nodes [c0, c0 + nc), whose values start at `row` of tile; itself
 * excluded. */
KNN_SCAN int knn_cpu_offer_row(const knn_cpu *cpu, const void *tile,
                               size_t row, int q0, int qi, int c0, int nc)
{
    knn_pool *pool = knn_cpu_pool(cpu, qi, q0);
    double base = knn_cpu_norm(cpu->query, qi);
    float floor = knn_cpu_pool_floor(cpu, pool, base);
    int itself = cpu->self ? qi : -1;
    int failed = 0, j0 = 0;
    for (; j0 + KNN_GROUP <= nc; j0 += KNN_GROUP) {
        if (knn_cpu_pretest(cpu) &&
            !knn_row_may_pass(cpu->score, (const float *)tile + row + j0,
                              KNN_GROUP, floor,
                              cpu->halves ? cpu->halves + c0 + j0 : NULL))
            continue;
        for (int b = 0; b < KNN_GROUP; b += KNN_BLOCK)
            failed |= knn_cpu_offer_block(cpu, tile, pool, &floor, base,
                                          itself, row + j0 + b,
                                          c0 + j0 + b, KNN_BLOCK);
    }
    for (; j0 + KNN_BLOCK <= nc; j0 += KNN_BLOCK)
        failed |= knn_cpu_offer_block(cpu, tile, pool, &floor, base, itself,
                                      row + j0, c0 + j0, KNN_BLOCK);
    if (j0 < nc)
        failed |= knn_cpu_offer_block(cpu, tile, pool, &floor, base, itself,
                                      row + j0, c0 + j0, nc - j0);
    return failed;
}

/* The bounds of a stretch of column pools, read once per stretch and kept
 * current by its offers: as they are, and as closeness floors for the
 * float32 test (knn_cpu_floor). */
typedef struct {
    double *bound;
    float *floor;
} knn_column_bounds;

/* Symmetric mode: offers one block of row node qi's tile values, column
 * nodes [c, c + n) at tile offset `at`, to those columns' pools, whose
 * bounds the caller keeps in bounds from bounds[0] on. */
KNN_INLINE int knn_cpu_offer_to_columns(const knn_cpu *cpu, const void *tile,
                                        double base, size_t at, int c,
                                        int qi, knn_column_bounds bounds,
                                        int n)
{
    double *bound = bounds.bound;
    if (knn_cpu_pretest(cpu) &&
        !knn_columns_may_pass(cpu->score, (const float *)tile + at, n,
                              bounds.floor,
                              cpu->halves ? cpu->halves[qi] : 0.0f))
        return 0;
    double g[KNN_BLOCK], s[KNN_BLOCK];
    knn_tile_values(cpu, tile, at, n, g);
    knn_block_scores(cpu->score, base, knn_cpu_norms(&cpu->ref, c), g, n, s);
    int hit = 0;
    for (int j = 0; j < n; j++) hit |= s[j] <= bound[j];
    if (!hit) return 0;
    int failed = 0;
    for (int j = 0; j < n; j++) {
        if (!(s[j] <= bound[j])) continue;
        knn_pool *pool = &cpu->pools[c + j];
        failed |= knn_pool_offer(pool, s[j], qi);
        bound[j] = pool->bound;
        bounds.floor[j] = knn_cpu_pool_floor(cpu, pool,
                                             knn_cpu_norm(&cpu->ref, c + j));
    }
    return failed;
}

/* bounds[from..]: the bounds in `bounds` of the column from `from` on. */
static knn_column_bounds knn_column_bounds_from(knn_column_bounds bounds,
                                                int from)
{
    knn_column_bounds rest = {bounds.bound + from, bounds.floor + from};
    return rest;
}

/* Symmetric mode: offers the column nodes [c0 + a, c0 + b) of `tile`
 * (row nodes [q0, q0 + nr) against columns [c0, c0 + nc)) their row
 * nodes. The tile is read row by row, each row's stretch contiguous, so
 * memory streams as in the row pass; `bounds` has room for b - a. */
KNN_SCAN int knn_cpu_offer_column_range(const knn_cpu *cpu, const void *tile,
                                        int q0, int nr, int c0, int nc,
                                        int a, int b,
                                        knn_column_bounds bounds)
{
    for (int j = a; j < b; j++) {
        const knn_pool *pool = &cpu->pools[c0 + j];
        bounds.bound[j - a] = pool->bound;
        bounds.floor[j - a] = knn_cpu_pool_floor(
            cpu, pool, knn_cpu_norm(&cpu->ref, c0 + j));
    }
    int failed = 0;
    for (int i = 0; i < nr; i++) {
        double base = knn_cpu_norm(&cpu->ref, q0 + i);
        size_t row = (size_t)i * nc;
        float half = cpu->halves ? cpu->halves[q0 + i] : 0.0f;
        int j0 = a;
        for (; j0 + KNN_GROUP <= b; j0 += KNN_GROUP) {
            if (knn_cpu_pretest(cpu) &&
                !knn_columns_may_pass(cpu->score,
                                      (const float *)tile + row + j0,
                                      KNN_GROUP, bounds.floor + (j0 - a),
                                      half))
                continue;
            for (int g = 0; g < KNN_GROUP; g += KNN_BLOCK)
                failed |= knn_cpu_offer_to_columns(
                    cpu, tile, base, row + j0 + g, c0 + j0 + g, q0 + i,
                    knn_column_bounds_from(bounds, j0 + g - a), KNN_BLOCK);
        }
        for (; j0 + KNN_BLOCK <= b; j0 += KNN_BLOCK)
            failed |= knn_cpu_offer_to_columns(
                cpu, tile, base, row + j0, c0 + j0, q0 + i,
                knn_column_bounds_from(bounds, j0 - a), KNN_BLOCK);
        if (j0 < b)
            failed |= knn_cpu_offer_to_columns(
                cpu, tile, base, row + j0, c0 + j0, q0 + i,
                knn_column_bounds_from(bounds, j0 - a), b - j0);
    }
    return failed;
}

/* Rows [*a, *b) of a row tile of nr rows that task t multiplies. */
static void knn_cpu_task_rows(int t, int nr, int *a, int *b)
{
    *a = t * KNN_CPU_ROWS_PER_TASK;
    *b = *a + KNN_CPU_ROWS_PER_TASK < nr ? *a + KNN_CPU_ROWS_PER_TASK : nr;
}

/* Streamed: rows [a, b) of the row tile from q0 (fast vectors `rows`,
 * at most KNN_CPU_SHARE_ROWS) against the columns [ja, jb) of the column
 * block from c0 (`cols`), in stretches multiplied into `scratch` and
 * offered to the rows' pools while they are in the cache. */
static int knn_cpu_stream_rows(const knn_cpu *cpu, const void *cols,
                               const void *rows, int q0, int a, int b,
                               int c0, int ja, int jb, void *scratch)
{
    int failed = 0, p = cpu->space.p;
    for (int j0 = ja; j0 < jb; j0 += KNN_CPU_COLS_PER_TASK) {
        int w = jb - j0 < KNN_CPU_COLS_PER_TASK ? jb - j0
                                                : KNN_CPU_COLS_PER_TASK;
        knn_cpu_products(cpu, knn_cpu_values_at(cpu, cols, (size_t)j0 * p),
                         knn_cpu_values_at(cpu, rows, (size_t)a * p), b - a,
                         w, scratch);
        for (int i = a; i < b; i++)
            failed |= knn_cpu_offer_row(cpu, scratch, (size_t)(i - a) * w,
                                        q0, q0 + i, c0 + j0, w);
    }
    return failed;
}

/* Streamed and shared: rows [a, b) of the row tile from q0 against the
 * columns [ja, jb) of the column block from c0, none of them a row of the
 * tile, each score offered to both nodes. The product is taken with the
 * roles swapped (the column stretch as its rows), because the BLAS packs
 * the first operand of a transposed product at several times the cost
 * per value of the second, and the stretch is the longer one: each row's
 * scores then lie along the stretch's columns, and the two offers swap
 * too. */
static int knn_cpu_share_rows(const knn_cpu *cpu, const void *cols,
                              const void *rows, int q0, int a, int b,
                              int c0, int ja, int jb, void *scratch)
{
    int failed = 0, p = cpu->space.p, nr = b - a;
    double bound[KNN_CPU_SHARE_ROWS];
    float floor[KNN_CPU_SHARE_ROWS];
    knn_column_bounds bounds = {bound, floor};
    for (int j0 = ja; j0 < jb; j0 += KNN_CPU_COLS_PER_TASK) {
        int w = jb - j0 < KNN_CPU_COLS_PER_TASK ? jb - j0
                                                : KNN_CPU_COLS_PER_TASK;
        knn_cpu_products(cpu, knn_cpu_values_at(cpu, rows, (size_t)a * p),
                         knn_cpu_values_at(cpu, cols, (size_t)j0 * p), w, nr,
                         scratch);
        for (int j = 0; j < w; j++)
            failed |= knn_cpu_offer_row(cpu, scratch, (size_t)j * nr,
                                        c0 + j0, c0 + j0 + j, q0 + a, nr);
        failed |= knn_cpu_offer_column_range(cpu, scratch, c0 + j0, w,
                                             q0 + a, nr, 0, nr, bounds);
    }
    return failed;
}

/* Streamed: task t of a row tile of nr rows, its rows against every
 * column of the block, offered to the rows' pools. */
static int knn_cpu_stream_task(const knn_cpu *cpu, const void *cols,
                               const void *rows, int q0, int nr, int t,
                               int c0, int nc, void *scratch)
{
    int a, b;
    knn_cpu_task_rows(t, nr, &a, &b);
    return knn_cpu_stream_rows(cpu, cols, rows, q0, a, b, c0, 0, nc,
                               scratch);
}

/* Where part t of `parts` of [0, n) begins: on a scan block's edge. */
static int knn_cpu_part_edge(int t, int parts, int n)
{
    if (t >= parts) return n;
    return (int)((long)n * t / parts / KNN_BLOCK) * KNN_BLOCK;
}

/* Part `t` of `parts` of [0, n), as [*a, *b): whole scan blocks but for
 * the last, so that the scans run on whole blocks. */
static void knn_cpu_part(int t, int parts, int n, int *a, int *b)
{
    *a = knn_cpu_part_edge(t, parts, n);
    *b = knn_cpu_part_edge(t + 1, parts, n);
}

/* Streamed and shared: the rows of part `t` of the row tile from q0 (nr
 * rows) against the columns [ja, jb) of the column block from c0. */
static int knn_cpu_share_part(const knn_cpu *cpu, const void *cols,
                              const void *rows, int q0, int nr, int t,
                              int c0, int ja, int jb, int to_columns)
{
    void *scratch = knn_cpu_values_at(cpu, cpu->scratch,
                                      (size_t)t * KNN_CPU_STRETCH);
    int a, b, failed = 0;
    knn_cpu_part(t, cpu->threads, nr, &a, &b);
    int chunks = (b - a + KNN_CPU_SHARE_ROWS - 1) / KNN_CPU_SHARE_ROWS;
    for (int c = 0; c < chunks; c++) {
        int i0, i1;
        knn_cpu_part(c, chunks, b - a, &i0, &i1);
        failed |= to_columns
            ? knn_cpu_share_rows(cpu, cols, rows, q0, a + i0, a + i1, c0, ja,
                                 jb, scratch)
            : knn_cpu_stream_rows(cpu, cols, rows, q0, a + i0, a + i1, c0,
                                  ja, jb, scratch);
    }
    return failed;
}

/* Streamed and shared: the row tile [q0, q0 + nr) against the column
 * block [c0, c0 + nc), c0 >= q0. Its rows are split into one part per
 * thread, and the block's columns past the row tile into as many parts;
 * in round r, thread t multiplies its rows against column part
 * (t + r) mod threads, offering each score to both nodes, so no two
 * threads offer to one pool at once. The block's columns inside the row
 * tile are rows too: their scores go to the rows alone, in round 0. */
static int knn_cpu_share_rounds(const knn_cpu *cpu, const void *cols,
                                const void *rows, int q0, int nr, int c0,
                                int nc)
{
    int parts = cpu->threads, failed = 0;
    int inside = q0 + nr - c0 < nc ? q0 + nr - c0 : nc;
    if (inside < 0) inside = 0;
    for (int r = 0; r < parts; r++) {
        #pragma omp parallel for num_threads(parts) schedule(static, 1) \
            reduction(| : failed)
        for (int t = 0; t < parts; t++) {
            if (r == 0 && inside > 0)
                failed |= knn_cpu_share_part(cpu, cols, rows, q0, nr, t, c0,
                                             0, inside, 0);
            int ja, jb;
            knn_cpu_part((t + r) % parts, parts, nc - inside, &ja, &jb);
            if (jb > ja)
                failed |= knn_cpu_share_part(cpu, cols, rows, q0, nr, t, c0,
                                             inside + ja, inside + jb, 1);
        }
    }
    return failed;
}

/* Fills the tile of query nodes [q0, q0 + nr) against reference nodes
 * [c0, c0 + nc) and offers each row its scores. Streamed (the BLAS held
 * to one thread, knn_blas.c), each thread multiplies a few rows and scans
 * them while they are in its cache; else the BLAS (or, for Manhattan, the
 * keys themselves) fills the whole tile first. */
static int knn_cpu_offer_rows(knn_cpu *cpu, int q0, int nr, int c0, int nc)
{
    int product = knn_uses_product(cpu->space.metric);
    cpu->tile_fp32 = product && cpu->rung == KNN_PRECISION_FP32;
    const void *rows = NULL, *cols = NULL;
    if (product) {
        rows = knn_cpu_form_fast(cpu, cpu->query, q0, nr, cpu->row_tile,
                                 &cpu->query_fast);
        cols = knn_cpu_form_fast(cpu, &cpu->ref, c0, nc, cpu->col_tile,
                                 &cpu->ref_fast);
    }
    int tasks = (nr + KNN_CPU_ROWS_PER_TASK - 1) / KNN_CPU_ROWS_PER_TASK;
    int failed = 0;
    if (cpu->streamed && cpu->symmetric)
        return knn_cpu_share_rounds(cpu, cols, rows, q0, nr, c0, nc);
    if (cpu->streamed) {
        #pragma omp parallel num_threads(cpu->threads) reduction(| : failed)
        {
            void *scratch = knn_cpu_values_at(cpu, cpu->scratch,
                                              (size_t)knn_thread_number() *
                                                  KNN_CPU_STRETCH);
            #pragma omp for schedule(dynamic, 1)
            for (int t = 0; t < tasks; t++)
                failed |= knn_cpu_stream_task(cpu, cols, rows, q0, nr, t,
                                              c0, nc, scratch);
        }
        return failed;
    }
    if (product) knn_cpu_products(cpu, cols, rows, nr, nc, cpu->tile);
    else knn_cpu_direct(cpu, q0, nr, c0, nc);
    #pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 8) \
        reduction(| : failed)
    for (int i = 0; i < nr; i++)
        failed |= knn_cpu_offer_row(cpu, cpu->tile, (size_t)i * nc, q0,
                                    q0 + i, c0, nc);
    return failed;
}

static knn_status knn_cpu_offer_tile(knn_cpu *cpu, int q0, int nr, int c0,
                                     int nc)
{
    int failed = knn_cpu_offer_rows(cpu, q0, nr, c0, nc);
    if (cpu->symmetric && !cpu->streamed) {
        /* Columns inside the row tile already got their scores as rows.
         * Each thread owns a stretch of the other columns (whole blocks),
         * so no two threads offer to one pool. */
        int first = q0 + nr - c0 > 0 ? q0 + nr - c0 : 0;
        int blocks = (nc - first + KNN_BLOCK - 1) / KNN_BLOCK;
        int parts = cpu->threads < blocks ? cpu->threads : blocks;
        #pragma omp parallel for num_threads(cpu->threads) \
            schedule(static, 1) reduction(| : failed)
        for (int t = 0; t < parts; t++) {
            int a = first + (int)((long)blocks * t / parts) * KNN_BLOCK;
            int b = first + (int)((long)blocks * (t + 1) / parts) * KNN_BLOCK;
            if (b > nc) b = nc;
            knn_column_bounds bounds = {cpu->column_bound + a,
                                        cpu->column_floor + a};
            failed |= knn_cpu_offer_column_range(cpu, cpu->tile, q0, nr, c0,
                                                 nc, a, b, bounds);
        }
    }
    return failed ? KNN_E_NOMEM : KNN_OK;
}

/* Re-ranks one query node's pool and writes its k neighbours into row qi
 * of the result (knn_nodes_rerank). */
static void knn_cpu_finish(const knn_cpu *cpu, knn_pool *pool, int qi,
                           knn_result *out)
{
    knn_nodes_rerank(&cpu->space, cpu->query, qi, &cpu->ref, pool,
                     cpu->n_query, out);
}

/* Goes on in float64 products once the float32 rung's candidates, `found`
 * over `rows` finished rows, are too many for the data. Pools already
 * open keep their float32 margins (the float64 scores they go on to
 * receive are closer to their keys than those margins), unless a self
 * search starts again (knn_cpu_restarts). */
static void knn_cpu_climb(knn_cpu *cpu, double found, int rows)
{
    if (!cpu->adaptive || !knn_rung_too_wide(found, rows, cpu->req->k))
        return;
    cpu->rung = KNN_PRECISION_FP64;
    cpu->adaptive = 0;
    cpu->climbed = 1;
}

/* Processes query nodes [q0, q0 + nr) against every reference tile they
 * need, then writes their neighbours. Adds their pool sizes to *pooled. */
static knn_status knn_cpu_row_tile(knn_cpu *cpu, int q0, int nr,
                                   knn_result *out, double *pooled)
{
    const knn_request *req = cpu->req;
    if (!cpu->symmetric)
        for (int i = 0; i < nr; i++)
            knn_cpu_reset_pool(cpu, &cpu->pools[i], q0 + i);

    for (int c0 = cpu->symmetric ? q0 : 0; c0 < req->n_ref;
         c0 += cpu->col_tile) {
        int nc = req->n_ref - c0 < cpu->col_tile ? req->n_ref - c0
                                                  : cpu->col_tile;
        knn_status st = knn_cpu_offer_tile(cpu, q0, nr, c0, nc);
        if (st != KNN_OK) return st;
        if (knn_interrupted(&req->cb)) return KNN_E_INTERRUPTED;
    }

    double sizes = 0.0, t0 = knn_seconds();
    for (int i0 = 0, i1; i0 < nr; i0 = i1) {
        double work = 0.0;
        for (i1 = i0; i1 < nr && work < KNN_CPU_RERANK_WORK * cpu->threads;
             i1++)
            work += knn_cpu_pool(cpu, q0 + i1, q0)->size *
                    (req->p + KNN_CPU_RERANK_SORT);
        #pragma omp parallel for num_threads(cpu->threads) \
            schedule(dynamic, 8) reduction(+ : sizes)
        for (int i = i0; i < i1; i++) {
            knn_pool *pool = knn_cpu_pool(cpu, q0 + i, q0);
            knn_cpu_finish(cpu, pool, q0 + i, out);
            sizes += pool->size + pool->compacted;
        }
        if (i1 < nr && knn_interrupted(&req->cb)) {
            cpu->seconds_rerank += knn_seconds() - t0;
            return KNN_E_INTERRUPTED;
        }
    }
    cpu->seconds_rerank += knn_seconds() - t0;
    *pooled += sizes;
    knn_cpu_climb(cpu, sizes, nr);
    return KNN_OK;
}

/* Rows of the next row tile, after one of `last` rows (0: the first).
 * A self search's first tiles offer every score to pools that are still
 * empty, so nearly all become candidates: there the work of a tile is
 * some twenty times that of a later one, and Ctrl-C waits for it. They
 * grow from KNN_CPU_FIRST_ROWS, doubling, to the planned tile. */
#define KNN_CPU_FIRST_ROWS 32
/* Pairs that a first tile holds at least (in whole KNN_CPU_FIRST_ROWS,
 * which the threads part in whole scan blocks): that short a tile stays
 * short whatever its offers, and a small search needs fewer tiles (each
 * ends in the threads' wait for the slowest and a re-rank of its own). */
#define KNN_CPU_FIRST_PAIRS 262144.0
static int knn_cpu_tile_rows(const knn_cpu *cpu, int last)
{
    if (!cpu->symmetric) return cpu->row_tile;
    int first = KNN_CPU_FIRST_ROWS *
        (int)ceil(KNN_CPU_FIRST_PAIRS / cpu->req->n_ref / KNN_CPU_FIRST_ROWS);
    int rows = last > 0 ? 2 * last : first;
    return rows < cpu->row_tile ? rows : cpu->row_tile;
}

static void knn_cpu_describe(const knn_cpu *cpu, knn_report *report)
{
    snprintf(report->device, sizeof report->device, "cpu (%d threads)",
             cpu->threads);
    const char *rung = cpu->climbed ? "fp32, then fp64"
                       : cpu->rung == KNN_PRECISION_FP32 ? "fp32" : "fp64";
    if (knn_uses_product(cpu->space.metric))
        snprintf(report->precision, sizeof report->precision,
                 "%s BLAS candidates + fp64 exact re-rank", rung);
    else
        snprintf(report->precision, sizeof report->precision,
                 "fp64 exact direct");
    report->row_tile = cpu->row_tile;
    report->col_tile = cpu->col_tile;
}

static void knn_cpu_describe_failure(const knn_cpu *cpu, knn_status st,
                                     knn_report *report)
{
    if (st == KNN_E_NOMEM)
        snprintf(report->message, sizeof report->message,
                 "out of memory on the CPU with %d threads and %.0f MB for "
                 "tiles: lower 'threads' or options(knngpu.cpu.memory)",
                 cpu->threads, cpu->budget / 1048576.0);
    else if (st == KNN_E_INTERRUPTED)
        snprintf(report->message, sizeof report->message,
                 "stopped between tiles; all memory released");
}

/* Whether a self search starts again after the climb to float64, its
 * pools emptied and opened with float64's margins: in a self search every
 * node's pool is open from the first tile on, and pools that keep
 * float32's margins keep float32's crowd of candidates to the end (999 a
 * row on inst/bench/shapes-data.R's clusters at 20000 nodes, against 10
 * in float64). Only while the rows done are a small share of the search
 * (KNN_CPU_RESTART_SHARE), which bounds what starting again costs. */
#define KNN_CPU_RESTART_SHARE 8
static int knn_cpu_restarts(knn_cpu *cpu, int climbed, int rows_done)
{
    if (!cpu->symmetric || climbed || !cpu->climbed ||
        (double)rows_done * KNN_CPU_RESTART_SHARE > cpu->n_query)
        return 0;
    for (int j = 0; j < cpu->req->n_ref; j++)
        knn_cpu_reset_pool(cpu, &cpu->pools[j], j);
    return 1;
}

/* The scan of cpu's request, its nodes prepared (else st says why not)
 * since t0: sets up, searches, reports and frees. */
static knn_status knn_cpu_run(knn_cpu *cpu, knn_status st, double t0,
                              knn_result *out, knn_report *report)
{
    const knn_request *req = cpu->req;
    if (st == KNN_OK) st = knn_cpu_setup(cpu);
    double t1 = knn_seconds();
    if (st == KNN_OK && cpu->symmetric)
        for (int j = 0; j < req->n_ref; j++)
            knn_cpu_reset_pool(cpu, &cpu->pools[j], j);
    double pooled = 0.0;
    int nr = 0;
    for (int q0 = 0; st == KNN_OK && q0 < cpu->n_query; q0 += nr) {
        int climbed = cpu->climbed;
        nr = knn_cpu_tile_rows(cpu, nr);
        if (nr > cpu->n_query - q0) nr = cpu->n_query - q0;
        st = knn_cpu_row_tile(cpu, q0, nr, out, &pooled);
        if (st == KNN_OK && knn_cpu_restarts(cpu, climbed, q0 + nr)) {
            pooled = 0.0;
            q0 = -nr; /* the loop's step makes it 0 */
            continue;
        }
        if (st == KNN_OK && req->cb.progress)
            req->cb.progress(req->cb.ctx, q0 + nr, cpu->n_query);
    }
    if (st == KNN_OK) {
        knn_cpu_describe(cpu, report);
        report->seconds_prepare = t1 - t0;
        report->seconds_rerank = cpu->seconds_rerank;
        report->seconds_search = knn_seconds() - t1 - cpu->seconds_rerank;
        report->candidates = pooled / cpu->n_query;
    } else {
        knn_cpu_describe_failure(cpu, st, report);
    }
    knn_cpu_free(cpu);
    return st;
}

knn_status knn_cpu_search(const knn_request *req, knn_result *out,
                          knn_report *report)
{
    knn_cpu cpu = {0};
    double t0 = knn_seconds();
    knn_cpu_begin(&cpu, req, knn_cpu_threads(req));
    knn_status st = knn_cpu_prepare_nodes(req, cpu.threads, &cpu.space,
                                          &cpu.ref, &cpu.query_nodes);
    return knn_cpu_run(&cpu, st, t0, out, report);
}

knn_status knn_cpu_search_prepared(const knn_request *req, int threads,
                                   knn_space space, knn_nodes ref,
                                   knn_nodes query, knn_result *out,
                                   knn_report *report)
{
    knn_cpu cpu = {0};
    double t0 = knn_seconds();
    knn_cpu_begin(&cpu, req, threads);
    cpu.space = space;
    cpu.ref = ref;
    cpu.query_nodes = query;
    return knn_cpu_run(&cpu, KNN_OK, t0, out, report);
}
