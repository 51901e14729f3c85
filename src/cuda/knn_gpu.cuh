/*
 * knn_gpu.cuh: what the CUDA backend's files share (not part of the engine
 * contract; knn_backend.h is). One device's search runs through a
 * knn_gpu_dev (knn_gpu_search.cu starts one per device; knn_gpu_tiles.cuh
 * lists the host files that drive it): the nodes uploaded
 * (knn_gpu_upload.cu) and prepared (knn_gpu_prepare.cu), the row tile and
 * its buffers (knn_gpu_plan.cu), the pipeline of tiles (knn_gpu_loop.cu)
 * or the shared walk (knn_gpu_walk.cu), on the course that
 * knn_gpu_policy.cu chooses; a tile's candidates from a panel of products
 * (knn_gpu_products.cu) and a selection kernel (knn_gpu_select.cu) or
 * from the fused kernel (knn_gpu_fused.cu), whose self searches may
 * compute each pair once (knn_gpu_pairs.cu), and the exact re-rank
 * (knn_gpu_rerank.cu). Every function returns a knn_status and, on
 * failure, writes the failing call into dev->message; kernels never
 * allocate, and streams are passed explicitly, last.
 */
#ifndef KNN_GPU_CUH
#define KNN_GPU_CUH

#include <atomic>
#include <vector>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <stddef.h>
#include <stdint.h>
#include "knn_backend.h"
#include "knn_exact.h"
#include "knn_gpu_policy.cuh"

/* Devices from this compute capability on are used: the build carries
 * sm_80 and sm_90 code and compute_90 PTX, which no older card runs. */
#define KNN_MIN_MAJOR 8

/* Error reporting (knn_gpu_errors.cu): the first failure of a device is
 * kept, with the call. */
knn_status knn_gpu_fail(char *message, knn_status status, const char *what,
                        const char *detail, const char *file, int line);
knn_status knn_gpu_fail_cuda(char *message, cudaError_t e, const char *call,
                             const char *file, int line);
knn_status knn_gpu_fail_blas(char *message, cublasStatus_t s,
                             const char *call, const char *file, int line);

#define KNN_CUDA_TRY(msg, call)                                            \
    do {                                                                   \
        cudaError_t knn_e_ = (call);                                       \
        if (knn_e_ != cudaSuccess)                                         \
            return knn_gpu_fail_cuda((msg), knn_e_, #call, __FILE__,       \
                                     __LINE__);                            \
    } while (0)

/* After every kernel launch: a bad configuration shows up here. */
#define KNN_LAUNCH_TRY(msg, kernel)                                        \
    do {                                                                   \
        cudaError_t knn_e_ = cudaGetLastError();                           \
        if (knn_e_ != cudaSuccess)                                         \
            return knn_gpu_fail_cuda((msg), knn_e_, "launch of " kernel,   \
                                     __FILE__, __LINE__);                  \
    } while (0)

#define KNN_BLAS_TRY(msg, call)                                            \
    do {                                                                   \
        cublasStatus_t knn_s_ = (call);                                    \
        if (knn_s_ != CUBLAS_STATUS_SUCCESS)                               \
            return knn_gpu_fail_blas((msg), knn_s_, #call, __FILE__,       \
                                     __LINE__);                            \
    } while (0)

#define KNN_TRY(call)                                                      \
    do {                                                                   \
        knn_status knn_st_ = (call);                                       \
        if (knn_st_ != KNN_OK) return knn_st_;                             \
    } while (0)

/* Hands out 256-byte aligned pieces of one block; with no block it only
 * adds up their sizes. Each group of arrays takes one cudaMalloc or
 * cudaHostAlloc, whose fixed cost (pinning above all) a small search would
 * otherwise pay a dozen times. */
typedef struct {
    char *block;
    size_t used;
} knn_carver;

template <typename T>
static inline T *knn_carve(knn_carver *c, size_t n)
{
    T *piece = c->block ? (T *)(c->block + c->used) : NULL;
    c->used += (n * sizeof(T) + 255) / 256 * 256;
    return piece;
}

/* What a device keeps between searches (knn_gpu_context.cu): its stream,
 * a second stream for the result tiles' transfers to the host (which then
 * overlap the next tile's work), its cuBLAS handle (stream set, math mode
 * set per search), a pinned staging ring for uploads (made on the first
 * upload) and pinned memory for result slots. */
