/*
 * knn_gpu_tiles.cu: one device's share of a search, as a loop over row
 * tiles of its query rows (host code; the kernels live in the files that
 * knn_gpu.cuh lists).
 *
 * The float64 input travels once, through the device's pinned staging ring
 * on several OpenMP threads (knn_gpu_context.cu), and is prepared on the
 * device. A row tile of R queries then takes a panel of R x n_ref fast
 * products (the column tile is the whole reference: R is chosen so that
 * the panel fits the budget, at most 2^31 floats, and the n x n matrix
 * never exists; rows are padded to 4 floats for aligned GEMM output), the
 * candidate selection, the exact re-rank and sort, and a transfer of the
 * R x k results, already in the caller's layout, into one of two pinned
 * slots. The host copies tile t-1's slot into the caller's arrays (several
 * OpenMP threads for a large tile) while the device works on tile t. A row
 * whose candidates outnumber its slots (heavy ties) makes the host run
 * that tile again with each row's exact count of slots, so no candidate is
 * dropped.
 * R comes from cudaMemGetInfo and the request's budget; when an allocation
 * fails, R is halved and tried again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "knn_gpu_tiles.cuh"

#define KNN_RESERVE_BYTES (512.0 * 1048576.0)
#define KNN_HOST_KEEP_BYTES ((size_t)64 << 20)
#define KNN_SLOT_BYTES_MAX (256.0 * 1048576.0)
#define KNN_PANEL_FLOATS_MAX 2147483648.0 /* keeps one tile well under 1 s */
/* Results of a tile below this many elements are copied by one thread:
 * waking others would cost more than they save. */
#define KNN_COPY_PARALLEL_MIN ((size_t)1 << 15)

/* Copies ref and this device's query rows into one p x n_nodes array. */
static knn_status knn_upload_nodes(knn_gpu_dev *d, double **x)
{
    const knn_request *req = d->req;
    size_t p = (size_t)req->p;
    KNN_CUDA_TRY(d->message,
                 cudaMalloc((void **)x, p * d->n_nodes * sizeof(double)));
    knn_upload_part parts[2] = {
        {*x, req->ref, p * req->n_ref},
        {*x + p * req->n_ref,
         req->query ? req->query + p * d->q0 : NULL, p * d->nq}};
    return knn_context_upload(d->ctx, parts, req->query ? 2 : 1,
                              d->copy_threads, &d->shared->stop, d->message);
}

knn_status knn_dev_prepare(knn_gpu_dev *d)
{
    const knn_request *req = d->req;
    double t0 = knn_seconds();
    d->self = req->query == NULL;
    d->n_nodes = req->n_ref + (d->self ? 0 : d->nq);
    double *x = NULL;
    knn_status st = knn_upload_nodes(d, &x);
    if (st == KNN_OK)
        st = knn_prepare_nodes(req->metric, x, req->p, req->n_ref,
                               d->n_nodes, d->query_max_abs,
                               knn_gemm_unit_in(d->gemm), &d->nodes,
                               d->message, d->stream);
    if (x != d->nodes.exact) cudaFree(x);
    d->seconds_prepare = knn_seconds() - t0;
    return st;
}

/* The row tile's fixed arrays: device ones from dev, pinned ones from
 * host. */
static void knn_tiles_carve(knn_gpu_tiles *t, size_t ld, int k,
                            knn_carver *dev, knn_carver *host)
{
    size_t r = (size_t)t->rows, rk = r * k;
    t->panel = knn_carve<float>(dev, r * ld);
    t->offsets_uniform = knn_carve<int>(dev, r + 1);
    t->offsets_exact = knn_carve<int>(dev, r + 1);
    t->seg_end = knn_carve<int>(dev, r);
    t->count = knn_carve<int>(dev, r);
    t->out_index = knn_carve<int>(dev, rk);
    t->out_distance = knn_carve<double>(dev, rk);
    t->out_weight = knn_carve<double>(dev, rk);
    t->h_offsets = knn_carve<int>(host, r + 1);
    for (int s = 0; s < 2; s++) {
        knn_gpu_slot *sl = &t->slot[s];
        sl->index = knn_carve<int>(host, rk);
        sl->distance = knn_carve<double>(host, rk);
        sl->weight = knn_carve<double>(host, rk);
        sl->count = knn_carve<int>(host, r);
    }
}

