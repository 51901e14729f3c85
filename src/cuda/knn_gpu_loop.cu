/*
 * knn_gpu_loop.cu: the pipeline of one device's row tiles (host code;
 * knn_gpu_plan.cu sizes the tiles and their buffers, knn_gpu_policy.cu
 * decides the course, the kernels live in the files that knn_gpu.cuh
 * lists).
 *
 * A row tile of R queries takes its candidates, from a panel of R x n_ref
 * fast products and a selection kernel, from the fused kernel that never
 * writes the products, or from a shared walk's lists (knn_gpu_walk.cu);
 * then the exact re-rank and sort, and a transfer of the R x k results,
 * already in the caller's layout, into one of two pinned slots. Two tiles
 * are in flight: the host copies tile t-1's slot into the caller's arrays
 * (several OpenMP threads for a large tile) while the device works on
 * tile t. As each tile is collected the policy judges it
 * (knn_dev_next_step): the search may change its course there, and a
 * tile is done again for one of two reasons: its rows found more
 * candidates than their slots hold (heavy ties: run again with each
 * row's exact count, so no candidate is dropped), or the course changed
 * after it was queued and it overflowed under the old one.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "knn_gpu_tiles.cuh"

/* Results of a tile below this many elements are copied by one thread:
 * waking others would cost more than they save. */
#define KNN_COPY_PARALLEL_MIN ((size_t)1 << 15)

/* knn_margin_dist_unit of an arithmetic at p features. */
static double knn_dist_unit_of(knn_gemm_mode gemm, int p)
{
    knn_gemm_units u = knn_gemm_units_of(gemm, p);
    return knn_margin_dist_unit(p, u.in, u.acc);
}

/* Rows of float64 products the tile's panel holds: half its rows of
 * floats where the tiles were planned before the search climbed to
 * float64. */
static int knn_panel_rows_fp64(const knn_gpu_tiles *t, size_t ld)
{
    size_t rows = t->panel_floats / (2 * ld);
    return rows < (size_t)t->rows ? (int)rows : t->rows;
}

/* The selection arguments of a tile of `rows` rows from global query row
 * row0 (node node0 of nd: the device's nodes, or a local frame's view)
 * with the given slot offsets; the panel path's panel (the fused path has
 * none). */
static knn_select_args knn_select_args_on(const knn_gpu_dev *d,
                                          const knn_gpu_nodes *nd, int row0,
                                          int node0, int rows,
                                          const int *offsets,
                                          knn_gemm_mode gemm)
{
    const knn_request *req = d->req;
    const knn_gpu_tiles *t = &d->t;
    int p = req->p;
    knn_gemm_units u = knn_gemm_units_of(gemm, p);
    int fp64 = gemm == KNN_GEMM_FP64;
    knn_select_args sa;
    sa.panel = knn_dev_fused(d) || fp64 ? NULL : t->panel;
    sa.panel64 = fp64 ? (const double *)t->panel : NULL;
    sa.col_sqnorm64 = nd->sqnorm64;
    sa.row_sqnorm64 = nd->sqnorm64 ? nd->sqnorm64 + node0 : NULL;
    sa.ld = knn_dev_fused(d) ? 0 : knn_panel_ld(req->n_ref);
    sa.rows = rows;
    sa.n_cols = req->n_ref;
    sa.k = req->k;
    sa.kind = d->score_kind;
    sa.self_first = d->self ? row0 : -1;
    sa.row_self = NULL;
    sa.col_sqnorm = nd->sqnorm;
    sa.row_sqnorm = nd->sqnorm ? nd->sqnorm + node0 : NULL;
    sa.row_margin2 = nd->margin2 + node0;
    sa.row_norm = d->score_kind == KNN_SCORE_DIST && nd->norm
                      ? nd->norm + node0 : NULL;
    sa.margin_unit = knn_margin_dist_unit(p, u.in, u.acc);
    sa.margin_floor = knn_margin_floor(p, u.tiny);
    sa.metric = req->metric;
    sa.scale_exp = nd->scale_exp;
    sa.offsets = offsets;
    sa.cand_index = t->cand_index;
    sa.count = t->count;
    sa.seg_end = t->seg_end;
    sa.fast = nd->fast;
    sa.row_fast = nd->fast ? nd->fast + (size_t)node0 * nd->ldf : NULL;
    sa.ldf = nd->ldf;
    sa.row_margin2_fp32 = knn_refine_possible(d, gemm)
                              ? nd->margin2_fp32 + node0 : NULL;
    sa.wide = sa.row_margin2_fp32 ? t->wide : NULL;
    sa.wide_buffer = d->course.refine;
    sa.fp32_unit = knn_dist_unit_of(KNN_GEMM_FP32, p);
    return sa;
}

knn_select_args knn_tile_select_args(const knn_gpu_dev *d, int row0,
                                     int node0, int rows,
                                     const int *offsets, knn_gemm_mode gemm)
{
    return knn_select_args_on(d, &d->nodes, row0, node0, rows, offsets,
                              gemm);
}

