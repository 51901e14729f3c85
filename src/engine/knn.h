/*
 * knn.h: the contract of the knngpu engine (plain C11, no R headers).
 *
 * The engine finds, for every query node, the k reference nodes closest under
 * a metric, exactly: the ranking is the one the canonical float64 arithmetic
 * of knn_exact.h gives, ties at equal key broken by the smaller node index.
 * Backends (CPU here, CUDA in src/cuda) may find candidates with faster,
 * lower-precision arithmetic, but only with a proven margin, and always
 * re-rank the candidates with knn_exact.h, so every backend, tile size and
 * device count gives the same bits.
 *
 * Layout: every matrix of node features is p x n, column-major, so node j's
 * p features are contiguous at x + (size_t)j * p. Results are n_query x k,
 * column-major (R's layout: neighbour r of query i at i + r * n_query), or
 * row-major when the caller asks (at i * k + r: the order of an edge list
 * grouped by query). Node indices are 0-based unless the caller asks for
 * another base (R's 1).
 *
 * Errors: every function returns a knn_status; on failure it writes a one-line
 * reason into report->message, frees what it allocated, and leaves its inputs
 * untouched. The engine never prints, aborts or exits.
 */
#ifndef KNN_H
#define KNN_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KNN_OK = 0,
    KNN_E_INVALID,     /* bad request: k, sizes */
    KNN_E_NOMEM,       /* host or device allocation failed */
    KNN_E_INTERRUPTED, /* the interrupt callback asked to stop, or the
                          caller could not allocate the result */
    KNN_E_NOGPU,       /* no usable GPU, or built without CUDA */
    KNN_E_DEVICE,      /* a CUDA or cuBLAS call failed */
    KNN_E_NONFINITE,   /* a value is NA, NaN or Inf */
    KNN_E_DEGENERATE   /* a node the metric cannot use (constant for the
                          correlations, all zero for cosine) */
} knn_status;

/* The metrics (knn_metric) and what each is: knn_metric.h's table. */
#include "knn_metric.h"

typedef enum { KNN_BACKEND_CPU = 0, KNN_BACKEND_GPU } knn_backend;

/* How the CPU backend searches: AUTO chooses by measured cost; PRODUCTS
 * scans every pair through matrix products; TREE uses a k-d tree (distance
 * metrics only, for few features); CLUSTERS partitions the nodes and
 * multiplies residuals from the cluster centres, skipping the cluster
 * pairs that cannot hold a neighbour (Euclidean and squared Euclidean
 * only, knn_clusters.h). Every choice gives the same bits. Order matches
 * the R layer's names (R/engine.R). */
typedef enum {
    KNN_ALGO_AUTO = 0,
    KNN_ALGO_PRODUCTS,
    KNN_ALGO_TREE,
    KNN_ALGO_CLUSTERS
} knn_algorithm;

/* The GPU backend's candidate selection: CHOOSE picks by measured cost;
 * the others force one, for measurement scripts and tests: WARP and RADIX
 * select from a panel of products (cuBLAS), FUSED computes the products
 * and selects in one kernel (product metrics in TF32, k <= 128; elsewhere
 * the panel path runs), computing each pair once in a self search on one
 * device; FUSED_ROWS is FUSED with every row walking every node. The bits
 * are the same. Order matches the R layer's names (R/engine.R). */
typedef enum {
    KNN_SELECT_CHOOSE = 0,
    KNN_SELECT_FORCE_WARP,
    KNN_SELECT_FORCE_RADIX,
    KNN_SELECT_FORCE_FUSED,
    KNN_SELECT_FORCE_FUSED_ROWS
} knn_select_force;

/* The arithmetic that finds candidates (the rungs of the precision
 * policy); every rung is followed by the float64 re-rank, so the bits are
 * the same on every rung, only the time differs. AUTO starts on the
 * cheapest rung of the backend (the GPU's TF32, the CPU's float32 BLAS)
 * and climbs to the next (the GPU's split TF32, TF32X3, then float64
 * DGEMM; the CPU's float64 BLAS) for the rest of the search once a tile's
 * rows average more candidates than the re-rank can afford
 * (knn_rung_too_wide); src/cuda/knn_gpu.cuh has the GPU's detours. TF32
 * and TF32X3 exist on the GPU only: forcing them on the CPU is
 * KNN_E_INVALID. Order matches the R layer's names (R/engine.R). */
typedef enum {
    KNN_PRECISION_AUTO = 0,
    KNN_PRECISION_TF32,
    KNN_PRECISION_FP32,
    KNN_PRECISION_FP64,
    KNN_PRECISION_TF32X3
} knn_precision;

