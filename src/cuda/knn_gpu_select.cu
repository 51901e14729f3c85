/*
 * knn_gpu_select.cu: candidate selection on a row tile's panel of products.
 *
 * For query row r the fast scores s_j (knn_score_kind) of all reference
 * nodes lie in one contiguous panel row. A node is a candidate when
 * s_j <= T_r with T_r >= (k-th smallest s of the row) + 2 * margin_r; by the
 * margins of knn_exact.h every node of the exact top k is then a candidate.
 * Each kernel makes a threshold pass (or two) and one compaction pass that
 * writes the candidates in ascending node order (stable), so that the
 * re-rank's stable sort breaks equal keys by the smaller index. The number
 * found is always written, also when it exceeds the row's slots; the caller
 * then gives the row more slots and runs the tile again, so nothing is
 * dropped.
 *
 *  - KNN_SELECT_WARP (k <= 32): one warp per row. Each lane keeps the K
 *    smallest scores of its strided share in a sorted register queue (K the
 *    power-of-two bucket >= k), KNN_ITEMS loads in flight; the warp then
 *    pops the k smallest of the 32 queues, which is exactly the row's k-th
 *    score. Then a ballot compaction, 32 nodes per step, no barriers.
 *  - KNN_SELECT_RADIX (any k): one block per row. Two histogram passes over
 *    the order-preserving bits of the scores (12 bits each, shared-memory
 *    bins) find the bucket holding the k-th score; T uses the bucket's upper
 *    edge, a bound at most 2^-15 relative above it. Then the block-wide
 *    compaction (each thread tests 8 consecutive nodes; a block scan of
 *    the counts places the candidates). For k small against the row, the
 *    histograms run on 1/stride of the nodes only (runs of 32), which bounds
 *    T from above, and one pass moves the few nodes under that bound into
 *    shared memory where the exact bucket is found: one read of the row
 *    instead of three (two where more nodes pass that bound than the
 *    buffer holds: the first buffer's k-th bounds a second pass). A TF32
 *    tile's candidates there, where more than 2k + 32, are then rescored
 *    in float32 (knn_refine), whose narrower margin lets far fewer through
 *    to the float64 re-rank; a search that found TF32 crowded gives the
 *    buffer room for thousands of them (KNN_REFINE_BUF).
 *  - Float64 panels (the fp64 rung): the radix kernel on the 64
 *    order-preserving bits, as many 12-bit digits as it takes to leave
 *    few scores above the k-th in its bucket (five at most: within 2^-48
 *    relative of it, where float64's margins are some 2^-45), its
 *    sampled path keeping the nodes under the sample's bound in shared
 *    memory (KNN_SAMPLE64_BUF), then the same compaction.
 * knn_select_choose() picks one from (rows, k) by the crossovers that
 * inst/bench/select_thresholds.R measured.
 *
 * Exact keys (knn_select_keys, a pairwise-complete search's float64
 * distances as bits): one block per row finds the k-th smallest key by a
 * radix select, eight bits a pass, and keeps the keys below it and the
 * first of those equal to it; no margin, no re-rank.
 */
#include <stdlib.h>
#include <string.h>
#include <cub/block/block_scan.cuh>
#include <math_constants.h>
#include "knn_gpu_score.cuh"

#define KNN_WARP_ROWS 4            /* rows (warps) per block, warp select */
#define KNN_RADIX_THREADS 512
#define KNN_RADIX_BINS 4096        /* 12-bit digits */
#define KNN_RADIX_PER_THREAD (KNN_RADIX_BINS / KNN_RADIX_THREADS)
#define KNN_SAMPLE_BUF 3072         /* shared-memory nodes, sampled path */
#define KNN_REFINE_BUF 10240        /* the same, TF32 found crowded */
#define KNN_SAMPLE_MAX_STRIDE 16
#define KNN_ITEMS 8                 /* loads in flight per thread */


/* ---- warp select ------------------------------------------------------ */

template <int K>
__device__ __forceinline__ void knn_queue_insert(float (&q)[K], float v)
{
    if (!(v < q[K - 1])) return;
    q[K - 1] = v;
#pragma unroll
    for (int i = K - 1; i > 0; i--) {
        if (q[i] < q[i - 1]) {
            float t = q[i];
            q[i] = q[i - 1];
            q[i - 1] = t;
        }
    }
}

/* The k-th smallest value over the lanes' sorted queues: k rounds, each
 * popping the warp's minimum head (lowest lane on ties). */
