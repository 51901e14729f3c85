/*
 * knn_stream.c: a search whose nodes do not fit the device at once (the
 * GPU's free memory, or the request's memory budget), run as a sequence of
 * searches of query blocks against reference blocks, merged on the host.
 *
 * Each block search is exact under the canonical arithmetic of
 * knn_exact.h, and the request's max_abs gives every block the power-of-two
 * scale of the whole search, so a pair's key and reported distance are
 * those of one search whatever block it falls in. A query's lists from the
 * reference blocks, each sorted by (reported distance, index), merge into
 * its whole list by the same order. A self search's blocks are query
 * searches; where a query block meets its own nodes, it asks for k + 1
 * neighbours and drops each node from its own list.
 *
 * Memory: the merged lists of one query block and one block's results on
 * the host; on the device, one block search at a time (whose upload goes
 * through the backend's pinned staging as ever).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "knn_backend.h"
#include "knn_exact.h"
#include "knn_threads.h"

/* Device bytes per node of a block search: float64 values, float32 fast
 * values (rows padded to 4), per-node scalars, and Spearman's ranks made
 * beside the values. An estimate for planning: the backend halves its
 * tiles when an allocation still fails. */
static double knn_node_bytes(const knn_request *req)
{
    double values = (req->metric == KNN_SPEARMAN ? 16.0 : 8.0) * req->p;
    return values + 4.0 * (req->p + 4) + 64.0;
}

/* Nodes of one side of a block search (half of what may be on the device
 * at once: the other half is left to the tiles) for a budget in bytes;
 * 0 when the whole search fits. */
static int knn_stream_block(const knn_request *req, const knn_knobs *knobs,
                            double budget)
{
    if (knobs->block_nodes > 0) return knobs->block_nodes;
    if (budget <= 0.0) return 0;
    double nodes = req->n_ref + (req->query ? req->n_query : 0);
    double fit = 0.5 * budget / knn_node_bytes(req);
    if (nodes <= fit) return 0;
    int side = (int)(0.5 * fit);
    return side < 1 ? 1 : side;
}

/* Free bytes of the least free GPU the request may use, less the
 * backend's reserve; 0 when unknown. */
static double knn_gpu_free_bytes(const knn_request *req)
{
    knn_gpu_info *info = malloc(sizeof *info);
    if (!info) return 0.0;
    knn_gpu_query(info);
    double least = 0.0;
    for (int i = 0; i < info->n_devices; i++) {
        int used = req->n_devices <= 0;
        for (int j = 0; j < req->n_devices; j++)
            used |= req->devices[j] == i;
        double free_b = info->device[i].memory_free;
        if (used && (least == 0.0 || free_b < least)) least = free_b;
    }
    free(info);
    return least > 0.0 ? 0.9 * least : 0.0;
}

/* The merged lists of one query block: up to k entries per query, sorted
 * by (distance, index); indices 0-based and global. */
typedef struct {
    int k;
    int *count;
    int *index;
    double *distance, *weight;
    /* one block search's results and a merge's scratch list */
    int *b_index, *s_index;
    double *b_distance, *b_weight, *s_distance, *s_weight;
} knn_merge;

static void knn_merge_free(knn_merge *m)
{
    free(m->count);
    free(m->index);
    free(m->distance);
    free(m->weight);
    free(m->b_index);
    free(m->b_distance);
    free(m->b_weight);
    free(m->s_index);
    free(m->s_distance);
    free(m->s_weight);
    memset(m, 0, sizeof *m);
}

