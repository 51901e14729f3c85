/*
 * knn_gpu_plan.cu: one device's buffers for a search (host code): the
 * row tile R and the arrays of a tile, carved from one device and one
 * host allocation, on the path the policy chose (knn_gpu_policy.cu).
 *
 * A tile of R query rows needs, on the panel path, an R x n_ref panel of
 * fast products (at most 2^31 floats, which keeps a tile well under a
 * second); on the fused path (knn_gpu_fused.cu) no panel, so R is bounded
 * by its pairs instead (KNN_FUSED_PAIRS_MAX), and its rows get the fused
 * kernel's survivor slots. Both need the candidate slots, the re-rank's
 * sort arrays, R x k results on the device and two pinned result slots
 * on the host. R comes from cudaMemGetInfo and the request's budget; when
 * an allocation fails, R is halved and tried again.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "knn_gpu_tiles.cuh"

/* Pinned result slots a device's context keeps (knn_host_slots): enough
 * for a shared walk's tiles (one wave of a 132-SM device, 33792 rows) up
 * to k = 128, 173 MB, which a search would otherwise pin anew each time
 * (inst/bench/gpu_phases.R's setup column). */
#define KNN_HOST_KEEP_BYTES ((size_t)192 << 20)
#define KNN_SLOT_BYTES_MAX (256.0 * 1048576.0)
/* Products of a panel tile, and pairs of a fused tile: few enough that a
 * tile ends, and an interrupt is answered, well within a second. A
 * reference of more than about 4M nodes gets a wave of blocks per fused
 * tile instead. */
#define KNN_PANEL_FLOATS_MAX 2147483648.0
#define KNN_FUSED_PAIRS_MAX 68719476736.0

/* The row tile's fixed arrays: device ones from dev, pinned ones from
 * host. */
