/*
 * knn_gpu_fused.cu: the products of a row tile and its candidate selection
 * in one kernel, for the product metrics on the TF32 rung. The tile's
 * scores never reach device memory: only the few that can still be
 * neighbours leave.
 *
 * A block of 256 threads owns 128 rows of the tile and walks the whole
 * reference in column blocks of 128 nodes, in node order. Per column block:
 *  - products: 8 warps (2 x 4), each 64 rows x 32 columns, mma.sync
 *    m16n8k16 on fp16 copies of the fast vectors with float32
 *    accumulation, within the TF32 margins of knn_gemm_units_of (knn_mma
 *    says why; distances scale each node by a power of two, undone
 *    exactly after the products by knn_fused_unscale). Features are staged
 *    64 at a time in shared memory by cp.async, two stages, and read into
 *    fragments by ldmatrix; rows are padded to 144 bytes so that those
 *    reads are free of bank conflicts. The next column block's first
 *    stage (and its nodes' squared norms and unscales) is loaded while
 *    this one's scores are tested, so its latency hides behind them;
 *  - epilogue: each product becomes the row's fast score (knn_score_from,
 *    the panel path's rounded operations) and only scores at or below the
 *    row's running threshold go on, into a short list per row in shared
 *    memory, which gathers over several column blocks;
 *  - owners: thread r < 128 owns row r. When its list is half full, every
 *    KNN_FUSED_TIGHTEN_EVERY blocks, on each of the first
 *    knn_fused_early_blocks and on the last, it inserts the list into the
 *    row's k smallest scores so far (a max-heap in shared memory, in
 *    device memory past k = 32), takes
 *    the threshold knn_row_bound(k-th of them), rounded down to float
 *    (knn_owner_tighten), and appends the listed nodes under the
 *    threshold, in node order, to the row's survivors in device memory
 *    (score bits and node packed in 64 bits; a buffer of their own, since
 *    they include nodes that passed looser thresholds and so outnumber the
 *    candidates). On the other blocks an owner only reads its list's
 *    count, so the warps seldom wait for the owners at a barrier.
 * A column block where some row's list overflows (the first always does
 * where thresholds start at infinity) is taken whole instead: the owners first
 * take their lists as far as the earlier blocks filled them, then the
 * block's scores go to shared memory (over the staging buffers), the
 * rows' k smallest take them (all warps, knn_warp_merge_row, where those
 * are in device memory; else each owner its row's), and each owner
 * appends its row's survivors.
 *
 * Why this is the panel path's candidate set, or a superset of it: a
 * threshold is the bound of the k-th smallest score of nodes already seen,
 * never below the bound of the row's k-th over all nodes, so every
 * node under the final bound, and every one of the row's k smallest
 * scores, passed when its block did. After the last block the owner thus
 * holds exactly the row's k smallest fast scores, takes the final bound
 * the panel path would take, and keeps the survivors under it, in node
 * order, as the row's candidates.
 * The survivors' number depends only on the data and the block order (no
 * atomics decide it), so a row that overflows its survivor or candidate
 * slots gets its exact counts on a second run of the tile, as the panel
 * path's rows do; that run starts each row's threshold where the first
 * run's ended (knn_fused_seed), so its survivors are its candidates.
 */
#include <stdlib.h>
#include <string.h>
#include "knn_gpu_score.cuh"

#define KNN_FUSED_THREADS 256
/* A stage holds 64 fp16 features of each node, 128 bytes; an mma step
 * takes 16 of them. */
#define KNN_FUSED_STAGE_FEATURES 64
#define KNN_FUSED_STEP_FEATURES 16
/* Staging row length, in floats (the buffers' unit): 36 (144 bytes) put
 * the 8 rows of an ldmatrix phase on 32 distinct banks. */
#define KNN_FUSED_LD 36
#define KNN_FUSED_LIST 16             /* list entries per row (k <= 32) */
#define KNN_FUSED_TILE_LD (KNN_FUSED_COLS + 1)
/* Floats of one stage (rows, then columns) and of both. */
#define KNN_FUSED_STAGE ((KNN_FUSED_ROWS + KNN_FUSED_COLS) * KNN_FUSED_LD)
#define KNN_FUSED_STAGING (2 * KNN_FUSED_STAGE)


int knn_fused_survivor_slots(int k, int n_ref, int avail)
{
    /* Survivors per row: what the row's threshold admits at the b-th
     * column block falls as 1 / b (a running k-th smallest over nodes in
     * random order), so about c (ln B + 1) for B blocks, where c is what
     * the final bound admits (k and the margins' band; 2k + 64 covers it
     * with room). */
    double blocks = (double)n_ref / KNN_FUSED_COLS;
    double want = (2.0 * k + 64.0) * (log(blocks > 1.0 ? blocks : 1.0) + 2.0);
    return want < avail ? (int)want : avail;
}

/* What the owner of a row keeps, in shared memory: only owners touch it,
 * and seldom, where in registers it held 19 of the 128 that every thread's
 * products and epilogue need (ptxas spilled the shared walk's epilogue).
 * The row's bound inputs and candidate slots are read where needed
 * (knn_row_of). */
struct knn_owner {
    int row;        /* in the tile */
    int sbegin, sslots; /* the row's survivor slots */
    int filled;     /* scores in best, <= k */
    float kth;      /* once filled == k: the largest of them, the row's
                       k-th smallest so far (best's root) */
    int stale;      /* they changed since the bound was last taken */
    int survivors;  /* appended so far (may pass sslots) */
    int listed;     /* list entries from the column blocks before this one */
    float bound;    /* the row's threshold */
};

/* A row's k smallest live in shared memory up to this k, past it in
 * device memory (knn_fused_scratch.best, the same layout per block): at
 * k = 100 they took 51 KB of a block's 149, which left one block an SM. */
#define KNN_FUSED_SHARED_BEST_MAX_K 32

__host__ __device__ static inline bool knn_fused_best_shared(int k)
{
    return k <= KNN_FUSED_SHARED_BEST_MAX_K;
}

/* Entries of a row's list. Past k = 32 the lists take the room that the
 * rows' k smallest leave in shared memory (two blocks an SM still fit):
 * a running threshold admits some k' / b of a row's nodes in its b-th
 * column block, k' the row's candidates in the end (about 2.3k on N(0,1)
 * data), so a longer list takes fewer of the first column blocks whole
 * (inst/bench/gpu.R's k = 100 case measures it). */
__host__ __device__ static inline int knn_fused_list_cap(int k)
{
    return knn_fused_best_shared(k) ? KNN_FUSED_LIST : 2 * KNN_FUSED_LIST;
}

/* Floats of the block's shared memory besides the staging buffers and the
 * rows' k smallest: the column blocks' squared norms and unscales (two
 * blocks), the lists, the thresholds and the rows' squared norms and
 * unscales. */
static size_t knn_fused_small_floats(int k)
{
    return 4 * KNN_FUSED_COLS +
           2 * (size_t)knn_fused_list_cap(k) * KNN_FUSED_ROWS +
           3 * KNN_FUSED_ROWS;
}

size_t knn_fused_best_floats(int k, int rows)
{
    if (knn_fused_best_shared(k)) return 0;
    size_t blocks = ((size_t)rows + KNN_FUSED_ROWS - 1) / KNN_FUSED_ROWS;
    return blocks * KNN_FUSED_ROWS * k;
}

static size_t knn_fused_smem_bytes(int k)
{
    size_t floats = KNN_FUSED_STAGING + knn_fused_small_floats(k) +
                    (knn_fused_best_shared(k) ? (size_t)k * KNN_FUSED_ROWS
                                              : 0);
    return floats * sizeof(float) + (2 * KNN_FUSED_ROWS + 3) * sizeof(int) +
           KNN_FUSED_ROWS * sizeof(knn_owner);
}