/* Whether rows that found `candidates` candidates in all, `rows` of them
 * searching for k each, are too many for the rung they ran on: past
 * 4k + 64 per row the re-rank of the extra ones (or, on the GPU, a tile
 * redone for overflowing slots) costs more than the cheaper products save;
 * the switch is measured in inst/bench/RESULTS.md ("No cliffs"). */
static inline int knn_rung_too_wide(double candidates, int rows, int k)
{
    return candidates > rows * (4.0 * k + 64.0);
}

/* Host callbacks, always called from the thread that called the engine, and
 * never from inside a parallel region. */
typedef struct {
    /* Returns nonzero when the user asked to stop; polled between tiles. */
    int (*interrupted)(void *ctx);
    /* Reports that `done` of `total` query nodes are finished. */
    void (*progress)(void *ctx, double done, double total);
    void *ctx;
} knn_callbacks;

/* Whether the user asked to stop (callbacks, which may be absent or have
 * no interrupt callback). */
static inline int knn_interrupted(const knn_callbacks *cb)
{
    return cb && cb->interrupted && cb->interrupted(cb->ctx);
}

#define KNN_MAX_DEVICES 16

typedef struct {
    knn_metric metric;
    int p;                /* features per node, >= 1 */
    int k;                /* neighbours per query, 1 <= k <= candidates */
    const double *ref;    /* p x n_ref, read only */
    int n_ref;
    const double *query;  /* p x n_query, or NULL: self search of ref, where
                             a node is never its own neighbour */
    int n_query;          /* ignored when query is NULL */
    int threads;          /* CPU threads; <= 0: the OpenMP default */
    knn_algorithm algorithm; /* CPU backend: see knn_algorithm */
    knn_precision precision; /* candidate arithmetic: see knn_precision */
    double memory_bytes;  /* budget for tiles; <= 0: backend default. On
                             the GPU, nodes past half of it stream through
                             the device in blocks (knn_stream.c) */
    double max_abs;       /* the distance metrics' power-of-two scale covers
                             at least this |value| (besides the nodes'): a
                             block of a larger search takes its scale; 0 */
    int n_devices;        /* GPU backend: devices to use; 0: all visible */
    int devices[KNN_MAX_DEVICES];
    knn_callbacks cb;
} knn_request;

/* Overrides for tests and tuning, kept apart from the request: the R
 * layer sets them from its internal options (R/engine.R), the C harness
 * from its cases; the engine never reads the environment. All zero (or a
 * NULL pointer): the engine decides everything. The bits are the same
 * whatever they say. */
typedef struct {
    knn_select_force select; /* GPU backend: see knn_select_force */
    int block_nodes;      /* > 0: nodes per side of a streamed search's
                             blocks, on either backend; 0: stream only
                             what the GPU cannot hold */
    int stage_peers;      /* GPU backend, several devices: nonzero treats
                             every other device's memory as unreadable,
                             so that shared arrays pass through staging
                             buffers (the path of GPUs without peer
                             access, on any machine) */
    int duplicates;       /* knn_duplicates: how exact copies among the
                             reference nodes are searched */
    int keep_rows_in_tiles; /* GPU backend: nonzero runs a tile again for
                               its rows past their slots rather than
                               setting them apart (the path of tiles
                               whose many rows overflow, on any data); a
                               shared walk's lost nodes go apart still */
} knn_knobs;

/* Exact copies among the reference nodes (knn_dedup.c): AUTO searches
 * the distinct nodes once where an even sample finds copies many; ONCE
 * always does; EACH never does. Order matches the R layer's names
 * (R/engine.R). */
typedef enum {
    KNN_DUPLICATES_AUTO = 0,
    KNN_DUPLICATES_ONCE,
    KNN_DUPLICATES_EACH
} knn_duplicates;

/* Caller-owned output, each n_query x k. */
typedef struct knn_result knn_result;
struct knn_result {
    int *index;        /* reference node, counted from index_base */
    double *distance;  /* metric distance, see knn_exact.h */
    double *weight;    /* similarity: r, |r|, cosine, or 1 / (1 + d) */
    int by_row;        /* 0: column-major; 1: row-major (edge order) */
    int index_base;    /* added to every node index: 0, or 1 for R */
    /* A graph's edge list (by_row, a self search) also has its sources and
     * ranks, which follow from the position alone: knn_search() writes
     * them after the search (knn_edge_ends), and a GPU search makes their
     * pages resident meanwhile. NULL otherwise. */
    int *from;
    int *rank;
    int ends_written;  /* set by a backend that wrote from and rank itself:
                          the GPU's page threads do, as they go */
    /* Set where the caller allocates the arrays above late (they are NULL
     * until then): the engine calls it once, on the calling thread and
     * never from inside a parallel region, before it writes a result
     * (knn_result_allocate). It fills the arrays and returns 0, or
     * returns nonzero where it could not (the search then stops with
     * KNN_E_INTERRUPTED: the caller holds its own reason). A GPU search
     * calls it once its devices are searching, so that what the
     * allocation costs overlaps the search: R may collect its heap first,
     * which for a large graph takes a noticeable share of the call. */
    int (*allocate)(void *ctx, knn_result *out);
    void *allocate_ctx;
};