static knn_status knn_merge_alloc(knn_merge *m, int rows, int k)
{
    size_t lists = (size_t)rows * k, block = (size_t)rows * (k + 1);
    memset(m, 0, sizeof *m);
    m->k = k;
    m->count = calloc((size_t)rows, sizeof(int));
    m->index = malloc(lists * sizeof(int));
    m->distance = malloc(lists * sizeof(double));
    m->weight = malloc(lists * sizeof(double));
    m->b_index = malloc(block * sizeof(int));
    m->b_distance = malloc(block * sizeof(double));
    m->b_weight = malloc(block * sizeof(double));
    m->s_index = malloc((size_t)k * sizeof(int));
    m->s_distance = malloc((size_t)k * sizeof(double));
    m->s_weight = malloc((size_t)k * sizeof(double));
    if (!m->count || !m->index || !m->distance || !m->weight ||
        !m->b_index || !m->b_distance || !m->b_weight || !m->s_index ||
        !m->s_distance || !m->s_weight) {
        knn_merge_free(m);
        return KNN_E_NOMEM;
    }
    return KNN_OK;
}

static int knn_before(double da, int ia, double db, int ib)
{
    return da < db || (da == db && ia < ib);
}

/* Merges query row i's block list (kb entries from b, reference offset r0,
 * its own node `self` skipped, -1 for none) into its merged list. */
static void knn_merge_row(knn_merge *m, int i, int kb, int r0, int self)
{
    int k = m->k, *have = m->index + (size_t)i * k;
    double *have_d = m->distance + (size_t)i * k;
    double *have_w = m->weight + (size_t)i * k;
    const int *b = m->b_index + (size_t)i * kb;
    const double *b_d = m->b_distance + (size_t)i * kb;
    const double *b_w = m->b_weight + (size_t)i * kb;
    int a = 0, c = 0, n = 0, count = m->count[i];
    while (n < k) {
        while (c < kb && b[c] + r0 == self) c++;
        int take_b = c < kb &&
            (a >= count || knn_before(b_d[c], b[c] + r0, have_d[a], have[a]));
        if (take_b) {
            m->s_index[n] = b[c] + r0;
            m->s_distance[n] = b_d[c];
            m->s_weight[n++] = b_w[c++];
        } else if (a < count) {
            m->s_index[n] = have[a];
            m->s_distance[n] = have_d[a];
            m->s_weight[n++] = have_w[a++];
        } else {
            break;
        }
    }
    memcpy(have, m->s_index, (size_t)n * sizeof(int));
    memcpy(have_d, m->s_distance, (size_t)n * sizeof(double));
    memcpy(have_w, m->s_weight, (size_t)n * sizeof(double));
    m->count[i] = n;
}

/* Writes a query block's merged lists (rows q0..) into the caller's
 * result. */
static void knn_merge_write(const knn_merge *m, int q0, int rows, int n_q,
                            knn_result *out)
{
    for (int i = 0; i < rows; i++) {
        for (int r = 0; r < m->k; r++) {
            size_t at = knn_result_at(out, (size_t)n_q, m->k,
                                      (size_t)(q0 + i), r);
            size_t from = (size_t)i * m->k + r;
            out->index[at] = m->index[from] + out->index_base;
            out->distance[at] = m->distance[from];
            out->weight[at] = m->weight[from];
        }
    }
}

/* What a stream of block searches reports: the first block's device and
 * precision (with any other precision a block used), summed timings,
 * mean candidates, the block sizes as the tile shape. */
static void knn_report_add(knn_report *total, const knn_report *part,
                           int first)
{
    if (first) {
        snprintf(total->device, sizeof total->device, "%s", part->device);
        snprintf(total->precision, sizeof total->precision, "%s",
                 part->precision);
    } else if (!strstr(total->precision, part->precision)) {
        size_t used = strlen(total->precision);
        snprintf(total->precision + used, sizeof total->precision - used,
                 "; %s", part->precision);
    }
    total->seconds_setup += part->seconds_setup;
    total->seconds_prepare += part->seconds_prepare;
    total->seconds_search += part->seconds_search;
    total->seconds_rerank += part->seconds_rerank;
    total->seconds_collect += part->seconds_collect;
    total->candidates += part->candidates;
}

static int knn_stream_min(int a, int b)
{
    return a < b ? a : b;
}

/* One block search, query rows q0..q0+nq against reference nodes
 * r0..r0+nr, merged into m. */