template <int K>
__device__ __forceinline__ float knn_warp_kth(float (&q)[K], int k, int lane)
{
    float m = 0.0f;
    for (int round = 0; round < k; round++) {
        m = q[0];
        for (int o = 16; o > 0; o >>= 1)
            m = fminf(m, __shfl_xor_sync(0xffffffffu, m, o));
        unsigned owners = __ballot_sync(0xffffffffu, q[0] == m);
        if (lane == __ffs(owners) - 1) {
#pragma unroll
            for (int i = 0; i < K - 1; i++) q[i] = q[i + 1];
            q[K - 1] = INFINITY;
        }
    }
    return m;
}

template <int K, int KIND>
__global__ void __launch_bounds__(32 * KNN_WARP_ROWS)
knn_warp_select_kernel(knn_select_args a)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * KNN_WARP_ROWS + (threadIdx.x >> 5);
    if (r >= a.rows) return;
    knn_row w = knn_row_of(a, r);

    /* KNN_ITEMS loads in flight per lane: one warp reads the whole row. */
    float q[K];
#pragma unroll
    for (int i = 0; i < K; i++) q[i] = INFINITY;
    for (int base = 0; base < a.n_cols; base += 32 * KNN_ITEMS) {
        float v[KNN_ITEMS];
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) {
            int j = base + it * 32 + lane;
            v[it] = j < a.n_cols && j != w.self
                ? knn_fast_score<KIND>(w.vals[j], j, a, w.sq) : INFINITY;
        }
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) knn_queue_insert<K>(q, v[it]);
    }
    double t = knn_row_bound(a, w, (double)knn_warp_kth<K>(q, a.k, lane));

    int found = 0;
    unsigned below = (1u << lane) - 1u;
    for (int base = 0; base < a.n_cols; base += 32 * KNN_ITEMS) {
        bool take[KNN_ITEMS];
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) {
            int j = base + it * 32 + lane;
            take[it] = j < a.n_cols && j != w.self &&
                (double)knn_fast_score<KIND>(w.vals[j], j, a, w.sq) <= t;
        }
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) {
            unsigned mask = __ballot_sync(0xffffffffu, take[it]);
            int pos = found + __popc(mask & below);
            if (take[it] && pos < w.slots)
                a.cand_index[w.begin + pos] = base + it * 32 + lane;
            found += __popc(mask);
        }
    }
    if (lane == 0) knn_row_done(a, r, w, found);
}

/* ---- radix select ----------------------------------------------------- */

typedef cub::BlockScan<unsigned, KNN_RADIX_THREADS> knn_radix_scan;

struct knn_radix_shared {
    unsigned hist[KNN_RADIX_BINS];
    typename knn_radix_scan::TempStorage scan;
    unsigned warp_count[KNN_RADIX_THREADS / 32];
    unsigned bin, rank;
};

/* The sampled path's buffer, in the dynamic shared memory after
 * knn_radix_shared: nodes under T1 in ascending order, and their scores;
 * cap of each. */
struct knn_radix_buf {
    int *index;
    float *score;
    int cap;
};

/* Finds the bin holding the rank-th smallest counted value (rank >= 1) and
 * the value's rank inside that bin; every thread gets both. */
__device__ static void knn_radix_find(knn_radix_shared &sh, unsigned rank,
                               unsigned *bin, unsigned *rank_in_bin)
{
    int t = threadIdx.x;
    unsigned local = 0;
#pragma unroll
    for (int i = 0; i < KNN_RADIX_PER_THREAD; i++)
        local += sh.hist[t * KNN_RADIX_PER_THREAD + i];
    unsigned before;
    knn_radix_scan(sh.scan).ExclusiveSum(local, before);
    if (before < rank && rank <= before + local) {
        for (int i = 0; i < KNN_RADIX_PER_THREAD; i++) {
            unsigned c = sh.hist[t * KNN_RADIX_PER_THREAD + i];
            if (rank <= before + c) {
                sh.bin = t * KNN_RADIX_PER_THREAD + i;
                sh.rank = rank - before;
                break;
            }
            before += c;
        }
    }
    __syncthreads();
    *bin = sh.bin;
    *rank_in_bin = sh.rank;
    __syncthreads();
}

/* score(i, &v) gives item i's score (a V), or false for an item not
 * counted; digit(v) its bin, or -1 for a score outside the bucket being
 * refined. Each thread loads KNN_ITEMS items before counting them, so
 * that enough loads are in flight to keep device memory busy. */