static void knn_tiles_carve(knn_gpu_tiles *t, size_t ld, int k,
                            knn_carver *dev, knn_carver *host)
{
    size_t r = (size_t)t->rows, rk = r * k;
    t->panel_floats = r * ld;
    t->panel = knn_carve<float>(dev, r * ld);
    t->offsets_uniform = knn_carve<int>(dev, r + 1);
    t->offsets_exact = knn_carve<int>(dev, r + 1);
    t->seg_end = knn_carve<int>(dev, r);
    t->sort_end = knn_carve<int>(dev, r);
    t->count = knn_carve<int>(dev, r);
    t->wide = knn_carve<int>(dev, r);
    t->survivors = knn_carve<int>(dev, r);
    /* Survivor slots exist exactly on the fused path. */
    t->fused_best = knn_carve<float>(
        dev, t->surv_slots > 0 ? knn_fused_best_floats(k, t->rows) : 0);
    t->surv_offsets_uniform = knn_carve<int>(dev, r + 1);
    t->h_surv_offsets = knn_carve<int>(host, r + 1);
    t->h_offsets = knn_carve<int>(host, r + 1);
    t->h_pairs_lost = knn_carve<int>(host, 1);
    for (int s = 0; s < 2; s++) {
        knn_gpu_slot *sl = &t->slot[s];
        sl->d_index = knn_carve<int>(dev, rk);
        sl->d_distance = knn_carve<double>(dev, rk);
        sl->d_weight = knn_carve<double>(dev, rk);
        sl->d_bound = knn_carve<float>(dev, t->surv_slots > 0 ? r : 0);
        sl->index = knn_carve<int>(host, rk);
        sl->distance = knn_carve<double>(host, rk);
        sl->weight = knn_carve<double>(host, rk);
        sl->count = knn_carve<int>(host, r);
        sl->wide = knn_carve<int>(host, r);
        sl->survivors = knn_carve<int>(host, r);
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
 * alignment hardly counts, and its survivor slots. */
static double knn_row_bytes(size_t ld, int slots, int surv_slots, int k)
{
    const int rows = 1024;
    knn_gpu_tiles t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.surv_slots = surv_slots;
    knn_carver dev = {NULL, 0}, host = {NULL, 0};
    knn_tiles_carve(&t, ld, k, &dev, &host);
    knn_slots_carve(&t, (size_t)rows * slots, &dev);
    return (double)dev.used / rows + surv_slots * sizeof(uint64_t);
}

void knn_slots_free(knn_gpu_tiles *t)
{
    knn_device_free(t->slots_block);
    t->slots_block = NULL;
    knn_carver none = {NULL, 0};
    knn_slots_carve(t, 0, &none);
    t->n_slots_alloc = 0;
}

void knn_tiles_free(knn_gpu_tiles *t)
{
    knn_slots_free(t);
    knn_survivors_free(t);
    knn_device_free(t->device_block);
    if (t->host_own == KNN_HOST_PINNED) cudaFreeHost(t->host_block);
    else if (t->host_own == KNN_HOST_PLAIN) free(t->host_block);
    for (int s = 0; s < 2; s++) {
        knn_gpu_slot *sl = &t->slot[s];
        if (sl->start) cudaEventDestroy(sl->start);
        if (sl->selected) cudaEventDestroy(sl->selected);
        if (sl->ranked) cudaEventDestroy(sl->ranked);
        if (sl->done) cudaEventDestroy(sl->done);
    }
    memset(t, 0, sizeof *t);
}

void knn_survivors_free(knn_gpu_tiles *t)
{
    knn_device_free(t->surv_block);
    t->surv_block = NULL;
    t->survivor = NULL;
    t->surv_alloc = 0;
}

knn_status knn_survivors_alloc(knn_gpu_dev *d, int64_t n)
{
    knn_gpu_tiles *t = &d->t;
    KNN_CUDA_TRY(d->message,
                 knn_device_alloc(&t->surv_block, (size_t)n * sizeof(uint64_t),
                                  d->stream));
    t->survivor = (uint64_t *)t->surv_block;
    t->surv_alloc = n;
    return KNN_OK;
}

knn_status knn_slots_alloc(knn_gpu_dev *d, int64_t n_slots,
                           size_t min_temp)
{
    knn_gpu_tiles *t = &d->t;
    KNN_TRY(knn_rerank_sort_bytes(n_slots, t->rows, &t->sort_temp_bytes,
                                  d->message));
    if (min_temp > t->sort_temp_bytes) t->sort_temp_bytes = min_temp;
    knn_carver c = {NULL, 0};
    knn_slots_carve(t, (size_t)n_slots, &c);
    KNN_CUDA_TRY(d->message,
                 knn_device_alloc(&t->slots_block, c.used, d->stream));
    c.block = (char *)t->slots_block;
    c.used = 0;
    knn_slots_carve(t, (size_t)n_slots, &c);
    t->n_slots_alloc = n_slots;
    return KNN_OK;
}

/* Host memory for the result slots. Pinned slots let the transfers run at
 * full speed and one tile's transfer overlap the next tile's work, but
 * pinning costs half a millisecond a megabyte: up to
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

/* A panel's row length in floats on the device's path: none on the fused
 * path, twice the reference's for float64 products. */
static size_t knn_dev_panel_ld(const knn_gpu_dev *d)
{
    if (knn_dev_fused(d)) return 0;
    return knn_panel_ld(d->req->n_ref) *
           (d->course.gemm == KNN_GEMM_FP64 ? 2 : 1);
}

/* Uniform offsets: row i's slots from i * slots, on the device from the
 * pinned staging array h (rows + 1 ints). */
static knn_status knn_offsets_uniform(knn_gpu_dev *d, int *dst, int *h,
                                      int rows, int slots)
{
    for (int i = 0; i <= rows; i++) h[i] = i * slots;
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(dst, h, ((size_t)rows + 1) * sizeof(int),
                                 cudaMemcpyHostToDevice, d->stream));
    return KNN_OK;
}

static knn_status knn_tiles_alloc(knn_gpu_dev *d, int rows, int slots,
                                  int surv_slots)
{
    knn_gpu_tiles *t = &d->t;
    int k = d->req->k;
    size_t ld = knn_dev_panel_ld(d);
    t->rows = rows;
    t->slots = slots;
    t->surv_slots = surv_slots;
    knn_carver dev = {NULL, 0}, host = {NULL, 0};
    knn_tiles_carve(t, ld, k, &dev, &host);
    KNN_CUDA_TRY(d->message,
                 knn_device_alloc(&t->device_block, dev.used, d->stream));
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
        KNN_CUDA_TRY(d->message, cudaEventCreate(&sl->ranked));
        KNN_CUDA_TRY(d->message, cudaEventCreate(&sl->done));
    }
    KNN_TRY(knn_offsets_uniform(d, t->offsets_uniform, t->h_offsets, rows,
                                slots));
    if (surv_slots > 0) {
        KNN_TRY(knn_survivors_alloc(d, (int64_t)rows * surv_slots));
        KNN_TRY(knn_offsets_uniform(d, t->surv_offsets_uniform,
                                    t->h_surv_offsets, rows, surv_slots));
    }
    return knn_dev_idle(d);
}

/* Slots that hold `need` with KNN_GROW_SLOTS room, at least `now`, at
 * most `avail` and what `rows` rows index in an int. */