static void knn_slots_carve(knn_gpu_tiles *t, size_t n, knn_carver *c)
{
    t->cand_index = knn_carve<int>(c, n);
    t->cand_key = knn_carve<double>(c, n);
    t->sort_key = knn_carve<uint64_t>(c, n);
    t->sort_key_out = knn_carve<uint64_t>(c, n);
    t->sort_val = knn_carve<int>(c, n);
    t->sort_val_out = knn_carve<int>(c, n);
    t->sort_temp = knn_carve<char>(c, t->sort_temp_bytes);
}

/* Bytes of device memory one tile row needs, the sort's scratch aside:
 * what the carvers above hand out, averaged over many rows so that their
 * alignment hardly counts. */
static double knn_row_bytes(size_t ld, int slots, int k)
{
    const int rows = 1024;
    knn_gpu_tiles t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    knn_carver dev = {NULL, 0}, host = {NULL, 0};
    knn_tiles_carve(&t, ld, k, &dev, &host);
    knn_slots_carve(&t, (size_t)rows * slots, &dev);
    return (double)dev.used / rows;
}

static void knn_slots_free(knn_gpu_tiles *t)
{
    cudaFree(t->slots_block);
    t->slots_block = NULL;
    knn_carver none = {NULL, 0};
    knn_slots_carve(t, 0, &none);
    t->n_slots_alloc = 0;
}

static void knn_tiles_free(knn_gpu_tiles *t)
{
    knn_slots_free(t);
    cudaFree(t->device_block);
    if (t->host_own == KNN_HOST_PINNED) cudaFreeHost(t->host_block);
    else if (t->host_own == KNN_HOST_PLAIN) free(t->host_block);
    for (int s = 0; s < 2; s++) {
        knn_gpu_slot *sl = &t->slot[s];
        if (sl->start) cudaEventDestroy(sl->start);
        if (sl->selected) cudaEventDestroy(sl->selected);
        if (sl->done) cudaEventDestroy(sl->done);
    }
    memset(t, 0, sizeof *t);
}

/* Candidate slot arrays for n_slots slots, and the sort's scratch for a
 * full tile or `min_temp` bytes, whichever is more. */
static knn_status knn_slots_alloc(knn_gpu_dev *d, int64_t n_slots,
                                  size_t min_temp)
{
    knn_gpu_tiles *t = &d->t;
    KNN_TRY(knn_rerank_sort_bytes(n_slots, t->rows, &t->sort_temp_bytes,
                                  d->message));
    if (min_temp > t->sort_temp_bytes) t->sort_temp_bytes = min_temp;
    knn_carver c = {NULL, 0};
    knn_slots_carve(t, (size_t)n_slots, &c);
    KNN_CUDA_TRY(d->message, cudaMalloc(&t->slots_block, c.used));
    c.block = (char *)t->slots_block;
    c.used = 0;
    knn_slots_carve(t, (size_t)n_slots, &c);
    t->n_slots_alloc = n_slots;
    return KNN_OK;
}

/* Host memory for the result slots. Pinned slots let the transfers run at
 * full speed and one tile's transfer overlap the next tile's work, but
 * pinning costs half a millisecond and more per allocation: up to
 * KNN_HOST_KEEP_BYTES come from the device's context, kept from one search
 * to the next. A search that needs more pins its own, or, if it has one
 * tile only (whose transfer overlaps nothing), takes plain memory. */
static knn_status knn_host_slots(knn_gpu_dev *d, size_t bytes)
{
    knn_gpu_tiles *t = &d->t;
    if (bytes <= KNN_HOST_KEEP_BYTES) {
        t->host_own = KNN_HOST_CONTEXT;
        return knn_context_host(d->ctx, bytes, &t->host_block, d->message);
    }
    if (t->rows < d->nq) {
        KNN_CUDA_TRY(d->message, cudaHostAlloc(&t->host_block, bytes,
                                               cudaHostAllocDefault));
        t->host_own = KNN_HOST_PINNED;
        return KNN_OK;
    }
    if ((t->host_block = malloc(bytes)) == NULL)
        return knn_gpu_fail(d->message, KNN_E_NOMEM, "host result slots",
                            "out of host memory", __FILE__, __LINE__);
    t->host_own = KNN_HOST_PLAIN;
    return KNN_OK;
}