/* This thread's place in the block's 128 x 128 tile of products: warp
 * (wm, wn) computes rows 64 wm .. + 64 and columns 32 wn .. + 32; in each
 * m16n8 piece, lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8,
 * columns 2t and 2t + 1. */
struct knn_frag {
    int g, t, wm, wn;
};

__device__ __forceinline__ knn_frag knn_frag_of()
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    knn_frag f = {lane >> 2, lane & 3, warp >> 2, warp & 3};
    return f;
}

/* Block row of entry (mt, h) and column of entry (nt, e) of acc[mt][nt]
 * (entry 2h + e). */
__device__ __forceinline__ int knn_frag_row(const knn_frag &f, int mt, int h)
{
    return f.wm * 64 + mt * 16 + f.g + 8 * h;
}

__device__ __forceinline__ int knn_frag_col(const knn_frag &f, int nt, int e)
{
    return f.wn * 32 + nt * 8 + 2 * f.t + e;
}

/* ---- products ---------------------------------------------------------- */

__device__ __forceinline__ void knn_cp16(float *dst, const void *src,
                                         bool valid)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(s), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void knn_cp_commit()
{
    asm volatile("cp.async.commit_group;\n");
}

template <int N>
__device__ __forceinline__ void knn_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

/* Queues one stage of features from f0 of n nodes from node `first` (ld
 * values apart) into 128 staging rows; absent nodes and features past ld
 * read as zero (cp.async's zero fill). 256 threads, four 16-byte pieces
 * each: the thread's piece q = tid % 8 of rows tid / 8 + 32 i, so the
 * four share one feature offset and step by 32 rows. */
__device__ __forceinline__ void knn_stage_nodes(float *dst, const __half *x,
                                                int ld, int first, int n,
                                                int f0)
{
    int r = threadIdx.x >> 3, f = f0 + (threadIdx.x & 7) * 8;
    bool f_in = f < ld;
    const __half *src = x + (size_t)(first + r) * ld + f;
    float *to = dst + r * KNN_FUSED_LD + (threadIdx.x & 7) * 4;
    size_t step = (size_t)32 * ld;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        bool valid = f_in && first + r + 32 * i < n;
        knn_cp16(to + 32 * i * KNN_FUSED_LD, valid ? src + i * step : x,
                 valid);
    }
}

struct knn_fused_args {
    knn_select_args sel;    /* panel unused; offsets, outputs, margins */
    const __half *vec_ref;  /* ld x n_cols (knn_gpu_nodes.half) */
    const __half *vec_rows; /* ld x rows */
    int ld;
    const float *unscale_ref;  /* distances: knn_gpu_nodes.half_unscale */
    const float *unscale_rows;
    knn_fused_scratch scratch;
    knn_pairs_walk walk;    /* the shared walk's (PAIRS kernels only) */
    knn_fused_prune prune;  /* a pruned walk's (PRUNE kernels only) */
};

/* d += a b over 16 features: fp16 inputs, exact products, float32
 * accumulation (mma.sync m16n8k16). Why TF32's units (knn_gemm_units_of:
 * inputs within 2^-10, sums as the tensor cores' TF32 ones) hold: each
 * fp16 value is f (times a power of two) rounded to nearest, within
 * 2^-11 relative where it is normal, and
 *  - correlations: |f| = sqrt(p) (cosine: 1), so no value overflows, and
 *    one under fp16's normal range (2^-14) errs by at most 2^-25, less
 *    than 2^-25 sqrt(p) |f_j| over a product;
 *  - distances: node i's values are scaled by 2^e_i (knn_nodes_half)
 *    that puts its largest |value| m_i in [2^13, 2^14): none overflows,
 *    and one under the normal range errs by 2^-25 2^-e_i <= 2^-38 m_i
 *    <= 2^-38 |f_i|, less than 2^-38 sqrt(p) |f_i| |f_j| over a product
 *    (knn_fused_unscale undoes the scales exactly). Where e_i stops at
 *    126 (m_i under 2^-113) that error is under float32's smallest
 *    subnormal, which the margins' floor already holds.
 * With the float32 rounding of f (2^-24) that is under 2^-10 |f_i| |f_j|
 * for p < 2^26 (KNN_FUSED_HALF_MAX_FEATURES). The fragments are the
 * registers ldmatrix gives for 16-byte pieces (an fp16 register holds
 * features 2t, 2t + 1 of its row). */
__device__ __forceinline__ void knn_mma(float (&d)[4],
                                        const unsigned (&a)[4],
                                        const unsigned (&b)[2])
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void knn_ldmatrix4(unsigned &r0, unsigned &r1,
                                              unsigned &r2, unsigned &r3,
                                              const float *row)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                 "{%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

/* Queues chunk c (the c-th stage of features) of the block's rows and of
 * column block col0 into staging buffer `buf`. */
__device__ __forceinline__ void knn_fused_load(const knn_fused_args &a,
                                               float *buf, int row0,
                                               int col0, int c)
{
    int f0 = c * KNN_FUSED_STAGE_FEATURES;
    knn_stage_nodes(buf, a.vec_rows, a.ld, row0, a.sel.rows, f0);
    knn_stage_nodes(buf + KNN_FUSED_ROWS * KNN_FUSED_LD, a.vec_ref, a.ld,
                    col0, a.sel.n_cols, f0);
}

/* Queues 4 floats of n per column node from node j (thread's piece) into
 * dst; a piece past the n_cols nodes reads zeros, one that straddles the
 * end or is not 16-byte aligned is read float by float. */
__device__ __forceinline__ void knn_stage_col_floats(float *dst,
                                                     const float *src,
                                                     int j, int n_cols)
{
    if (j + 4 <= n_cols && ((size_t)(src + j) & 15) == 0) {
        knn_cp16(dst, src + j, true);
    } else {
        for (int e = 0; e < 4; e++)
            dst[e] = j + e < n_cols ? src[j + e] : 0.0f;
    }
}

/* Queues what column block col0 needs first: chunk 0 into the first
 * staging buffer and, for distances, its nodes' squared norms and
 * unscales (col_sq, col_sq + KNN_FUSED_COLS), as one cp.async group. */
template <int KIND>
__device__ __forceinline__ void knn_fused_prefetch(const knn_fused_args &a,
                                                   float *stage,
                                                   float *col_sq, int row0,
                                                   int col0)
{
    knn_fused_load(a, stage, row0, col0, 0);
    const int pieces = KNN_FUSED_COLS / 4;
    if (KIND == KNN_SCORE_DIST && threadIdx.x < 2 * pieces) {
        int q = threadIdx.x % pieces, unscale = threadIdx.x / pieces;
        knn_stage_col_floats(col_sq + unscale * KNN_FUSED_COLS + q * 4,
                             unscale ? a.unscale_ref : a.sel.col_sqnorm,
                             col0 + q * 4, a.sel.n_cols);
    }
    knn_cp_commit();
}

/* The block's 128 x 128 products against column block col0 into acc, by
 * the warp's 64 x 32 share (knn_frag). Chunk 0 is already queued
 * (knn_fused_prefetch). */