static knn_status knn_stream_pair(const knn_request *req,
                                  const knn_knobs *knobs, knn_backend backend,
                                  knn_merge *m, int q0, int nq, int r0,
                                  int nr, knn_report *total, int first)
{
    int self = req->query == NULL;
    int meets = self && q0 < r0 + nr && r0 < q0 + nq;
    int kb = knn_stream_min(req->k + meets, nr);
    const double *queries = self ? req->ref : req->query;
    knn_request sub = *req;
    sub.ref = req->ref + (size_t)r0 * req->p;
    sub.n_ref = nr;
    sub.query = queries + (size_t)q0 * req->p;
    sub.n_query = nq;
    sub.k = kb;
    knn_knobs sub_knobs = *knobs;
    sub_knobs.block_nodes = 0;
    /* The budget covers the block's nodes (at most half of it) and its
     * tiles together. */
    sub.memory_bytes = 0.5 * req->memory_bytes;
    /* Progress is the stream's to report: a block's rows mean nothing to
     * the caller. */
    sub.cb.progress = NULL;
    knn_result part = {m->b_index, m->b_distance, m->b_weight, 1, 0};
    knn_report rep;
    memset(&rep, 0, sizeof rep);
    knn_status st = knn_search_on(&sub, &sub_knobs, backend, &part, &rep);
    if (st != KNN_OK) {
        snprintf(total->message, sizeof total->message, "%s", rep.message);
        return st;
    }
    knn_report_add(total, &rep, first);
    for (int i = 0; i < nq; i++)
        knn_merge_row(m, i, kb, r0, self ? q0 + i : -1);
    return KNN_OK;
}

/* Runs req (validated by knn_search) on the backend in blocks of `block`
 * nodes per side; fills out and report as one search would. */
static knn_status knn_stream_run(const knn_request *req,
                                 const knn_knobs *knobs, knn_backend backend,
                                 int block, knn_result *out,
                                 knn_report *report)
{
    int n_q = req->query ? req->n_query : req->n_ref;
    int q_block = knn_stream_min(block, n_q);
    int r_block = knn_stream_min(block, req->n_ref);
    knn_request whole = *req;
    whole.max_abs = fmax(req->max_abs,
                         knn_is_correlation(req->metric) ? 0.0 :
                         fmax(knn_nodes_max_abs(req->ref, req->p, req->n_ref),
                              req->query ? knn_nodes_max_abs(req->query,
                                  req->p, req->n_query) : 0.0));
    knn_merge m;
    if (knn_merge_alloc(&m, q_block, req->k) != KNN_OK) {
        snprintf(report->message, sizeof report->message,
                 "out of host memory for the streamed search's lists");
        return KNN_E_NOMEM;
    }
    knn_status st = KNN_OK;
    int searches = 0;
    for (int q0 = 0; q0 < n_q && st == KNN_OK; q0 += q_block) {
        int nq = knn_stream_min(q_block, n_q - q0);
        memset(m.count, 0, (size_t)nq * sizeof(int));
        for (int r0 = 0; r0 < req->n_ref && st == KNN_OK; r0 += r_block) {
            st = knn_stream_pair(&whole, knobs, backend, &m, q0, nq, r0,
                                 knn_stream_min(r_block, req->n_ref - r0),
                                 report, searches++ == 0);
            if (st == KNN_OK && req->cb.progress)
                req->cb.progress(req->cb.ctx,
                                 q0 + (double)nq *
                                 fmin(r0 + r_block, req->n_ref) /
                                 req->n_ref, n_q);
        }
        if (st == KNN_OK) knn_merge_write(&m, q0, nq, n_q, out);
    }
    knn_merge_free(&m);
    if (st != KNN_OK) return st;
    report->candidates /= searches;
    report->row_tile = q_block;
    report->col_tile = r_block;
    return KNN_OK;
}

/* Bytes of a result's arrays touched between two interrupt polls
 * (knn_result_touch): some milliseconds of page faults. Fewer pages than
 * KNN_TOUCH_PARALLEL_PAGES are touched on the calling thread: a small
 * search would wait longer for the threads than for its faults. */
