/*
 * knn_gpu_rerank.cu: the exact float64 ranking of a row tile's candidates.
 *
 * 1. Keys: one warp per query row, a lane per candidate slot, 32 slots at
 *    a time. Each lane computes its candidate's canonical key as the C
 *    engine does (knn_key_corr_of_dot over knn_dot_more, or
 *    knn_key_dist_more and knn_key_dist_finish over the nodes as given, of
 *    knn_exact.h: sequential over the features, rounded operations), so
 *    the bits are the same. The candidates'
 *    values are read 32 features at a time into shared memory, a whole
 *    warp per candidate (coalesced, where a lane reading its own node's
 *    values would touch 32 nodes per load), and each lane then runs
 *    through its own candidate's stretch there.
 * 2. Order: each key's reported distance (knn_key_distance, what results
 *    are ordered by) becomes 64 unsigned bits whose integer order is its
 *    order (-0 folded into +0, since the C engine's comparison treats them
 *    as equal), and every row's slots are ordered by it, equal ones by
 *    node: the engine's tie rule. A row of up to KNN_SORT_SHORT slots is
 *    sorted by a block of its own in shared memory (a bitonic sort on
 *    (bits, node)). A longer row needs only its k first: a block finds,
 *    a byte of the bits at a time (a radix select), the least bound
 *    under which at least k of its slots lie and at most KNN_SORT_SHORT,
 *    and sorts those in shared memory the same way; their k first are
 *    the row's k first, since every slot left out lies above every slot
 *    kept. Rows where more than KNN_SORT_SHORT slots share the k-th bits
 *    (ties) go to CUB's stable segmented sort on the bits, whose input
 *    must list a row's slots in node order for equal bits to stay so:
 *    where the candidates were not filled in ascending node order (a
 *    pruned walk visits column blocks nearest first), a segmented sort by
 *    node puts them so first.
 * 3. Output: one thread per (row, rank < k) reads its slot's node and
 *    original key and writes index, distance and weight (knn_key_output)
 *    into rows x k arrays, column- or row-major as the caller's result is;
 *    thread t writes element t of that layout, so writes coalesce.
 */
#include <limits.h>
#include <cub/device/device_segmented_sort.cuh>
#include "knn_gpu_score.cuh"

#define KNN_KEY_WARPS 4  /* rows per block */
#define KNN_KEY_CHUNK 32 /* features staged at a time */
#define KNN_OUT_THREADS 256
#define KNN_SORT_SHORT 1024 /* slots a row sorted in shared memory holds */
#define KNN_SORT_THREADS 128

/* Stages features [f0, f0 + w) of the warp's n candidates (lane c holds
 * candidate c's node j) into tile[c][0..w), one coalesced read each. */
__device__ __forceinline__ void knn_key_stage(double (*tile)[KNN_KEY_CHUNK + 1],
                                              const double *exact, int p,
                                              int j, int n, int f0, int w,
                                              int lane)
{
#pragma unroll 8
    for (int c = 0; c < n; c++) {
        int jc = __shfl_sync(0xffffffffu, j, c);
        if (lane < w) tile[c][lane] = exact[(size_t)jc * p + f0 + lane];
    }
}