template <typename V, typename Score, typename Digit>
__device__ void knn_radix_count(knn_radix_shared &sh, int count, Score score,
                                Digit digit)
{
    for (int i = threadIdx.x; i < KNN_RADIX_BINS; i += blockDim.x)
        sh.hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < count; base += KNN_RADIX_THREADS * KNN_ITEMS) {
        V v[KNN_ITEMS];
        bool ok[KNN_ITEMS];
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) {
            int i = base + it * KNN_RADIX_THREADS + threadIdx.x;
            ok[it] = i < count && score(i, &v[it]);
        }
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) {
            int bin = ok[it] ? digit(v[it]) : -1;
            if (bin >= 0) atomicAdd(&sh.hist[bin], 1u);
        }
    }
    __syncthreads();
}

/* Float scores: the top 12 bits (pass 0), then the next 12 of those whose
 * top ones are prefix. */
template <typename Score>
__device__ void knn_radix_histogram(knn_radix_shared &sh, int count,
                                    Score score, int pass, unsigned prefix)
{
    knn_radix_count<float>(sh, count, score, [&](float v) {
        unsigned u = knn_order_bits(v);
        if (pass == 0) return (int)(u >> 20);
        return (u >> 20) == prefix ? (int)((u >> 8) & 0xfffu) : -1;
    });
}

/* Upper edge of the 24-bit bucket holding the k-th smallest score: at most
 * 2^-15 relative above it. */
template <typename Score>
__device__ double knn_radix_bound(knn_radix_shared &sh, int count,
                                  Score score, int k)
{
    unsigned bin1, bin2, rank1, rank2;
    knn_radix_histogram(sh, count, score, 0, 0);
    knn_radix_find(sh, (unsigned)k, &bin1, &rank1);
    knn_radix_histogram(sh, count, score, 1, bin1);
    knn_radix_find(sh, rank1, &bin2, &rank2);
    return (double)knn_order_float((bin1 << 20) | (bin2 << 8) | 0xffu);
}

/* Stable block-wide compaction: emit(i, pos) for each item i < count with
 * take(i), pos counting from 0 in item order. Returns how many. Each thread
 * tests KNN_ITEMS consecutive items (loads in flight together), so a block
 * scan of the threads' counts gives every taken item its place: a chunk
 * costs at most three barriers, and one none of whose items is taken, the
 * usual case, one. */
template <typename Take, typename Emit>
__device__ int knn_block_compact(knn_radix_shared &sh, int count, Take take,
                                 Emit emit)
{
    int found = 0;
    for (int base = 0; base < count; base += KNN_RADIX_THREADS * KNN_ITEMS) {
        int first = base + threadIdx.x * KNN_ITEMS;
        bool t[KNN_ITEMS];
        unsigned mine = 0;
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++) {
            t[it] = first + it < count && take(first + it);
            mine += t[it];
        }
        if (!__syncthreads_or(mine)) continue;
        unsigned before, total;
        knn_radix_scan(sh.scan).ExclusiveSum(mine, before, total);
        int pos = found + (int)before;
#pragma unroll
        for (int it = 0; it < KNN_ITEMS; it++)
            if (t[it]) emit(first + it, pos++);
        found += (int)total;
        __syncthreads(); /* sh.scan is the next chunk's */
    }
    return found;
}

/* The float32 product of two fast vectors of ldf values (a multiple of
 * 4, zero padded, 16-byte aligned), a warp's lanes taking every 32nd
 * group of four values and then summing in a tree: an order that the
 * float32 margins cover (knn_margin_*: (p + 4) units hold for any order;
 * the padding's zeros add exactly nothing). Four loads in flight per lane
 * keep the gather of a candidate's values near the memory's speed. The
 * butterfly gives every lane the same bits. */
__device__ __forceinline__ float knn_warp_dot(const float *x, const float *y,
                                              int ldf, int lane)
{
    const float4 *x4 = (const float4 *)x, *y4 = (const float4 *)y;
    float s = 0.0f;
#pragma unroll 4
    for (int g = lane; g < ldf / 4; g += 32) {
        float4 u = x4[g], v = __ldg(y4 + g);
        s = __fmaf_rn(u.x, v.x, s);
        s = __fmaf_rn(u.y, v.y, s);
        s = __fmaf_rn(u.z, v.z, s);
        s = __fmaf_rn(u.w, v.w, s);
    }
    for (int o = 16; o > 0; o >>= 1)
        s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}

/* The refinement of a TF32 tile's candidates. TF32 keeps 10 bits of each
 * input, so its margins are some 60 times float32's: on log-counts, whose
 * many near-ties crowd every row's k-th score, hundreds of nodes a row
 * pass TF32's bound where 16 pass float32's. Rescoring only those n
 * candidates in float32, one warp per candidate, costs a read of their
 * fast vectors; the split products of TF32X3 would cost three GEMMs of the
 * whole panel. The candidates' nodes arrive in `moved` (ascending) and go
 * to the buffer in the same order with their float32 scores; returns the
 * float32 bound, which every node of the exact top k meets (the
 * candidates hold them all, and the k-th smallest float32 score among
 * them bounds the exact k-th key by one float32 margin, as in the panel's
 * own selection). A warp reads moved[i] before its lane 0 overwrites
 * that place, which only that warp touches: moved may alias the scores. */