/* The selection arguments of rows [r0, r0 + rows) of a tile's. */
static knn_select_args knn_select_rows(const knn_select_args *sa, int r0,
                                       int rows)
{
    knn_select_args part = *sa;
    part.rows = rows;
    if (sa->self_first >= 0) part.self_first = sa->self_first + r0;
    if (sa->row_self) part.row_self = sa->row_self + r0;
    if (sa->row_sqnorm) part.row_sqnorm = sa->row_sqnorm + r0;
    if (sa->row_sqnorm64) part.row_sqnorm64 = sa->row_sqnorm64 + r0;
    if (sa->row_norm) part.row_norm = sa->row_norm + r0;
    if (sa->row_fast) part.row_fast = sa->row_fast + (size_t)r0 * sa->ldf;
    if (sa->row_margin2_fp32)
        part.row_margin2_fp32 = sa->row_margin2_fp32 + r0;
    if (sa->wide) part.wide = sa->wide + r0;
    part.row_margin2 = sa->row_margin2 + r0;
    part.offsets = sa->offsets + r0;
    part.count = sa->count + r0;
    part.seg_end = sa->seg_end + r0;
    return part;
}

/* A float64 tile's candidates, as many rows at a time as the panel holds
 * in doubles. */
static knn_status knn_tile_candidates_fp64(knn_gpu_dev *d,
                                           const knn_select_args *sa,
                                           int node0)
{
    int step = knn_panel_rows_fp64(&d->t, sa->ld);
    for (int r0 = 0; r0 < sa->rows; r0 += step) {
        int rows = sa->rows - r0 < step ? sa->rows - r0 : step;
        KNN_TRY(knn_panel_gemm(d->blas, &d->nodes, KNN_GEMM_FP64, node0 + r0,
                               rows, d->t.panel, sa->ld, d->message));
        knn_select_args part = knn_select_rows(sa, r0, rows);
        KNN_TRY(knn_select_candidates(&part, KNN_SELECT_RADIX, d->message,
                                      d->stream));
    }
    return KNN_OK;
}

/* The fused kernel's scratch in the tile's arrays, with these survivor
 * slots and the rows' bounds (knn_fused_scratch). */
knn_fused_scratch knn_fused_scratch_of(const knn_gpu_tiles *t,
                                       const int *surv_offsets,
                                       float *bound, int seeded)
{
    knn_fused_scratch s = {t->survivor, surv_offsets, t->survivors,
                           t->fused_best, bound, seeded};
    return s;
}

/* Where a tile's rows keep their candidates (rows + 1 offsets, n_slots in
 * all) and, on the fused path, their survivors; the uniform slots of a
 * row (INT_MAX: each row's exact counts); `seeded`: a run again with each
 * row's exact slots, whose thresholds start at the bounds of the run
 * before (knn_fused_seed). */
typedef struct {
    const int *offsets;
    int64_t n_slots;
    const int *surv_offsets;
    int slots, surv_slots;
    int seeded;
} knn_tile_slots;

/* A tile's candidates: a shared walk's lists, the fused kernel (its
 * rows' bounds in the slot's d_bound; a local frame's pruned walk where
 * prune->col_node is set), or products into the panel (of nd's nodes:
 * the device's, or a local frame's view) and a selection kernel. */
static knn_status knn_tile_candidates(knn_gpu_dev *d,
                                      const knn_gpu_nodes *nd,
                                      knn_gemm_mode gemm,
                                      const knn_select_args *sa, int node0,
                                      const knn_tile_slots *ts,
                                      const knn_gpu_slot *sl,
                                      const knn_fused_prune *prune)
{
    const knn_request *req = d->req;
    knn_gpu_tiles *t = &d->t;
    if (d->course.path == KNN_PATH_GATHER)
        return knn_pairs_gather(&d->pairs, sa, node0, d->message, d->stream);
    if (sa->panel64) return knn_tile_candidates_fp64(d, sa, node0);
    if (knn_dev_fused(d)) {
        knn_fused_scratch scratch = knn_fused_scratch_of(
            t, ts->surv_offsets, sl->d_bound, ts->seeded);
        return knn_fused_candidates(sa, nd, node0, &scratch, NULL,
                                    prune->col_node ? prune : NULL,
                                    d->message, d->stream);
    }
    if (knn_uses_product(req->metric)) {
        KNN_BLAS_TRY(d->message,
                     cublasSetMathMode(d->blas, knn_gemm_math(gemm)));
        if (sl->apart)
            KNN_TRY(knn_panel_gemm_rows(d->blas, nd, sa->row_fast, sa->rows,
                                        t->panel, sa->ld, d->message));
        else
            KNN_TRY(knn_panel_gemm(d->blas, nd, gemm, node0, sa->rows,
                                   t->panel, sa->ld, d->message));
    }
    else
        KNN_TRY(knn_panel_manhattan(nd->exact + (size_t)node0 * req->p,
                                    nd->exact, req->p, sa->rows, req->n_ref,
                                    nd->scale_exp,
                                    t->panel, sa->ld, d->message,
                                    d->stream));
    return knn_select_candidates(sa, knn_tile_algo(d, sa->rows), d->message,
                                 d->stream);
}

/* The exact re-rank of slot sl's candidates; in_node_order: each row's
 * are in ascending node order (knn_rerank_args). */
static knn_status knn_tile_rerank(knn_gpu_dev *d, const knn_gpu_slot *sl,
                                  int node0, const int *offsets,
                                  int64_t n_slots, int in_node_order)
{
    knn_gpu_tiles *t = &d->t;
    int rows = sl->rows;
    knn_rerank_args ra;
    ra.metric = d->req->metric;
    ra.nodes = d->nodes;
    ra.rows = rows;
    ra.k = d->req->k;
    ra.row_node0 = node0;
    ra.row_nodes = sl->d_nodes;
    ra.offsets = offsets;
    ra.seg_end = t->seg_end;
    ra.cand_index = t->cand_index;
    ra.n_slots = n_slots;
    ra.cand_key = t->cand_key;
    ra.sort_key = t->sort_key;
    ra.sort_key_out = t->sort_key_out;
    ra.sort_val = t->sort_val;
    ra.sort_val_out = t->sort_val_out;
    ra.sort_end = t->sort_end;
    ra.cand_in_node_order = in_node_order;
    ra.sort_temp = t->sort_temp;
    ra.sort_temp_bytes = t->sort_temp_bytes;
    ra.by_row = d->out->by_row;
    ra.index_base = d->out->index_base;
    ra.out_index = sl->d_index;
    ra.out_distance = sl->d_distance;
    ra.out_weight = sl->d_weight;
    return knn_rerank(&ra, d->message, d->stream);
}

