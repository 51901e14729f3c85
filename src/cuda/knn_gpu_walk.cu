/*
 * knn_gpu_walk.cu: the shared walk of a self search, on one device or
 * several (host code; the kernels are knn_gpu_pairs.cu's and the fused
 * kernel's).
 *
 * Tile t's rows walk only the nodes up to their tile's end, and each
 * product against an earlier tile's node is also offered to that node's
 * list, so each pair of nodes is computed once. Each tile is judged as it
 * ends, as the plain walk's tiles are (knn_dev_next_step); a walk that
 * must refine, climb or give up (an overflowing list) is left, and the
 * search starts again from its first row on the course the policy
 * chose. After the walk the tiles gather their candidates from the
 * lists (knn_gpu_loop.cu).
 *
 * Several devices share one walk: they agree on it once their plans are
 * made (all planned one, with lists alike), then walk the tiles in step,
 * each its share of every tile's rows, meeting between tiles
 * (knn_gpu_team.cu) and lowering the earlier nodes' thresholds to the
 * others'; after the walk each takes the others' lists of its own rows'
 * nodes, read where they lie where it may read their memory, else staged
 * through its own buffers. A device that must leave takes the others with
 * it, for its reason, and a device frees its lists only once the others
 * have read them.
 */
#include <stdio.h>
#include <vector>
#include "knn_gpu_tiles.cuh"

/* Progress of a shared walk: half of each node, counted by node (the
 * nodes before x make x / 2), the walk's share of it split among the
 * devices that walk (device w's share of the nodes before x), and the
 * gather of a tile counting the rest of its rows. Each adds up over any
 * tiles, so the rows done end at the rows' number. */
static long long knn_walk_share(const knn_gpu_dev *d, long long x)
{
    long long half = x / 2;
    return half * (d->walker + 1) / d->walkers -
           half * d->walker / d->walkers;
}

/* The device's share of a tile's rows [row0, row0 + rows): *mine rows
 * from *first (all of them on one device). */
static void knn_walk_rows(const knn_gpu_dev *d, int row0, int rows,
                          int *first, int *mine)
{
    long long a = (long long)rows * d->walker / d->walkers;
    long long b = (long long)rows * (d->walker + 1) / d->walkers;
    *first = row0 + (int)a;
    *mine = (int)(b - a);
}

/* Device w's array of n T's at src as this device's kernels may read it
 * (*view): where it lies, where this device reads w's memory, else
 * copied into `stage`. */
template <typename T>
static knn_status knn_team_view(knn_gpu_dev *d, int w, const T *src,
                                size_t n, T *stage, const T **view)
{
    *view = src;
    if (d->team_reads >> w & 1u) return KNN_OK;
    KNN_CUDA_TRY(d->message, cudaMemcpyPeerAsync(
        stage, d->device, src, d->shared->team.device[w], n * sizeof(T),
        d->stream));
    *view = stage;
    return KNN_OK;
}

/* Before a tile of a walk shared by several devices (the others done
 * with the earlier tiles): the earlier tiles' nodes take the other
 * devices' thresholds where lower, or where this device has none (their
 * rows walked elsewhere), one device at a time. */
static knn_status knn_team_tighten(knn_gpu_dev *d, int row0)
{
    const knn_gpu_team *team = &d->shared->team;
    knn_pairs *p = &d->pairs;
    for (int w = 0; w < d->walkers && row0 > 0; w++) {
        const float *other = NULL;
        if (w == d->walker) continue;
        KNN_TRY(knn_team_view(d, w, (const float *)team->pairs[w].threshold,
                              (size_t)row0, p->stage_threshold, &other));
        KNN_TRY(knn_pairs_tighten(p, other, row0, d->message, d->stream));
    }
    return KNN_OK;
}

/* Runs the device's share of rows [row0, row0 + rows) of a shared walk,
 * judged through slot 0: the fused kernel over the nodes up to the tile's
 * end, offering to the earlier tiles' nodes, then those nodes' merge;
 * waits for both. The slot gets the rows' own candidate and survivor
 * counts (the policy's input on the plain walk), *lost the nodes lost so
 * far (knn_pairs.lost). */
