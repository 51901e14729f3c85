/*
 * knn_gpu_pairs.cu: a self search that computes each pair of nodes once
 * (the CPU engine's habit, knn_cpu.c), on the fused path of one device
 * or shared by several.
 *
 * The row tiles run in order. Tile t's rows walk the nodes up to the end
 * of their own tile only (the fused kernel, knn_gpu_fused.cu, with a
 * knn_pairs_walk), so the pairs of a row and a later tile's node are left
 * to that later tile. Its kernel tests each product against the node's
 * threshold too, and offers the row's node to the node's list where it
 * passes. Between tiles, knn_pairs_merge takes each node's new offers into
 * its k smallest scores and tightens its threshold. After the last tile
 * every node's list holds its candidates, which knn_pairs_gather hands to
 * the exact re-rank, tile by tile, as the selection would.
 *
 * Why the lists hold every candidate: each pair's fast score is computed
 * once (in whichever tile meets it first) and judged, for each of its
 * two nodes, against a threshold that was then the bound of the k
 * smallest scores of nodes already seen, never below the node's final
 * bound: the argument of the fused kernel, now over offers as well. The
 * candidates are thus those under the final bound, and the float64
 * re-rank gives the same bits as every other path. A list that overflows
 * its entries loses offers, and so does a node whose own row's survivors
 * overflowed its walk: the node is marked lost (knn_pairs_lose) and
 * searched apart after the walk (knn_gpu_apart), or, where many are, the
 * device leaves the shared walk and searches again without it
 * (knn_gpu_walk.cu). A lost node's k smallest and threshold come from
 * fewer pairs than it met, so they bound its k-th from above, as every
 * threshold does: the other nodes' offers stay proven.
 *
 * Thresholds tighten as the search goes: tile 0's rows know only their
 * own tile's nodes when tile 1 makes its offers, so each node sees about
 * (k + the margins' band) / t offers from tile t; the pairs cost half of
 * the plain walk's, plus one tile of the diagonal.
 *
 * Several devices (knn_gpu_walk.cu) share the walk: the tiles run in
 * step on all of them, each device walking its share of a tile's rows
 * against every node up to the tile's end, so each pair is still
 * computed once, on one device, and each row walks once (its own
 * candidates, the costs of a row's walk that do not shrink with fewer
 * nodes, are paid once). Each device keeps lists for every node. Before
 * a tile, a device lowers the thresholds of the earlier nodes to the
 * other devices' (knn_pairs_tighten): a node whose row walked elsewhere
 * has none of its own. A threshold is the bound of a k-th smallest over
 * some of the pairs, never below the final bound, so each device's
 * lists hold what it saw under the final bound, and they hold its k
 * smallest under its thresholds. After the walk each device takes, for
 * the nodes of its own rows, the other devices' lists (knn_pairs_absorb)
 * and merges them as offers: their union holds every pair under the
 * final bound and the k smallest, from which the merge takes the one
 * device's bound and cuts the lists to the entries under it, so the
 * gather and the exact re-rank give the same bits.
 */
#include <string.h>
#include "knn_gpu_score.cuh"

#define KNN_PAIRS_WARPS 8 /* nodes per block: one warp each */
/* The merge holds a node's k smallest in a warp, entry i in slot i / 32
 * of lane i % 32. */
#define KNN_PAIRS_PER_LANE 4
static_assert(KNN_PAIRS_MAX_K == 32 * KNN_PAIRS_PER_LANE,
              "the merge holds KNN_PAIRS_MAX_K entries a warp");

/* The arrays of knn_pairs, carved from one block (sizes only without
 * one). */
static void knn_pairs_carve(knn_pairs *p, knn_carver *c)
{
    size_t n = (size_t)p->n;
    p->best = knn_carve<float>(c, n * p->k);
    p->threshold = knn_carve<float>(c, n);
    p->list = knn_carve<uint64_t>(c, n * p->cap);
    p->count = knn_carve<int>(c, n);
    p->merged = knn_carve<int>(c, n);
    p->lost = knn_carve<unsigned>(c, knn_pairs_lost_words(p->n));
    p->lost_nodes = knn_carve<int>(c, 1);
    size_t stage = (size_t)p->stage_nodes;
    p->stage_list = stage ? knn_carve<uint64_t>(c, stage * p->cap) : NULL;
    p->stage_count = stage ? knn_carve<int>(c, stage) : NULL;
    p->stage_threshold = stage ? knn_carve<float>(c, n) : NULL;
    p->stage_lost = stage
        ? knn_carve<unsigned>(c, knn_pairs_lost_words(p->n)) : NULL;
}

/* +inf into n floats. */
__global__ static void knn_fill_inf_kernel(float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = INFINITY;
}