static knn_status knn_tiles_alloc(knn_gpu_dev *d, int rows, int slots)
{
    knn_gpu_tiles *t = &d->t;
    int k = d->req->k;
    size_t ld = knn_panel_ld(d->req->n_ref);
    t->rows = rows;
    t->slots = slots;
    knn_carver dev = {NULL, 0}, host = {NULL, 0};
    knn_tiles_carve(t, ld, k, &dev, &host);
    KNN_CUDA_TRY(d->message, cudaMalloc(&t->device_block, dev.used));
    KNN_TRY(knn_host_slots(d, host.used));
    dev.block = (char *)t->device_block;
    host.block = (char *)t->host_block;
    dev.used = host.used = 0;
    knn_tiles_carve(t, ld, k, &dev, &host);
    KNN_TRY(knn_slots_alloc(d, (int64_t)rows * slots, 0));
    for (int s = 0; s < 2; s++) {
        knn_gpu_slot *sl = &t->slot[s];
        KNN_CUDA_TRY(d->message, cudaEventCreate(&sl->start));
        KNN_CUDA_TRY(d->message, cudaEventCreate(&sl->selected));
        KNN_CUDA_TRY(d->message, cudaEventCreate(&sl->done));
    }
    for (int i = 0; i <= rows; i++) t->h_offsets[i] = i * slots;
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(t->offsets_uniform, t->h_offsets,
                                 ((size_t)rows + 1) * sizeof(int),
                                 cudaMemcpyHostToDevice, d->stream));
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    return KNN_OK;
}

/* Chooses the row tile from free memory and the budget, halving it while
 * the allocation fails. */
static knn_status knn_dev_plan_tiles(knn_gpu_dev *d)
{
    const knn_request *req = d->req;
    int k = req->k;
    int avail = req->n_ref - (d->self ? 1 : 0);
    int slots = 2 * k + 256 < avail ? 2 * k + 256 : avail;
    size_t free_b = 0, total_b = 0;
    KNN_CUDA_TRY(d->message, cudaMemGetInfo(&free_b, &total_b));
    double budget = (double)free_b - KNN_RESERVE_BYTES - 0.05 * total_b;
    if (req->memory_bytes > 0 && req->memory_bytes < budget)
        budget = req->memory_bytes;
    double per_row = knn_row_bytes(knn_panel_ld(req->n_ref), slots, k);
    double rows = budget / per_row;
    double limits[] = {(double)d->nq, 2147483647.0 / slots,
                       KNN_SLOT_BYTES_MAX / (k * 20.0),
                       KNN_PANEL_FLOATS_MAX / req->n_ref};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        if (limits[i] < rows) rows = limits[i];
    int r = rows < 1.0 ? 1 : (int)rows;
    for (;;) {
        knn_status st = knn_tiles_alloc(d, r, slots);
        if (st == KNN_OK) {
            d->row_tile = r;
            return KNN_OK;
        }
        knn_tiles_free(&d->t);
        if (st != KNN_E_NOMEM) return st;
        if (r == 1) {
            snprintf(d->message, sizeof d->message,
                     "GPU %d: not enough free memory for one row tile "
                     "(%.0f MB per row, %.0f MB free)", d->device,
                     per_row / 1048576.0, free_b / 1048576.0);
            return KNN_E_NOMEM;
        }
        r /= 2;
    }
}

knn_status knn_dev_plan(knn_gpu_dev *d)
{
    double t0 = knn_seconds();
    knn_status st = knn_dev_plan_tiles(d);
    d->seconds_setup += knn_seconds() - t0;
    return st;
}

/* Queues tile work for global query rows [row0, row0 + rows) with the given
 * per-row slot offsets, and the transfer of its results into slot s. */