#define KNN_STAGE_SLOTS 32
typedef struct {
    int device;
    cudaStream_t stream;
    cudaStream_t copy_stream;
    cublasHandle_t blas;
    double *stage;
    cudaEvent_t stage_free[KNN_STAGE_SLOTS]; /* each slot's last transfer */
    void *host;        /* pinned result slots (knn_context_host) */
    size_t host_bytes;
    int keepable; /* may become (or is) the device's kept context */
    int fresh;    /* made by the search that holds it */
} knn_gpu_context;

/* The device's kept context, or a new one (the device must be current).
 * On failure *ctx is NULL and nothing is left allocated. */
knn_status knn_context_acquire(int device, knn_gpu_context **ctx,
                               char *message);
/* Ends a search's use of ctx, given how the search ended: keeps it for the
 * next search or destroys it (after its stream is idle). */
void knn_context_release(knn_gpu_context *ctx, knn_status status);

/* A search's device array on the current device, zeroed, from the
 * device's pool (knn_gpu_context.cu: what a successful search gives back
 * is kept for the next one), or from cudaMalloc where it is larger than
 * the pool keeps; ordered on `stream`; cudaMalloc's errors. */
cudaError_t knn_device_alloc(void **ptr, size_t bytes, cudaStream_t stream);
/* Gives an array of knn_device_alloc back once the current device's work
 * is done, as cudaFree does. NULL does nothing. */
void knn_device_free(void *ptr);
/* Bytes the pool of `device` keeps that no search uses: free for a
 * search's plan and in gpuInfo(). */
size_t knn_device_idle_bytes(int device);
/* Lets the kernels of `reader` use the arrays of `owner`'s pool (peer
 * access between the two enabled). */
knn_status knn_device_share(int owner, int reader, char *message);

/* A pinned host block of at least `bytes` for a search's result slots
 * (or a pairwise-complete search's products, knn_gpu_coexpr.cu), kept
 * with ctx for later searches (replaced by a larger one when a search
 * needs more). */
knn_status knn_context_host(knn_gpu_context *ctx, size_t bytes, void **block,
                            char *message);

/* The bytes a search may use on the current device: its free memory
 * (with its pool's idle bytes) less a reserve and 5% of the total, at
 * most `requested` where that is positive (options(knngpu.gpu.memory));
 * knn_gpu_plan.cu. */
knn_status knn_device_budget(double requested, double *budget,
                             char *message);
/* knn_gpu_query.cu: the devices a search may use, into ids: every one of
 * the n_devices listed, each of which must exist and have compute
 * capability KNN_MIN_MAJOR or newer; with none listed, every visible one
 * that has (at most KNN_MAX_DEVICES). On failure ids may hold some and
 * rep->message says why. What the report names them (rep->device). */
knn_status knn_usable_devices(const int *devices, int n_devices,
                              std::vector<int> &ids, knn_report *rep);
void knn_device_names(const std::vector<int> &ids, knn_report *rep);

/* n doubles from host src (any memory) to device dst. */
typedef struct {
    double *dst;
    const double *src;
    size_t n;
} knn_upload_part;

/* Queues the parts' transfers on ctx->stream through the staging ring, on
 * up to `threads` OpenMP threads; returns once every part has left src
 * (the transfers may still run). Stops between 1 MB chunks when *stop is set
 * (KNN_E_INTERRUPTED); KNN_E_NONFINITE when a value is NA, NaN or Inf. */
knn_status knn_context_upload(knn_gpu_context *ctx,
                              const knn_upload_part *parts, int n_parts,
                              int threads, const std::atomic<int> *stop,
                              char *message);

/* Nodes prepared on one device: ref nodes 0..n_ref-1, then (query search
 * only) this device's query rows. Every matrix is p x n_nodes, column-major
 * (node-contiguous), as in knn.h. */