static int knn_grown_slots(int now, int need, int avail, int rows)
{
    double want = fmin(fmin(need * KNN_GROW_SLOTS, (double)avail),
                       2147483647.0 / rows - 1.0);
    return want > now ? (int)want : now;
}

/* Bytes of candidate slot arrays for n slots, the sort's scratch for n
 * in one tile included. */
static knn_status knn_slots_bytes(knn_gpu_dev *d, int64_t n, double *bytes)
{
    knn_gpu_tiles t = d->t;
    KNN_TRY(knn_rerank_sort_bytes(n, t.rows, &t.sort_temp_bytes,
                                  d->message));
    knn_carver c = {NULL, 0};
    knn_slots_carve(&t, (size_t)n, &c);
    *bytes = (double)c.used;
    return KNN_OK;
}

/* The tiles' uniform slots become `slots` candidates and `surv` survivors
 * a row: the new arrays are allocated while the old ones are held, so
 * where they do not fit the old ones stay (KNN_E_NOMEM, the message
 * cleared). The device is idle. */
static knn_status knn_uniform_swap(knn_gpu_dev *d, int slots, int surv)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_tiles old = *t;
    t->slots_block = NULL;
    t->surv_block = NULL;
    knn_status st = knn_slots_alloc(d, (int64_t)t->rows * slots, 0);
    if (st == KNN_OK)
        st = knn_survivors_alloc(d, (int64_t)t->rows * surv);
    if (st != KNN_OK) {
        knn_device_free(t->slots_block);
        knn_device_free(t->surv_block);
        cudaGetLastError();
        *t = old;
        d->message[0] = '\0';
        return KNN_E_NOMEM;
    }
    knn_device_free(old.slots_block);
    knn_device_free(old.surv_block);
    t->slots = slots;
    t->surv_slots = surv;
    KNN_TRY(knn_offsets_uniform(d, t->offsets_uniform, t->h_offsets, t->rows,
                                slots));
    KNN_TRY(knn_offsets_uniform(d, t->surv_offsets_uniform,
                                t->h_surv_offsets, t->rows, surv));
    return knn_dev_idle(d);
}

knn_status knn_grow_uniform(knn_gpu_dev *d, int cand, int surv)
{
    knn_gpu_tiles *t = &d->t;
    int avail = d->req->n_ref;
    int slots = knn_grown_slots(t->slots, cand, avail, t->rows);
    int surv_slots = knn_grown_slots(t->surv_slots, surv, avail, t->rows);
    if (d->req->memory_bytes > 0 || t->grow_refused ||
        (slots == t->slots && surv_slots == t->surv_slots))
        return KNN_OK;
    double now = 0.0, grown = 0.0, budget = 0.0;
    knn_status st = knn_slots_bytes(d, t->n_slots_alloc, &now);
    if (st == KNN_OK)
        st = knn_slots_bytes(d, (int64_t)t->rows * slots, &grown);
    if (st == KNN_OK) st = knn_device_budget(0, &budget, d->message);
    grown += (double)t->rows * surv_slots * sizeof(uint64_t);
    if (st == KNN_OK && grown > budget * KNN_GROW_MEMORY_SHARE)
        st = KNN_E_NOMEM;
    if (st == KNN_OK) st = knn_uniform_swap(d, slots, surv_slots);
    if (st == KNN_OK) return KNN_OK;
    /* Growing is optional: the search goes on with the slots it has. */
    d->message[0] = '\0';
    t->grow_refused = 1;
    return KNN_OK;
}

/* Several devices share a walk through staging buffers for the arrays of
 * another device that this one cannot read, the lists of at most this
 * many bytes: the lists of the device's own rows' nodes pass through it
 * in pieces (knn_gpu_walk.cu). */
#define KNN_PAIRS_STAGE_BYTES ((size_t)256 << 20)

/* The nodes a piece of another device's lists holds: none on one device
 * or where this one reads every other's memory. */
static int knn_dev_stage_nodes(const knn_gpu_dev *d, int list_cap)
{
    if (d->walkers < 2 || knn_dev_reads_peers(d)) return 0;
    size_t per_node = (size_t)list_cap * sizeof(uint64_t) + sizeof(int);
    size_t nodes = KNN_PAIRS_STAGE_BYTES / per_node;
    if (nodes < 1) nodes = 1;
    return nodes < (size_t)d->nq ? (int)nodes : d->nq;
}

/* Whether the device's search takes a shared walk, in such tiles. */
static int knn_dev_wants_pairs(const knn_gpu_dev *d, int rows)
{
    return knn_dev_fused(d) && knn_dev_could_pair(d, rows);
}