template <int KIND>
__device__ double knn_refine(knn_radix_shared &sh, const knn_radix_buf &b,
                             const int *moved, const knn_select_args &a,
                             const knn_row &w, int r, int n)
{
    const float *x = a.row_fast + (size_t)r * a.ldf;
    int lane = threadIdx.x & 31;
    for (int i = threadIdx.x >> 5; i < n; i += KNN_RADIX_THREADS / 32) {
        int j = moved[i];
        float v = knn_warp_dot(x, a.fast + (size_t)j * a.ldf, a.ldf, lane);
        __syncwarp(); /* every lane has read moved[i] */
        if (lane == 0) {
            b.index[i] = j;
            b.score[i] = knn_fast_score<KIND>(v, j, a, w.sq);
        }
    }
    __syncthreads();
    double kth = knn_radix_bound(sh, n, [&](int i, float *v) {
        *v = b.score[i];
        return true;
    }, a.k);
    return knn_row_bound_in(a, w, a.row_margin2_fp32[r], a.fp32_unit, kth);
}

/* Nodes of the row under t (self excepted) into the buffer, the first cap
 * of them; returns how many there are. */
template <int KIND>
__device__ int knn_radix_keep(knn_radix_shared &sh, const knn_radix_buf &b,
                              const knn_select_args &a, const knn_row &w,
                              double t)
{
    return knn_block_compact(sh, a.n_cols, [&](int j) {
        return j != w.self &&
            (double)knn_fast_score<KIND>(w.vals[j], j, a, w.sq) <= t;
    }, [&](int j, int pos) {
        if (pos < b.cap) {
            b.index[pos] = j;
            b.score[pos] = knn_fast_score<KIND>(w.vals[j], j, a, w.sq);
        }
    });
}

/* The sample of a row of n_cols nodes at a stride: runs of 32 contiguous
 * nodes (whole memory sectors), one run in every `stride` runs. */
struct knn_sample {
    int period, size;
};

__device__ __forceinline__ knn_sample knn_sample_of(int n_cols, int stride)
{
    knn_sample sm;
    sm.period = 32 * stride;
    int runs = n_cols / sm.period, tail = n_cols - runs * sm.period;
    sm.size = runs * 32 + (tail < 32 ? tail : 32);
    return sm;
}

/* The row's node of sample item i. */
__device__ __forceinline__ int knn_sample_node(const knn_sample &sm, int i)
{
    return (i >> 5) * sm.period + (i & 31);
}

/* Sampled path (stride > 1): T1 from 1 / stride of the nodes bounds the row's
 * k-th score from above (a subset's k-th is never below the whole row's);
 * one pass keeps the nodes under T1 + margin in shared memory, where the
 * exact bucket of the k-th score is found. Where more than the buffer
 * holds pass T1, the first cap of them are a subset of the row too, and
 * their k-th score, close to the row's, gives a second pass a far tighter
 * bound. Returns -1 when the nodes still do not fit (the caller then runs
 * the full path), else the candidates found. */
template <int KIND>
__device__ int knn_radix_sampled(knn_radix_shared &sh, const knn_radix_buf &b,
                                 const knn_select_args &a, const knn_row &w,
                                 int r, int stride, int *wide)
{
    knn_sample sm = knn_sample_of(a.n_cols, stride);
    if (sm.size <= a.k) return -1; /* the sample needs k nodes besides self */
    double t1 = knn_row_bound(a, w, knn_radix_bound(sh, sm.size,
        [&](int i, float *v) {
            int j = knn_sample_node(sm, i);
            *v = knn_fast_score<KIND>(w.vals[j], j, a, w.sq);
            return j != w.self;
        }, a.k));
    auto buffered = [&](int i, float *v) {
        *v = b.score[i];
        return true;
    };
    int kept = knn_radix_keep<KIND>(sh, b, a, w, t1);
    if (kept > b.cap) {
        t1 = knn_row_bound(a, w, knn_radix_bound(sh, b.cap, buffered, a.k));
        kept = knn_radix_keep<KIND>(sh, b, a, w, t1);
        if (kept > b.cap) return -1;
    }
    double t = knn_row_bound(a, w, knn_radix_bound(sh, kept, buffered, a.k));
    if (a.row_margin2_fp32) {
        /* The candidates first, in order; a few more than k are cheaper
         * to re-rank than to rescore, and go to the slots as they are. */
        int *moved = (int *)b.score; /* knn_refine says why it may */
        kept = knn_block_compact(sh, kept, [&](int i) {
            return (double)b.score[i] <= t;
        }, [&](int i, int pos) { moved[pos] = b.index[i]; });
        __syncthreads();
        if (kept <= KNN_REFINE_MIN(a.k)) {
            for (int i = threadIdx.x; i < kept && i < w.slots;
                 i += KNN_RADIX_THREADS)
                a.cand_index[w.begin + i] = moved[i];
            return kept;
        }
        *wide = kept;
        t = knn_refine<KIND>(sh, b, moved, a, w, r, kept);
    }
    return knn_block_compact(sh, kept, [&](int i) {
        return (double)b.score[i] <= t;
    }, [&](int i, int pos) {
        if (pos < w.slots) a.cand_index[w.begin + pos] = b.index[i];
    });
}