typedef struct {
    int p, n_ref, n_nodes;
    void *block;      /* one allocation holding the arrays below but exact */
    double *exact;    /* canonical u (correlations) or the nodes as given */
    double *sum;      /* correlations: per-node sum and css of u */
    double *css;
    float *fast;      /* product metrics: fast vectors f, ldf x n_nodes */
    int ldf;          /* p rounded up to 4, zero padded: aligned rows let
                         cuBLAS use its tensor-core kernels */
    __half *half;     /* the fused path's (knn_nodes_half): f rounded to
                         nearest fp16, ldh x n_nodes, zero padded;
                         distances: node i's times 2^e_i; else NULL */
    float *half_unscale; /* distances: 2^-e_i per node; else NULL */
    void *half_block; /* the allocation of half and half_unscale */
    int ldh;          /* p rounded up to 8: rows of 16-byte pieces */
    float *split;     /* split TF32 (knn_nodes_split): per node 4 ldf
                         floats, [hi | hi | lo | hi] with f = hi + lo (to
                         2^-22), both TF32 values; else NULL */
    double *fast64;   /* the fp64 rung (knn_nodes_fp64): the float64
                         values f is rounded from, ldf x n_nodes, zero
                         padded; else NULL */
    double *sqnorm64; /* distances, the fp64 rung: |fast64|^2 */
    void *block64;    /* the allocation of fast64 and sqnorm64 */
    double *centre;   /* distances: the fast vectors' translation (p) */
    float *sqnorm;    /* distances: |f|^2 */
    double *margin2;  /* per node: twice its candidate margin */
    double *margin2_fp32; /* product metrics: twice its float32 margin,
                             the refinement's (knn_select_args) */
    double *norm;     /* distances: |node - means| (float64), and the */
    double *norm_max; /* largest over the ref nodes: the margins' inputs */
    double *kappa_max; /* correlations: the largest cancellation (>= 1),
                          the margins' input */
    int scale_exp;    /* distances: the frame of the fast vectors (and of
                         Manhattan's panel) divides nodes by 2^scale_exp;
                         else 0 */
} knn_gpu_nodes;

/* One row tile's arguments to the selection kernels. The panel holds, for
 * each of `rows` queries, n_cols contiguous values at panel + r * ld; on
 * the fp64 rung it is panel64, and the distances' squared norms are
 * col_sqnorm64 and row_sqnorm64. */
typedef struct {
    const float *panel;
    const double *panel64;
    const double *col_sqnorm64, *row_sqnorm64;
    size_t ld;
    int rows, n_cols, k;
    knn_score_kind kind;
    int self_first;          /* self search: ref index of row 0, else -1 */
    const int *row_self;     /* self search in a spatial order: each row's
                                node (self_first unused); else NULL */
    const float *col_sqnorm; /* KNN_SCORE_DIST: |f_j|^2 of ref nodes */
    const float *row_sqnorm; /* KNN_SCORE_DIST: |f_i|^2 of the tile rows */
    const double *row_margin2;
    const double *row_norm;  /* KNN_SCORE_DIST: |f_i| of the tile rows, for
                                knn_dist_row_bound; else NULL */
    double margin_unit;      /* knn_margin_dist_unit and knn_margin_floor */
    double margin_floor;     /* of the tile's GEMM */
    knn_metric metric;       /* with scale_exp: knn_candidate_bound */
    int scale_exp;
    const int *offsets;      /* rows + 1: row r's slots [offsets[r],
                                offsets[r + 1]) of cand_index */
    int *cand_index;         /* out: candidates, ascending index per row
                                (a pruned walk's: as its blocks came) */
    int *count;              /* out: candidates found per row (may exceed
                                the row's slots: the caller re-plans) */
    int *seg_end;            /* out: offsets[r] + candidates stored */
    /* The refinement of TF32 candidates (knn_gpu_select.cu): float32
     * products of the fast vectors (ldf floats apart; the tile's rows
     * from row_fast) and their margins (row_margin2_fp32, fp32_unit).
     * row_margin2_fp32 NULL: no refinement. */
    const float *fast;
    const float *row_fast;
    int ldf;
    const double *row_margin2_fp32;
    double fp32_unit;
    int *wide;               /* out, with the refinement: each row's
                                candidates before it (after it, count) */
    int wide_buffer;         /* the refinement's larger buffer: the
                                search found TF32 crowded */
} knn_select_args;

/* Selection algorithms, chosen by knn_select_choose(). */
typedef enum {
    KNN_SELECT_WARP = 0, /* one warp per row, register queues (k <= 32) */
    KNN_SELECT_RADIX     /* one block per row, two radix histogram passes */
} knn_select_algo;