static knn_status knn_tile_enqueue(knn_gpu_dev *d, int row0, int rows,
                                   const int *offsets, int64_t n_slots,
                                   int s)
{
    const knn_request *req = d->req;
    knn_gpu_tiles *t = &d->t;
    knn_gpu_nodes *nd = &d->nodes;
    knn_gpu_slot *sl = &t->slot[s];
    int p = req->p, k = req->k;
    int node0 = d->self ? row0 : req->n_ref + (row0 - d->q0);
    size_t rk = (size_t)rows * k, ld = knn_panel_ld(req->n_ref);
    sl->row0 = row0;
    sl->rows = rows;
    sl->gemm = d->gemm;

    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->start, d->stream));
    if (knn_uses_product(req->metric))
        KNN_TRY(knn_panel_gemm(d->blas, nd->fast,
                               nd->fast + (size_t)node0 * nd->ldf, nd->ldf,
                               req->n_ref, rows, t->panel, ld, d->message));
    else
        KNN_TRY(knn_panel_manhattan(nd->exact + (size_t)node0 * p,
                                    nd->exact, p, rows, req->n_ref,
                                    t->panel, ld, d->message, d->stream));

    knn_select_args sa;
    sa.panel = t->panel;
    sa.ld = ld;
    sa.rows = rows;
    sa.n_cols = req->n_ref;
    sa.k = k;
    sa.kind = d->score_kind;
    sa.self_first = d->self ? row0 : -1;
    sa.col_sqnorm = nd->sqnorm;
    sa.row_sqnorm = nd->sqnorm ? nd->sqnorm + node0 : NULL;
    sa.row_margin2 = nd->margin2 + node0;
    sa.row_norm = d->score_kind == KNN_SCORE_DIST && nd->norm
                      ? nd->norm + node0 : NULL;
    sa.margin_unit = knn_margin_dist_unit(p, knn_gemm_unit_in(sl->gemm),
                                          KNN_U32);
    sa.margin_floor = knn_margin_floor(p, KNN_TINY32);
    sa.metric = req->metric;
    sa.scale_exp = nd->scale_exp;
    sa.offsets = offsets;
    sa.cand_index = t->cand_index;
    sa.count = t->count;
    sa.seg_end = t->seg_end;
    KNN_TRY(knn_select_candidates(&sa, knn_select_choose(req->select, rows, k),
                                  d->message, d->stream));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->selected, d->stream));

    knn_rerank_args ra;
    ra.metric = req->metric;
    ra.nodes = *nd;
    ra.rows = rows;
    ra.k = k;
    ra.row_node0 = node0;
    ra.offsets = offsets;
    ra.seg_end = t->seg_end;
    ra.cand_index = t->cand_index;
    ra.n_slots = n_slots;
    ra.cand_key = t->cand_key;
    ra.sort_key = t->sort_key;
    ra.sort_key_out = t->sort_key_out;
    ra.sort_val = t->sort_val;
    ra.sort_val_out = t->sort_val_out;
    ra.sort_temp = t->sort_temp;
    ra.sort_temp_bytes = t->sort_temp_bytes;
    ra.by_row = d->out->by_row;
    ra.index_base = d->out->index_base;
    ra.out_index = t->out_index;
    ra.out_distance = t->out_distance;
    ra.out_weight = t->out_weight;
    KNN_TRY(knn_rerank(&ra, d->message, d->stream));

    KNN_CUDA_TRY(d->message, cudaMemcpyAsync(sl->index, t->out_index,
                                             rk * sizeof(int),
                                             cudaMemcpyDeviceToHost,
                                             d->stream));
    KNN_CUDA_TRY(d->message, cudaMemcpyAsync(sl->distance, t->out_distance,
                                             rk * sizeof(double),
                                             cudaMemcpyDeviceToHost,
                                             d->stream));
    KNN_CUDA_TRY(d->message, cudaMemcpyAsync(sl->weight, t->out_weight,
                                             rk * sizeof(double),
                                             cudaMemcpyDeviceToHost,
                                             d->stream));
    KNN_CUDA_TRY(d->message, cudaMemcpyAsync(sl->count, t->count,
                                             (size_t)rows * sizeof(int),
                                             cudaMemcpyDeviceToHost,
                                             d->stream));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->done, d->stream));
    return KNN_OK;
}

/* Runs the tile in slot s again with each row's exact candidate count as
 * its slots (the first run found more than its uniform slots held). */