/* The sizes of p's arrays, with none allocated yet. */
static void knn_pairs_size(knn_pairs *p, int n, int k, int cap,
                           int stage_nodes)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    p->k = k;
    p->cap = cap;
    p->stage_nodes = stage_nodes;
}

double knn_pairs_bytes(int n, int k, int cap, int stage_nodes)
{
    knn_pairs p;
    knn_pairs_size(&p, n, k, cap, stage_nodes);
    knn_carver c = {NULL, 0};
    knn_pairs_carve(&p, &c);
    return (double)c.used;
}

void knn_pairs_free(knn_pairs *p)
{
    knn_device_free(p->block);
    memset(p, 0, sizeof *p);
}

static knn_status knn_pairs_load_kernels(char *message);

knn_status knn_pairs_alloc(knn_pairs *p, int n, int k, int cap,
                           int stage_nodes, char *message,
                           cudaStream_t stream)
{
    knn_pairs_size(p, n, k, cap, stage_nodes);
    knn_carver c = {NULL, 0};
    knn_pairs_carve(p, &c);
    cudaError_t e = knn_device_alloc(&p->block, c.used, stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        p->block = NULL;
        return e == cudaErrorMemoryAllocation
            ? KNN_E_NOMEM
            : knn_gpu_fail_cuda(message, e, "knn_device_alloc(pairs)", __FILE__,
                                __LINE__);
    }
    c.block = (char *)p->block;
    c.used = 0;
    knn_pairs_carve(p, &c);
    /* The k smallest +inf: a node whose row walks on another device
     * merges its first offers into none. */
    size_t nk = (size_t)n * k;
    knn_fill_inf_kernel<<<(unsigned)((nk + 255) / 256), 256, 0, stream>>>(
        p->best, nk);
    KNN_LAUNCH_TRY(message, "knn_fill_inf_kernel");
    /* Thresholds NaN (all bits set): no offer passes before a node's own
     * tile has run. */
    KNN_CUDA_TRY(message, cudaMemsetAsync(p->threshold, 0xff,
                                          (size_t)n * sizeof(float), stream));
    KNN_CUDA_TRY(message, cudaMemsetAsync(p->count, 0,
                                          (size_t)n * sizeof(int), stream));
    KNN_CUDA_TRY(message, cudaMemsetAsync(p->merged, 0,
                                          (size_t)n * sizeof(int), stream));
    KNN_CUDA_TRY(message, cudaMemsetAsync(p->lost, 0,
                                          knn_pairs_lost_words(n) *
                                              sizeof(unsigned),
                                          stream));
    KNN_CUDA_TRY(message, cudaMemsetAsync(p->lost_nodes, 0, sizeof(int),
                                          stream));
    return knn_pairs_load_kernels(message);
}

__device__ __forceinline__ float knn_entry_score(uint64_t u)
{
    return knn_order_float((unsigned)(u >> 32));
}

__device__ __forceinline__ float knn_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The largest of the k smallest that the warp's lanes hold. */
__device__ __forceinline__ float knn_warp_best_max(
    const float (&b)[KNN_PAIRS_PER_LANE])
{
    float m = b[0];
#pragma unroll
    for (int q = 1; q < KNN_PAIRS_PER_LANE; q++) m = fmaxf(m, b[q]);
    return knn_warp_max(m);
}

/* Inserts s into the k smallest that the warp's lanes hold (entry i in
 * slot i / 32 of lane i % 32, in no order; places past k -inf, never the
 * largest), given their largest mx; returns the new largest. The first
 * place that holds mx takes s. */
__device__ __forceinline__ float knn_warp_best_insert(
    float (&b)[KNN_PAIRS_PER_LANE], float mx, float s, int lane)
{
    if (!(s < mx)) return mx;
    int at = -1;
#pragma unroll
    for (int q = KNN_PAIRS_PER_LANE - 1; q >= 0; q--)
        if (b[q] == mx) at = q;
    unsigned holds = __ballot_sync(0xffffffffu, at >= 0);
    if (lane == __ffs(holds) - 1) {
#pragma unroll
        for (int q = 0; q < KNN_PAIRS_PER_LANE; q++)
            if (q == at) b[q] = s; /* no indexing: b stays in registers */
    }
    return knn_warp_best_max(b);
}

/* Appends the first n entries of `from` that are at or below thr to
 * `to` from entry `at`, in their order, those past cap lost; returns `at`
 * plus how many there were. `to` may be `from` with `at` 0, compacting
 * it: each round reads its 32 entries before the ballot and writes at or
 * before them after it. */