__device__ __forceinline__ void knn_fused_products(const knn_fused_args &a,
                                                   float *stage, int row0,
                                                   int col0,
                                                   float (&acc)[4][4][4])
{
    knn_frag fr = knn_frag_of();
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;

    int chunks = (a.ld + KNN_FUSED_STAGE_FEATURES - 1) /
                 KNN_FUSED_STAGE_FEATURES;
    for (int c = 0; c < chunks; c++) {
        if (c + 1 < chunks) {
            knn_fused_load(a, stage + ((c + 1) & 1) * KNN_FUSED_STAGE, row0,
                           col0, c + 1);
            knn_cp_commit();
            knn_cp_wait<1>();
        } else {
            knn_cp_wait<0>();
        }
        __syncthreads();
        const float *As = stage + (c & 1) * KNN_FUSED_STAGE;
        const float *Bs = As + KNN_FUSED_ROWS * KNN_FUSED_LD;
        int steps = (a.ld - c * KNN_FUSED_STAGE_FEATURES +
                     KNN_FUSED_STEP_FEATURES - 1) / KNN_FUSED_STEP_FEATURES;
#pragma unroll
        for (int ks = 0;
             ks < KNN_FUSED_STAGE_FEATURES / KNN_FUSED_STEP_FEATURES; ks++) {
            if (ks >= steps) break;
            /* ldmatrix hands each lane its fragment of four 8 x 16-byte
             * pieces (8 x 8 in b16 units) in one instruction: lane l
             * names row l % 8 of piece l / 8. A's pieces: rows +0/+8,
             * bytes +0/+16; B's: bytes +0/+16 of two n tiles. */
            unsigned fa[4][4], fb[4][2];
            int piece = lane >> 3, prow = lane & 7;
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
                knn_ldmatrix4(fa[mt][0], fa[mt][1], fa[mt][2], fa[mt][3],
                              As + (fr.wm * 64 + mt * 16 + prow +
                                    8 * (piece & 1)) * KNN_FUSED_LD +
                                  ks * 8 + 4 * (piece >> 1));
#pragma unroll
            for (int nt = 0; nt < 4; nt += 2)
                knn_ldmatrix4(fb[nt][0], fb[nt][1], fb[nt + 1][0],
                              fb[nt + 1][1],
                              Bs + (fr.wn * 32 + nt * 8 + 8 * (piece >> 1) +
                                    prow) * KNN_FUSED_LD +
                                  ks * 8 + 4 * (piece & 1));
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
                    knn_mma(acc[mt][nt], fa[mt], fb[nt]);
        }
        __syncthreads(); /* the stage is refilled next */
    }
}

/* ---- the rows' running k smallest -------------------------------------- */

/* Shared memory of a block, carved from one dynamic array. The
 * whole-block tile lies over both staging buffers: a block taken whole
 * waits for the next block's first stage, already queued, and queues it
 * again after. */
struct knn_fused_shared {
    float *stage;
    float *tile;        /* [128][KNN_FUSED_TILE_LD], over both staging
                           buffers */
    float *col_sq;      /* [2][2][128]: by parity, a column block's |f_j|^2
                           and (distances) unscales */
    int list_cap;       /* knn_fused_list_cap */
    float *list_score;  /* [list_cap][128] */
    int *list_node;     /* [list_cap][128] */
    float *threshold;   /* [128] */
    float *row_sq;      /* [128]: distances, the rows' |f_i|^2 */
    float *row_unscale; /* [128]: distances, the rows' unscales */
    float *best;        /* [k][128]: row r's k smallest, column r (in
                           device memory past KNN_FUSED_SHARED_BEST_MAX_K) */
    int *list_count;    /* [128] */
    int *row_self;      /* [128]: each row's own node in a self search
                           (knn_row_self), else -1 */
    int *overflow;      /* the last column block whose lists overflowed,
                           numbered from 1 */
    int *walk;          /* [2], a pruned walk's: the place of the next
                           column block in its order (-1: none), and the
                           home block the order starts from */
    knn_owner *owners;  /* [128] */
};

__device__ __forceinline__ knn_fused_shared knn_fused_carve(
    float *base, int k, float *device_best)
{
    knn_fused_shared sh;
    sh.stage = base;
    sh.tile = base;
    sh.col_sq = base + KNN_FUSED_STAGING;
    sh.list_score = sh.col_sq + 4 * KNN_FUSED_COLS;
    sh.list_cap = knn_fused_list_cap(k);
    sh.list_node = (int *)(sh.list_score + sh.list_cap * KNN_FUSED_ROWS);
    sh.threshold = (float *)(sh.list_node + sh.list_cap * KNN_FUSED_ROWS);
    sh.row_sq = sh.threshold + KNN_FUSED_ROWS;
    sh.row_unscale = sh.row_sq + KNN_FUSED_ROWS;
    float *end = sh.row_unscale + KNN_FUSED_ROWS;
    if (knn_fused_best_shared(k)) {
        sh.best = end;
        end += (size_t)k * KNN_FUSED_ROWS;
    } else {
        sh.best = device_best + (size_t)blockIdx.x * k * KNN_FUSED_ROWS;
    }
    sh.list_count = (int *)end;
    sh.row_self = sh.list_count + KNN_FUSED_ROWS;
    sh.overflow = sh.row_self + KNN_FUSED_ROWS;
    sh.walk = sh.overflow + 1;
    sh.owners = (knn_owner *)(sh.walk + 2);
    return sh;
}

/* The row's k smallest (column `best`, stride 128) form a max-heap once
 * there are k of them, KNN_BEST_ARITY children a node (entry i's are
 * KNN_BEST_ARITY i + 1 on): the largest, the row's k-th smallest so far,
 * is at the root. Replacing it takes a step a level where a scan for the
 * new largest took k loads (at k = 100 that scan made the owners' work
 * rival the products). Past k = 32 the heap lies in device memory, where
 * a step waits for its loads: a level's children are loaded together, so
 * eight a node took 3 waits at k = 100 where two took 7 (the sift was
 * most of the owners' time, whom the block's other warps wait for).
 * s sinks from place i to where it is at least its children. */
#define KNN_BEST_ARITY 8

__device__ __forceinline__ void knn_best_sift(float *best, int k, int i,
                                             float s)
{
    for (int c0 = KNN_BEST_ARITY * i + 1; c0 < k;
         c0 = KNN_BEST_ARITY * i + 1) {
        float child[KNN_BEST_ARITY];
#pragma unroll
        for (int q = 0; q < KNN_BEST_ARITY; q++)
            child[q] = c0 + q < k ? best[(c0 + q) * KNN_FUSED_ROWS]
                                  : -INFINITY;
        float v = child[0];
        int c = c0;
#pragma unroll
        for (int q = 1; q < KNN_BEST_ARITY; q++)
            if (child[q] > v) {
                v = child[q];
                c = c0 + q;
            }
        if (!(v > s)) break;
        best[i * KNN_FUSED_ROWS] = v;
        i = c;
    }
    best[i * KNN_FUSED_ROWS] = s;
}

/* Inserts s into the row's k smallest: into a free place (the k-th
 * makes them a heap), or over the largest when s is below it; returns
 * whether it went in. The multiset kept is the k smallest seen, whatever
 * the order they came in. */
__device__ __forceinline__ int knn_best_insert(float *best, int k,
                                               knn_owner *o, float s)
{
    if (o->filled < k) {
        best[o->filled++ * KNN_FUSED_ROWS] = s;
        if (o->filled < k) return 1;
        for (int i = (k - 2) / KNN_BEST_ARITY; i >= 0; i--)
            knn_best_sift(best, k, i, best[i * KNN_FUSED_ROWS]);
    } else {
        if (!(s < o->kth)) return 0;
        knn_best_sift(best, k, 0, s);
    }
    o->kth = best[0];
    return 1;
}

/* When an owner takes its list (see the top of the file): that costs a
 * pass over shared memory, and the bound float64 square roots and
 * divisions, a long chain the block's other warps would wait for at the
 * next barrier. So after the first blocks, where thresholds fall fast,
 * lists are taken every KNN_FUSED_TIGHTEN_EVERY column blocks: a
 * threshold from an older, larger k-th smallest only lets a few more
 * survivors through, since the bound grows with the k-th. */
#define KNN_FUSED_TIGHTEN_EVERY 8
#define KNN_FUSED_EARLY_BLOCKS 16