/* The kernel for a row tile of `rows` rows and k neighbours: the forced
 * one, else by the measured crossovers (knn_gpu_policy.cu). */
knn_select_algo knn_select_choose(knn_select_force force, int rows, int k);
knn_status knn_select_candidates(const knn_select_args *a,
                                 knn_select_algo algo, char *message,
                                 cudaStream_t stream);

/* A key that stands for no pair: above every distance's bits. */
#define KNN_KEY_NONE 0xffffffffffffffffull

/* Each of `rows` rows' k smallest of its n_ref keys (rows x n_ref: the
 * bits of non-negative float64 distances, or KNN_KEY_NONE), ties to the
 * smaller node, in order into best_j (rows x k; -1 for a KNN_KEY_NONE)
 * and best_d (NaN for one); pick_key and pick_j (rows x k) are scratch.
 * Queued on stream; KNN_OK, or an error with message set. */
knn_status knn_select_keys(const unsigned long long *keys, int rows,
                           int n_ref, int k, unsigned long long *pick_key,
                           int *pick_j, int *best_j, double *best_d,
                           char *message, cudaStream_t stream);

/* Arithmetic of the candidate products: with float32 accumulation,
 * TF32 (tensor cores), split TF32 (tensor cores, three products of the
 * halves of f = hi + lo) or float32; or float64 (DGEMM, on FP64 tensor
 * cores from sm_80 on). TF32 inputs keep 10 mantissa bits, so the
 * margins grow by about 2^15 / (p + 6), some 250 times at p = 128 (the
 * fast term of knn_margin_*). For the correlation metrics that is an
 * absolute 0.008 or so in r and costs a few candidates. For the
 * distances the margin scales with (|f_i| + |f_max|)^2; where neighbours
 * lie close against those norms (genes of an expression matrix at
 * different levels) TF32 would admit far more than k candidates per row;
 * for correlations, so would nodes whose neighbours' r are all within
 * that 0.008 (positive data at different levels under cosine, log-counts
 * full of near duplicates). So a product search starts in TF32, and the
 * panel path's radix selection rescores a TF32 tile's candidates in
 * float32 before they reach the re-rank (knn_refine, knn_gpu_select.cu),
 * which keeps them near float32's count for the price of reading their
 * fast vectors. A search whose TF32 tile still shows too many goes on
 * refining (leaving the fused path and the warp kernel, which do not),
 * and then, or where the refinement would read more than split TF32's
 * extra products cost, in split TF32. Split TF32 errs nearly as little
 * as float32 (its margins are some three times float32's, from the
 * accumulation over 3p terms) and runs on tensor cores, faster than
 * float32 (inst/bench/gemm_rates.py). Where a tile is still crowded
 * there (nodes whose neighbours differ by less than float32 resolves:
 * points on a curve, near-copies of a profile, cosine about a large
 * common level), the search climbs once more, to float64, whose margins
 * are 2^29 times narrower (inst/bench/rungs.R on replicates of 20
 * profiles: 10 candidates a row where float32 leaves 10000). Where the
 * split's arrays do not fit, float64 takes their place on a device whose
 * float64 runs at half float32's rate or better, and float32 on others,
 * which climb to float64 only from a crowded float32 tile. The policy
 * decides each step (knn_gpu_policy.cu, knn_dev_next_step), the pipeline
 * carries a climb out (knn_gpu_loop.cu, knn_dev_climb). The request's
 * `precision` can force one arithmetic for the whole search. */
typedef enum {
    KNN_GEMM_FP32 = 0,
    KNN_GEMM_TF32,
    KNN_GEMM_TF32X3,
    KNN_GEMM_FP64
} knn_gemm_mode;

/* A set of arithmetics (the ones a search left behind) as bits. */
static inline unsigned knn_gemm_bit(knn_gemm_mode mode)
{
    return 1u << (unsigned)mode;
}

/* The arithmetic a search starts with: TF32 unless forced
 * (knn_gpu_policy.cu). */
knn_gemm_mode knn_gemm_choose(knn_precision force);
/* Whether the search may give TF32 up for a finer arithmetic (not
 * forced, a product metric). */
int knn_gemm_adaptive(knn_precision force, knn_metric metric);
/* The cuBLAS handle's math mode for the arithmetic: TF32 tensor cores
 * (TF32, split TF32) or the default (float32 units; DGEMM takes the FP64
 * tensor cores by itself). */