static knn_status knn_copy_on(knn_gpu_dev *d, cudaStream_t stream,
                              void *dst, const void *src, size_t bytes)
{
    KNN_CUDA_TRY(d->message, cudaMemcpyAsync(dst, src, bytes,
                                             cudaMemcpyDeviceToHost,
                                             stream));
    return KNN_OK;
}

knn_status knn_copy_back(knn_gpu_dev *d, void *dst, const void *src,
                                size_t bytes)
{
    return knn_copy_on(d, d->stream, dst, src, bytes);
}

/* The tile's per-row counts into its pinned slot on the stream (the next
 * tile overwrites them), then `ranked`, then its results on the copy
 * stream, which overlaps the next tile's work (each slot re-ranks into
 * arrays of its own), then `done`. */
static knn_status knn_tile_transfer(knn_gpu_dev *d, knn_gpu_slot *sl)
{
    knn_gpu_tiles *t = &d->t;
    size_t rk = (size_t)sl->rows * d->req->k, r = (size_t)sl->rows;
    KNN_TRY(knn_copy_back(d, sl->count, t->count, r * sizeof(int)));
    if (sl->refined)
        KNN_TRY(knn_copy_back(d, sl->wide, t->wide, r * sizeof(int)));
    if (knn_slot_fused(sl))
        KNN_TRY(knn_copy_back(d, sl->survivors, t->survivors,
                              r * sizeof(int)));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->ranked, d->stream));
    KNN_CUDA_TRY(d->message,
                 cudaStreamWaitEvent(d->copy_stream, sl->ranked, 0));
    cudaStream_t cs = d->copy_stream;
    KNN_TRY(knn_copy_on(d, cs, sl->index, sl->d_index, rk * sizeof(int)));
    KNN_TRY(knn_copy_on(d, cs, sl->distance, sl->d_distance,
                        rk * sizeof(double)));
    KNN_TRY(knn_copy_on(d, cs, sl->weight, sl->d_weight,
                        rk * sizeof(double)));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->done, cs));
    return KNN_OK;
}

static knn_tile_slots knn_slots_uniform(const knn_gpu_tiles *t, int rows)
{
    knn_tile_slots ts = {t->offsets_uniform, (int64_t)rows * t->slots,
                         t->surv_offsets_uniform, t->slots, t->surv_slots,
                         0};
    return ts;
}

/* The arithmetic of a slot's products: float32 for rows apart, TF32 in
 * a local frame, else the course's when the tile was queued. */
static knn_gemm_mode knn_slot_gemm(const knn_gpu_slot *sl)
{
    return sl->apart ? KNN_GEMM_FP32
         : sl->d_nodes ? KNN_GEMM_TF32 : sl->course.gemm;
}

/* What slot sl's tile of rows [row0, row0 + rows) runs on: the course
 * the search is on as it is queued (knn_dev_next_step reads it back),
 * and the slots a row has (knn_tile_slots). */
void knn_slot_begin(const knn_gpu_dev *d, knn_gpu_slot *sl, int row0,
                    int rows, int slots, int surv_slots)
{
    int end = d->q0 + d->nq;
    sl->row0 = row0;
    sl->rows = rows;
    sl->slots = slots;
    sl->surv_slots = surv_slots;
    sl->course = d->course;
    sl->apart = row0 >= end;
    int ordered = !sl->apart && d->course.local && row0 >= d->local.base;
    if (sl->apart) {
        sl->place = d->apart.rows + (row0 - end);
        sl->d_nodes = d->apart.nodes + (row0 - end);
    } else {
        sl->place = ordered ? d->local.place + (row0 - d->local.base)
                            : NULL;
        sl->d_nodes = ordered ? d->local.nodes + (row0 - d->local.base)
                              : NULL;
    }
    sl->refined = knn_tile_refined(d, rows, knn_slot_gemm(sl));
}

/* The selection arguments of rows apart from the i0-th on: their gathered
 * vectors, norms and float32 margins stand for their nodes' (sa built on
 * node 0). */
static void knn_apart_args(const knn_gpu_dev *d, int i0, knn_select_args *sa)
{
    const knn_gpu_apart *a = &d->apart;
    sa->self_first = -1;
    sa->row_self = d->self ? a->nodes + i0 : NULL;
    sa->row_sqnorm = sa->row_sqnorm ? a->sqnorm + i0 : NULL;
    sa->row_norm = sa->row_norm ? a->norm + i0 : NULL;
    sa->row_sqnorm64 = NULL;
    sa->row_margin2 = a->margin2 + i0;
    sa->row_fast = a->fast + (size_t)i0 * d->nodes.ldf;
    sa->row_margin2_fp32 = NULL;
    sa->wide = NULL;
}

/* Queues tile work for global query rows [row0, row0 + rows) with the given
 * slots, and the transfer of its results into slot s. */