static knn_status knn_pairs_walk_tile(knn_gpu_dev *d, int row0, int rows,
                                      int *lost)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[0];
    const knn_gpu_nodes *nd = &d->nodes;
    int first = row0, mine = rows;
    if (d->team_walk) knn_walk_rows(d, row0, rows, &first, &mine);
    knn_slot_begin(d, sl, first, mine, t->slots, t->surv_slots);
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->start, d->stream));
    if (d->team_walk) KNN_TRY(knn_team_tighten(d, row0));
    knn_select_args sa = knn_tile_select_args(
        d, first, first, mine, t->offsets_uniform, d->course.gemm);
    sa.n_cols = row0 + rows;
    knn_pairs_walk walk = {d->pairs, row0};
    knn_fused_scratch scratch = knn_fused_scratch_of(
        t, t->surv_offsets_uniform, NULL, 0);
    if (mine > 0)
        KNN_TRY(knn_fused_candidates(&sa, nd, first, &scratch, &walk, NULL,
                                     d->message, d->stream));
    knn_select_args earlier = knn_tile_select_args(d, 0, 0, row0,
                                                   t->offsets_uniform,
                                                   d->course.gemm);
    KNN_TRY(knn_pairs_merge(&d->pairs, &earlier, 0, row0, d->message,
                            d->stream));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->selected, d->stream));
    size_t r = (size_t)mine;
    KNN_TRY(knn_copy_back(d, sl->count, t->count, r * sizeof(int)));
    KNN_TRY(knn_copy_back(d, sl->survivors, t->survivors, r * sizeof(int)));
    KNN_TRY(knn_copy_back(d, t->h_pairs_lost, d->pairs.lost_nodes,
                          sizeof(int)));
    KNN_CUDA_TRY(d->message, cudaEventRecord(sl->done, d->stream));
    KNN_CUDA_TRY(d->message, cudaEventSynchronize(sl->done));
    float ms = 0.0f;
    KNN_CUDA_TRY(d->message, cudaEventElapsedTime(&ms, sl->start, sl->done));
    d->seconds_search += ms / 1000.0;
    *lost = *t->h_pairs_lost;
    return KNN_OK;
}

/* Why the devices sharing the walk left it, once one of them has (the
 * first one's reason; 0 while they walk): a device that must leave
 * records its own reason unless another's is there. */
static int knn_team_leave(knn_gpu_dev *d, int left)
{
    if (!d->team_walk) return left;
    return knn_meet_first(d->shared, &d->shared->team.left, left);
}

/* The walk of every tile (on several devices, of every row: each walks
 * its share of each tile, the tiles in step). Each tile is judged as it
 * ends, as the plain walk's are: *left gets the step (a knn_rung_step)
 * where the search must refine or climb, or -1 where too many nodes are
 * lost to search them apart (knn_walk_too_lossy; a rerun would offer
 * their pairs twice); 0 when the walk is done. Devices sharing the walk
 * leave it together, for the first one's reason. Its share of half of
 * each walked row counts as progress; a walk that is left takes it
 * back. */
