/*
 * knn_gpu_search.cu: knn_gpu_search(), the CUDA backend's entry point.
 *
 * The query rows are split into one contiguous block per device; one host
 * thread per device prepares its copy of the nodes (knn_gpu_upload.cu)
 * and runs its row tiles (knn_gpu_loop.cu), writing its own rows of the
 * caller's arrays (a small search on one device runs on the calling
 * thread instead); a self search whose devices all take the fused path
 * shares one walk of its pairs among them first (knn_gpu_walk.cu), and
 * each gathers its rows from it.
 * Every row's answer is the exact one of knn_exact.h, so the split
 * changes nothing in the output. The calling thread only waits: every
 * 100 ms it asks the interrupt callback and reports progress (callbacks
 * run on the caller's thread alone), and on an interrupt or a device's
 * failure it raises the stop flag that the device threads read between
 * tiles. Each device thread frees everything it allocated before it
 * ends, so device memory is as before after an interrupt or an error
 * too.
 */
#include <stdio.h>
#include <string.h>
#include <new>
#include <thread>
#include <vector>
#include "knn_gpu_tiles.cuh"

#define KNN_POLL_MS 100
#define KNN_COPY_THREADS_MAX 8

/* Fills ids with the devices to use: the request's list, or as many of
 * the usable ones as pay. */
static knn_status knn_pick_devices(const knn_request *req,
                                   std::vector<int> &ids, knn_report *rep)
{
    KNN_TRY(knn_usable_devices(req->devices, req->n_devices, ids, rep));
    if (req->n_devices <= 0) ids.resize(knn_devices_wanted(req, ids.size()));
    return KNN_OK;
}

/* Largest |value| of the query nodes, which the distance metrics' 2^-e
 * scaling must cover on every device alike. One device sees every query
 * node itself and needs no host scan. */
static double knn_query_max_abs(const knn_request *req, int n_dev)
{
    if (req->query == NULL || knn_is_correlation(req->metric) || n_dev == 1)
        return 0.0;
    return knn_nodes_max_abs(req->query, req->p, req->n_query);
}

/* Host threads each device may use to upload its input and copy its
 * results out: the cores shared among the devices, at most
 * KNN_COPY_THREADS_MAX (both are bound by memory, not cores) and at most
 * the request's CPU threads. */
static int knn_copy_threads(const knn_request *req, int n_dev)
{
    int cores = (int)std::thread::hardware_concurrency() / n_dev;
    if (req->threads > 0 && req->threads < cores) cores = req->threads;
    if (cores > KNN_COPY_THREADS_MAX) cores = KNN_COPY_THREADS_MAX;
    return cores < 1 ? 1 : cores;
}

static knn_status knn_dev_open(knn_gpu_dev *d)
{
    KNN_CUDA_TRY(d->message, cudaSetDevice(d->device));
    KNN_TRY(knn_context_acquire(d->device, &d->ctx, d->message));
    d->stream = d->ctx->stream;
    d->copy_stream = d->ctx->copy_stream;
    d->blas = d->ctx->blas;
    KNN_BLAS_TRY(d->message,
                 cublasSetMathMode(d->blas, knn_gemm_math(d->course.gemm)));
    return KNN_OK;
}

/* One device's course through its rows: a shared walk where its plan
 * took one (agreed with the other devices first), whose tiles then
 * gather their candidates from the walk's lists, its lost nodes apart;
 * else, or where the walk had to be left, the row tiles of the plain
 * course, starting with a probe where the fused path may still change
 * course (knn_dev_tiles). */
static knn_status knn_dev_search(knn_gpu_dev *d)
{
    if (d->walkers > 1) KNN_TRY(knn_team_agree(d));
    if (d->pairs.block) {
        int left = 0;
        KNN_TRY(knn_pairs_walk_all(d, &left));
        if (d->shared->stop) return KNN_E_INTERRUPTED;
        if (!left && d->team_walk) KNN_TRY(knn_team_exchange(d, &left));
        if (!left) {
            KNN_TRY(knn_walk_set_apart(d));
            knn_course_path(d, KNN_PATH_GATHER);
            d->pairs_once = 1;
            knn_status st = knn_dev_tiles(d, 0);
            knn_course_path(d, KNN_PATH_FUSED);
            return st;
        }
        KNN_TRY(knn_dev_leave_pairs(d, left));
    }
    return knn_dev_tiles(d, knn_dev_fused(d) && d->course.may_climb);
}