static knn_status knn_tile_enqueue(knn_gpu_dev *d, int row0, int rows,
                                   const knn_tile_slots *ts, int s)
{
    knn_gpu_slot *sl = &d->t.slot[s];
    knn_slot_begin(d, sl, row0, rows, ts->slots, ts->surv_slots);
    int node0 = sl->apart ? 0 : knn_dev_row_node(d, row0);
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->start, d->stream));
    /* A tile of the spatial order takes its own frame: its rows follow
     * the ref nodes in the frame's view. */
    const knn_gpu_nodes *nd = &d->nodes;
    int rows_node0 = node0;
    knn_gemm_mode gemm = knn_slot_gemm(sl);
    knn_fused_prune prune;
    memset(&prune, 0, sizeof prune);
    if (sl->d_nodes && !sl->apart) {
        KNN_TRY(knn_local_frame(d, sl->d_nodes, rows, &nd, &prune));
        rows_node0 = d->req->n_ref;
    }
    knn_select_args sa = knn_select_args_on(d, nd, row0, rows_node0, rows,
                                            ts->offsets, gemm);
    if (sl->apart)
        knn_apart_args(d, row0 - (d->q0 + d->nq), &sa);
    else if (sl->d_nodes && d->self)
        sa.row_self = sl->d_nodes;
    KNN_TRY(knn_tile_candidates(d, nd, gemm, &sa, rows_node0, ts, sl,
                                &prune));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->selected, d->stream));
    KNN_TRY(knn_tile_rerank(d, sl, node0, ts->offsets, ts->n_slots,
                            prune.col_node == NULL));
    return knn_tile_transfer(d, sl);
}

/* Whether row r of slot sl's tile needed more survivor slots than the
 * uniform ones (fused path only). */
static int knn_row_surv_over(const knn_gpu_tiles *t, const knn_gpu_slot *sl,
                             int r)
{
    return knn_slot_fused(sl) && sl->survivors[r] > sl->surv_slots;
}

/* Exact offsets from per-row counts into the pinned array h (rows + 1);
 * returns the total, or -1 past what one pass can index. */
static int64_t knn_offsets_exact(const std::vector<int> &need, int *h)
{
    int64_t total = 0;
    for (size_t r = 0; r < need.size(); r++) {
        h[r] = (int)total;
        total += need[r];
        if (total > 2147483647) return -1;
    }
    h[need.size()] = (int)total;
    return total;
}

/* Candidate slots for n of them and the sort's scratch for a tile of
 * `rows` rows, kept when they suffice. */
static knn_status knn_slots_fit(knn_gpu_dev *d, int64_t n, int rows)
{
    knn_gpu_tiles *t = &d->t;
    size_t temp_bytes = 0;
    KNN_TRY(knn_rerank_sort_bytes(n, rows, &temp_bytes, d->message));
    if (n <= t->n_slots_alloc && temp_bytes <= t->sort_temp_bytes)
        return KNN_OK;
    int64_t want = n > t->n_slots_alloc ? n : t->n_slots_alloc;
    knn_slots_free(t);
    return knn_slots_alloc(d, want, temp_bytes);
}

static knn_status knn_survivors_fit(knn_gpu_dev *d, int64_t n)
{
    if (n <= d->t.surv_alloc) return KNN_OK;
    knn_survivors_free(&d->t);
    return knn_survivors_alloc(d, n);
}