/* The dynamic shared memory: knn_radix_shared, then the buffer. */
extern __shared__ __align__(16) unsigned char knn_radix_memory[];

template <int KIND>
__global__ void __launch_bounds__(KNN_RADIX_THREADS)
knn_radix_select_kernel(knn_select_args a, int stride, int cap)
{
    knn_radix_shared &sh = *(knn_radix_shared *)knn_radix_memory;
    knn_radix_buf b;
    b.index = (int *)(knn_radix_memory + sizeof(knn_radix_shared));
    b.score = (float *)(b.index + cap);
    b.cap = cap;
    int r = blockIdx.x;
    knn_row w = knn_row_of(a, r);
    int wide = -1; /* the candidates before a refinement, if one ran */
    int found = stride > 1
        ? knn_radix_sampled<KIND>(sh, b, a, w, r, stride, &wide) : -1;
    if (found < 0) {
        double t = knn_row_bound(a, w, knn_radix_bound(sh, a.n_cols,
            [&](int j, float *v) {
                *v = knn_fast_score<KIND>(w.vals[j], j, a, w.sq);
                return j != w.self;
            }, a.k));
        found = knn_block_compact(sh, a.n_cols, [&](int j) {
            return j != w.self &&
                (double)knn_fast_score<KIND>(w.vals[j], j, a, w.sq) <= t;
        }, [&](int j, int pos) {
            if (pos < w.slots) a.cand_index[w.begin + pos] = j;
        });
    }
    if (threadIdx.x == 0) {
        knn_row_done(a, r, w, found);
        if (wide >= 0) a.wide[r] = wide;
    }
}

/* ---- float64 panels --------------------------------------------------- */

#define KNN_RADIX64_PASSES 5 /* 12-bit digits from bit 63 down to bit 4 */
#define KNN_RADIX64_SPARE 32 /* scores above the k-th left in its bucket */

/* Float64 scores: digit (u >> shift) of those whose bits under mask are
 * prefix. */
template <typename Score>
__device__ void knn_radix64_histogram(knn_radix_shared &sh, int count,
                                      Score score, int shift, uint64_t mask,
                                      uint64_t prefix)
{
    knn_radix_count<double>(sh, count, score, [&](double v) {
        uint64_t u = knn_order_bits64(v);
        return (u & mask) == prefix ? (int)((u >> shift) & 0xfffu) : -1;
    });
}

/* Upper edge of the bucket holding the k-th smallest score, after as many
 * digits as leave at most KNN_RADIX64_SPARE scores above it in its bucket
 * (every thread sees the same counts, so all leave the loop together). */
template <typename Score>
__device__ double knn_radix64_bound(knn_radix_shared &sh, int count,
                                    Score score, int k)
{
    uint64_t prefix = 0, mask = 0;
    unsigned rank = (unsigned)k;
    int shift = 64;
    for (int pass = 0; pass < KNN_RADIX64_PASSES; pass++) {
        shift -= 12;
        knn_radix64_histogram(sh, count, score, shift, mask, prefix);
        unsigned bin, rank_in_bin;
        knn_radix_find(sh, rank, &bin, &rank_in_bin);
        unsigned in_bin = sh.hist[bin];
        __syncthreads(); /* read before the next pass clears the bins */
        prefix |= (uint64_t)bin << shift;
        mask |= (uint64_t)0xfff << shift;
        rank = rank_in_bin;
        if (in_bin - rank_in_bin <= KNN_RADIX64_SPARE) break;
    }
    return knn_order_double(prefix | ~mask);
}