static knn_status knn_dev_run(knn_gpu_dev *d)
{
    double t0 = knn_seconds();
    knn_status st = knn_dev_open(d);
    d->seconds_setup += knn_seconds() - t0;
    if (st != KNN_OK) return st;
    KNN_TRY(knn_dev_prepare(d));
    if (d->shared->stop) return KNN_E_INTERRUPTED;
    KNN_TRY(knn_dev_plan(d));
    return knn_dev_search(d);
}

static void knn_team_init(knn_gpu_team *team)
{
    for (int b = 0; b < KNN_MEETINGS; b++) team->met[b] = 0;
    team->tiles_done = 0;
    team->walking = 0;
    team->tile_rows = 0x7fffffff;
    team->left = 0;
    team->released = 0;
    team->upload_done = 0;
    memset(team->pairs, 0, sizeof team->pairs);
    memset(team->device, 0, sizeof team->device);
    memset(team->upload, 0, sizeof team->upload);
}

/* The devices that search (those given rows), numbered in row order:
 * they may share a walk (knn_gpu_walk.cu), each knowing the others'
 * GPUs. */
static void knn_place_walkers(std::vector<knn_gpu_dev> &devs)
{
    int walkers = 0;
    for (knn_gpu_dev &d : devs)
        if (d.nq > 0) {
            d.walker = walkers++;
            d.shared->team.device[d.walker] = d.device;
        }
    for (knn_gpu_dev &d : devs) d.walkers = walkers;
}

/* Frees everything the device took, once its streams are idle, on every
 * path: it says on the way out that it reads no other device's upload
 * and lists any more, and waits until the others are done with its own
 * before it frees them. */
static void knn_dev_free(knn_gpu_dev *d)
{
    if (d->stream) cudaStreamSynchronize(d->stream);
    if (d->copy_stream) cudaStreamSynchronize(d->copy_stream);
    knn_upload_release(d);
    knn_tiles_free(&d->t);
    knn_local_free(&d->local);
    knn_apart_free(&d->apart);
    knn_team_release(d);
    knn_pairs_free(&d->pairs);
    knn_nodes_free(&d->nodes);
    knn_context_release(d->ctx, d->status);
    d->ctx = NULL;
    d->blas = NULL;
    d->stream = NULL;
    d->copy_stream = NULL;
    cudaGetLastError();
}

static void knn_dev_thread(knn_gpu_dev *d)
{
    try {
        d->status = knn_dev_run(d);
    } catch (...) {
        snprintf(d->message, sizeof d->message,
                 "out of host memory in the GPU backend");
        d->status = KNN_E_NOMEM;
    }
    if (d->status != KNN_OK) knn_meet_stop(d->shared);
    double t0 = knn_seconds();
    knn_dev_free(d);
    d->seconds_setup += knn_seconds() - t0;
    knn_meet_add(d->shared, &d->shared->finished, 1);
}

/* The caller's loop while the `started` device threads run: polls the
 * callbacks every KNN_POLL_MS, and once more after the last has ended. */
static int knn_wait_devices(const knn_request *req, knn_gpu_shared *shared,
                            int started, double total)
{
    int interrupted = 0;
    while (shared->finished < started) {
        knn_meet_wait_for(shared, &shared->finished, started, KNN_POLL_MS);
        if (!interrupted && knn_interrupted(&req->cb)) {
            interrupted = 1;
            knn_meet_stop(shared);
        }
        if (req->cb.progress)
            req->cb.progress(req->cb.ctx, (double)shared->rows_done, total);
    }
    return interrupted;
}