static knn_status knn_redo_nomem(knn_gpu_dev *d, knn_status st,
                                 long long total)
{
    if (st == KNN_E_NOMEM)
        snprintf(d->message, sizeof d->message,
                 "GPU %d: no memory for the %lld candidates that tied "
                 "values produce in one row tile", d->device, total);
    return st;
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

/* Copies a slot of the spatial order into the caller's arrays: row r to
 * its place. */
static void knn_copy_placed(const knn_gpu_dev *d, const knn_gpu_slot *sl)
{
    const knn_result *out = d->out;
    const knn_request *req = d->req;
    size_t n_q = (size_t)(req->query ? req->n_query : req->n_ref);
    int rows = sl->rows, k = req->k;
    int parts = (size_t)rows * k < KNN_COPY_PARALLEL_MIN ? 1
                                                         : d->copy_threads;
    #pragma omp parallel for num_threads(parts) if (parts > 1) \
        schedule(static)
    for (int i = 0; i < parts; i++) {
        for (int r = rows * i / parts; r < rows * (i + 1) / parts; r++) {
            for (int c = 0; c < k; c++) {
                size_t from = out->by_row ? (size_t)r * k + c
                                          : (size_t)r + (size_t)c * rows;
                size_t to = knn_result_at(out, n_q, k,
                                          (size_t)sl->place[r], c);
                out->index[to] = sl->index[from];
                out->distance[to] = sl->distance[from];
                out->weight[to] = sl->weight[from];
            }
        }
    }
}

/* Copies a slot into the caller's arrays. A large tile is split over
 * several OpenMP threads: the copy lands in memory R has just allocated,
 * and one thread is held up by the first-touch page faults; the device
 * meanwhile runs the next tile. */
static void knn_copy_out(const knn_gpu_dev *d, const knn_gpu_slot *sl)
{
    if (sl->place) {
        knn_copy_placed(d, sl);
        return;
    }
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

/* Waits until the caller's result arrays exist: the calling thread
 * allocates them while the devices search (knn_result_arrive). */
static knn_status knn_dev_await_result(const knn_gpu_dev *d)
{
    return knn_meet_wait(d->shared, &d->shared->out_ready, 1,
                         KNN_ENDS_ON_STOP, NULL);
}

/* The candidates of all the slot's rows. */
double knn_slot_found(const knn_gpu_slot *sl)
{
    double found = 0.0;
    for (int r = 0; r < sl->rows; r++) found += sl->count[r];
    return found;
}

/* The largest of a slot's per-row counts. */
static int knn_slot_most(const int *counts, int rows)
{
    int most = 0;
    for (int r = 0; r < rows; r++)
        if (counts[r] > most) most = counts[r];
    return most;
}

/* The query row of row r of slot sl: its place in a spatial order. */
static int knn_slot_row(const knn_gpu_slot *sl, int r)
{
    return sl->place ? sl->place[r] : sl->row0 + r;
}

/* Whether row r of slot sl's tile is set apart (its results there are
 * written over by its own). */
static int knn_row_apart(const knn_gpu_dev *d, const knn_gpu_slot *sl,
                         int r)
{
    if (sl->apart || !d->apart.mark) return 0;
    return d->apart.mark[knn_slot_row(sl, r) - d->q0];
}

/* Whether row r of the slot, not set apart, needed more candidate or
 * survivor slots than it had. */
static int knn_row_over(const knn_gpu_dev *d, const knn_gpu_slot *sl, int r)
{
    return (sl->count[r] > sl->slots || knn_row_surv_over(&d->t, sl, r)) &&
           !knn_row_apart(d, sl, r);
}

/* The rows of the slot that needed more slots than they had. */
static int knn_slot_rows_over(const knn_gpu_dev *d, const knn_gpu_slot *sl)
{
    int over = 0;
    for (int r = 0; r < sl->rows; r++) over += knn_row_over(d, sl, r);
    return over;
}

/* Whether a row of the slot needed more than its uniform slots; *found
 * gets the candidates of all its rows. */
static int knn_slot_overflow(const knn_gpu_dev *d, const knn_gpu_slot *sl,
                             double *found)
{
    *found = knn_slot_found(sl);
    for (int r = 0; r < sl->rows; r++)
        if (knn_row_over(d, sl, r)) return 1;
    return 0;
}

knn_status knn_apart_add(knn_gpu_dev *d, int row)
{
    knn_gpu_apart *a = &d->apart;
    if (!a->mark) a->mark = (unsigned char *)calloc((size_t)d->nq, 1);
    if (a->mark && a->mark[row - d->q0]) return KNN_OK;
    if (a->n == a->cap) {
        int cap = a->cap > 0 ? 2 * a->cap : 256;
        int *rows = (int *)realloc(a->rows, (size_t)cap * sizeof(int));
        if (rows) {
            a->rows = rows;
            a->cap = cap;
        }
    }
    if (!a->mark || a->n == a->cap) {
        snprintf(d->message, sizeof d->message,
                 "out of host memory for the rows set apart");
        return KNN_E_NOMEM;
    }
    a->mark[row - d->q0] = 1;
    a->rows[a->n++] = row;
    return KNN_OK;
}

/* The rows of slot sl's tile that overflowed join the rows apart. */
static knn_status knn_apart_keep(knn_gpu_dev *d, const knn_gpu_slot *sl)
{
    for (int r = 0; r < sl->rows; r++)
        if (knn_row_over(d, sl, r))
            KNN_TRY(knn_apart_add(d, knn_slot_row(sl, r)));
    return KNN_OK;
}

/* No row apart any more: the device's rows are searched again from the
 * first. */
static void knn_apart_clear(knn_gpu_dev *d)
{
    knn_gpu_apart *a = &d->apart;
    if (a->mark) memset(a->mark, 0, (size_t)d->nq);
    a->n = 0;
}

/* Why a tile is done again: the search changed its course (arithmetic or
 * refinement) after the tile was queued and the tile overflowed under the
 * old one, so it runs on the new course with the uniform slots; or a row
 * found more candidates than its slots hold (heavy ties), so it runs with
 * each row's exact counts. */
typedef enum {
    KNN_AGAIN_COURSE = 0,
    KNN_AGAIN_SLOTS
} knn_again;

/* Each row's exact slots for a tile done again for KNN_AGAIN_SLOTS (the
 * first run found more than its uniform slots held), into *ts. A row
 * whose survivors overflowed kept candidates among the stored ones only;
 * it gets as many candidate slots as survivors. On the fused path the run
 * again is seeded with the rows' bounds, so its survivors are its
 * candidates and take the same slots. cand keeps the counts asked for,
 * which the run must give again (knn_slots_check). */
static knn_status knn_slots_exact(knn_gpu_dev *d, const knn_gpu_slot *sl,
                                  knn_tile_slots *ts, std::vector<int> &cand)
{
    knn_gpu_tiles *t = &d->t;
    int avail = d->req->n_ref, fused = knn_slot_fused(sl);
    cand.resize(sl->rows);
    for (int r = 0; r < sl->rows; r++)
        cand[r] = knn_row_surv_over(t, sl, r)
            ? (sl->survivors[r] < avail ? sl->survivors[r] : avail)
            : sl->count[r];
    int64_t total = knn_offsets_exact(cand, t->h_offsets);
    if (total < 0) {
        snprintf(d->message, sizeof d->message,
                 "a row tile has more tied candidates than one pass can "
                 "sort; lower options(knngpu.gpu.memory)");
        return KNN_E_NOMEM;
    }
    knn_status st = knn_slots_fit(d, total, sl->rows);
    if (st == KNN_OK && fused) st = knn_survivors_fit(d, total);
    if (st != KNN_OK)
        return knn_redo_nomem(d, st, (long long)total);
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(t->offsets_exact, t->h_offsets,
                                 (size_t)(sl->rows + 1) * sizeof(int),
                                 cudaMemcpyHostToDevice, d->stream));
    ts->offsets = t->offsets_exact;
    ts->n_slots = total;
    ts->surv_offsets = t->offsets_exact;
    ts->slots = ts->surv_slots = INT_MAX;
    ts->seeded = fused;
    return KNN_OK;
}

/* A tile run with exact slots gives every row at most the candidates it
 * asked for and, seeded on the fused path, exactly its candidates as
 * survivors. */
static knn_status knn_slots_check(knn_gpu_dev *d, const knn_gpu_slot *sl,
                                  const std::vector<int> &cand)
{
    for (int r = 0; r < sl->rows; r++) {
        if (sl->count[r] > cand[r] ||
            (knn_slot_fused(sl) && sl->survivors[r] != sl->count[r]))
            return knn_gpu_fail(d->message, KNN_E_DEVICE, "candidate redo",
                                "a row's candidate count changed between "
                                "two runs of the same tile", __FILE__,
                                __LINE__);
    }
    return KNN_OK;
}

/* The one way to do the tile in slot s again, for a reason (knn_again),
 * once the tiles in flight are done; its time counts as search (a new
 * course) or re-rank (more slots). */
static knn_status knn_tile_again(knn_gpu_dev *d, int s, knn_again why)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[s];
    double t0 = knn_seconds();
    KNN_TRY(knn_dev_idle(d));
    knn_tile_slots ts = knn_slots_uniform(t, sl->rows);
    std::vector<int> cand;
    if (why == KNN_AGAIN_SLOTS) KNN_TRY(knn_slots_exact(d, sl, &ts, cand));
    KNN_TRY(knn_tile_enqueue(d, sl->row0, sl->rows, &ts, s));
    KNN_CUDA_TRY(d->message, cudaEventSynchronize(sl->done));
    if (why == KNN_AGAIN_SLOTS) KNN_TRY(knn_slots_check(d, sl, cand));
    double *seconds = why == KNN_AGAIN_SLOTS ? &d->seconds_rerank
                                             : &d->seconds_search;
    *seconds += knn_seconds() - t0;
    return KNN_OK;
}