knn_status knn_pairs_walk_all(knn_gpu_dev *d, int *left)
{
    knn_gpu_tiles *t = &d->t;
    knn_gpu_slot *sl = &t->slot[0];
    knn_gpu_team *team = &d->shared->team;
    int first = d->team_walk ? 0 : d->q0;
    int end = d->team_walk ? d->req->n_ref : d->q0 + d->nq;
    /* Several devices: a tile of one such share each (each a full wave
     * of the fused kernel's blocks, where planned so). */
    int tile = d->team_walk ? d->walkers * (int)team->tile_rows : t->rows;
    long long credited = 0;
    *left = 0;
    for (int row0 = first, n = 0; row0 < end && !d->shared->stop; n++) {
        int rows = end - row0 < tile ? end - row0 : tile, lost = 0;
        if (d->team_walk && n > 0)
            KNN_TRY(knn_team_meet(d, &team->tiles_done, d->walkers * n,
                                  left));
        if (!*left) {
            KNN_TRY(knn_pairs_walk_tile(d, row0, rows, &lost));
            /* A row's candidates past the tile's slots stay in its
             * node's list, which holds more; a node whose list or
             * survivors overflowed is lost (`lost` so far), and goes
             * apart. */
            double found = knn_slot_found(sl);
            knn_rung_step step = knn_dev_next_step(d, sl, found, 0);
            int lossy = knn_walk_too_lossy(d, lost);
            *left = knn_team_leave(d, step != KNN_RUNG_STAY ? (int)step
                                      : lossy ? -1 : 0);
        }
        if (*left) {
            knn_meet_progress(d->shared, -credited);
            return KNN_OK;
        }
        long long share = knn_walk_share(d, row0 + rows) -
                          knn_walk_share(d, row0);
        knn_meet_progress(d->shared, share);
        credited += share;
        row0 += rows;
    }
    return KNN_OK;
}

/* Whether the published walks can be shared: every device planned one,
 * with lists alike. */
static int knn_team_alike(const knn_gpu_dev *d)
{
    const knn_gpu_team *team = &d->shared->team;
    if (team->walking != d->walkers) return 0;
    for (int w = 0; w < d->walkers; w++)
        if (team->pairs[w].cap != d->pairs.cap ||
            team->pairs[w].k != d->pairs.k ||
            team->pairs[w].n != d->pairs.n)
            return 0;
    return 1;
}

/* Several devices agree on a shared walk: each says whether its plan
 * took one (and its tile), and they walk together, in the fewest rows
 * any planned, only where all did; a device that planned one alone
 * plans its rows again without it. */
knn_status knn_team_agree(knn_gpu_dev *d)
{
    knn_gpu_team *team = &d->shared->team;
    if (d->pairs.block) {
        team->pairs[d->walker] = d->pairs;
        int rows = team->tile_rows;
        while (d->t.rows < rows &&
               !team->tile_rows.compare_exchange_weak(rows, d->t.rows)) {
        }
        team->walking++;
    }
    KNN_TRY(knn_team_meet(d, &team->met[KNN_MEET_AGREE], d->walkers,
                          NULL));
    if (d->pairs.block && knn_team_alike(d)) {
        d->team_walk = 1;
        return KNN_OK;
    }
    if (!d->pairs.block) return KNN_OK;
    knn_course_refuse_walk(d);
    return knn_dev_leave_fused(d, KNN_RUNG_STAY);
}

/* Device w's lists of this device's rows' nodes, absorbed as offers and
 * merged: read where they lie, in one pass, where this device reads w's
 * memory (only the entries in use cross between the GPUs), else a piece
 * at a time through the staging buffer (whole lists); w's lost nodes are
 * lost here too. */
static knn_status knn_team_take_from(knn_gpu_dev *d, int w,
                                     const knn_select_args *all)
{
    const knn_pairs *peer = &d->shared->team.pairs[w];
    knn_pairs *p = &d->pairs;
    int end = d->q0 + d->nq;
    int step = d->team_reads >> w & 1u ? d->nq : p->stage_nodes;
    const unsigned *lost = NULL;
    KNN_TRY(knn_team_view(d, w, (const unsigned *)peer->lost,
                          knn_pairs_lost_words(p->n), p->stage_lost, &lost));
    for (int c0 = d->q0; c0 < end; c0 += step) {
        int nodes = end - c0 < step ? end - c0 : step;
        const uint64_t *list = NULL;
        const int *count = NULL;
        KNN_TRY(knn_team_view(d, w,
                              (const uint64_t *)peer->list +
                                  (size_t)c0 * p->cap,
                              (size_t)nodes * p->cap, p->stage_list, &list));
        KNN_TRY(knn_team_view(d, w, (const int *)peer->count + c0,
                              (size_t)nodes, p->stage_count, &count));
        KNN_TRY(knn_pairs_absorb(p, c0, nodes, list, count, lost,
                                 d->message, d->stream));
        KNN_TRY(knn_pairs_merge(p, all, c0, c0 + nodes, d->message,
                                d->stream));
    }
    return KNN_OK;
}