static void knn_fill_report(const std::vector<knn_gpu_dev> &devs, int n_q,
                            knn_metric m, knn_report *rep)
{
    double cand = 0.0;
    unsigned before = 0;
    int refined = 0, half_products = 0, climbs = -1;
    /* What the devices ended on: the one that climbed furthest says to
     * what, and from which arithmetics any of them came. */
    knn_gemm_mode gemm = devs.empty() ? KNN_GEMM_FP32 : devs[0].course.gemm;
    for (const knn_gpu_dev &d : devs) {
        int n = __builtin_popcount(d.course.climbed_from);
        if (n > climbs) {
            climbs = n;
            gemm = d.course.gemm;
        }
        before |= d.course.climbed_from;
    }
    rep->row_tile = 0;
    rep->pairs_once = !devs.empty();
    for (const knn_gpu_dev &d : devs) {
        refined |= d.refined;
        half_products |= d.half_products;
        rep->pairs_once &= d.pairs_once;
        if (d.seconds_setup > rep->seconds_setup)
            rep->seconds_setup = d.seconds_setup;
        if (d.seconds_collect > rep->seconds_collect)
            rep->seconds_collect = d.seconds_collect;
        if (d.seconds_prepare > rep->seconds_prepare)
            rep->seconds_prepare = d.seconds_prepare;
        if (d.seconds_search > rep->seconds_search)
            rep->seconds_search = d.seconds_search;
        if (d.seconds_rerank > rep->seconds_rerank)
            rep->seconds_rerank = d.seconds_rerank;
        cand += d.candidates;
        if (rep->row_tile == 0 || d.row_tile < rep->row_tile)
            rep->row_tile = d.row_tile;
    }
    rep->candidates = n_q > 0 ? cand / n_q : 0.0;
    rep->col_tile = devs.empty() ? 0 : devs[0].req->n_ref;
    knn_gemm_precision(m, gemm, before, refined, half_products,
                       rep->precision, sizeof rep->precision);
    int local = 0, apart = 0;
    for (const knn_gpu_dev &d : devs) {
        local |= d.local_frames;
        apart |= d.rows_apart > 0;
    }
    size_t used = strlen(rep->precision);
    if (local)
        used += snprintf(rep->precision + used, sizeof rep->precision - used,
                         " (tf32 tiles in local frames)");
    if (apart && used < sizeof rep->precision)
        snprintf(rep->precision + used, sizeof rep->precision - used,
                 " (rows apart: fp32 candidates)");
}

/* Whether a search runs on the calling thread: one device, and work that
 * ends in milliseconds (knn_work_is_small), so that not polling for
 * interrupts meanwhile costs nothing and starting a device thread and
 * waking from it is saved. */
static bool knn_runs_inline(const knn_request *req, int n_dev)
{
    return n_dev == 1 && knn_work_is_small(req);
}

/* The caller's result arrays, allocated while the devices search where
 * the caller does that late (knn_result.allocate), then made resident
 * (and a graph's ends written) by the page threads; the devices wait for
 * them before their first copy-out (knn_dev_await_result). A failed
 * allocation stops them. */
static knn_status knn_result_arrive(knn_result *out, size_t entries, int k,
                                    knn_gpu_shared *shared,
                                    knn_pages *pages, knn_report *rep)
{
    knn_status st = knn_result_allocate(out, rep->message,
                                        sizeof rep->message);
    if (st != KNN_OK) {
        knn_meet_stop(shared);
        return st;
    }
    knn_pages_start(pages, out, entries, k, shared);
    knn_meet_first(shared, &shared->out_ready, 1);
    return KNN_OK;
}