cublasMath_t knn_gemm_math(knn_gemm_mode mode);

/* unit_in, unit_acc and tiny of knn_margin_* for an arithmetic and p
 * features (knn_gpu_products.cu says why each holds). */
typedef struct {
    double in, acc, tiny;
} knn_gemm_units;
knn_gemm_units knn_gemm_units_of(knn_gemm_mode mode, int p);
/* The report's precision into out: the arithmetic a search ended on, the
 * ones it climbed from (before: knn_gemm_bit of each), whether TF32
 * candidates were rescored in float32 (refined), whether TF32 tiles ran
 * as the fused kernel's fp16 products (half_products). */
void knn_gemm_precision(knn_metric metric, knn_gemm_mode mode,
                        unsigned before, int refined, int half_products,
                        char *out, size_t size);

/* The fused path (knn_gpu_fused.cu): products and selection in one
 * kernel, so the panel never exists. Whether a device's search of `rows`
 * query rows of p features takes it (knn_gpu_policy.cu): the forced
 * choice where the kernel can run, else where it was measured to win. */
int knn_fused_choose(knn_select_force force, knn_metric metric,
                     knn_gemm_mode gemm, int k, int p, int rows,
                     int sm_count, int shared_walk);
/* Rows of one full wave of the fused kernel's blocks on sm_count SMs:
 * as many blocks as each SM holds at once for this k and score kind. */
knn_status knn_fused_wave_rows(knn_score_kind kind, int k, int sm_count,
                               int *rows, char *message);
/* Survivor slots per row for the fused path: the nodes that passed a
 * row's running threshold, which outnumber its final candidates. */
int knn_fused_survivor_slots(int k, int n_ref, int avail);
/* Floats of device memory a fused tile of `rows` rows needs for its rows'
 * k smallest scores: none where they fit in the kernel's shared memory
 * (k <= 32). */
size_t knn_fused_best_floats(int k, int rows);
/* A fused tile's scratch in device memory: survivor, row r's survivor
 * slots [offsets[r], offsets[r + 1]); needed, out, per row, the survivor
 * slots it needed (more than it had: the tile runs again with exact
 * slots); best, knn_fused_best_floats() of them; bound (or NULL), out, per
 * row, the last threshold it took, and where `seeded`, in too: the rows'
 * thresholds start there (a run again of the same rows on the same
 * course, see knn_fused_seed). */
typedef struct {
    uint64_t *survivor;
    const int *offsets;
    int *needed;
    float *best;
    float *bound;
    int seeded;
} knn_fused_scratch;
/* A pruned walk (local frames on the fused path, knn_gpu_local.cu): the
 * frame's column j is node col_node[j] and node i is column col_pos[i],
 * the reference in a k-d order, so that each block of KNN_FUSED_COLS
 * columns lies in a small box; so do the tile's blocks of rows (rows
 * from 128 b). A block of rows skips a column block where the boxes prove
 * that no score of theirs passes the rows' thresholds
 * (knn_fused_kernel). Boxes are each feature's least and largest value
 * over the block's nodes, exact (feature-major: lo[f * blocks + b]);
 * norm_max: the largest fast norm of each block in the tile's frame;
 * skip_floor: scratch of col_blocks floats for each block of the
 * launch. The kernel writes only skip_floor; the frame that holds the
 * arrays fills the others. */
typedef struct {
    int *col_node, *col_pos;
    double *col_lo, *col_hi, *col_norm_max;
    double *row_lo, *row_hi, *row_norm_max;
    float *skip_floor;
    int p, col_blocks, row_blocks;
} knn_fused_prune;

/* Candidates of a row tile as knn_select_candidates gives them (sel's
 * panel unused), from the nodes' fp16 vectors (nodes->half, which
 * knn_nodes_half must have made): the reference's first n_cols nodes and
 * the tile's rows from node0; with `prune` (else NULL), the columns of
 * a pruned walk, each row's candidates then in the order its column
 * blocks were visited, not by node. */
knn_status knn_fused_candidates(const knn_select_args *sel,
                                const knn_gpu_nodes *nodes, int node0,
                                const knn_fused_scratch *scratch,
                                const struct knn_pairs_walk *walk,
                                const knn_fused_prune *prune,
                                char *message, cudaStream_t stream);