static knn_status knn_tile_redo(knn_gpu_dev *d, int s)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[s];
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    std::vector<int> found(sl->count, sl->count + sl->rows);
    int64_t total = 0;
    for (int r = 0; r < sl->rows; r++) {
        t->h_offsets[r] = (int)total;
        total += found[r];
    }
    if (total > 2147483647) {
        snprintf(d->message, sizeof d->message,
                 "a row tile has %lld tied candidates, more than one pass "
                 "can sort; lower options(knngpu.gpu.memory)",
                 (long long)total);
        return KNN_E_NOMEM;
    }
    t->h_offsets[sl->rows] = (int)total;
    size_t temp_bytes = 0;
    KNN_TRY(knn_rerank_sort_bytes(total, sl->rows, &temp_bytes, d->message));
    if (total > t->n_slots_alloc || temp_bytes > t->sort_temp_bytes) {
        int64_t want = total > t->n_slots_alloc ? total : t->n_slots_alloc;
        knn_slots_free(t);
        knn_status st = knn_slots_alloc(d, want, temp_bytes);
        if (st != KNN_OK) {
            if (st == KNN_E_NOMEM)
                snprintf(d->message, sizeof d->message,
                         "GPU %d: no memory for the %lld candidates that "
                         "tied values produce in one row tile",
                         d->device, (long long)total);
            return st;
        }
    }
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(t->offsets_exact, t->h_offsets,
                                 (size_t)(sl->rows + 1) * sizeof(int),
                                 cudaMemcpyHostToDevice, d->stream));
    KNN_TRY(knn_tile_enqueue(d, sl->row0, sl->rows, t->offsets_exact, total,
                             s));
    KNN_CUDA_TRY(d->message, cudaEventSynchronize(sl->done));
    for (int r = 0; r < sl->rows; r++) {
        if (sl->count[r] != found[r])
            return knn_gpu_fail(d->message, KNN_E_DEVICE, "candidate redo",
                                "a row's candidate count changed between "
                                "two runs of the same tile", __FILE__,
                                __LINE__);
    }
    return KNN_OK;
}

/* A slot's results and where they go: `runs` runs of `length` elements,
 * run c from src + c * length to dst + c * dst_stride (dst already at the
 * tile's first element). */
typedef struct {
    const knn_gpu_slot *slot;
    const knn_result *out;
    size_t dst0, runs, length, dst_stride;
} knn_copy_job;

/* Copies elements [a, b) of the slot, counted run after run. */
static void knn_copy_part(const knn_copy_job *job, size_t a, size_t b)
{
    const knn_gpu_slot *sl = job->slot;
    while (a < b) {
        size_t run = a / job->length, off = a % job->length;
        size_t len = job->length - off < b - a ? job->length - off : b - a;
        size_t to = job->dst0 + run * job->dst_stride + off;
        memcpy(job->out->index + to, sl->index + a, len * sizeof(int));
        memcpy(job->out->distance + to, sl->distance + a,
               len * sizeof(double));
        memcpy(job->out->weight + to, sl->weight + a, len * sizeof(double));
        a += len;
    }
}

/* Copies a slot into the caller's arrays. A large tile is split over
 * several OpenMP threads: the copy lands in memory R has just allocated,
 * and one thread is held up by the first-touch page faults (3 of the 4.6 s
 * of a 262144 x 1024 search); the device meanwhile runs the next tile. */
static void knn_copy_out(const knn_gpu_dev *d, const knn_gpu_slot *sl)
{
    const knn_request *req = d->req;
    size_t n_q = (size_t)(req->query ? req->n_query : req->n_ref);
    size_t rows = (size_t)sl->rows, k = (size_t)req->k;
    knn_copy_job job;
    job.slot = sl;
    job.out = d->out;
    if (d->out->by_row) {
        job.dst0 = (size_t)sl->row0 * k;
        job.runs = 1;
        job.length = rows * k;
        job.dst_stride = 0;
    } else {
        job.dst0 = (size_t)sl->row0;
        job.runs = k;
        job.length = rows;
        job.dst_stride = n_q;
    }
    size_t total = job.runs * job.length;
    int parts = total < KNN_COPY_PARALLEL_MIN ? 1 : d->copy_threads;
    #pragma omp parallel for num_threads(parts) if (parts > 1) \
        schedule(static)
    for (int i = 0; i < parts; i++)
        knn_copy_part(&job, total * i / parts, total * (i + 1) / parts);
}

/* Whether a row of the slot found more candidates than its `slots`;
 * *found gets the candidates of all its rows. */
static int knn_slot_overflow(const knn_gpu_slot *sl, int slots,
                             double *found)
{
    int overflow = 0;
    *found = 0.0;
    for (int r = 0; r < sl->rows; r++) {
        overflow |= sl->count[r] > slots;
        *found += sl->count[r];
    }
    return overflow;
}

/* Runs the tile in slot s again with the uniform slots (after the search
 * changed its arithmetic). */
static knn_status knn_tile_rerun(knn_gpu_dev *d, int s)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[s];
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    KNN_TRY(knn_tile_enqueue(d, sl->row0, sl->rows, t->offsets_uniform,
                             (int64_t)sl->rows * t->slots, s));
    KNN_CUDA_TRY(d->message, cudaEventSynchronize(sl->done));
    return KNN_OK;
}