/* Past k = 32 thresholds fall for longer (a row's list fills at
 * k' / b entries in its b-th block, see knn_fused_list_cap), so lists are
 * taken on twice as many first blocks (inst/bench/gpu.R's k = 100
 * case). */
__device__ __forceinline__ int knn_fused_early_blocks(int k)
{
    return knn_fused_best_shared(k) ? KNN_FUSED_EARLY_BLOCKS
                                    : 2 * KNN_FUSED_EARLY_BLOCKS;
}

/* The row's threshold once its k smallest are known: the candidate bound,
 * rounded down to a float (a float score is at most the bound exactly when
 * it is at most that float). */
__device__ __forceinline__ void knn_owner_tighten(const knn_select_args &a,
                                                  knn_owner *o, int changed)
{
    o->stale |= changed;
    if (!o->stale || o->filled < a.k) return;
    double b = knn_row_bound(a, knn_row_of(a, o->row), (double)o->kth);
    o->bound = fminf(o->bound, __double2float_rd(b));
    o->stale = 0;
}

__device__ __forceinline__ void knn_owner_append(const knn_fused_args &a,
                                                 knn_owner *o, float s,
                                                 int node)
{
    if (o->survivors < o->sslots)
        a.scratch.survivor[o->sbegin + o->survivors] =
            ((uint64_t)knn_order_bits(s) << 32) | (unsigned)node;
    o->survivors++;
}

/* The owner takes the first n entries of its list: sorted by node (a
 * plain walk's survivors become its candidates in their order; a shared
 * walk's lists are put in node order by knn_pairs_gather, so its owners
 * skip the sort), into the k smallest, then appended under the tightened
 * threshold; the list is emptied. Neither the k smallest, a multiset,
 * nor the survivors' number depends on the order. */
template <bool PAIRS>
__device__ void knn_owner_list(const knn_fused_args &a,
                               const knn_fused_shared &sh, knn_owner *o,
                               int n)
{
    int r = threadIdx.x;
    float *score = sh.list_score + r, *best = sh.best + r;
    int *node = sh.list_node + r;
    for (int i = 1; i < n && !PAIRS; i++) {
        float s = score[i * KNN_FUSED_ROWS];
        int c = node[i * KNN_FUSED_ROWS], j = i - 1;
        for (; j >= 0 && node[j * KNN_FUSED_ROWS] > c; j--) {
            score[(j + 1) * KNN_FUSED_ROWS] = score[j * KNN_FUSED_ROWS];
            node[(j + 1) * KNN_FUSED_ROWS] = node[j * KNN_FUSED_ROWS];
        }
        score[(j + 1) * KNN_FUSED_ROWS] = s;
        node[(j + 1) * KNN_FUSED_ROWS] = c;
    }
    int changed = 0;
    for (int i = 0; i < n; i++)
        changed |= knn_best_insert(best, a.sel.k, o,
                                   score[i * KNN_FUSED_ROWS]);
    knn_owner_tighten(a.sel, o, changed);
    for (int i = 0; i < n; i++) {
        float s = score[i * KNN_FUSED_ROWS];
        if (s <= o->bound)
            knn_owner_append(a, o, s, node[i * KNN_FUSED_ROWS]);
    }
    sh.list_count[r] = 0;
    o->listed = 0;
}

/* After column block `block` (from 0), whose lists all fitted: whether
 * the owner takes its list now or leaves it to gather (see
 * KNN_FUSED_TIGHTEN_EVERY). */
template <bool PAIRS>
__device__ __forceinline__ void knn_owner_after(const knn_fused_args &a,
                                                const knn_fused_shared &sh,
                                                knn_owner *o, int block,
                                                bool last)
{
    int n = sh.list_count[threadIdx.x];
    if (last || block < knn_fused_early_blocks(a.sel.k) ||
        n >= sh.list_cap / 2 ||
        block % KNN_FUSED_TIGHTEN_EVERY == KNN_FUSED_TIGHTEN_EVERY - 1)
        knn_owner_list<PAIRS>(a, sh, o, n);
    else
        o->listed = n;
}

/* A warp sorts 32 N values, N = 2^LOG_N a lane (value q of lane l is
 * element N l + q), ascending: a bitonic network, whose pairs more than N
 * elements apart meet across lanes. A pair swaps only where the first is
 * greater, so the values end as the same multiset. */
template <int LOG_N>
__device__ __forceinline__ void knn_warp_sort(float (&v)[1 << LOG_N],
                                              int lane)
{
    const int N = 1 << LOG_N;
    /* Counted loops, which the compiler unrolls (over doubled sizes it
     * did not, and indexed v in local memory). */
#pragma unroll
    for (int ls = 1; ls <= 5 + LOG_N; ls++) {
        const int size = 1 << ls;
#pragma unroll
        for (int lst = ls - 1; lst >= 0; lst--) {
            const int stride = 1 << lst;
            if (stride >= N) {
                int lanes = stride / N;
                bool low = (lane & lanes) == 0;
#pragma unroll
                for (int q = 0; q < N; q++) {
                    bool up = ((lane * N + q) & size) == 0;
                    float other = __shfl_xor_sync(0xffffffffu, v[q], lanes);
                    /* The pair's first element is the low lane's. */
                    float first = low ? v[q] : other;
                    float second = low ? other : v[q];
                    bool swap = up ? first > second : first < second;
                    if (swap) v[q] = other;
                }
            } else {
#pragma unroll
                for (int q = 0; q < N; q++) {
                    if (q & stride) continue;
                    bool up = ((lane * N + q) & size) == 0;
                    float x = v[q], y = v[q + stride];
                    if (up ? x > y : x < y) {
                        v[q] = y;
                        v[q + stride] = x;
                    }
                }
            }
        }
    }
}

/* Values a lane holds in knn_warp_merge_row: a row's k smallest (k <=
 * KNN_FUSED_MAX_K, four a lane) and a column block's 128 scores. */
#define KNN_MERGE_LOG_PER_LANE 3
#define KNN_MERGE_PER_LANE (1 << KNN_MERGE_LOG_PER_LANE)

/* A warp takes block row rl's scores of a column block taken whole (the
 * tile's row `row`, NaN where there is no node) into the row's k
 * smallest: those at or below its threshold join them, the warp sorts
 * the lot and keeps the k smallest, in descending order, which is a heap
 * (each parent before its children). Owners inserting score by score
 * wait on device memory at each level of the heap, so past k = 32 the
 * warps' sorts are faster; where the k smallest are in shared memory the
 * owners' inserts cost less than the sorts (inst/bench/gpu.R's k = 100
 * and k = 15 cases). The k smallest are the same multiset either
 * way. */
__device__ void knn_warp_merge_row(const knn_select_args &s,
                                   const knn_fused_shared &sh, int rl,
                                   const float *row, int lane)
{
    knn_owner *o = sh.owners + rl;
    float *best = sh.best + rl;
    int k = s.k, filled = o->filled;
    float bound = o->bound, v[KNN_MERGE_PER_LANE];
    int fresh = 0;
#pragma unroll
    for (int q = 0; q < KNN_MERGE_PER_LANE / 2; q++) {
        int i = lane + 32 * q;
        v[q] = i < filled ? best[i * KNN_FUSED_ROWS] : INFINITY;
        float x = row[i];
        bool in = x <= bound; /* not NaN */
        v[KNN_MERGE_PER_LANE / 2 + q] = in ? x : INFINITY;
        fresh += __popc(__ballot_sync(0xffffffffu, in));
    }
    if (fresh == 0) return; /* the whole warp */
    knn_warp_sort<KNN_MERGE_LOG_PER_LANE>(v, lane);
    int kept = min(k, filled + fresh);
#pragma unroll
    for (int q = 0; q < KNN_MERGE_PER_LANE; q++) {
        int e = lane * KNN_MERGE_PER_LANE + q;
        if (e < kept)
            best[(kept == k ? k - 1 - e : e) * KNN_FUSED_ROWS] = v[q];
    }
    /* The k-th went to the heap's root (read back: picking it from v by
     * a lane's index would put v in local memory). */
    __syncwarp();
    if (lane == 0) {
        o->filled = kept;
        if (kept == k) o->kth = best[0];
        o->stale = 1;
    }
}