__global__ static void __launch_bounds__(KNN_KEY_WARPS * 32)
knn_key_kernel(knn_rerank_args a)
{
    __shared__ double stage[KNN_KEY_WARPS][32][KNN_KEY_CHUNK + 1];
    const knn_gpu_nodes *nd = &a.nodes;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * KNN_KEY_WARPS + warp;
    if (r >= a.rows) return; /* the whole warp: only warp syncs below */
    double (*tile)[KNN_KEY_CHUNK + 1] = stage[warp];
    int p = nd->p, i = a.row_nodes ? a.row_nodes[r] : a.row_node0 + r;
    const double *xi = nd->exact + (size_t)i * p;
    int corr = knn_is_correlation(a.metric);
    int end = a.seg_end[r];
    for (int s0 = a.offsets[r]; s0 < end; s0 += 32) {
        int n = min(32, end - s0), s = s0 + lane;
        int j = lane < n ? a.cand_index[s] : 0;
        double dot = 0.0; /* correlations: the dot product */
        knn_dist_acc acc = {0.0}; /* distances: the plain sum */
        for (int f0 = 0; f0 < p; f0 += KNN_KEY_CHUNK) {
            int w = min(KNN_KEY_CHUNK, p - f0);
            knn_key_stage(tile, nd->exact, p, j, n, f0, w, lane);
            __syncwarp();
            if (lane < n) {
                if (corr) dot = knn_dot_more(xi + f0, tile[lane], w, dot);
                else knn_key_dist_more(a.metric, xi + f0, tile[lane], w,
                                       &acc);
            }
            __syncwarp();
        }
        if (lane >= n) continue;
        /* A pair whose plain sum is not its key (overflow, or tiny: rare)
         * reads its nodes again for the scaled sum, from global memory. */
        double key = corr ? knn_key_corr_of_dot(a.metric, dot, p, nd->sum[i],
                                                nd->css[i], nd->sum[j],
                                                nd->css[j])
                          : knn_key_dist_finish(a.metric, acc.s, xi,
                                                nd->exact + (size_t)j * p, p);
        a.cand_key[s] = key;
        a.sort_key[s] = knn_order_bits64(knn_key_distance(a.metric, key));
        a.sort_val[s] = s;
    }
}

/* Whether entry (ka, node na) goes before (kb, nb): by the bits, then by
 * the node (a row's candidates are distinct nodes). */
__device__ __forceinline__ bool knn_sort_before(uint64_t ka, int na,
                                                uint64_t kb, int nb)
{
    return ka < kb || (ka == kb && na < nb);
}

/* Sorts the m entries (m a power of two) of key, node and val in shared
 * memory by (key, node), ascending, with the block's threads. */
__device__ static void knn_bitonic_sort(uint64_t *key, int *node, int *val,
                                        int m)
{
    for (int size = 2; size <= m; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < m / 2; t += blockDim.x) {
                /* Pair (i, i + stride), ascending where i's block of
                 * `size` is even-numbered. */
                int i = 2 * t - (t & (stride - 1));
                int j = i + stride;
                bool up = (i & size) == 0;
                if (knn_sort_before(key[j], node[j], key[i], node[i]) ==
                    up) {
                    uint64_t kt = key[i];
                    key[i] = key[j];
                    key[j] = kt;
                    int nt = node[i];
                    node[i] = node[j];
                    node[j] = nt;
                    int vt = val[i];
                    val[i] = val[j];
                    val[j] = vt;
                }
            }
        }
    __syncthreads();
}

/* A row's entries in shared memory for knn_bitonic_sort. */
struct knn_sort_shared {
    uint64_t key[KNN_SORT_SHORT];
    int node[KNN_SORT_SHORT];
    int val[KNN_SORT_SHORT];
};

/* Sorts the n entries the block placed in sh (n <= KNN_SORT_SHORT) by
 * (bits, node) and writes the first k slots of row r to sort_val_out;
 * the row is done here, so CUB gets an empty segment. */
__device__ static void knn_sort_placed(knn_sort_shared &sh, int n,
                                       const knn_rerank_args &a, int r,
                                       int begin)
{
    int m = 32;
    while (m < n) m <<= 1;
    for (int e = n + threadIdx.x; e < m; e += blockDim.x) {
        sh.key[e] = ~0ull;
        sh.node[e] = INT_MAX;
        sh.val[e] = INT_MAX;
    }
    knn_bitonic_sort(sh.key, sh.node, sh.val, m);
    for (int e = threadIdx.x; e < min(n, a.k); e += blockDim.x)
        a.sort_val_out[begin + e] = sh.val[e];
    if (threadIdx.x == 0) a.sort_end[r] = begin;
}

/* One block per row: a row of up to KNN_SORT_SHORT slots is sorted here
 * (knn_sort_placed); sort_end[r] gets the row's end for CUB, which a
 * long row keeps unless knn_select_long_kernel sorts it. */