#define KNN_TOUCH_STRETCH (8.0 * 1024 * 1024)
#define KNN_TOUCH_PARALLEL_PAGES 256

/* Writes a byte of every page of bytes [a, b) of `array`, on `threads`,
 * so that the pages exist. */
static void knn_touch_pages(char *array, size_t a, size_t b, size_t page,
                            int threads)
{
    long long first = (long long)(a / page), last = (long long)((b - 1) / page);
    (void)threads; /* read only by the pragma, absent without OpenMP */
    #pragma omp parallel for num_threads(threads) schedule(static) \
        if (last - first >= KNN_TOUCH_PARALLEL_PAGES)
    for (long long i = first; i <= last; i++) {
        size_t at = (size_t)i * page;
        ((volatile char *)array)[at < a ? a : at] = 0;
    }
}

/* A column-major result (n x k) that a backend writes from the start:
 * its pages made to exist first, a stretch at a time between interrupt
 * polls. A row's k entries lie on k different pages of each array, so
 * the first row of every page's worth of rows would take k page faults
 * of each array at once, inside a re-rank that Ctrl-C waits for (a
 * second and more for a large k on a busy machine). The faults cost
 * what they would later; the search overwrites every entry. (The GPU
 * backend makes its result resident its own way, on a thread beside the
 * devices: knn_gpu_pages.cu.) */
static knn_status knn_result_touch(const knn_request *req, knn_result *out)
{
    if (out->by_row) return KNN_OK;
    size_t n = (size_t)(req->query ? req->n_query : req->n_ref) *
               (size_t)req->k;
    char *arrays[3] = {(char *)out->index, (char *)out->distance,
                       (char *)out->weight};
    size_t sizes[3] = {sizeof(int), sizeof(double), sizeof(double)};
    long page = sysconf(_SC_PAGESIZE);
    int threads = knn_threads(req->threads);
    for (int a = 0; a < 3; a++) {
        size_t bytes = n * sizes[a];
        for (size_t at = 0; at < bytes; at += (size_t)KNN_TOUCH_STRETCH) {
            size_t end = bytes - at < (size_t)KNN_TOUCH_STRETCH
                             ? bytes : at + (size_t)KNN_TOUCH_STRETCH;
            knn_touch_pages(arrays[a], at, end, (size_t)page, threads);
            if (knn_interrupted(&req->cb))
                return KNN_E_INTERRUPTED;
        }
    }
    return KNN_OK;
}

knn_status knn_search_blocks(const knn_request *req, const knn_knobs *knobs,
                             knn_backend backend, knn_result *out,
                             knn_report *report)
{
    int block = knn_stream_block(req, knobs, backend == KNN_BACKEND_GPU
                                                 ? req->memory_bytes : 0.0);
    /* Only the GPU backend allocates the caller's result late, once its
     * devices search (knn_result.allocate); the others write it from the
     * start. */
    knn_status st = KNN_OK;
    if (block > 0 || backend != KNN_BACKEND_GPU)
        st = knn_result_allocate(out, report->message,
                                 sizeof report->message);
    if (st == KNN_OK && backend != KNN_BACKEND_GPU)
        st = knn_result_touch(req, out);
    if (st != KNN_OK) return st;
    if (block > 0)
        return knn_stream_run(req, knobs, backend, block, out, report);
    st = knn_search_on(req, knobs, backend, out, report);
    if (backend != KNN_BACKEND_GPU) return st;
    if (st != KNN_E_NOMEM) return st;
    /* The nodes (or the tiles beside them) did not fit: stream them
     * through what the device has free. */
    block = knn_stream_block(req, knobs, knn_gpu_free_bytes(req));
    if (block <= 0) return st;
    memset(report, 0, sizeof *report);
    st = knn_result_allocate(out, report->message, sizeof report->message);
    if (st != KNN_OK) return st;
    return knn_stream_run(req, knobs, backend, block, out, report);
}