/* A self search computes each pair of nodes once (knn_gpu_pairs.cu):
 * tile t's rows walk the nodes before their tile's end only, and each
 * product against a node of an earlier tile is also offered to that node,
 * whose list keeps it when it is at or below the node's threshold. On
 * several devices each walks its share of every tile's rows, and then
 * takes the other devices' lists of its own rows' nodes. Per node, for
 * the whole search: */
typedef struct {
    int n, k, cap;      /* nodes, neighbours, list entries per node */
    float *best;        /* [n][k]: the node's k smallest fast scores seen
                           (+inf where fewer), node j's from j * k */
    float *threshold;   /* [n]: its candidate bound, rounded down to a
                           float; NaN before its own tile has run */
    uint64_t *list;     /* [n][cap]: (knn_order_bits(score) << 32) | node,
                           every node seen at or below the threshold */
    int *count;         /* [n]: entries listed (past cap: lost, and the
                           node marked in `lost`) */
    int *merged;        /* [n]: entries already merged into best */
    unsigned *lost;     /* [n / 32 + 1]: bit j set where node j's list
                           lost entries, or its own row's survivors
                           overflowed: its list misses candidates, and the
                           node is searched apart (knn_gpu_apart) */
    int *lost_nodes;    /* the bits set */
    /* Several devices, one of whose memory this device cannot read:
     * that device's lists and counts of stage_nodes nodes at a time,
     * copied here (knn_pairs_absorb), its thresholds [n]
     * (knn_pairs_tighten) and its lost bits; else none. */
    int stage_nodes;
    uint64_t *stage_list;
    int *stage_count;
    float *stage_threshold;
    unsigned *stage_lost;
    void *block;        /* the one allocation of the arrays above */
} knn_pairs;

/* What a tile of the shared walk adds to the fused kernel: nodes
 * [0, offer_end) (the earlier tiles') receive offers; the tile's rows walk
 * sel->n_cols nodes (up to their tile's end). */
struct knn_pairs_walk {
    knn_pairs pairs;
    int offer_end;
};

/* Whether a device's search on the fused path shares its pairs
 * (knn_gpu_policy.cu): not forced to walk every node per row, a self
 * search, in more than one tile of `tile_rows` (0: any size), and k as
 * the policy's table allows. */
int knn_pairs_choose(knn_select_force force, int self, int k, int n_ref,
                     int tile_rows);
/* Bytes of the per-node arrays (with staging for stage_nodes nodes of
 * another device's lists); their allocation and release. */
double knn_pairs_bytes(int n, int k, int cap, int stage_nodes);
knn_status knn_pairs_alloc(knn_pairs *p, int n, int k, int cap,
                           int stage_nodes, char *message,
                           cudaStream_t stream);
void knn_pairs_free(knn_pairs *p);
/* After a tile's walk: each node of [node0, node_end) with new offers
 * merges them into its k smallest, tightens its threshold (the bound of
 * sel's margins, sel describing the nodes from node 0) and drops the
 * entries above it. */
knn_status knn_pairs_merge(const knn_pairs *p, const knn_select_args *sel,
                           int node0, int node_end, char *message,
                           cudaStream_t stream);
/* Several devices, during the walk: the thresholds of nodes [0, n_nodes)
 * lowered to another device's (`other`, its knn_pairs.threshold where
 * this device reads it directly, else a staged copy), where that one's
 * are lower or this one's NaN (the node's row walked there): its pairs
 * judge this device's offers too. */
knn_status knn_pairs_tighten(const knn_pairs *p, const float *other,
                             int n_nodes, char *message, cudaStream_t stream);
/* Several devices, after the walk: the entries of another device's lists
 * of nodes [node0, node0 + nodes) (node node0 + i's from_list + i cap,
 * from_count[i] of them: the other device's arrays where this one reads
 * them directly, else staged copies) that are at or below this device's
 * thresholds, appended to its lists as new offers (knn_pairs_merge then
 * takes them); a node the other device lost (from_lost, its lost bits,
 * indexed by node) is lost here too. */
knn_status knn_pairs_absorb(const knn_pairs *p, int node0, int nodes,
                            const uint64_t *from_list, const int *from_count,
                            const unsigned *from_lost, char *message,
                            cudaStream_t stream);