__device__ __forceinline__ int knn_warp_append_under(const uint64_t *from,
                                                     int n, uint64_t *to,
                                                     int at, int cap,
                                                     float thr, int lane)
{
    for (int e0 = 0; e0 < n; e0 += 32) {
        int e = e0 + lane;
        uint64_t u = e < n ? from[e] : 0;
        bool keep = e < n && knn_entry_score(u) <= thr;
        unsigned mask = __ballot_sync(0xffffffffu, keep);
        int pos = at + __popc(mask & ((1u << lane) - 1u));
        if (keep && pos < cap) to[pos] = u;
        at += __popc(mask);
    }
    return at;
}

/* One warp per node: its new offers into its k smallest, its threshold
 * from their bound, its list cut to the entries under it; a node offered
 * more than its list holds is lost (knn_pairs_lose: the offer kernel only
 * counts them, which keeps its hot loop free of the marking). */
__global__ static void __launch_bounds__(KNN_PAIRS_WARPS * 32)
knn_pairs_merge_kernel(knn_pairs p, knn_select_args sel, int node0,
                       int node_end)
{
    int lane = threadIdx.x & 31;
    int j = node0 + blockIdx.x * KNN_PAIRS_WARPS + (threadIdx.x >> 5);
    if (j >= node_end) return; /* the whole warp */
    if (lane == 0 && p.count[j] > p.cap) knn_pairs_lose(p, j);
    int listed = min(p.count[j], p.cap), from = p.merged[j];
    if (listed == from) return;
    uint64_t *list = p.list + (size_t)j * p.cap;
    float *node_best = p.best + (size_t)j * p.k;
    float b[KNN_PAIRS_PER_LANE];
#pragma unroll
    for (int q = 0; q < KNN_PAIRS_PER_LANE; q++)
        b[q] = 32 * q + lane < p.k ? node_best[32 * q + lane] : -INFINITY;
    float mx = knn_warp_best_max(b);
    for (int e0 = from; e0 < listed; e0 += 32) {
        int n = min(32, listed - e0);
        float mine = lane < n ? knn_entry_score(list[e0 + lane]) : 0.0f;
        for (int i = 0; i < n; i++)
            mx = knn_warp_best_insert(
                b, mx, __shfl_sync(0xffffffffu, mine, i), lane);
    }
    knn_row w;
    memset(&w, 0, sizeof w);
    w.margin2 = sel.row_margin2[j];
    w.norm = sel.row_norm ? sel.row_norm[j] : 0.0;
    double bound = isinf(mx) ? INFINITY : knn_row_bound(sel, w, (double)mx);
    float thr = fminf(p.threshold[j], __double2float_rd(bound));
    int kept = knn_warp_append_under(list, listed, list, 0, p.cap, thr,
                                     lane);
#pragma unroll
    for (int q = 0; q < KNN_PAIRS_PER_LANE; q++)
        if (32 * q + lane < p.k) node_best[32 * q + lane] = b[q];
    if (lane == 0) {
        p.threshold[j] = thr;
        p.count[j] = kept;
        p.merged[j] = kept;
    }
}

knn_status knn_pairs_merge(const knn_pairs *p, const knn_select_args *sel,
                           int node0, int node_end, char *message,
                           cudaStream_t stream)
{
    if (node_end <= node0) return KNN_OK;
    unsigned blocks = (node_end - node0 + KNN_PAIRS_WARPS - 1) /
                      KNN_PAIRS_WARPS;
    knn_pairs_merge_kernel<<<blocks, KNN_PAIRS_WARPS * 32, 0, stream>>>(
        *p, *sel, node0, node_end);
    KNN_LAUNCH_TRY(message, "knn_pairs_merge_kernel");
    return KNN_OK;
}

/* One thread per node: the smaller of the two thresholds, or the other
 * where this one is NaN. A node's threshold on another device sharing
 * the walk bounds a k-th smallest over the pairs that device saw, so it
 * is never below the node's final bound either. That device may be
 * writing its array while this one reads it (where it lies or through a
 * copy): a float read is whole, the old value or the new, each such a
 * bound. */
__global__ static void knn_pairs_tighten_kernel(float *threshold,
                                                const float *other, int n)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) threshold[j] = fminf(threshold[j], other[j]);
}

knn_status knn_pairs_tighten(const knn_pairs *p, const float *other,
                             int n_nodes, char *message, cudaStream_t stream)
{
    if (n_nodes <= 0) return KNN_OK;
    unsigned blocks = (n_nodes + 255) / 256;
    knn_pairs_tighten_kernel<<<blocks, 256, 0, stream>>>(p->threshold, other,
                                                         n_nodes);
    KNN_LAUNCH_TRY(message, "knn_pairs_tighten_kernel");
    return KNN_OK;
}