/* The fp16 vectors that the fused kernel reads; where they do not fit,
 * the search takes the panel path. */
static knn_status knn_dev_make_half(knn_gpu_dev *d)
{
    knn_status st = knn_nodes_half(d->req->metric, &d->nodes, d->message,
                                   d->stream);
    if (st == KNN_E_NOMEM) {
        knn_course_path(d, KNN_PATH_PANEL);
        d->message[0] = '\0';
        return KNN_OK;
    }
    return st;
}

/* Whether the device's search takes the fused path (knn_fused_choose),
 * and its wave: some searches take it only as a shared walk, which needs
 * more than one wave of rows. */
static knn_status knn_dev_choose_path(knn_gpu_dev *d)
{
    const knn_request *req = d->req;
    int sms = 0;
    KNN_CUDA_TRY(d->message,
                 cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                        d->device));
    knn_gemm_mode gemm = d->course.gemm;
    knn_course_path(d, KNN_PATH_PANEL);
    d->wave_rows = 0;
    /* Local tiles never share a walk (each has its own frame). */
    int walk_possible = !d->course.local;
    if (d->course.refine ||
        !knn_fused_choose(d->knobs->select, req->metric, gemm, req->k,
                          req->p, d->nq, sms, walk_possible))
        return KNN_OK;
    KNN_TRY(knn_fused_wave_rows(d->score_kind, req->k, sms, &d->wave_rows,
                                d->message));
    if (knn_fused_choose(d->knobs->select, req->metric, gemm, req->k, req->p,
                         d->nq, sms, knn_dev_could_pair(d, d->wave_rows))) {
        knn_course_path(d, KNN_PATH_FUSED);
        KNN_TRY(knn_dev_make_half(d));
    }
    if (!knn_dev_fused(d)) d->wave_rows = 0;
    return KNN_OK;
}

/* A shared walk's tiles hold at least a block of the fused kernel's rows
 * (fewer leave its threads idle) beside the per-node arrays, or the
 * search walks plain. */
#define KNN_PAIRS_MIN_TILE_ROWS 128

/* The entries of a shared walk's list of a node, whose arrays must fit
 * in `room` bytes; 0 where none do. A list holds the node's candidates
 * and then a tile's offers, judged against a threshold from fewer nodes,
 * whose band of margins holds more of them: at first about as many
 * again, so the lists hold twice a row's slots (lists of 2k + 256
 * overflow with the second tile's offers in inst/bench/pairs.R's k = 100
 * cases). Where those do not fit (tens of millions of nodes), they hold
 * half as many, and half again, down to KNN_PAIRS_MIN_CAP: a list that
 * overflows makes the search leave the walk (the same bits), which
 * happens, if at all, in the first tiles, whose thresholds are the
 * loosest. Halving, rather than taking whatever fits, lets devices of one
 * kind plan lists alike, which a walk they share needs (knn_team_alike),
 * though their free memory differs a little. */
#define KNN_PAIRS_MIN_CAP(k) (4 * (k) + 64)
static int knn_dev_list_cap(const knn_gpu_dev *d, int slots, int avail,
                            double room)
{
    int k = d->req->k;
    int least = KNN_PAIRS_MIN_CAP(k) < avail ? KNN_PAIRS_MIN_CAP(k) : avail;
    for (int cap = 2 * slots < avail ? 2 * slots : avail;; cap /= 2) {
        if (cap < least) cap = least;
        if (knn_pairs_bytes(d->req->n_ref, k, cap,
                            knn_dev_stage_nodes(d, cap)) <= room)
            return cap;
        if (cap == least) return 0;
    }
}

/* The search is planned again without a shared walk. */
static knn_status knn_dev_refuse_pairs(knn_gpu_dev *d)
{
    knn_pairs_free(&d->pairs);
    knn_course_refuse_walk(d);
    d->message[0] = '\0';
    return knn_dev_plan_tiles(d);
}

/* The row tile on the path chosen, for at most `most` rows, and its
 * buffers. */