/* Whether the tiles (when planned) hold a row of float64 products. */
static int knn_dev_fp64_fits(const knn_gpu_dev *d)
{
    return !d->t.device_block ||
           knn_panel_rows_fp64(&d->t, knn_panel_ld(d->req->n_ref)) >= 1;
}

/* Float64's arrays where they fit (*st KNN_OK); KNN_E_NOMEM, the message
 * cleared, where they or a float64 row of the panel do not. */
static knn_status knn_dev_try_fp64(knn_gpu_dev *d)
{
    knn_status st = knn_dev_fp64_fits(d)
        ? knn_nodes_fp64(d->req->metric, &d->nodes, d->message, d->stream)
        : KNN_E_NOMEM;
    if (st == KNN_E_NOMEM) d->message[0] = '\0';
    return st;
}

/* The next arithmetic after TF32: split TF32; where its arrays do not
 * fit, float64 on a device that runs it fast and has room for its
 * (smaller) arrays, else float32. */
static knn_status knn_dev_leave_tf32(knn_gpu_dev *d, knn_gemm_mode *next)
{
    knn_status st = knn_nodes_split(&d->nodes, d->message, d->stream);
    if (st != KNN_E_NOMEM) {
        *next = KNN_GEMM_TF32X3;
        return st;
    }
    d->message[0] = '\0';
    st = d->fp64_fast ? knn_dev_try_fp64(d) : KNN_E_NOMEM;
    *next = st == KNN_OK ? KNN_GEMM_FP64 : KNN_GEMM_FP32;
    return st == KNN_E_NOMEM ? KNN_OK : st;
}

/* Float64 after split TF32 or float32. The split's arrays go first (the
 * tiles in flight that read them are waited for): float64's take half
 * their room. Where float64's do not fit either, float32, as accurate
 * as split TF32, ends the climb. */
static knn_status knn_dev_leave_fp32(knn_gpu_dev *d, knn_gemm_mode *next)
{
    if (d->nodes.split) {
        KNN_TRY(knn_dev_idle(d));
        knn_device_free(d->nodes.split);
        d->nodes.split = NULL;
    }
    knn_status st = knn_dev_try_fp64(d);
    *next = st == KNN_OK ? KNN_GEMM_FP64 : KNN_GEMM_FP32;
    return st == KNN_E_NOMEM ? KNN_OK : st;
}

/* The climb to the next arithmetic, from here on (knn_gpu.cuh has the
 * order). Tiles already queued keep their margins and vectors: the new
 * ones are computed on the stream after them. */
static knn_status knn_dev_climb(knn_gpu_dev *d)
{
    knn_course c = d->course;
    knn_gemm_mode from = c.gemm, next = c.gemm;
    KNN_TRY(from == KNN_GEMM_TF32 ? knn_dev_leave_tf32(d, &next)
                                  : knn_dev_leave_fp32(d, &next));
    /* Float32 after TF32 may still climb to float64; nothing climbs
     * further, or from where float64 did not fit. */
    c.may_climb = next == KNN_GEMM_TF32X3 ||
                  (next == KNN_GEMM_FP32 && from == KNN_GEMM_TF32);
    if (next != from) {
        c.climbed_from |= knn_gemm_bit(from);
        c.gemm = next;
    }
    knn_course_set(d, c);
    if (next == from) return KNN_OK;
    KNN_BLAS_TRY(d->message,
                 cublasSetMathMode(d->blas, knn_gemm_math(next)));
    return knn_nodes_remargin(d->req->metric, &d->nodes, next, d->message,
                              d->stream);
}

/* A gathered tile's share of the progress: the rest of its rows, whose
 * first half the shared walk counted (knn_walk_share, knn_gpu_walk.cu). */