__global__ static void __launch_bounds__(KNN_SORT_THREADS)
knn_sort_short_kernel(knn_rerank_args a)
{
    __shared__ knn_sort_shared sh;
    int r = blockIdx.x, begin = a.offsets[r], n = a.seg_end[r] - begin;
    if (n > KNN_SORT_SHORT) {
        if (threadIdx.x == 0) a.sort_end[r] = a.seg_end[r];
        return; /* the whole block */
    }
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        sh.key[e] = a.sort_key[begin + e];
        sh.node[e] = a.cand_index[begin + e];
        sh.val[e] = a.sort_val[begin + e];
    }
    knn_sort_placed(sh, n, a, r, begin);
}

#define KNN_SELECT_DIGITS 256 /* a byte of the bits per pass */

/* The least `hi` such that at least k of the n bits keys[0 .. n) are at
 * most hi, and at most KNN_SORT_SHORT are (a radix select, the most
 * significant byte first: each pass counts the keys under the prefix
 * found so far by their next byte, and takes the byte where the count
 * below it reaches k; it stops once the keys up to that byte's end are
 * few enough). Returns 0 where no such bound exists (more than
 * KNN_SORT_SHORT keys tie at the k-th), else 1. The block's threads. */
__device__ static int knn_select_bound(const uint64_t *keys, int n, int k,
                                       int *hist, uint64_t *hi)
{
    __shared__ int s_digit, s_below;
    uint64_t prefix = 0;
    int below = 0; /* keys under the prefix's range */
    for (int shift = 56; shift >= 0; shift -= 8) {
        uint64_t mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
        for (int b = threadIdx.x; b < KNN_SELECT_DIGITS; b += blockDim.x)
            hist[b] = 0;
        __syncthreads();
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            uint64_t v = keys[e];
            if ((v & mask) == prefix)
                atomicAdd(&hist[(v >> shift) & 0xff], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int b = 0, cum = below;
            while (cum + hist[b] < k) cum += hist[b++];
            s_digit = b;
            s_below = cum;
        }
        __syncthreads();
        int b = s_digit;
        prefix |= (uint64_t)b << shift;
        below = s_below;
        int upto = below + hist[b];
        __syncthreads(); /* every thread read hist before it is cleared */
        if (upto <= KNN_SORT_SHORT) {
            *hi = prefix | ((1ull << shift) - 1ull);
            return 1;
        }
    }
    return 0;
}

/* One block per row of more than KNN_SORT_SHORT slots (after
 * knn_sort_short_kernel): its slots whose bits are at most the bound of
 * knn_select_bound, sorted (knn_sort_placed); a row with no such bound
 * keeps its segment for CUB. */
__global__ static void __launch_bounds__(KNN_SORT_THREADS)
knn_select_long_kernel(knn_rerank_args a)
{
    __shared__ knn_sort_shared sh;
    __shared__ int hist[KNN_SELECT_DIGITS];
    __shared__ int placed;
    int r = blockIdx.x, begin = a.offsets[r], n = a.seg_end[r] - begin;
    if (n <= KNN_SORT_SHORT || a.k > KNN_SORT_SHORT) return;
    const uint64_t *keys = a.sort_key + begin;
    uint64_t hi = 0;
    if (!knn_select_bound(keys, n, a.k, hist, &hi)) return;
    if (threadIdx.x == 0) placed = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        if (keys[e] > hi) continue;
        int at = atomicAdd(&placed, 1);
        sh.key[at] = keys[e];
        sh.node[at] = a.cand_index[begin + e];
        sh.val[at] = a.sort_val[begin + e];
    }
    __syncthreads();
    knn_sort_placed(sh, placed, a, r, begin);
}

__global__ static void knn_output_kernel(knn_rerank_args a)
{
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)a.rows * a.k) return;
    int r = (int)(a.by_row ? t / a.k : t % a.rows);
    int rank = (int)(a.by_row ? t % a.k : t / a.rows);
    /* A row with fewer than k candidates (one set apart, searched again
     * later) has no sorted slot here: its place says "no node" until
     * then. */
    if (rank >= a.seg_end[r] - a.offsets[r]) {
        a.out_index[t] = -1;
        a.out_distance[t] = 0.0;
        a.out_weight[t] = 0.0;
        return;
    }
    int s = a.sort_val_out[a.offsets[r] + rank];
    double distance, weight;
    knn_key_output(a.metric, a.cand_key[s], &distance, &weight);
    a.out_index[t] = a.cand_index[s] + a.index_base;
    a.out_distance[t] = distance;
    a.out_weight[t] = weight;
}