/* Makes the caller's arrays exist where it allocates them late; a no-op
 * after the first call. Returns KNN_OK, or KNN_E_INTERRUPTED with
 * `message` (of `size` bytes) set where the caller could not allocate. */
static inline knn_status knn_result_allocate(knn_result *out, char *message,
                                             size_t size)
{
    if (!out->allocate) return KNN_OK;
    int failed = out->allocate(out->allocate_ctx, out);
    out->allocate = NULL;
    if (!failed) return KNN_OK;
    snprintf(message, size, "the caller could not allocate the result");
    return KNN_E_INTERRUPTED;
}

/* Offset of query i's neighbour r in a result of n_query x k. */
static inline size_t knn_result_at(const knn_result *out, size_t n_query,
                                   int k, size_t i, int r)
{
    return out->by_row ? i * (size_t)k + (size_t)r
                       : i + (size_t)r * n_query;
}

/* What a run did, for verbose output and result attributes. */
typedef struct {
    char message[512];      /* error reason, empty on success */
    char device[128];       /* "cpu (4 threads)" or the GPU's name(s) */
    char precision[256];    /* candidate arithmetic + exact re-rank */
    double seconds_setup;   /* GPU: stream, cuBLAS, tile buffers */
    double seconds_prepare; /* upload, ranks, normalisation */
    double seconds_search;  /* products, candidate selection */
    double seconds_rerank;  /* exact float64 re-ranking and output */
    double seconds_collect; /* GPU: results copied into the caller's arrays */
    double candidates;      /* mean candidates re-ranked per query */
    int row_tile;           /* tile shape the plan chose */
    int col_tile;
    int pairs_once;         /* GPU: the self search computed each pair of
                               nodes once (src/cuda/knn_gpu_pairs.cu) */
} knn_report;

/* Runs the search on one backend. Returns KNN_OK and fills `out`, or an error
 * with report->message set and `out` unspecified. Values that are not all
 * finite give KNN_E_NONFINITE: checked here for the CPU backend, by the GPU
 * backend as it uploads them. Nodes the metric cannot use give
 * KNN_E_DEGENERATE (a node holding non-finite values is never called
 * degenerate): checked here for the CPU backend, by the GPU backend as it
 * prepares them. The caller names the offending nodes with
 * knn_nonfinite_nodes and knn_degenerate_nodes, on that path only. */
knn_status knn_search(const knn_request *req, const knn_knobs *knobs,
                      knn_backend backend, knn_result *out,
                      knn_report *report);

/* Copies the nodes of a column-major nrow x ncol matrix into `out` in the
 * engine's layout (p x n, node-contiguous): the rows are the nodes when
 * by_rows (a transpose), else the columns (a copy). Uses up to `threads`
 * threads (knn_threads). x is left untouched; never fails. */
void knn_layout_nodes(const double *x, int nrow, int ncol, int by_rows,
                      double *out, int threads);

/* Writes into `bad` (capacity max_bad) the 0-based nodes of the p x n
 * matrix x that hold NA, NaN or Inf; returns how many there are in all.
 * Uses up to `threads` threads; never fails. */
int knn_nonfinite_nodes(const double *x, int p, int n, int *bad,
                        int max_bad, int threads);

/* Writes into `rows` (capacity max_rows) the 0-based nodes of the p x n matrix
 * x that the metric cannot use: constant nodes for the correlation metrics,
 * all-zero nodes for cosine; none for distance metrics, and none holding a
 * non-finite value (those are knn_nonfinite_nodes' to report). Returns how many
 * there are in all (which may exceed max_rows). Uses up to `threads`
 * threads; never fails. */
int knn_degenerate_nodes(knn_metric metric, const double *x, int p, int n,
                         int *rows, int max_rows, int threads);

/* Fills the ends of a directed edge list of n nodes x k neighbours in edge
 * order (row-major, see knn_result): from[e] = i + base and rank[e] = r + 1
 * for edge e = i * k + r. Uses up to `threads` threads; never fails. */