/* The words of a walk's lost bits over n nodes. */
static inline size_t knn_pairs_lost_words(int n)
{
    return (size_t)n / 32 + 1;
}
/* After the walk: the candidates of a tile of sel->rows rows from node
 * node0, in ascending node order, as knn_select_candidates gives them
 * (as many as sel's offsets give each row slots; a row counts all of its
 * own, for a redo with more). */
knn_status knn_pairs_gather(const knn_pairs *p, const knn_select_args *sel,
                            int node0, char *message, cudaStream_t stream);

/* Products of a row tile (nodes node0..node0 + rows - 1) against the
 * reference into the panel, in the given arithmetic (split TF32: from
 * nodes->split; float64: from nodes->fast64 into a panel of doubles). */
knn_status knn_panel_gemm(cublasHandle_t blas, const knn_gpu_nodes *nodes,
                          knn_gemm_mode mode, int node0, int rows,
                          void *panel, size_t ld, char *message);
/* Float32 products of `rows` fast vectors gathered at rows_fast (ldf
 * floats apart: rows set apart) against the reference into the panel;
 * the math mode is the caller's. */
knn_status knn_panel_gemm_rows(cublasHandle_t blas,
                               const knn_gpu_nodes *nodes,
                               const float *rows_fast, int rows,
                               float *panel, size_t ld, char *message);
knn_status knn_panel_manhattan(const double *x_rows, const double *x_ref,
                               int p, int rows, int n_ref, int scale_exp,
                               float *panel, size_t ld, char *message,
                               cudaStream_t stream);

/* Leading dimension of a panel row: n_ref rounded up to 4 (aligned rows). */
static inline size_t knn_panel_ld(int n_ref)
{
    return ((size_t)n_ref + 3) / 4 * 4;
}

/* Exact re-rank: keys of every stored candidate, a stable segmented sort
 * by key, and the k best per row written as a rows x k tile in the
 * caller's result layout (knn_result.by_row), node indices from
 * index_base. */
typedef struct {
    knn_metric metric;
    knn_gpu_nodes nodes;   /* by value: kernels read its device pointers */
    int rows, k;
    int row_node0;         /* node index (in nodes) of tile row 0 */
    const int *row_nodes;  /* or each row's, in a spatial order; NULL */
    const int *offsets, *seg_end, *cand_index;
    int64_t n_slots;       /* offsets[rows] */
    double *cand_key;      /* scratch, n_slots each */
    uint64_t *sort_key, *sort_key_out;
    int *sort_val, *sort_val_out;
    int *sort_end;         /* scratch, rows: the segments CUB sorts */
    int cand_in_node_order; /* each row's slots hold its candidates in
                               ascending node order (else a pruned walk's
                               order: knn_rerank sorts long rows by node) */
    void *sort_temp;
    size_t sort_temp_bytes;
    int by_row;            /* 1: row-major tile, else column-major */
    int index_base;
    int *out_index;        /* rows x k */
    double *out_distance, *out_weight;
} knn_rerank_args;

knn_status knn_rerank_sort_bytes(int64_t n_slots, int rows, size_t *bytes,
                                 char *message);
knn_status knn_rerank(const knn_rerank_args *a, char *message,
                      cudaStream_t stream);

/* Node preparation. `x` holds the p x n_nodes float64 input on the device;
 * it becomes nodes->exact (then nodes owns it) or stays the caller's, also
 * on failure. query_max_abs is the largest |value| of the query nodes that
 * are not in x (distances). */
knn_status knn_prepare_nodes(knn_metric metric, double *x, int p, int n_ref,
                             int n_nodes, double query_max_abs,
                             knn_gemm_mode gemm,
                             knn_gpu_nodes *nodes, char *message,
                             cudaStream_t stream);
void knn_nodes_free(knn_gpu_nodes *nodes);
/* Rows set apart (knn_gpu_loop.cu): the fast vectors of nodes
 * rows[0 .. n_rows), and for distances their squared norms and norms,
 * gathered in that order (sqnorm and norm NULL for correlations), with
 * twice their float32 margins (margin2_fp32). On the stream. */
knn_status knn_apart_vectors(const knn_gpu_nodes *nodes, const int *rows,
                             int n_rows, float *fast, float *sqnorm,
                             double *norm, double *margin2, char *message,
                             cudaStream_t stream);