static long long knn_gather_share(int row0, int rows)
{
    return rows - ((long long)(row0 + rows) / 2 - row0 / 2);
}

/* The policy's word on slot s's tile (knn_dev_next_step), rerunning the
 * tile with the uniform slots where the search has changed its
 * arithmetic or begun to refine since the tile ran and a row overflowed,
 * as often as it changes (a redo must see the counts of the same
 * selection): *overflow and *found then hold the counts of its last run.
 * A fused tile that shows the search must refine or climb, or any that
 * shows it must take or leave local frames, sets *rewind (a
 * knn_rung_step) and is not collected. */
static knn_status knn_tile_judge(knn_gpu_dev *d, int s, int *overflow,
                                 double *found, int *rewind)
{
    knn_gpu_slot *sl = &d->t.slot[s];
    /* A rerun in the search's new course may show it must change again
     * (TF32, then split TF32, then float64, on data none but float64
     * resolves): each pass refines or climbs, or leaves the loop. */
    for (;;) {
        knn_rung_step step = knn_dev_next_step(
            d, sl, *found, knn_slot_fused(sl) ? 0 : *overflow);
        if (step == KNN_RUNG_LOCAL || step == KNN_RUNG_UNLOCAL) {
            *rewind = (int)step;
            return KNN_OK;
        }
        if (step == KNN_RUNG_REFINE) knn_course_refine(d);
        if (knn_slot_fused(sl) && step != KNN_RUNG_STAY) {
            *rewind = (int)step;
            return KNN_OK;
        }
        if (step == KNN_RUNG_CLIMB) KNN_TRY(knn_dev_climb(d));
        if (!*overflow || (sl->course.gemm == d->course.gemm &&
                           sl->course.refine == d->course.refine))
            return KNN_OK;
        KNN_TRY(knn_tile_again(d, s, KNN_AGAIN_COURSE));
        *overflow = knn_slot_overflow(d, sl, found);
    }
}

/* Gives the rows of slot s's tile that overflowed their slots what they
 * need: sets them apart where the policy says so (the tile's run took
 * `seconds`), else runs the tile again with each row's exact slots
 * (*found then its candidates). */
static knn_status knn_tile_overflowed(knn_gpu_dev *d, int s, double seconds,
                                      double *found)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[s];
    if (knn_rows_go_apart(d, sl, knn_slot_rows_over(d, sl), seconds))
        return knn_apart_keep(d, sl);
    int grow = sl->course.local && knn_slot_fused(sl);
    int surv = grow ? knn_slot_most(sl->survivors, sl->rows) : 0;
    KNN_TRY(knn_tile_again(d, s, KNN_AGAIN_SLOTS));
    knn_slot_overflow(d, sl, found); /* the counts of the run again */
    if (grow)
        KNN_TRY(knn_grow_uniform(d, knn_slot_most(sl->count, sl->rows),
                                 surv));
    return KNN_OK;
}

/* Waits for slot s, has the policy judge its tile (knn_tile_judge; not
 * a tile of rows apart, whose rows are crowded by nature), gives rows that
 * overflowed their slots what they need (knn_tile_overflowed), and copies
 * its rows x k results into the caller's n_query x k arrays. *rewind:
 * see knn_tile_judge. */
static knn_status knn_tile_collect(knn_gpu_dev *d, int s, int *rewind)
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
    int overflow = knn_slot_overflow(d, sl, &found);
    if (!sl->apart) {
        KNN_TRY(knn_tile_judge(d, s, &overflow, &found, rewind));
        if (*rewind) return KNN_OK;
    }
    /* Only a tile kept says how the result was made: a fused probe that
     * the search rewound to the panel path left no candidate behind. */
    d->half_products |= knn_slot_fused(sl) || knn_slot_gathered(sl);
    d->local_frames |= sl->d_nodes != NULL && !sl->apart;
    if (overflow)
        KNN_TRY(knn_tile_overflowed(d, s, (ms_search + ms_rerank) / 1000.0,
                                    &found));
    d->refined |= sl->refined && knn_slot_wide(sl, found) > found;
    for (int r = 0; r < sl->rows; r++) {
        /* A row set apart (a fused row whose survivors overflowed, or a
         * walk's lost node, may hold fewer than k) counts when it is
         * searched. */
        if (knn_row_apart(d, sl, r)) continue;
        if (sl->count[r] < k)
            return knn_gpu_fail(d->message, KNN_E_DEVICE,
                                "candidate selection",
                                "a row has fewer candidates than k",
                                __FILE__, __LINE__);
        d->candidates += sl->count[r];
    }

    double t0 = knn_seconds();
    KNN_TRY(knn_dev_await_result(d));
    knn_copy_out(d, sl);
    d->seconds_collect += knn_seconds() - t0;
    /* A shared walk counted half of each row as its tile ran; a tile's
     * rows set apart count with it, not again when they are searched. */
    long long done = knn_slot_gathered(sl)
                         ? knn_gather_share(sl->row0, sl->rows)
                         : sl->apart ? 0 : sl->rows;
    d->rows_reported += done;
    knn_meet_progress(d->shared, done);
    return KNN_OK;
}

/* Leaves the fused path for the panel path, refining TF32 candidates or
 * in the finer arithmetic (step): the tiles in flight are dropped (which
 * frees room for the split's arrays), the margins recomputed where the
 * search climbs, and the tiles planned again. */