/* The float64 kernel's buffer: the nodes under the sample's bound and
 * their scores, beside knn_radix_shared in a block's static 48 KB. */
#define KNN_SAMPLE64_BUF 2048
struct knn_radix64_buf {
    int index[KNN_SAMPLE64_BUF];
    double score[KNN_SAMPLE64_BUF];
};

/* The float64 kernel's sampled path, as knn_radix_sampled's: T1 from the
 * sample, one pass keeping the nodes under it in the buffer, where the
 * bucket of the k-th score is found and the candidates compacted. -1
 * where the sample is too small or the nodes do not fit (the caller then
 * reads the whole row for each digit). */
template <int KIND, typename Score>
__device__ int knn_radix64_sampled(knn_radix_shared &sh, knn_radix64_buf &b,
                                   const knn_select_args &a,
                                   const knn_row &w, int stride, Score score)
{
    knn_sample sm = knn_sample_of(a.n_cols, stride);
    if (sm.size <= a.k) return -1; /* the sample needs k nodes besides self */
    double t1 = knn_row_bound(a, w, knn_radix64_bound(sh, sm.size,
        [&](int i, double *v) {
            int j = knn_sample_node(sm, i);
            *v = score(j);
            return j != w.self;
        }, a.k));
    int kept = knn_block_compact(sh, a.n_cols, [&](int j) {
        return j != w.self && score(j) <= t1;
    }, [&](int j, int pos) {
        if (pos < KNN_SAMPLE64_BUF) {
            b.index[pos] = j;
            b.score[pos] = score(j);
        }
    });
    if (kept > KNN_SAMPLE64_BUF) return -1;
    __syncthreads();
    double t = knn_row_bound(a, w, knn_radix64_bound(sh, kept,
        [&](int i, double *v) {
            *v = b.score[i];
            return true;
        }, a.k));
    return knn_block_compact(sh, kept, [&](int i) {
        return b.score[i] <= t;
    }, [&](int i, int pos) {
        if (pos < w.slots) a.cand_index[w.begin + pos] = b.index[i];
    });
}

template <int KIND>
__global__ void __launch_bounds__(KNN_RADIX_THREADS)
knn_radix64_select_kernel(knn_select_args a, int stride)
{
    __shared__ knn_radix_shared sh;
    __shared__ knn_radix64_buf b;
    int r = blockIdx.x;
    knn_row w = knn_row_of(a, r);
    const double *vals = a.panel64 + (size_t)r * a.ld;
    double sq = KIND == KNN_SCORE_DIST ? a.row_sqnorm64[r] : 0.0;
    auto score = [&](int j) {
        return knn_score_from<KIND>(vals[j], sq, KIND == KNN_SCORE_DIST
                                                     ? a.col_sqnorm64[j]
                                                     : 0.0);
    };
    int found = stride > 1
        ? knn_radix64_sampled<KIND>(sh, b, a, w, stride, score) : -1;
    if (found < 0) {
        double t = knn_row_bound(a, w, knn_radix64_bound(sh, a.n_cols,
            [&](int j, double *v) {
                *v = score(j);
                return j != w.self;
            }, a.k));
        found = knn_block_compact(sh, a.n_cols, [&](int j) {
            return j != w.self && score(j) <= t;
        }, [&](int j, int pos) {
            if (pos < w.slots) a.cand_index[w.begin + pos] = j;
        });
    }
    if (threadIdx.x == 0) knn_row_done(a, r, w, found);
}

/* The sampling stride: about KNN_SAMPLE_BUF / 4 expected nodes under T1,
 * with at least 4k sampled nodes; 1 (no sampling) when that leaves < 2. */
static int knn_sample_stride(int n_cols, int k)
{
    int s = KNN_SAMPLE_BUF / (4 * k);
    if (s > KNN_SAMPLE_MAX_STRIDE) s = KNN_SAMPLE_MAX_STRIDE;
    if ((long long)s * 4 * k > n_cols) s = n_cols / (4 * k);
    return s < 2 ? 1 : s;
}

/* ---- dispatch --------------------------------------------------------- */

/* The buffer's places: once TF32 has shown itself crowded, a tile's rows
 * keep all their TF32 candidates there (hundreds on log-counts, thousands
 * on some rows), and two blocks still fit an SM; until then the smaller
 * buffer lets four, which a selection streaming the panel needs (the
 * larger one everywhere slows gpu.R's k = 100 case by a third). */
static int knn_radix_cap(const knn_select_args *a)
{
    return a->row_margin2_fp32 && a->wide_buffer ? KNN_REFINE_BUF
                                                 : KNN_SAMPLE_BUF;
}