static knn_status knn_dev_plan_rows(knn_gpu_dev *d, int most)
{
    const knn_request *req = d->req;
    int k = req->k;
    int avail = req->n_ref - (d->self ? 1 : 0);
    int slots = 2 * k + 256 < avail ? 2 * k + 256 : avail;
    int surv_slots = knn_dev_fused(d)
        ? knn_fused_survivor_slots(k, req->n_ref, avail) : 0;
    double budget = 0.0;
    KNN_TRY(knn_device_budget(req->memory_bytes, &budget, d->message));
    double per_row = knn_row_bytes(knn_dev_panel_ld(d), slots, surv_slots,
                                   k);
    /* A shared walk's per-node arrays come out of the same budget, with
     * room left for a block of rows. */
    int pairs = knn_dev_wants_pairs(d, 0);
    int list_cap = 0, stage_nodes = 0;
    if (pairs) {
        list_cap = knn_dev_list_cap(d, slots, avail,
                                    budget - KNN_PAIRS_MIN_TILE_ROWS * per_row);
        if (list_cap == 0) return knn_dev_refuse_pairs(d);
        stage_nodes = knn_dev_stage_nodes(d, list_cap);
        budget -= knn_pairs_bytes(req->n_ref, k, list_cap, stage_nodes);
    }
    double rows = budget / per_row;
    /* A fused tile keeps at least one full wave of blocks, however wide
     * the reference: fewer rows would leave SMs idle for the whole tile.
     * A shared walk takes one wave a tile: the pairs within a tile are
     * computed twice, so more tiles save more. Local fused tiles are at
     * most one wave (knn_local_rows). */
    int one_wave = pairs || (knn_dev_fused(d) && d->course.local);
    double tile_rows = one_wave ? (double)d->wave_rows
        : knn_dev_fused(d)
        ? fmax(KNN_FUSED_PAIRS_MAX / req->n_ref, (double)d->wave_rows)
        : KNN_PANEL_FLOATS_MAX / req->n_ref /
              (d->course.gemm == KNN_GEMM_FP64 ? 2 : 1);
    double limits[] = {(double)most, 2147483647.0 / slots,
                       2147483647.0 / (surv_slots > 0 ? surv_slots : 1),
                       KNN_SLOT_BYTES_MAX / (k * 20.0), tile_rows};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
        if (limits[i] < rows) rows = limits[i];
    int r = rows < 1.0 ? 1 : (int)rows;
    /* Whole waves: a tile of 2.03 waves of fused blocks takes as long as
     * one of 3, its last few blocks running alone. */
    if (knn_dev_fused(d) && r < most && r > d->wave_rows)
        r -= r % d->wave_rows;
    if (knn_dev_wants_pairs(d, r)) {
        knn_status st = knn_pairs_alloc(&d->pairs, req->n_ref, k, list_cap,
                                        stage_nodes, d->message, d->stream);
        if (st == KNN_E_NOMEM) return knn_dev_refuse_pairs(d);
        KNN_TRY(st);
    }
    for (;;) {
        knn_status st = knn_tiles_alloc(d, r, slots, surv_slots);
        if (st == KNN_OK) {
            d->row_tile = r;
            return KNN_OK;
        }
        knn_tiles_free(&d->t);
        if (st != KNN_E_NOMEM) return st;
        if (r == 1) {
            snprintf(d->message, sizeof d->message,
                     "GPU %d: not enough free memory for one row tile "
                     "(%.0f MB per row, %.0f MB usable)", d->device,
                     per_row / 1048576.0, budget / 1048576.0);
            return KNN_E_NOMEM;
        }
        r /= 2;
    }
}

knn_status knn_dev_plan_tiles(knn_gpu_dev *d)
{
    KNN_TRY(knn_dev_choose_path(d));
    knn_pairs_free(&d->pairs);
    return knn_dev_plan_rows(d, d->nq);
}

/* A shared walk's lists stay: in a walk of several devices the others
 * may still read them (knn_team_release). */
knn_status knn_dev_plan_apart(knn_gpu_dev *d, int rows)
{
    knn_course_path(d, KNN_PATH_PANEL);
    d->wave_rows = 0;
    return knn_dev_plan_rows(d, rows);
}

knn_status knn_dev_plan(knn_gpu_dev *d)
{
    double t0 = knn_seconds();
    knn_status st = knn_dev_plan_tiles(d);
    d->seconds_setup += knn_seconds() - t0;
    return st;
}

knn_status knn_dev_idle(knn_gpu_dev *d)
{
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->copy_stream));
    return KNN_OK;
}

/* What the driver, cuBLAS's workspaces and other processes keep beyond a
 * search's own arrays. */
#define KNN_RESERVE_BYTES (512.0 * 1048576.0)

knn_status knn_device_budget(double requested, double *budget,
                             char *message)
{
    size_t free_b = 0, total_b = 0;
    int device = 0;
    KNN_CUDA_TRY(message, cudaGetDevice(&device));
    KNN_CUDA_TRY(message, cudaMemGetInfo(&free_b, &total_b));
    free_b += knn_device_idle_bytes(device);
    *budget = (double)free_b - KNN_RESERVE_BYTES - 0.05 * total_b;
    if (requested > 0 && requested < *budget) *budget = requested;
    return KNN_OK;
}