/* The block's rows of a column block taken whole, in the tile: each
 * warp merges 16 of them (knn_warp_merge_row). */
__device__ __forceinline__ void knn_warp_merge_tile(
    const knn_select_args &s, const knn_fused_shared &sh, int row0)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int per_warp = KNN_FUSED_ROWS / (KNN_FUSED_THREADS / 32);
    for (int i = 0; i < per_warp; i++) {
        int rl = warp * per_warp + i;
        if (row0 + rl < s.rows)
            knn_warp_merge_row(s, sh, rl,
                               sh.tile + rl * KNN_FUSED_TILE_LD, lane);
    }
}

/* The node of column j: a pruned walk's columns are in its k-d order. */
__device__ __forceinline__ int knn_fused_node(const int *col_node, int j)
{
    return col_node ? col_node[j] : j;
}

/* The owner's share of a column block taken whole (its row's scores
 * `row`): those under the old threshold go into the k smallest, unless
 * the warps have merged them already (`merged`), and those under the new
 * one are appended, in column order. */
__device__ void knn_owner_tile(const knn_fused_args &a,
                               const knn_fused_shared &sh, knn_owner *o,
                               const float *row, int col0, bool merged,
                               const int *col_node)
{
    float *best = sh.best + threadIdx.x;
    int changed = 0;
    for (int c = 0; c < KNN_FUSED_COLS && !merged; c++)
        if (row[c] <= o->bound)
            changed |= knn_best_insert(best, a.sel.k, o, row[c]);
    knn_owner_tighten(a.sel, o, changed);
    for (int c = 0; c < KNN_FUSED_COLS; c++)
        if (row[c] <= o->bound)
            knn_owner_append(a, o, row[c], knn_fused_node(col_node, col0 + c));
}

/* A shared walk's row after its walk: its k smallest and threshold
 * become its node's, from which later tiles' offers are judged (the
 * candidates are already in its list, `kept` of them; the node is lost
 * where they are more than the list holds or its survivors overflowed
 * their slots, since then some are missing). */
__device__ void knn_owner_to_node(const knn_fused_args &a,
                                  const knn_fused_shared &sh,
                                  const knn_owner *o, int node, int kept,
                                  double bound)
{
    const knn_pairs &p = a.walk.pairs;
    for (int i = 0; i < p.k; i++)
        p.best[(size_t)node * p.k + i] = i < o->filled
            ? sh.best[i * KNN_FUSED_ROWS + threadIdx.x] : INFINITY;
    p.threshold[node] = __double2float_rd(bound);
    p.count[node] = kept;
    p.merged[node] = kept;
    if (kept > p.cap || o->survivors > o->sslots) knn_pairs_lose(p, node);
}

/* After the last column block: the final bound from the row's k smallest,
 * and the survivors under it, in node order, become the candidates (of a
 * shared walk: the first entries of its node's list). */
template <bool PAIRS>
__device__ void knn_owner_finish(const knn_fused_args &a,
                                 const knn_fused_shared &sh, knn_owner *o,
                                 int r)
{
    const knn_select_args &s = a.sel;
    const knn_pairs &p = a.walk.pairs;
    knn_row w = knn_row_of(s, r);
    double bound = o->filled < s.k ? INFINITY
        : knn_row_bound(s, w, (double)o->kth);
    int node = s.self_first + r;
    int stored = min(o->survivors, o->sslots), kept = 0;
    for (int i = 0; i < stored; i++) {
        uint64_t u = a.scratch.survivor[o->sbegin + i];
        if ((double)knn_order_float((unsigned)(u >> 32)) <= bound) {
            if (PAIRS && kept < p.cap)
                p.list[(size_t)node * p.cap + kept] = u;
            else if (!PAIRS && kept < w.slots)
                s.cand_index[w.begin + kept] = (int)(u & 0xffffffffu);
            kept++;
        }
    }
    a.scratch.needed[r] = o->survivors;
    if (a.scratch.bound) a.scratch.bound[r] = o->bound;
    knn_row_done(s, r, w, kept);
    if (PAIRS) knn_owner_to_node(a, sh, o, node, kept, bound);
}

/* Distances: the products of the nodes' scaled fp16 copies become those
 * of their fast vectors, times the row's unscale and then the column's
 * (powers of two: exact where the results are normal floats). */
__device__ __forceinline__ void knn_fused_unscale(const knn_fused_shared &sh,
                                                  const float *col_unscale,
                                                  float (&acc)[4][4][4])
{
    knn_frag fr = knn_frag_of();
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float cu = col_unscale[knn_frag_col(fr, nt, e)];
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float ru = sh.row_unscale[knn_frag_row(fr, mt, h)];
                    acc[mt][nt][2 * h + e] = acc[mt][nt][2 * h + e] * ru * cu;
                }
        }
}

/* This thread's 8 rows' squared norms (distances; zeros otherwise). */
template <int KIND>
__device__ __forceinline__ void knn_fused_row_sq(const knn_fused_shared &sh,
                                                 float (&row_sq)[4][2])
{
    knn_frag fr = knn_frag_of();
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            row_sq[mt][h] = KIND == KNN_SCORE_DIST
                ? sh.row_sq[knn_frag_row(fr, mt, h)] : 0.0f;
}

/* Whether column j is a node, and not block row rl's own. */
__device__ __forceinline__ bool knn_fused_is_node(const knn_select_args &s,
                                                  const knn_fused_shared &sh,
                                                  int rl, int j)
{
    return j < s.n_cols && j != sh.row_self[rl];
}

/* The block's scores of column block col0, whole, in the tile; NaN where
 * there is no node. */
template <int KIND>
__device__ __forceinline__ void knn_fused_tile(
    const knn_select_args &s, const knn_fused_shared &sh,
    const float *col_sq, const float (&acc)[4][4][4],
    int col0)
{
    knn_frag fr = knn_frag_of();
    float row_sq[4][2];
    knn_fused_row_sq<KIND>(sh, row_sq);
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int cl = knn_frag_col(fr, nt, e), j = col0 + cl;
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int rl = knn_frag_row(fr, mt, h);
                    float v = knn_fused_is_node(s, sh, rl, j)
                        ? knn_score_from<KIND>(acc[mt][nt][2 * h + e],
                                               row_sq[mt][h], col_sq[cl])
                        : __int_as_float(0x7fffffff);
                    sh.tile[rl * KNN_FUSED_TILE_LD + cl] = v;
                }
        }
}

/* Lists score v of column col0 + cl for block row rl, by its node
 * (knn_fused_node), unless there is no such node or it is the row's own;
 * a full list marks the column block (`tag`: its number from 1) as
 * overflowed. */
__device__ __forceinline__ void knn_fused_list(const knn_select_args &s,
                                               const knn_fused_shared &sh,
                                               float v, int rl, int cl,
                                               int col0, int tag,
                                               const int *col_node)
{
    if (!knn_fused_is_node(s, sh, rl, col0 + cl)) return;
    int pos = atomicAdd(&sh.list_count[rl], 1);
    if (pos < sh.list_cap) {
        sh.list_score[pos * KNN_FUSED_ROWS + rl] = v;
        sh.list_node[pos * KNN_FUSED_ROWS + rl] =
            knn_fused_node(col_node, col0 + cl);
    } else {
        *sh.overflow = tag;
    }
}

/* A shared walk's offer of row node `node`, at score v, to node j's list
 * (past a full list only counted: the merge marks the node lost). */