/* One warp per node: the other device's entries at or below the node's
 * threshold appended to its list, in their order (entries past cap lose
 * the node, as does the other device's having lost it). The other
 * device's lists are merged already, so they hold its k smallest; those
 * under this device's threshold are all that can still be
 * candidates. */
__global__ static void __launch_bounds__(KNN_PAIRS_WARPS * 32)
knn_pairs_absorb_kernel(knn_pairs p, int node0, int nodes,
                        const uint64_t *from_list, const int *from_count,
                        const unsigned *from_lost)
{
    int lane = threadIdx.x & 31;
    int i = blockIdx.x * KNN_PAIRS_WARPS + (threadIdx.x >> 5);
    if (i >= nodes) return; /* the whole warp */
    int j = node0 + i;
    int n = min(from_count[i], p.cap), at = p.count[j];
    const uint64_t *from = from_list + (size_t)i * p.cap;
    uint64_t *list = p.list + (size_t)j * p.cap;
    at = knn_warp_append_under(from, n, list, at, p.cap, p.threshold[j],
                               lane);
    if (lane == 0) {
        p.count[j] = at;
        if (at > p.cap || (from_lost[j >> 5] >> (j & 31) & 1u))
            knn_pairs_lose(p, j);
    }
}

knn_status knn_pairs_absorb(const knn_pairs *p, int node0, int nodes,
                            const uint64_t *from_list, const int *from_count,
                            const unsigned *from_lost, char *message,
                            cudaStream_t stream)
{
    if (nodes <= 0) return KNN_OK;
    unsigned blocks = (nodes + KNN_PAIRS_WARPS - 1) / KNN_PAIRS_WARPS;
    knn_pairs_absorb_kernel<<<blocks, KNN_PAIRS_WARPS * 32, 0, stream>>>(
        *p, node0, nodes, from_list, from_count, from_lost);
    KNN_LAUNCH_TRY(message, "knn_pairs_absorb_kernel");
    return KNN_OK;
}

/* One warp per tile row: its node's list, placed in ascending node order
 * (each entry at the number of smaller nodes: the nodes are distinct)
 * into the row's candidate slots. */
__global__ static void __launch_bounds__(KNN_PAIRS_WARPS * 32)
knn_pairs_gather_kernel(knn_pairs p, knn_select_args sel, int node0)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * KNN_PAIRS_WARPS + (threadIdx.x >> 5);
    if (r >= sel.rows) return; /* the whole warp */
    int node = node0 + r;
    int n = min(p.count[node], p.cap);
    const uint64_t *list = p.list + (size_t)node * p.cap;
    knn_row w = knn_row_of(sel, r);
    for (int c0 = 0; c0 < n; c0 += 32) {
        int mine = c0 + lane < n ? (int)(list[c0 + lane] & 0xffffffffu)
                                 : 0x7fffffff;
        int rank = 0;
        for (int d0 = 0; d0 < n; d0 += 32) {
            int other = d0 + lane < n
                ? (int)(list[d0 + lane] & 0xffffffffu) : 0x7fffffff;
            int m = min(32, n - d0);
            for (int i = 0; i < m; i++)
                rank += __shfl_sync(0xffffffffu, other, i) < mine;
        }
        if (c0 + lane < n && rank < w.slots)
            sel.cand_index[w.begin + rank] = mine;
    }
    if (lane == 0) knn_row_done(sel, r, w, n);
}

knn_status knn_pairs_gather(const knn_pairs *p, const knn_select_args *sel,
                            int node0, char *message, cudaStream_t stream)
{
    unsigned blocks = (sel->rows + KNN_PAIRS_WARPS - 1) / KNN_PAIRS_WARPS;
    knn_pairs_gather_kernel<<<blocks, KNN_PAIRS_WARPS * 32, 0, stream>>>(
        *p, *sel, node0);
    KNN_LAUNCH_TRY(message, "knn_pairs_gather_kernel");
    return KNN_OK;
}

/* Loads the walk's kernels now, with its arrays: CUDA loads a kernel's
 * code at its first launch, which maps memory, and in the walk that
 * would wait for the faults of knn_gpu_pages.cu. */
static knn_status knn_pairs_load_kernels(char *message)
{
    cudaFuncAttributes attr;
    KNN_CUDA_TRY(message, cudaFuncGetAttributes(&attr,
                                                knn_pairs_merge_kernel));
    KNN_CUDA_TRY(message, cudaFuncGetAttributes(&attr,
                                                knn_pairs_gather_kernel));
    KNN_CUDA_TRY(message, cudaFuncGetAttributes(&attr,
                                                knn_pairs_absorb_kernel));
    KNN_CUDA_TRY(message, cudaFuncGetAttributes(&attr,
                                                knn_pairs_tighten_kernel));
    return KNN_OK;
}