/* One block per row CUB sorts (a long one): the bits of its slots in the
 * node order that knn_rerank's sort by node left in sort_val_out, into
 * sort_key_out (whose node keys that sort no longer needs), and those
 * slots into sort_val, the input of the sort by the bits. */
__global__ static void knn_long_by_node_kernel(knn_rerank_args a)
{
    int r = blockIdx.x, begin = a.offsets[r], end = a.sort_end[r];
    for (int e = begin + threadIdx.x; e < end; e += blockDim.x) {
        int s = a.sort_val_out[e];
        a.sort_key_out[e] = a.sort_key[s];
        a.sort_val[e] = s;
    }
}

knn_status knn_rerank_sort_bytes(int64_t n_slots, int rows, size_t *bytes,
                                 char *message)
{
    size_t by_bits = 0, by_node = 0;
    KNN_CUDA_TRY(message, cub::DeviceSegmentedSort::StableSortPairs(
        (void *)NULL, by_bits, (const uint64_t *)NULL, (uint64_t *)NULL,
        (const int *)NULL, (int *)NULL, n_slots, (int64_t)rows,
        (const int *)NULL, (const int *)NULL));
    KNN_CUDA_TRY(message, cub::DeviceSegmentedSort::StableSortPairs(
        (void *)NULL, by_node, (const int *)NULL, (int *)NULL,
        (const int *)NULL, (int *)NULL, n_slots, (int64_t)rows,
        (const int *)NULL, (const int *)NULL));
    *bytes = by_bits > by_node ? by_bits : by_node;
    return KNN_OK;
}

knn_status knn_rerank(const knn_rerank_args *a, char *message,
                      cudaStream_t stream)
{
    knn_key_kernel<<<(a->rows + KNN_KEY_WARPS - 1) / KNN_KEY_WARPS,
                     KNN_KEY_WARPS * 32, 0, stream>>>(*a);
    KNN_LAUNCH_TRY(message, "knn_key_kernel");
    size_t temp_bytes = 0;
    KNN_TRY(knn_rerank_sort_bytes(a->n_slots, a->rows, &temp_bytes, message));
    if (temp_bytes > a->sort_temp_bytes)
        return knn_gpu_fail(message, KNN_E_DEVICE, "segmented sort",
                            "its scratch was planned too small", __FILE__,
                            __LINE__);
    knn_sort_short_kernel<<<a->rows, KNN_SORT_THREADS, 0, stream>>>(*a);
    KNN_LAUNCH_TRY(message, "knn_sort_short_kernel");
    knn_select_long_kernel<<<a->rows, KNN_SORT_THREADS, 0, stream>>>(*a);
    KNN_LAUNCH_TRY(message, "knn_select_long_kernel");
    uint64_t *bits_in = a->sort_key, *bits_out = a->sort_key_out;
    if (!a->cand_in_node_order) {
        KNN_CUDA_TRY(message, cub::DeviceSegmentedSort::StableSortPairs(
            a->sort_temp, temp_bytes, a->cand_index,
            (int *)a->sort_key_out, a->sort_val, a->sort_val_out,
            a->n_slots, (int64_t)a->rows, a->offsets, a->sort_end, stream));
        knn_long_by_node_kernel<<<a->rows, KNN_SORT_THREADS, 0, stream>>>(
            *a);
        KNN_LAUNCH_TRY(message, "knn_long_by_node_kernel");
        bits_in = a->sort_key_out;
        bits_out = a->sort_key;
    }
    KNN_CUDA_TRY(message, cub::DeviceSegmentedSort::StableSortPairs(
        a->sort_temp, temp_bytes, bits_in, bits_out, a->sort_val,
        a->sort_val_out, a->n_slots, (int64_t)a->rows, a->offsets,
        a->sort_end, stream));
    size_t n_out = (size_t)a->rows * a->k;
    unsigned blocks = (unsigned)((n_out + KNN_OUT_THREADS - 1) /
                                 KNN_OUT_THREADS);
    knn_output_kernel<<<blocks, KNN_OUT_THREADS, 0, stream>>>(*a);
    KNN_LAUNCH_TRY(message, "knn_output_kernel");
    return KNN_OK;
}