static constexpr size_t knn_radix_bytes(int cap)
{
    return sizeof(knn_radix_shared) +
           (size_t)cap * (sizeof(int) + sizeof(float));
}

/* The larger buffer must fit the smallest opt-in shared memory of a block
 * among the cards the build runs on: 99 KB on sm_86 and sm_89 (sm_80
 * has 163 KB, sm_90 227 KB). It takes 100592 bytes of 101376. */
static_assert(knn_radix_bytes(KNN_REFINE_BUF) <= 101376,
              "the refinement's buffer outgrows a 99 KB block");

template <int KIND>
static knn_status knn_launch_radix(const knn_select_args *a, char *message,
                                   cudaStream_t stream)
{
    int cap = knn_radix_cap(a);
    size_t bytes = knn_radix_bytes(cap);
    /* The largest of any launch, not this one's: devices' host threads
     * launch concurrently, and a smaller limit set by one would fail
     * another's larger launch. */
    KNN_CUDA_TRY(message, cudaFuncSetAttribute(
        knn_radix_select_kernel<KIND>,
        cudaFuncAttributeMaxDynamicSharedMemorySize,
        (int)knn_radix_bytes(KNN_REFINE_BUF)));
    knn_radix_select_kernel<KIND><<<a->rows, KNN_RADIX_THREADS, bytes,
                                    stream>>>(
        *a, knn_sample_stride(a->n_cols, a->k), cap);
    KNN_LAUNCH_TRY(message, "knn_radix_select_kernel");
    return KNN_OK;
}

template <int KIND>
static knn_status knn_launch_radix64(const knn_select_args *a, char *message,
                                     cudaStream_t stream)
{
    knn_radix64_select_kernel<KIND><<<a->rows, KNN_RADIX_THREADS, 0,
                                      stream>>>(
        *a, knn_sample_stride(a->n_cols, a->k));
    KNN_LAUNCH_TRY(message, "knn_radix64_select_kernel");
    return KNN_OK;
}

template <int K, int KIND>
static knn_status knn_launch_warp(const knn_select_args *a, char *message,
                                  cudaStream_t stream)
{
    unsigned blocks = (a->rows + KNN_WARP_ROWS - 1) / KNN_WARP_ROWS;
    knn_warp_select_kernel<K, KIND>
        <<<blocks, 32 * KNN_WARP_ROWS, 0, stream>>>(*a);
    KNN_LAUNCH_TRY(message, "knn_warp_select_kernel");
    return KNN_OK;
}

/* One rung of the k-bucket ladder per queue length. */
#define KNN_WARP_BUCKET(K)                                                 \
    if (a->k <= (K)) return knn_launch_warp<(K), KIND>(a, message, stream);

template <int KIND>
static knn_status knn_select_kind(const knn_select_args *a,
                                  knn_select_algo algo, char *message,
                                  cudaStream_t stream)
{
    if (a->panel64) return knn_launch_radix64<KIND>(a, message, stream);
    if (algo == KNN_SELECT_RADIX)
        return knn_launch_radix<KIND>(a, message, stream);
    KNN_WARP_BUCKET(1)
    KNN_WARP_BUCKET(2)
    KNN_WARP_BUCKET(4)
    KNN_WARP_BUCKET(8)
    KNN_WARP_BUCKET(16)
    KNN_WARP_BUCKET(32)
    return knn_gpu_fail(message, KNN_E_INVALID, "warp selection",
                        "k is larger than its largest queue (32)", __FILE__,
                        __LINE__);
}

knn_status knn_select_candidates(const knn_select_args *a,
                                 knn_select_algo algo, char *message,
                                 cudaStream_t stream)
{
    switch (a->kind) {
    case KNN_SCORE_NEG:
        return knn_select_kind<KNN_SCORE_NEG>(a, algo, message, stream);
    case KNN_SCORE_NEGABS:
        return knn_select_kind<KNN_SCORE_NEGABS>(a, algo, message, stream);
    case KNN_SCORE_DIST:
        return knn_select_kind<KNN_SCORE_DIST>(a, algo, message, stream);
    case KNN_SCORE_IDENT:
        return knn_select_kind<KNN_SCORE_IDENT>(a, algo, message, stream);
    }
    return knn_gpu_fail(message, KNN_E_INVALID, "candidate selection",
                        "unknown score kind", __FILE__, __LINE__);
}

/* Threads choosing one row's best k of its exact keys. */
#define KNN_KEYS_SELECT_THREADS 256

/* The bin (of 256, from 8 bits of the keys) holding the want-th smallest
 * of the counts in hist, and want less the keys before it; by warp 0. */