knn_status knn_dev_leave_fused(knn_gpu_dev *d, int step)
{
    double t0 = knn_seconds();
    KNN_TRY(knn_dev_idle(d));
    knn_tiles_free(&d->t);
    if (step == KNN_RUNG_CLIMB) KNN_TRY(knn_dev_climb(d));
    KNN_TRY(knn_dev_plan_tiles(d));
    d->seconds_setup += knn_seconds() - t0;
    return KNN_OK;
}

/* The rows apart's device arrays, their vectors gathered (on the
 * stream, waited for: the host's list of nodes goes out of scope). */
static knn_status knn_apart_alloc(knn_gpu_dev *d)
{
    knn_gpu_apart *a = &d->apart;
    const knn_gpu_nodes *nd = &d->nodes;
    size_t n = (size_t)a->n;
    int dist = nd->sqnorm != NULL;
    knn_carver c = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        c.used = 0;
        a->nodes = knn_carve<int>(&c, n);
        a->fast = knn_carve<float>(&c, n * nd->ldf);
        a->sqnorm = dist ? knn_carve<float>(&c, n) : NULL;
        a->norm = dist ? knn_carve<double>(&c, n) : NULL;
        a->margin2 = knn_carve<double>(&c, n);
        if (pass == 0)
            KNN_CUDA_TRY(d->message,
                         knn_device_alloc(&a->block, c.used, d->stream));
        c.block = (char *)a->block;
    }
    std::vector<int> nodes(n);
    for (size_t i = 0; i < n; i++) nodes[i] = knn_dev_row_node(d, a->rows[i]);
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(a->nodes, nodes.data(), n * sizeof(int),
                                 cudaMemcpyHostToDevice, d->stream));
    KNN_TRY(knn_apart_vectors(nd, a->nodes, a->n, a->fast, a->sqnorm,
                              a->norm, a->margin2, d->message, d->stream));
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    return KNN_OK;
}

void knn_apart_free(knn_gpu_apart *a)
{
    knn_device_free(a->block);
    free(a->rows);
    free(a->mark);
    memset(a, 0, sizeof *a);
}

/* The rows set apart, after the device's last tile (knn_gpu_apart):
 * their arrays first (small), then panel tiles planned for them, each
 * collected before the next is queued (a tile of them runs again with
 * each row's exact slots where its rows overflow float32's too). Their
 * rows stand as rows q0 + nq + i. */
static knn_status knn_dev_apart(knn_gpu_dev *d)
{
    knn_gpu_apart *a = &d->apart;
    if (a->n == 0) return KNN_OK;
    double t0 = knn_seconds();
    KNN_TRY(knn_dev_idle(d));
    knn_tiles_free(&d->t);
    knn_local_free(&d->local); /* local tiles are done: room for these */
    KNN_TRY(knn_apart_alloc(d));
    KNN_TRY(knn_dev_plan_apart(d, a->n));
    d->seconds_setup += knn_seconds() - t0;
    d->rows_apart = a->n;
    int end = d->q0 + d->nq;
    for (int i = 0; i < a->n && !d->shared->stop; i += d->t.rows) {
        int rows = a->n - i < d->t.rows ? a->n - i : d->t.rows;
        int rewind = KNN_RUNG_STAY;
        knn_tile_slots ts = knn_slots_uniform(&d->t, rows);
        KNN_TRY(knn_tile_enqueue(d, end + i, rows, &ts, 0));
        KNN_TRY(knn_tile_collect(d, 0, &rewind));
    }
    return KNN_OK;
}

/* Two tiles in flight: tile t is queued before tile t-1 is collected.
 * A fused search that may still climb starts with a probe (`probe`): one
 * full wave of blocks, collected before any other tile is queued, so
 * that data which needs a finer arithmetic costs that wave, not a whole
 * tile, in TF32. */
knn_status knn_dev_tiles(knn_gpu_dev *d, int probe)
{
    knn_gpu_tiles *t = &d->t;
    int end = d->q0 + d->nq, next = d->q0; /* first row not yet queued */
    int pending = -1; /* slot whose results are not yet collected */
    int s = 0;
    while (!d->shared->stop) {
        int queued = -1, rewind = KNN_RUNG_STAY;
        if (next < end) {
            int rows = end - next < t->rows ? end - next : t->rows;
            if (probe && rows > d->wave_rows) rows = d->wave_rows;
            rows = knn_local_tile_rows(d, next, rows);
            knn_tile_slots ts = knn_slots_uniform(t, rows);
            KNN_TRY(knn_tile_enqueue(d, next, rows, &ts, s));
            queued = s;
            next += rows;
        }
        if (pending >= 0) KNN_TRY(knn_tile_collect(d, pending, &rewind));
        if (!rewind && queued >= 0 && probe) {
            pending = -1;
            KNN_TRY(knn_tile_collect(d, queued, &rewind));
            probe = 0;
            if (!rewind) continue;
            pending = queued;
        }
        if (rewind) {
            next = t->slot[pending].row0;
            if (rewind == KNN_RUNG_LOCAL) {
                KNN_TRY(knn_dev_go_local(d, next));
            } else if (rewind == KNN_RUNG_UNLOCAL) {
                KNN_TRY(knn_dev_leave_local(d));
                knn_apart_clear(d);
                next = d->q0;
            } else {
                KNN_TRY(knn_dev_leave_fused(d, rewind));
            }
            pending = -1;
            s = 0;
            continue;
        }
        if (queued < 0) break;
        pending = queued;
        s ^= 1;
    }
    if (!d->shared->stop) KNN_TRY(knn_dev_apart(d));
    KNN_TRY(knn_dev_idle(d));
    return d->shared->stop ? KNN_E_INTERRUPTED : KNN_OK;
}