void knn_edge_ends(int *from, int *rank, int n, int k, int base,
                   int threads);

/* The same for edges [a, b) only, on the calling thread. */
static inline void knn_edge_ends_range(int *from, int *rank, size_t a,
                                       size_t b, int k, int base)
{
    int i = (int)(a / (size_t)k), r = (int)(a % (size_t)k);
    for (size_t e = a; e < b; e++) {
        from[e] = i + base;
        rank[e] = r + 1;
        if (++r == k) {
            r = 0;
            i++;
        }
    }
}

/* Shared-nearest-neighbour weights as bluster::makeSNNGraph defines them. */
typedef enum { KNN_SNN_RANK = 0, KNN_SNN_NUMBER, KNN_SNN_JACCARD } knn_snn_type;

/* Builds the undirected SNN graph of a self-search result: `index` is n x k,
 * column-major, its nodes counted from `base` (0, or R's 1), every one in
 * [base, base + n) (the caller checks). Allocates *from, *to (counted from
 * base too, from < to, in (from, to) order) and *weight with malloc; the
 * caller frees them.
 * Polls cb's interrupt callback (cb may be NULL). Returns KNN_E_NOMEM when
 * memory runs out, KNN_E_INTERRUPTED when the callback asks to stop; the
 * outputs are then NULL and everything is freed. */
knn_status knn_snn_graph(const int *index, int n, int k, int base,
                         knn_snn_type type, const knn_callbacks *cb,
                         int **from, int **to, double **weight,
                         size_t *n_edges);

/* The undirected graph of a self search's directed edge list: `to` holds
 * n x k targets in edge order (edge e = i k + r joins node i to to[e] at
 * rank r + 1), counted from `base`, every one in [base, base + n) (the
 * caller checks). Each pair of nodes once, lo < hi, with the edge of the
 * better rank (the lo -> hi edge on a tie), every pair or (mutual) those
 * both ends chose, in (lo, hi) order. */
typedef struct {
    size_t *start; /* n + 1 offsets into edge */
    size_t *edge;  /* edges from larger nodes, by target, in edge order */
} knn_symmetry;

/* Builds the reverse lists (O(n k) memory). Returns KNN_E_NOMEM (s left
 * empty). */
knn_status knn_symmetry_build(knn_symmetry *s, const int *to, int n, int k,
                              int base);
void knn_symmetry_free(knn_symmetry *s);

/* Where knn_symmetry_pairs writes the pairs, one element each: the nodes
 * (from base, lo < hi) and the weight, distance and rank (1..k) of the
 * pair's edge. */
typedef struct {
    int *lo, *hi, *rank;
    double *weight, *distance;
} knn_symmetry_out;

/* Counts the pairs into *count and, where out is not NULL, writes them,
 * with the weights and distances of the directed list (edge order, as
 * `to`) that out->weight and out->distance take theirs from. Polls cb
 * (may be NULL). Returns KNN_E_NOMEM or KNN_E_INTERRUPTED (outputs
 * unspecified). */
knn_status knn_symmetry_pairs(const knn_symmetry *s, const int *to,
                              const double *weight, const double *distance,
                              int n, int k, int base, int mutual,
                              const knn_callbacks *cb,
                              const knn_symmetry_out *out, size_t *count);

/* What the GPU backend sees. */
typedef struct {
    char name[128];
    double memory_total; /* bytes */
    double memory_free;
    int major, minor;    /* compute capability */
    int multiprocessors;
} knn_gpu_device;

typedef struct {
    int built_with_cuda;
    char reason[256];     /* why no GPU can be used, empty when one can */
    int runtime_version;  /* e.g. 13000; 0 when unknown */
    int driver_version;
    int n_devices;
    knn_gpu_device device[KNN_MAX_DEVICES];
} knn_gpu_info;

/* Fills `info`; never fails (a failure is written to info->reason). */
void knn_gpu_query(knn_gpu_info *info);

/* Where the CUDA backend's shared object is; a build with CUDA opens it on
 * the first GPU call (not before: it maps the CUDA runtime and cuBLAS,
 * some 200 MB, which a CPU session should not pay). The path is copied;
 * a build without CUDA ignores it. Never fails. */
void knn_gpu_set_library(const char *path);

/* Frees what the GPU backend keeps between searches (per device: a stream,
 * a cuBLAS handle, pinned staging memory); the next search makes them
 * again. Called when the package is unloaded. Never fails. */
void knn_gpu_release(void);

#ifdef __cplusplus
}
#endif

#endif