__device__ __forceinline__ void knn_pairs_offer(const knn_pairs &p, int j,
                                                float v, int node)
{
    int pos = atomicAdd(&p.count[j], 1);
    if (pos < p.cap)
        p.list[(size_t)j * p.cap + pos] =
            ((uint64_t)knn_order_bits(v) << 32) | (unsigned)node;
}

/* The score of entry (mt, h) of column (nt, e), for a column that passed
 * its test: computed again, not kept from the test (live scores would
 * spill); the empty asm keeps the compiler from reusing them. Same
 * bits. */
template <int KIND>
__device__ __forceinline__ float knn_fused_rescore(
    const float (&acc)[4][4][4], const float (&row_sq)[4][2], float csq,
    int mt, int nt, int h, int e)
{
    float a = acc[mt][nt][2 * h + e];
    asm("" : "+f"(a));
    return knn_score_from<KIND>(a, row_sq[mt][h], csq);
}

/* A shared walk's offers from column cl (node j) of an earlier tile: each
 * of the thread's scores at or below the node's threshold cthr offers the
 * row's node to j's list. */
template <int KIND>
__device__ __forceinline__ void knn_fused_offer_column(
    const knn_fused_args &fa, const float (&acc)[4][4][4],
    const float (&row_sq)[4][2], float csq, float cthr, int nt, int e,
    int j, const knn_fused_shared &sh, int row0)
{
    knn_frag fr = knn_frag_of();
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v = knn_fused_rescore<KIND>(acc, row_sq, csq, mt, nt, h, e);
            int rl = knn_frag_row(fr, mt, h);
            if (v <= cthr && row0 + rl < fa.sel.rows)
                knn_pairs_offer(fa.walk.pairs, j, v, sh.row_self[rl]);
        }
}

/* Epilogue of a column block: the scores at or below their rows'
 * thresholds into the rows' lists (a full list sets the overflow flag)
 * and, in a shared walk's block of earlier tiles' nodes (OFFERS), the
 * offers of knn_fused_offer_column. Per score, an addition, a fused
 * multiply-add, a comparison and (OFFERS) a minimum, with no branch: a
 * column's 8 scores are tested together, against their rows' thresholds
 * and, by their smallest, against the column's, and only a column where
 * one passes is taken score by score, each checked for a node that
 * exists and is not the row's own. One pass, not one per test: two would
 * compute each score twice. */
template <int KIND, bool OFFERS>
__device__ __forceinline__ void knn_fused_epilogue(
    const knn_fused_args &fa, const knn_fused_shared &sh,
    const float *col_sq, const float (&acc)[4][4][4],
    int row0, int col0, int tag, const int *col_node)
{
    const knn_select_args &s = fa.sel;
    knn_frag fr = knn_frag_of();
    float row_sq[4][2];
    knn_fused_row_sq<KIND>(sh, row_sq);
    float bound[4][2];
#pragma unroll
    for (int mt = 0; mt < 4; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            bound[mt][h] = sh.threshold[knn_frag_row(fr, mt, h)];
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int cl = knn_frag_col(fr, nt, e), j = col0 + cl;
            float csq = KIND == KNN_SCORE_DIST ? col_sq[cl] : 0.0f;
            /* Nodes past the earlier tiles take no offers (NaN). */
            float cthr = OFFERS && j < fa.walk.offer_end
                ? fa.walk.pairs.threshold[j] : __int_as_float(0x7fffffff);
            bool any = false;
            float lowest = INFINITY;
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float v = knn_score_from<KIND>(acc[mt][nt][2 * h + e],
                                                   row_sq[mt][h], csq);
                    any |= v <= bound[mt][h];
                    if (OFFERS) lowest = fminf(lowest, v);
                }
            if (OFFERS && lowest <= cthr)
                knn_fused_offer_column<KIND>(fa, acc, row_sq, csq, cthr, nt,
                                             e, j, sh, row0);
            if (!any) continue;
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float v = knn_fused_rescore<KIND>(acc, row_sq, csq, mt,
                                                      nt, h, e);
                    if (v <= bound[mt][h])
                        knn_fused_list(s, sh, v, knn_frag_row(fr, mt, h), cl,
                                       col0, tag, col_node);
                }
        }
}

/* ---- a pruned walk ----------------------------------------------------- */

/* A pruned walk visits the column blocks from its home block (the one
 * whose centre is nearest its rows'), then outward, alternately after and
 * before it, so that the rows' thresholds fall early; place s of that
 * order is column block knn_prune_block_at (-1 where it falls outside;
 * every block has a place below 2 blocks). */
__device__ __forceinline__ int knn_prune_block_at(int home, int s,
                                                  int blocks)
{
    int b = (s & 1) ? home + (s + 1) / 2 : home - s / 2;
    return b >= 0 && b < blocks ? b : -1;
}

/* The least score any pair of the row block and a column block can
 * have, rounded down to a float: from lb, a lower bound of their nodes'
 * distance in exact units, and nsum, the sum of their largest fast norms,
 * less the margin |score - key| <= unit (n_i + n_l)^2 + floor that
 * knn_dist_row_bound rests on (1e-6 covers the keys' rounding, as there);
 * -inf where lb proves nothing. */
__device__ __forceinline__ float knn_prune_floor(const knn_select_args &s,
                                                 double lb, double nsum)
{
    if (!(lb > 0.0)) return -INFINITY;
    double f = ldexp(lb, -s.scale_exp);
    double low = f * f * (1.0 - 1e-6) -
                 s.margin_unit * nsum * nsum * (1.0 + 1e-6) - s.margin_floor;
    return __double2float_rd(low);
}

/* All threads: the row block's floor of every column block into its
 * scratch (knn_prune_floor of the boxes' distance: the root of the sum
 * over features of the squared gap between the two ranges, a float64 sum
 * of non-negative rounded terms within (p + 2) 2^-53, under 2^-26, of
 * itself), and its home block, whose box's centre is nearest the row
 * block's, into sh.walk[1]. Uses the staging buffers, before the first
 * column block is queued. */
__device__ void knn_prune_start(const knn_fused_args &a,
                                const knn_fused_shared &sh)
{
    const knn_fused_prune &pr = a.prune;
    int rb = blockIdx.x, nb = pr.col_blocks, p = pr.p;
    double nr = pr.row_norm_max[rb];
    float *floor = pr.skip_floor + (size_t)blockIdx.x * nb;
    double best = INFINITY;
    int home = 0;
    for (int c = threadIdx.x; c < nb; c += blockDim.x) {
        double gap2 = 0.0, centre2 = 0.0;
        for (int f = 0; f < p; f++) {
            size_t fr = (size_t)f * pr.row_blocks + rb;
            size_t fc = (size_t)f * nb + c;
            double rl = pr.row_lo[fr], rh = pr.row_hi[fr];
            double cl = pr.col_lo[fc], ch = pr.col_hi[fc];
            double gap = fmax(0.0, fmax(cl - rh, rl - ch));
            double off = (rl + rh) - (cl + ch);
            gap2 += gap * gap;
            centre2 += off * off;
        }
        if (centre2 < best) {
            best = centre2;
            home = c;
        }
        double lb = sqrt(gap2) * (1.0 - 0x1p-24);
        floor[c] = knn_prune_floor(a.sel, lb, nr + pr.col_norm_max[c]);
    }
    for (int o = 16; o > 0; o >>= 1) {
        double ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oh = __shfl_xor_sync(0xffffffffu, home, o);
        if (ob < best || (ob == best && oh < home)) {
            best = ob;
            home = oh;
        }
    }
    double *warp_best = (double *)sh.stage;
    int *warp_home = (int *)(warp_best + KNN_FUSED_THREADS / 32);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        warp_best[warp] = best;
        warp_home[warp] = home;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < KNN_FUSED_THREADS / 32; w++)
            if (warp_best[w] < best ||
                (warp_best[w] == best && warp_home[w] < home)) {
                best = warp_best[w];
                home = warp_home[w];
            }
        sh.walk[1] = home;
    }
    __syncthreads();
}