/* The other devices' lists of this device's rows' nodes, each device's
 * absorbed and merged in turn; *lost the nodes lost here then. */
static knn_status knn_team_take_lists(knn_gpu_dev *d, int *lost)
{
    knn_pairs *p = &d->pairs;
    knn_gpu_tiles *t = &d->t;
    knn_select_args all = knn_tile_select_args(
        d, 0, 0, d->req->n_ref, t->offsets_uniform, d->course.gemm);
    /* The last tile's nodes that walked elsewhere have no threshold here
     * yet: an entry is absorbed at or below one. */
    KNN_TRY(knn_team_tighten(d, d->req->n_ref));
    for (int w = 0; w < d->walkers; w++)
        if (w != d->walker) KNN_TRY(knn_team_take_from(d, w, &all));
    KNN_TRY(knn_copy_back(d, t->h_pairs_lost, p->lost_nodes, sizeof(int)));
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    *lost = *t->h_pairs_lost;
    return KNN_OK;
}

/* This device reads the others' lists no more: they may free them once
 * all are done. */
static void knn_team_done_reading(knn_gpu_dev *d)
{
    knn_meet_count_once(d->shared, &d->team_released,
                        &d->shared->team.released);
}

void knn_team_release(knn_gpu_dev *d)
{
    if (!d->team_walk) return;
    const knn_gpu_team *team = &d->shared->team;
    knn_team_done_reading(d);
    /* Only once every device has walked do the others read this one's
     * lists; then none may be freed before all have read them, stop or
     * not. */
    if (team->met[KNN_MEET_WALKED] < d->walkers) return;
    knn_meet_wait(d->shared, &team->released, d->walkers, 0, NULL);
}

/* After a shared walk: once every device has walked, the lists of this
 * device's rows' nodes take the others' (*left as knn_pairs_walk_all's:
 * -1 where too many nodes are lost, another device's reason where it
 * left the walk). The others are done reading this device's lists before
 * it leaves the walk, which frees them. */
knn_status knn_team_exchange(knn_gpu_dev *d, int *left)
{
    double t0 = knn_seconds();
    KNN_TRY(knn_team_meet(d, &d->shared->team.met[KNN_MEET_WALKED],
                          d->walkers, left));
    if (*left) return KNN_OK;
    int lost = 0;
    KNN_TRY(knn_team_take_lists(d, &lost));
    if (knn_walk_too_lossy(d, lost)) {
        *left = -1;
        knn_team_release(d);
    } else {
        knn_team_done_reading(d);
    }
    d->seconds_search += knn_seconds() - t0;
    return KNN_OK;
}

knn_status knn_walk_set_apart(knn_gpu_dev *d)
{
    if (*d->t.h_pairs_lost == 0) return KNN_OK;
    size_t w0 = (size_t)d->q0 >> 5;
    size_t words = ((size_t)(d->q0 + d->nq) >> 5) + 1 - w0;
    std::vector<unsigned> bits(words);
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(bits.data(), d->pairs.lost + w0,
                                 words * sizeof(unsigned),
                                 cudaMemcpyDeviceToHost, d->stream));
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    for (int row = d->q0; row < d->q0 + d->nq; row++)
        if (bits[(row >> 5) - w0] >> (row & 31) & 1u)
            KNN_TRY(knn_apart_add(d, row));
    return KNN_OK;
}

/* Leaves a shared walk that could not finish (left: see
 * knn_pairs_walk_all): the search starts again from its first row,
 * refining or climbing as the walk's tile showed, or, where too many
 * nodes were lost, on the plain walk. */
knn_status knn_dev_leave_pairs(knn_gpu_dev *d, int left)
{
    if (left == KNN_RUNG_LOCAL) return knn_dev_go_local(d, d->q0);
    if (left < 0) knn_course_refuse_walk(d);
    else if (left == KNN_RUNG_REFINE) knn_course_refine(d);
    return knn_dev_leave_fused(d, left < 0 ? KNN_RUNG_STAY : left);
}