/* A product search starts in TF32 (knn_gpu.cuh) and goes on in float32,
 * its margins recomputed, once a tile's rows average more candidates than
 * knn_rung_too_wide allows or one overflows its slots: the re-rank of the
 * extra candidates, or the tile's redo, would cost more than the faster
 * products save. Tiles already queued keep their TF32 margins: the new
 * ones are computed on the stream after them. */
static knn_status knn_dev_gemm_check(knn_gpu_dev *d, double found, int rows,
                                     int overflow)
{
    if (!d->gemm_adaptive) return KNN_OK;
    if (!overflow && !knn_rung_too_wide(found, rows, d->req->k))
        return KNN_OK;
    d->gemm = KNN_GEMM_FP32;
    d->gemm_adaptive = 0;
    d->gemm_switched = 1;
    KNN_BLAS_TRY(d->message, cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH));
    return knn_nodes_remargin(d->req->metric, &d->nodes,
                              knn_gemm_unit_in(KNN_GEMM_FP32), d->message,
                              d->stream);
}

/* Waits for slot s, re-runs its tile if a row overflowed (first with the
 * uniform slots in float32, when the tile ran in TF32 and the search has
 * changed since: a redo must see the counts of the same arithmetic), and
 * copies its rows x k results into the caller's n_query x k arrays. */
static knn_status knn_tile_collect(knn_gpu_dev *d, int s)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[s];
    const knn_request *req = d->req;
    int k = req->k;
    KNN_CUDA_TRY(d->message, cudaEventSynchronize(sl->done));
    float ms_search = 0.0f, ms_rerank = 0.0f;
    KNN_CUDA_TRY(d->message,
                 cudaEventElapsedTime(&ms_search, sl->start, sl->selected));
    KNN_CUDA_TRY(d->message,
                 cudaEventElapsedTime(&ms_rerank, sl->selected, sl->done));
    d->seconds_search += ms_search / 1000.0;
    d->seconds_rerank += ms_rerank / 1000.0;

    double found = 0.0;
    int overflow = knn_slot_overflow(sl, t->slots, &found);
    KNN_TRY(knn_dev_gemm_check(d, found, sl->rows, overflow));
    if (overflow && sl->gemm != d->gemm) {
        double t0 = knn_seconds();
        KNN_TRY(knn_tile_rerun(d, s));
        d->seconds_search += knn_seconds() - t0;
        overflow = knn_slot_overflow(sl, t->slots, &found);
    }
    if (overflow) {
        double t0 = knn_seconds();
        KNN_TRY(knn_tile_redo(d, s));
        d->seconds_rerank += knn_seconds() - t0;
    }
    for (int r = 0; r < sl->rows; r++) {
        if (sl->count[r] < k)
            return knn_gpu_fail(d->message, KNN_E_DEVICE,
                                "candidate selection",
                                "a row has fewer candidates than k",
                                __FILE__, __LINE__);
        d->candidates += sl->count[r];
    }

    double t0 = knn_seconds();
    knn_copy_out(d, sl);
    d->seconds_collect += knn_seconds() - t0;
    d->shared->rows_done += sl->rows;
    return KNN_OK;
}

knn_status knn_dev_search(knn_gpu_dev *d)
{
    knn_gpu_tiles *t = &d->t;
    int pending = -1; /* slot whose results are not yet collected */
    int s = 0;
    for (int row0 = d->q0; row0 < d->q0 + d->nq; row0 += t->rows) {
        if (d->shared->stop) break;
        int rows = d->q0 + d->nq - row0 < t->rows ? d->q0 + d->nq - row0
                                                 : t->rows;
        KNN_TRY(knn_tile_enqueue(d, row0, rows, t->offsets_uniform,
                                 (int64_t)rows * t->slots, s));
        if (pending >= 0) KNN_TRY(knn_tile_collect(d, pending));
        pending = s;
        s ^= 1;
    }
    if (pending >= 0 && !d->shared->stop)
        KNN_TRY(knn_tile_collect(d, pending));
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    return d->shared->stop ? KNN_E_INTERRUPTED : KNN_OK;
}

void knn_dev_free(knn_gpu_dev *d)
{
    if (d->stream) cudaStreamSynchronize(d->stream);
    knn_tiles_free(&d->t);
    knn_nodes_free(&d->nodes);
    knn_context_release(d->ctx, d->status);
    d->ctx = NULL;
    d->blas = NULL;
    d->stream = NULL;
    cudaGetLastError();
}