/* Warp 0: the place after `from` of the first column block that the rows
 * cannot skip, or -1. A block is skipped where its floor lies above every
 * row's threshold: no score of it would be listed, so the walk's
 * candidates are those of the whole reference (a threshold only falls, so
 * a block skipped now would be skipped when its turn came). */
__device__ int knn_prune_next(const knn_fused_args &a,
                              const knn_fused_shared &sh, int from,
                              int lane)
{
    const knn_fused_prune &pr = a.prune;
    float most = -INFINITY; /* NaN thresholds (no row) do not count */
    for (int i = lane; i < KNN_FUSED_ROWS; i += 32)
        most = fmaxf(most, sh.threshold[i]);
    for (int o = 16; o > 0; o >>= 1)
        most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, o));
    const float *floor = pr.skip_floor + (size_t)blockIdx.x * pr.col_blocks;
    int home = sh.walk[1], places = 2 * pr.col_blocks;
    for (int s0 = from + 1; s0 < places; s0 += 32) {
        int place = s0 + lane;
        int b = place < places
            ? knn_prune_block_at(home, place, pr.col_blocks) : -1;
        unsigned visit = __ballot_sync(0xffffffffu,
                                       b >= 0 && !(floor[b] > most));
        if (visit) return s0 + __ffs(visit) - 1;
    }
    return -1;
}

/* The column block at place `place` of a pruned walk, as its first
 * column; n_cols where there is none. */
__device__ __forceinline__ int knn_prune_col0(const knn_fused_args &a,
                                              int home, int place)
{
    return place < 0 ? a.sel.n_cols
        : knn_prune_block_at(home, place, a.prune.col_blocks) *
              KNN_FUSED_COLS;
}

/* ---- the kernel -------------------------------------------------------- */

/* Where row r's threshold starts: at infinity, or on a run again of the
 * same rows on the same course (products of the same vectors, so the same
 * scores), at the lowest threshold the row took in the run before (its
 * last, knn_owner_finish). Every threshold is a valid bound at or above
 * the k-th smallest score it came from, so the row's k smallest all pass
 * again and its final bound is the same; every node at or under the
 * seed passed every threshold of the first run, so this run's candidates
 * are among that run's (the bound is not monotone in the k-th where
 * distances underflow, so the first run's final bound may lie above an
 * earlier threshold); and no survivor lies above the final bound, so the
 * survivors are the candidates, and no column block overflows the lists
 * for want of a threshold. */
__device__ __forceinline__ float knn_fused_seed(const knn_fused_scratch &s,
                                                int r)
{
    return s.seeded ? s.bound[r] : INFINITY;
}

/* PRUNE: a pruned walk (knn_fused_prune): the column blocks in its order,
 * skipping those whose floors lie above the rows' thresholds; the nodes
 * of its columns (knn_fused_node) are listed, and a row's own node is its
 * column (row_self). Its first block is queued once the order is
 * known. */
template <int KIND, bool PAIRS, bool PRUNE>
__global__ void __launch_bounds__(KNN_FUSED_THREADS, 2)
knn_fused_kernel(knn_fused_args a)
{
    extern __shared__ float knn_fused_smem[];
    const knn_select_args &s = a.sel;
    knn_fused_shared sh = knn_fused_carve(knn_fused_smem, s.k,
                                          a.scratch.best);
    int row0 = blockIdx.x * KNN_FUSED_ROWS;
    int lane = threadIdx.x & 31;
    bool owner = threadIdx.x < KNN_FUSED_ROWS &&
                 row0 + (int)threadIdx.x < s.rows;

    if (!PRUNE) knn_fused_prefetch<KIND>(a, sh.stage, sh.col_sq, row0, 0);
    knn_owner *o = owner ? sh.owners + threadIdx.x : NULL;
    if (owner) {
        int r = row0 + threadIdx.x;
        o->row = r;
        o->sbegin = a.scratch.offsets[r];
        o->sslots = a.scratch.offsets[r + 1] - o->sbegin;
        o->filled = 0;
        o->kth = INFINITY;
        o->stale = 0;
        o->survivors = 0;
        o->listed = 0;
        o->bound = knn_fused_seed(a.scratch, r);
    }
    if (threadIdx.x < KNN_FUSED_ROWS) {
        /* A row past the tile has a NaN threshold, under which no score
         * is, so its list stays empty. */
        sh.threshold[threadIdx.x] = owner
            ? knn_fused_seed(a.scratch, row0 + threadIdx.x)
            : __int_as_float(0x7fffffff);
        sh.row_sq[threadIdx.x] = KIND == KNN_SCORE_DIST && owner
            ? s.row_sqnorm[row0 + threadIdx.x] : 0.0f;
        sh.row_unscale[threadIdx.x] = KIND == KNN_SCORE_DIST && owner
            ? a.unscale_rows[row0 + threadIdx.x] : 0.0f;
        sh.list_count[threadIdx.x] = 0;
        /* Kept in shared memory, not worked out where needed: that took
         * registers the products and epilogue need. */
        int self = owner ? knn_row_self(s, row0 + threadIdx.x) : -1;
        sh.row_self[threadIdx.x] = PRUNE && self >= 0 ? a.prune.col_pos[self]
                                                      : self;
    }
    if (threadIdx.x == 0) *sh.overflow = 0;

    /* Known NULL where the walk is not pruned, so those kernels' code
     * does not test it. */
    const int *col_node = PRUNE ? a.prune.col_node : NULL;
    int col0 = 0, place = 0, home = 0;
    if (PRUNE) {
        knn_prune_start(a, sh);
        if (threadIdx.x < 32) {
            int first = knn_prune_next(a, sh, -1, lane);
            if (lane == 0) sh.walk[0] = first;
        }
        __syncthreads();
        home = sh.walk[1];
        place = sh.walk[0];
        col0 = knn_prune_col0(a, home, place);
        if (col0 < s.n_cols)
            knn_fused_prefetch<KIND>(a, sh.stage, sh.col_sq, row0, col0);
    }

    for (int parity = 0, block = 0; col0 < s.n_cols;
         parity ^= 1, block++) {
        if (PRUNE) {
            /* The owners' thresholds of the block before are in; the
             * products' barriers hand the next place to every thread. */
            __syncthreads();
            if (threadIdx.x < 32) {
                int next = knn_prune_next(a, sh, place, lane);
                if (lane == 0) sh.walk[0] = next;
            }
        }
        float acc[4][4][4];
        knn_fused_products(a, sh.stage, row0, col0, acc);
        const float *col_sq = sh.col_sq + parity * 2 * KNN_FUSED_COLS;
        float *next_sq = sh.col_sq + (parity ^ 1) * 2 * KNN_FUSED_COLS;
        if (KIND == KNN_SCORE_DIST)
            knn_fused_unscale(sh, col_sq + KNN_FUSED_COLS, acc);
        int next_place = PRUNE ? sh.walk[0] : 0;
        int next_col0 = PRUNE ? knn_prune_col0(a, home, next_place)
                              : col0 + KNN_FUSED_COLS;
        bool more = next_col0 < s.n_cols;
        if (more)
            knn_fused_prefetch<KIND>(a, sh.stage, next_sq, row0, next_col0);

        if (PAIRS && col0 < a.walk.offer_end)
            knn_fused_epilogue<KIND, true>(a, sh, col_sq, acc, row0,
                                           col0, block + 1, col_node);
        else
            knn_fused_epilogue<KIND, false>(a, sh, col_sq, acc, row0,
                                            col0, block + 1, col_node);
        __syncthreads();
        /* Owners and the overflow flag need no barrier after them: the
         * lists, thresholds and flag are next written in the next block's
         * epilogue, after its products' barriers. */
        if (*sh.overflow == block + 1) {
            /* Some list overflowed: the lists as the earlier blocks left
             * them are taken, then this block whole, in the tile over the
             * staging buffers (the next block's first stage lands first,
             * and is queued again after). Where the rows' k smallest are
             * in device memory the warps merge the tile's rows into them
             * (knn_warp_merge_row); the owners insert their own
             * elsewhere; then they append. */
            bool merge = !knn_fused_best_shared(s.k);
            knn_cp_wait<0>();
            __syncthreads();
            if (owner) knn_owner_list<PAIRS>(a, sh, o, o->listed);
            knn_fused_tile<KIND>(s, sh, col_sq, acc, col0);
            __syncthreads();
            if (merge) {
                knn_warp_merge_tile(s, sh, row0);
                __syncthreads();
            }
            if (owner)
                knn_owner_tile(a, sh, o,
                               sh.tile + threadIdx.x * KNN_FUSED_TILE_LD,
                               col0, merge, col_node);
            __syncthreads();
            if (more)
                knn_fused_prefetch<KIND>(a, sh.stage, next_sq, row0,
                                         next_col0);
        } else if (owner) {
            knn_owner_after<PAIRS>(a, sh, o, block, !more);
        }
        if (owner) sh.threshold[threadIdx.x] = o->bound;
        col0 = next_col0;
        place = next_place;
    }
    if (owner)
        knn_owner_finish<PAIRS>(a, sh, o, row0 + threadIdx.x);
}