__device__ static void knn_keys_find_bin(const unsigned *hist,
                                         unsigned want, int *bin,
                                         unsigned *rest)
{
    int lane = threadIdx.x;
    unsigned c[8], sum = 0;
    for (int b = 0; b < 8; b++) {
        c[b] = hist[lane * 8 + b];
        sum += c[b];
    }
    unsigned inc = sum;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += t;
    }
    unsigned cum = inc - sum;
    if (!(cum < want && want <= inc)) return;
    for (int b = 0; b < 8; b++) {
        if (cum + c[b] >= want) {
            *bin = lane * 8 + b;
            *rest = want - cum;
            return;
        }
        cum += c[b];
    }
}

/* Row blockIdx.x's k best of its n_ref keys, ties to the smaller node, in
 * order into best_j (-1: none) and best_d. The k-th smallest key comes
 * from a radix select, eight bits at a time; the keys below it and, of
 * those equal to it, the ones of the smallest nodes go to pick_* in any
 * order; each then finds its place by counting the picks before it. */
__global__ void knn_keys_select_kernel(const unsigned long long *keys,
                                       int n_ref, int k,
                                       unsigned long long *pick_key,
                                       int *pick_j, int *best_j,
                                       double *best_d)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned long long s_prefix;
    __shared__ unsigned s_want;
    __shared__ int s_counts[KNN_KEYS_SELECT_THREADS / 32];
    __shared__ int s_below;
    const unsigned long long *row = keys + (size_t)blockIdx.x * n_ref;
    unsigned long long *pk = pick_key + (size_t)blockIdx.x * k;
    int *pj = pick_j + (size_t)blockIdx.x * k;
    int t = threadIdx.x;
    unsigned long long prefix = 0, mask = 0;
    unsigned want = (unsigned)k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int i = t; i < n_ref; i += blockDim.x) {
            unsigned long long key = row[i];
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (t < 32) {
            int bin = 0;
            unsigned rest = 0;
            knn_keys_find_bin(hist, want, &bin, &rest);
            if (rest > 0) {
                s_prefix = prefix | ((unsigned long long)bin << shift);
                s_want = rest;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        want = s_want;
        mask |= 0xffull << shift;
    }
    /* prefix is the k-th smallest key; k - want keys lie below it. */
    if (t == 0) s_below = 0;
    __syncthreads();
    for (int i = t; i < n_ref; i += blockDim.x) {
        unsigned long long key = row[i];
        if (key < prefix) {
            int at = atomicAdd(&s_below, 1);
            pk[at] = key;
            pj[at] = i;
        }
    }
    /* Of the keys equal to it, the first `want` by node, in node order:
     * each pass counts a stretch of blockDim.x nodes by warps. */
    int lane = t % 32, warp = t / 32, base_at = k - (int)want;
    unsigned taken = 0;
    for (int from = 0; from < n_ref && taken < want; from += blockDim.x) {
        int i = from + t;
        int equal = i < n_ref && row[i] == prefix;
        unsigned ballot = __ballot_sync(0xffffffffu, equal);
        if (lane == 0) s_counts[warp] = __popc(ballot);
        __syncthreads();
        unsigned before = taken + __popc(ballot & ((1u << lane) - 1u));
        unsigned total = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); w++) {
            if (w < warp) before += s_counts[w];
            total += s_counts[w];
        }
        if (equal && before < want) {
            pk[base_at + before] = prefix;
            pj[base_at + before] = i;
        }
        taken += total;
        __syncthreads();
    }
    __syncthreads();
    int *out_j = best_j + (size_t)blockIdx.x * k;
    double *out_d = best_d + (size_t)blockIdx.x * k;
    for (int i = t; i < k; i += blockDim.x) {
        unsigned long long key = pk[i];
        int j = pj[i], place = 0;
        for (int m = 0; m < k; m++) {
            unsigned long long other = pk[m];
            place += other < key || (other == key && pj[m] < j);
        }
        out_j[place] = key == KNN_KEY_NONE ? -1 : j;
        out_d[place] = key == KNN_KEY_NONE
            ? CUDART_NAN : __longlong_as_double((long long)key);
    }
}

knn_status knn_select_keys(const unsigned long long *keys, int rows,
                           int n_ref, int k, unsigned long long *pick_key,
                           int *pick_j, int *best_j, double *best_d,
                           char *message, cudaStream_t stream)
{
    knn_keys_select_kernel<<<rows, KNN_KEYS_SELECT_THREADS, 0, stream>>>(
        keys, n_ref, k, pick_key, pick_j, best_j, best_d);
    KNN_LAUNCH_TRY(message, "knn_keys_select_kernel");
    return KNN_OK;
}