/* Distances: a tile's local frame (knn_gpu_local.cu) into view, whose
 * fast, sqnorm, norm, norm_max and margin2 hold n_ref + n_rows nodes:
 * centre, the mean of the scaled nodes rows[0 .. n_rows) (device
 * array); the ref nodes' float32 vectors less it (in the order ref_pick
 * gives, else by node), then the rows'; the rows' margins in `gemm`. On
 * the stream. */
knn_status knn_local_vectors(const knn_gpu_nodes *nodes, const int *rows,
                             int n_rows, const int *ref_pick,
                             knn_gpu_nodes *view, double *centre,
                             knn_gemm_mode gemm, char *message,
                             cudaStream_t stream);
/* The boxes of a pruned walk (knn_fused_prune): nodes pick[0 .. n) of
 * nodes->exact in groups of `group` from the first, group b's least and
 * largest value of feature f into lo and hi[f * groups + b]. On the
 * stream. */
knn_status knn_group_boxes(const knn_gpu_nodes *nodes, const int *pick,
                           int n, int group, double *lo, double *hi,
                           char *message, cudaStream_t stream);
/* Refines order[0 .. n) (device; nodes of nodes->exact) in place: each
 * segment from starts[i] (host, ascending, starts[0] = 0) to the next
 * becomes a k-d order whose leaves are `leaf` nodes from its start (the
 * last may be fewer): each level sorts every segment of more than `leaf`
 * nodes on its feature of largest variance (over a sample) and parts it
 * between whole leaves, half of them (rounded down) first. On the stream,
 * which it waits for. */
knn_status knn_kd_refine(const knn_gpu_nodes *nodes, int *order, int n,
                         const int *starts, int n_starts, int leaf,
                         char *message, cudaStream_t stream);
/* The ref nodes 0 .. n_ref in a k-d order of leaves of `leaf`
 * (knn_kd_refine) into col_node, and each node's place in it into
 * col_pos. On the stream. */
knn_status knn_kd_columns(const knn_gpu_nodes *nodes, int leaf,
                          int *col_node, int *col_pos, char *message,
                          cudaStream_t stream);
/* The largest of each group of `group` values of norm[0 .. n) into
 * out[group index]. On the stream. */
knn_status knn_group_max(const double *norm, int n, int group, double *out,
                         char *message, cudaStream_t stream);
/* Product metrics: recomputes the margins for another arithmetic (the
 * search changed it), on the stream after the work already queued
 * there. */
knn_status knn_nodes_remargin(knn_metric metric, knn_gpu_nodes *nodes,
                              knn_gemm_mode gemm, char *message,
                              cudaStream_t stream);
/* Product metrics: the fp16 copy of the fast vectors (nodes->half, and
 * for distances nodes->half_unscale) that the fused kernel reads, on the
 * stream after the work already queued there; KNN_E_NOMEM (nothing
 * changed) where it does not fit. */
knn_status knn_nodes_half(knn_metric metric, knn_gpu_nodes *nodes,
                          char *message, cudaStream_t stream);
/* The fp16 copy of the first n nodes' fast vectors into nodes->half (and
 * their unscales into nodes->half_unscale, where that is not NULL), both
 * allocated by the caller; on the stream. */
knn_status knn_half_fill(const knn_gpu_nodes *nodes, size_t n,
                         char *message, cudaStream_t stream);
/* Product metrics: the split TF32 arrays (nodes->split) from the fast
 * vectors, on the stream after the work already queued there.
 * KNN_E_NOMEM (nothing changed) where they do not fit. */
knn_status knn_nodes_split(knn_gpu_nodes *nodes, char *message,
                           cudaStream_t stream);
/* Product metrics: the fp64 rung's arrays (nodes->fast64, sqnorm64), on
 * the stream after the work already queued there. KNN_E_NOMEM (nothing
 * changed) where they do not fit. */
knn_status knn_nodes_fp64(knn_metric metric, knn_gpu_nodes *nodes,
                          char *message, cudaStream_t stream);

/* Fork guard (knn_gpu_errors.cu). */
knn_status knn_gpu_claim_process(char *message, size_t size);
/* Whether this process is the one that first used CUDA. */
int knn_gpu_owns_process(void);

#endif