/* ---- dispatch ---------------------------------------------------------- */

/* Lets the kind's kernel take the shared memory it needs for this k
 * (*smem bytes; beyond 48 KB a kernel must be allowed it). */
template <int KIND, bool PAIRS, bool PRUNE>
static knn_status knn_fused_allow_smem(int k, size_t *smem, char *message)
{
    *smem = knn_fused_smem_bytes(k);
    KNN_CUDA_TRY(message, cudaFuncSetAttribute(
        knn_fused_kernel<KIND, PAIRS, PRUNE>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem));
    return KNN_OK;
}

template <int KIND, bool PAIRS, bool PRUNE>
static knn_status knn_fused_launch_as(const knn_fused_args *a,
                                      char *message, cudaStream_t stream)
{
    size_t smem = 0;
    KNN_TRY((knn_fused_allow_smem<KIND, PAIRS, PRUNE>(a->sel.k, &smem,
                                                      message)));
    unsigned blocks = (a->sel.rows + KNN_FUSED_ROWS - 1) / KNN_FUSED_ROWS;
    knn_fused_kernel<KIND, PAIRS, PRUNE>
        <<<blocks, KNN_FUSED_THREADS, smem, stream>>>(*a);
    KNN_LAUNCH_TRY(message, "knn_fused_kernel");
    return KNN_OK;
}

/* The kernel of a shared walk (a->walk.pairs.list set), of a pruned one
 * (a->prune.col_node set; distances only) or of a plain one. */
template <int KIND>
static knn_status knn_fused_launch(const knn_fused_args *a, char *message,
                                   cudaStream_t stream)
{
    if (a->walk.pairs.list)
        return knn_fused_launch_as<KIND, true, false>(a, message, stream);
    if constexpr (KIND == KNN_SCORE_DIST)
        if (a->prune.col_node)
            return knn_fused_launch_as<KIND, false, true>(a, message,
                                                          stream);
    return knn_fused_launch_as<KIND, false, false>(a, message, stream);
}

/* The end of each dispatch on the score kind: the kernel has no other. */
static knn_status knn_fused_kind_refused(char *message)
{
    return knn_gpu_fail(message, KNN_E_INVALID, "fused candidates",
                        "the fused kernel takes product metrics only",
                        __FILE__, __LINE__);
}

/* Blocks of the kind's kernel that one SM holds at once for this k
 * (registers and shared memory decide it), at least one: the fewest of
 * the plain, the shared and (distances) the pruned walk's kernels, so
 * that a wave is one for any. */
template <int KIND>
static knn_status knn_fused_blocks_per_sm(int k, int *blocks, char *message)
{
    size_t smem = 0;
    int plain = 1, pairs = 1, pruned = 1;
    KNN_TRY((knn_fused_allow_smem<KIND, false, false>(k, &smem, message)));
    KNN_TRY((knn_fused_allow_smem<KIND, true, false>(k, &smem, message)));
    KNN_CUDA_TRY(message, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &plain, knn_fused_kernel<KIND, false, false>, KNN_FUSED_THREADS,
        smem));
    KNN_CUDA_TRY(message, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &pairs, knn_fused_kernel<KIND, true, false>, KNN_FUSED_THREADS,
        smem));
    if constexpr (KIND == KNN_SCORE_DIST) {
        KNN_TRY((knn_fused_allow_smem<KIND, false, true>(k, &smem,
                                                         message)));
        KNN_CUDA_TRY(message, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &pruned, knn_fused_kernel<KIND, false, true>, KNN_FUSED_THREADS,
            smem));
    }
    *blocks = plain < pairs ? plain : pairs;
    if (pruned < *blocks) *blocks = pruned;
    if (*blocks < 1) *blocks = 1;
    return KNN_OK;
}

knn_status knn_fused_wave_rows(knn_score_kind kind, int k, int sm_count,
                               int *rows, char *message)
{
    int blocks = 1;
    switch (kind) {
    case KNN_SCORE_NEG:
        KNN_TRY(knn_fused_blocks_per_sm<KNN_SCORE_NEG>(k, &blocks, message));
        break;
    case KNN_SCORE_NEGABS:
        KNN_TRY(knn_fused_blocks_per_sm<KNN_SCORE_NEGABS>(k, &blocks,
                                                          message));
        break;
    case KNN_SCORE_DIST:
        KNN_TRY(knn_fused_blocks_per_sm<KNN_SCORE_DIST>(k, &blocks,
                                                        message));
        break;
    default:
        return knn_fused_kind_refused(message);
    }
    *rows = KNN_FUSED_ROWS * blocks * sm_count;
    return KNN_OK;
}

knn_status knn_fused_candidates(const knn_select_args *sel,
                                const knn_gpu_nodes *nodes, int node0,
                                const knn_fused_scratch *scratch,
                                const knn_pairs_walk *walk,
                                const knn_fused_prune *prune,
                                char *message, cudaStream_t stream)
{
    knn_fused_args a;
    memset(&a.walk, 0, sizeof a.walk);
    if (walk) a.walk = *walk;
    memset(&a.prune, 0, sizeof a.prune);
    if (prune) a.prune = *prune;
    a.sel = *sel;
    if (!nodes->half)
        return knn_gpu_fail(message, KNN_E_INVALID, "fused candidates",
                            "the fp16 vectors are absent (knn_nodes_half)",
                            __FILE__, __LINE__);
    a.vec_ref = nodes->half;
    a.vec_rows = nodes->half + (size_t)node0 * nodes->ldh;
    a.ld = nodes->ldh;
    a.unscale_ref = nodes->half_unscale;
    a.unscale_rows = nodes->half_unscale
        ? nodes->half_unscale + node0 : NULL;
    a.scratch = *scratch;
    switch (sel->kind) {
    case KNN_SCORE_NEG:
        return knn_fused_launch<KNN_SCORE_NEG>(&a, message, stream);
    case KNN_SCORE_NEGABS:
        return knn_fused_launch<KNN_SCORE_NEGABS>(&a, message, stream);
    case KNN_SCORE_DIST:
        return knn_fused_launch<KNN_SCORE_DIST>(&a, message, stream);
    default:
        return knn_fused_kind_refused(message);
    }
}