static knn_status knn_gpu_search_devices(const knn_request *req,
                                         const knn_knobs *knobs,
                                         knn_result *out, knn_report *rep,
                                         const std::vector<int> &ids)
{
    int n_q = req->query ? req->n_query : req->n_ref;
    int n_dev = (int)ids.size() < n_q ? (int)ids.size() : n_q;
    int block = (n_q + n_dev - 1) / n_dev;
    knn_gpu_shared shared;
    shared.stop = 0;
    shared.finished = 0;
    shared.rows_done = 0;
    shared.tile_done = 0;
    shared.out_ready = 0;
    knn_team_init(&shared.team);
    double qmax = fmax(knn_query_max_abs(req, n_dev), req->max_abs);
    int copy_threads = knn_copy_threads(req, n_dev);

    std::vector<knn_gpu_dev> devs(n_dev);
    for (int i = 0; i < n_dev; i++) {
        knn_gpu_dev *d = &devs[i];
        memset((void *)d, 0, sizeof *d);
        d->req = req;
        d->knobs = knobs;
        d->out = out;
        d->shared = &shared;
        d->device = ids[i];
        d->q0 = i * block;
        d->nq = n_q - d->q0 < block ? n_q - d->q0 : block;
        d->query_max_abs = qmax;
        d->score_kind = knn_score_of(req->metric);
        /* Manhattan multiplies nothing: its panel is float32 sums. */
        knn_course c = {KNN_PATH_PANEL,
                        knn_uses_product(req->metric)
                            ? knn_gemm_choose(req->precision)
                            : KNN_GEMM_FP32,
                        knn_gemm_adaptive(req->precision, req->metric), 0u,
                        0, 0};
        knn_course_set(d, c);
        d->copy_threads = copy_threads;
    }
    knn_place_walkers(devs);

    std::vector<std::thread> threads;
    knn_status st = KNN_OK;
    bool on_caller = knn_runs_inline(req, n_dev);
    size_t entries = (size_t)n_q * req->k;
    knn_pages pages;
    if (on_caller) {
        KNN_TRY(knn_result_arrive(out, entries, req->k, &shared, &pages,
                                  rep));
        knn_dev_thread(&devs[0]);
    }
    for (int i = 0; i < n_dev && st == KNN_OK && !on_caller; i++) {
        if (devs[i].nq <= 0) continue;
        try {
            threads.emplace_back(knn_dev_thread, &devs[i]);
        } catch (...) {
            knn_meet_stop(&shared);
            snprintf(rep->message, sizeof rep->message,
                     "could not start a host thread for GPU %d", ids[i]);
            st = KNN_E_NOMEM;
        }
    }
    /* A device whose thread did not start reads no other's upload. */
    if (!on_caller)
        knn_meet_add(&shared, &shared.team.upload_done,
                     devs[0].walkers - (int)threads.size());
    knn_status arrived = on_caller || st != KNN_OK
        ? KNN_OK
        : knn_result_arrive(out, entries, req->k, &shared, &pages, rep);
    int started = on_caller ? 1 : (int)threads.size();
    int interrupted = knn_wait_devices(req, &shared, started, (double)n_q);
    for (std::thread &t : threads) t.join();
    knn_pages_join(&pages);
    out->ends_written = knn_pages_wrote_ends(&pages);
    if (st != KNN_OK) return st;
    if (arrived != KNN_OK) return arrived;

    for (const knn_gpu_dev &d : devs) {
        if (d.status != KNN_OK && d.status != KNN_E_INTERRUPTED) {
            snprintf(rep->message, sizeof rep->message, "GPU %d: %.490s",
                     d.device, d.message);
            return d.status;
        }
    }
    if (interrupted) {
        snprintf(rep->message, sizeof rep->message,
                 "interrupted by the user");
        return KNN_E_INTERRUPTED;
    }
    knn_fill_report(devs, n_q, req->metric, rep);
    return KNN_OK;
}

extern "C" knn_status knn_gpu_search(const knn_request *req,
                                     const knn_knobs *knobs, knn_result *out,
                                     knn_report *report)
{
    static const knn_knobs defaults = {};
    if (!knobs) knobs = &defaults;
    if (knn_gpu_claim_process(report->message, sizeof report->message) !=
        KNN_OK)
        return KNN_E_NOGPU;
    std::vector<int> ids;
    knn_status st;
    try {
        st = knn_pick_devices(req, ids, report);
        if (st == KNN_OK) {
            knn_device_names(ids, report);
            st = knn_gpu_search_devices(req, knobs, out, report, ids);
        }
    } catch (const std::bad_alloc &) {
        snprintf(report->message, sizeof report->message,
                 "out of host memory in the GPU backend");
        st = KNN_E_NOMEM;
    } catch (...) {
        snprintf(report->message, sizeof report->message,
                 "unexpected failure in the GPU backend");
        st = KNN_E_DEVICE;
    }
    return st;
}
