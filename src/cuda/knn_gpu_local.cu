/*
 * knn_gpu_local.cu: local frames (host code; the frame's kernels are in
 * knn_gpu_prepare.cu, knn_local_vectors).
 *
 * A TF32 candidate's margin grows with the two nodes' norms in the frame
 * of the fast vectors, the nodes less one translation for the whole
 * search. Where neighbours lie close together far from that translation
 * (clusters, cell types, genes at similar levels), the margin lets
 * thousands of candidates through and the search would climb to a slower
 * arithmetic. Where TF32 is crowded on the fused path (before split TF32),
 * or split TF32 is crowded (before float64), local frames
 * (knn_local_possible): the device's remaining rows are put in a spatial
 * order (a k-d split at a gap between groups on one of the coordinates of
 * largest spread, or else between whole tiles on the widest, and a tile with
 * a sparse tail on it at its median, on the host, so consecutive rows lie
 * close together), each tile one subtree of the split, and each tile takes
 * its own translation, the mean of its rows, for its rows and every ref node
 * alike: the rows' norms shrink to the tile's spread, and the margins with
 * them (knn_dist_row_bound bounds each row from its own norm). Distances do
 * not change with the translation and every bound holds for any, so the
 * candidates are proven as ever; the float64 re-rank is the same, and so are
 * the bits. Each tile's results go to their rows' places in the caller's
 * arrays.
 *
 * Local tiles take TF32 products whatever arithmetic the course left: on
 * the fused path where the search came from it (a tile is then one wave
 * of the fused kernel's blocks, and the frame holds its fp16 vectors, and
 * each row's own node excludes itself), else on the panel path. Where
 * they are crowded too (knn_dev_next_step), local frames do not serve the
 * data: the device's rows are searched again from the first in the next
 * arithmetic (split TF32, then float64).
 *
 * On the fused path (distances) the walk is pruned (knn_fused_prune): the
 * frame holds the ref nodes in a k-d order of column blocks (made once,
 * on the GPU), each tile's rows are ordered so from the tile's start, and
 * each tile gets its row blocks' boxes and both kinds of blocks' largest
 * norms in its frame, from which the fused kernel skips column blocks
 * that cannot hold a candidate.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <new>
#include <vector>
#include "knn_gpu_tiles.cuh"

/* Subtrees above this many rows split in parallel; none below this many
 * rows splits further, however parted (a tile of fewer rows would use
 * the products' arithmetic poorly; on the fused path, a quarter of a
 * wave of its blocks). */
#define KNN_LOCAL_TASK_ROWS 65536
#define KNN_LOCAL_MIN_TILE 128
#define KNN_LOCAL_MIN_WAVES 0.25
#define KNN_LOCAL_MIN_SPLITS 8
/* A gap this many times the widest that the middle half's spacing gives
 * by chance parts groups (knn_gap_parts). */
#define KNN_LOCAL_GAP_FACTOR 4.0
/* Rows sampled to choose a split's coordinate, and keys sampled to place
 * the split on it. */
#define KNN_LOCAL_SAMPLE 256
#define KNN_LOCAL_SPLIT_SAMPLE 4096
/* Coordinates a split looks for a gap on: groups that overlap on the
 * coordinate of largest spread (cell types whose centres lie close on the
 * first PC) often lie apart on another of the leading ones, and a tile
 * that holds parts of two groups crowds its far rows' candidates. */
#define KNN_LOCAL_GAP_AXES 8
/* A tile whose keys on the widest coordinate span this many times their
 * middle half's range splits further (knn_keys_stretched). */
#define KNN_LOCAL_STRETCH 16.0

/* Up to KNN_LOCAL_GAP_AXES coordinates into axes[], by variance over an
 * even sample of rows[0..n), the largest first (ties: the first
 * coordinate); returns how many. */
static int knn_spread_axes(const double *x, int p, const int *rows, int n,
                           int *axes)
{
    int s = n < KNN_LOCAL_SAMPLE ? n : KNN_LOCAL_SAMPLE;
    std::vector<double> spread((size_t)p);
    for (int f = 0; f < p; f++) {
        double mean = 0.0, m2 = 0.0;
        for (int i = 0; i < s; i++) {
            double v = x[(size_t)rows[(long long)i * n / s] * p + f];
            double delta = v - mean;
            mean += delta / (i + 1);
            m2 += delta * (v - mean);
        }
        spread[f] = m2;
    }
    std::vector<int> order((size_t)p);
    for (int f = 0; f < p; f++) order[f] = f;
    int count = p < KNN_LOCAL_GAP_AXES ? p : KNN_LOCAL_GAP_AXES;
    std::partial_sort(order.begin(), order.begin() + count, order.end(),
                      [&](int a, int b) {
                          return spread[a] > spread[b] ||
                                 (spread[a] == spread[b] && a < b);
                      });
    std::copy(order.begin(), order.begin() + count, axes);
    return count;
}

/* Where `n` sorted keys split: at the widest gap between neighbouring
 * keys in their middle half (between groups, where the nodes form
 * groups), the median where none is wider than zero. *gap: that gap's
 * width. */
static int knn_split_at(const std::vector<double> &keys, int n, double *gap)
{
    int at = n / 2;
    *gap = 0.0;
    for (int i = n / 4; i < n - n / 4; i++) {
        double g = keys[i] - keys[i - 1];
        if (g > *gap) {
            *gap = g;
            at = i;
        }
    }
    return at;
}

/* Whether a gap sets two groups apart: wider than either side's spread
 * along the axis, or far wider than chance leaves between neighbouring
 * keys of one group: the m = n / 2 spacings of the middle half are about
 * exponential, the widest about ln m times their mean, and a gap
 * KNN_LOCAL_GAP_FACTOR times that lies between groups (many groups along
 * the axis, where each side spans several). The keys may be a sample: a
 * gap between groups shows in it at least as wide, and chance's widest
 * scales with the sample's spacing. */
static int knn_gap_parts(const std::vector<double> &keys, int n, int at,
                         double gap)
{
    if (gap > keys[at - 1] - keys[0] && gap > keys[n - 1] - keys[at])
        return 1;
    double m = n / 2.0;
    double middle = keys[n - n / 4 - 1] - keys[n / 4];
    return gap > KNN_LOCAL_GAP_FACTOR * (middle / m) * log(m);
}

/* The key of row `node` on `axis`. */
static inline double knn_key(const double *x, int p, int node, int axis)
{
    return x[(size_t)node * p + axis];
}

/* The sorted keys of an even sample of rows[0..n) on `axis`. */
static std::vector<double> knn_key_sample(const double *x, int p,
                                          const int *rows, int n, int axis)
{
    int s = n < KNN_LOCAL_SPLIT_SAMPLE ? n : KNN_LOCAL_SPLIT_SAMPLE;
    std::vector<double> keys((size_t)s);
    for (int i = 0; i < s; i++)
        keys[i] = knn_key(x, p, rows[(long long)i * n / s], axis);
    std::sort(keys.begin(), keys.end());
    return keys;
}

/* Parts rows[0..n) into the rows whose key on `axis` lies below `value`
 * and the rest, each in its order before (node order at the top, so the
 * rows' values are read in order at every depth); returns the first
 * part's size. */
static int knn_part_rows(const double *x, int p, int *rows, int n, int axis,
                         double value)
{
    int *mid = std::stable_partition(rows, rows + n, [&](int node) {
        return knn_key(x, p, node, axis) < value;
    });
    return (int)(mid - rows);
}

/* Parts rows[0..n) into the `left` rows of smallest key on `axis` (ties
 * at the boundary in their order) and the rest, each in its order
 * before. */
static void knn_part_rows_count(const double *x, int p, int *rows, int n,
                                int axis, int left)
{
    std::vector<double> keys((size_t)n);
    for (int i = 0; i < n; i++) keys[i] = knn_key(x, p, rows[i], axis);
    std::vector<double> order(keys);
    std::nth_element(order.begin(), order.begin() + (left - 1), order.end());
    double last = order[left - 1];
    int ties = left;
    for (int i = 0; i < n; i++) ties -= keys[i] < last;
    std::vector<int> right;
    right.reserve((size_t)(n - left));
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (keys[i] < last || (keys[i] == last && ties-- > 0))
            rows[kept++] = rows[i];
        else
            right.push_back(rows[i]);
    }
    std::copy(right.begin(), right.end(), rows + left);
}

/* Rows to the left of a split of n > tile rows that no gap parts: whole
 * tiles, ceil(n / tile) of them as equal as can be, half of them on
 * each side. The fused kernel takes as long for part of a wave as for a
 * whole one, so tiles split only down to the median would take half as
 * long again. */
static int knn_tile_split(int n, int tile)
{
    long long m = ((long long)n + tile - 1) / tile;
    return (int)(m / 2 * n / m);
}

/* Whether a gap in the sorted sample `keys` of rows' keys on an axis
 * parts groups of them (knn_gap_parts); *value: where the split then
 * goes. */
static int knn_keys_part(const std::vector<double> &keys, double *value)
{
    int s = (int)keys.size();
    double gap = 0.0;
    int at = knn_split_at(keys, s, &gap);
    *value = keys[at - 1] + gap / 2.0;
    return knn_gap_parts(keys, s, at, gap);
}

/* Whether the sorted sample `keys` of rows' keys on an axis spans more
 * than KNN_LOCAL_STRETCH times its middle half's range: the tile holds
 * a tail where the nodes lie far sparser than in its middle (genes at
 * the ends of levels spread over a hundredfold), its translation lies
 * far from the tail's rows, whose neighbours lie as close as their
 * sparse part allows, and their margins, which grow with their norms in
 * the frame, hold thousands. The keys of a uniform stretch span about
 * twice their middle half, of a normal distribution's last thirtieth
 * about six times, of a lognormal's some fifty. */
static int knn_keys_stretched(const std::vector<double> &keys)
{
    int s = (int)keys.size();
    double middle = keys[s - s / 4 - 1] - keys[s / 4];
    return middle > 0.0 &&
           keys[s - 1] - keys[0] > KNN_LOCAL_STRETCH * middle;
}

/* One split of knn_kd_order: -1 where rows[0..n) is a tile, else the
 * size of its first part, the rows parted: at a gap on the first of the
 * coordinates of largest spread that has one, else between whole tiles
 * on the widest, or, for a tile whose keys on the widest stretch far
 * (knn_keys_stretched) and holds at least twice min_tile rows, at their
 * median. */
static int knn_kd_split(const double *x, int p, int *rows, int n, int tile,
                        int min_tile)
{
    if (n <= min_tile) return -1;
    int axes[KNN_LOCAL_GAP_AXES];
    int n_axes = knn_spread_axes(x, p, rows, n, axes);
    int axis = axes[0], parts = 0;
    double value = 0.0;
    std::vector<double> widest; /* the sample of axes[0], sorted */
    for (int a = 0; a < n_axes && !parts; a++) {
        std::vector<double> keys = knn_key_sample(x, p, rows, n, axes[a]);
        parts = knn_keys_part(keys, &value);
        if (parts) axis = axes[a];
        if (a == 0) widest.swap(keys);
    }
    if (n <= tile && !parts &&
        (n < 2 * min_tile || !knn_keys_stretched(widest)))
        return -1;
    int half = parts ? knn_part_rows(x, p, rows, n, axis, value) : 0;
    /* A gap's midpoint rounded onto a key may leave a side empty. */
    if (half == 0 || half == n) {
        half = n > tile ? knn_tile_split(n, tile) : n / 2;
        knn_part_rows_count(x, p, rows, n, axis, half);
    }
    return half;
}

/* Orders rows[0..n) (nodes of x) so that every subtree of a k-d split
 * is a stretch, and marks in cut[] (by position from `first`) where each
 * subtree that becomes a tile starts: at most `tile` rows, and no gap
 * parting groups within it (down to `min_tile` rows), so a tile never
 * spans two groups the split can set apart. Each split is at a gap
 * parting groups on one of the axes of largest spread (knn_split_at of a
 * sample of its keys, which keeps each split linear in its rows), else
 * between whole tiles on the widest (knn_tile_split); any order is
 * exact. Host memory that runs out sets *failed (no exception may leave
 * an OpenMP task). */
static void knn_kd_order(const double *x, int p, int *rows, int n,
                         int tile, int min_tile, int first,
                         unsigned char *cut, int *failed)
{
    int half = -1;
    try {
        half = knn_kd_split(x, p, rows, n, tile, min_tile);
    } catch (const std::bad_alloc &) {
        #pragma omp atomic write
        *failed = 1;
        return;
    }
    if (half < 0) {
        cut[first] = 1;
        return;
    }
    #pragma omp task if (n > KNN_LOCAL_TASK_ROWS)
    knn_kd_order(x, p, rows, half, tile, min_tile, first, cut, failed);
    #pragma omp task if (n > KNN_LOCAL_TASK_ROWS)
    knn_kd_order(x, p, rows + half, n - half, tile, min_tile, first + half,
                 cut, failed);
    #pragma omp taskwait
}

void knn_local_free(knn_gpu_local *lf)
{
    knn_device_free(lf->block);
    free(lf->place);
    free(lf->cut);
    memset(lf, 0, sizeof *lf);
}

/* The spatial order of the device's n query rows from `row` into
 * lf->place (caller's rows), the tiles' starts into lf->cut, and the
 * host copy of their nodes; KNN_E_NOMEM where host memory ran out. */
static knn_status knn_local_order(knn_gpu_dev *d, int row, size_t n,
                                  int *nodes)
{
    const knn_request *req = d->req;
    knn_gpu_local *lf = &d->local;
    const double *x = d->self ? req->ref : req->query;
    for (size_t i = 0; i < n; i++) lf->place[i] = row + (int)i;
    memset(lf->cut, 0, n);
    /* Rows fewer than a few such tiles split further all the same: their
     * search is small, and one frame for all of them would serve none. */
    int min_tile = KNN_LOCAL_MIN_TILE;
    double fused_min = fmin(d->wave_rows * KNN_LOCAL_MIN_WAVES,
                            (double)n / KNN_LOCAL_MIN_SPLITS);
    if (knn_dev_fused(d) && fused_min > min_tile) min_tile = (int)fused_min;
    int failed = 0;
    #pragma omp parallel num_threads(d->copy_threads)
    #pragma omp single
    knn_kd_order(x, req->p, lf->place, (int)n, lf->rows, min_tile, 0,
                 lf->cut, &failed);
    if (failed) return KNN_E_NOMEM;
    for (size_t i = 0; i < n; i++)
        nodes[i] = knn_dev_row_node(d, lf->place[i]);
    return KNN_OK;
}

/* A pruned walk's orders (lf's arrays carved; the rows' order and its
 * nodes on the device): the ref nodes in a k-d order of column blocks,
 * their boxes, and each tile's rows in a k-d order of row blocks from
 * its start (a block of rows is then a small box too), the host's
 * copies of their places and nodes (n of them) made anew. */
static knn_status knn_local_prune_orders(knn_gpu_dev *d, size_t n,
                                         std::vector<int> &nodes)
{
    knn_gpu_local *lf = &d->local;
    knn_fused_prune *pr = &lf->prune;
    KNN_TRY(knn_kd_columns(&d->nodes, KNN_FUSED_COLS, pr->col_node,
                           pr->col_pos, d->message, d->stream));
    KNN_TRY(knn_group_boxes(&d->nodes, pr->col_node, d->req->n_ref,
                            KNN_FUSED_COLS, pr->col_lo, pr->col_hi,
                            d->message, d->stream));
    std::vector<int> starts;
    for (size_t i = 0; i < n; i++)
        if (lf->cut[i]) starts.push_back((int)i);
    KNN_TRY(knn_kd_refine(&d->nodes, lf->nodes, (int)n, starts.data(),
                          (int)starts.size(), KNN_FUSED_ROWS, d->message,
                          d->stream));
    KNN_CUDA_TRY(d->message,
                 cudaMemcpy(nodes.data(), lf->nodes, n * sizeof(int),
                            cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        lf->place[i] = d->self ? nodes[i]
                               : nodes[i] - d->req->n_ref + d->q0;
    return KNN_OK;
}

/* Rows of a local tile: the plan's, and on the fused path at most one
 * wave of its blocks, so that a tile stays one subtree of close rows. */
static int knn_local_rows(const knn_gpu_dev *d)
{
    int rows = d->t.rows;
    if (knn_dev_fused(d) && d->wave_rows > 0 && d->wave_rows < rows)
        rows = d->wave_rows;
    return rows;
}

/* Blocks of `group` of n. */
static size_t knn_groups(size_t n, int group)
{
    return (n + group - 1) / group;
}

/* The order and the frame's arrays for tiles of knn_local_rows rows; on
 * the fused path, the frame's fp16 vectors and (distances) the pruned
 * walk's arrays too. */
static knn_status knn_local_alloc(knn_gpu_dev *d, int row)
{
    knn_gpu_local *lf = &d->local;
    const knn_gpu_nodes *nd = &d->nodes;
    int n = d->q0 + d->nq - row, rows = knn_local_rows(d);
    int fused = knn_dev_fused(d);
    int pruned = fused && d->score_kind == KNN_SCORE_DIST;
    size_t views = (size_t)nd->n_ref + rows;
    size_t col_blocks = knn_groups((size_t)nd->n_ref, KNN_FUSED_COLS);
    size_t row_blocks = knn_groups((size_t)rows, KNN_FUSED_ROWS);
    int ldh = (nd->p + 7) / 8 * 8;
    if (n < 1) return KNN_E_INVALID;
    knn_local_free(lf);
    lf->base = row;
    lf->rows = rows;
    lf->place = (int *)malloc((size_t)n * sizeof(int));
    lf->cut = (unsigned char *)malloc((size_t)n + 1);
    std::vector<int> nodes((size_t)n);
    if (!lf->place || !lf->cut) return KNN_E_NOMEM;
    knn_carver c = {NULL, 0};
    for (int pass = 0; pass < 2; pass++) {
        c.used = 0;
        lf->nodes = knn_carve<int>(&c, (size_t)n);
        lf->centre = knn_carve<double>(&c, (size_t)nd->p);
        lf->view = *nd;
        lf->view.fast = knn_carve<float>(&c, views * nd->ldf);
        lf->view.sqnorm = knn_carve<float>(&c, views);
        lf->view.norm = knn_carve<double>(&c, views);
        lf->view.margin2 = knn_carve<double>(&c, views);
        lf->view.norm_max = knn_carve<double>(&c, 1);
        lf->view.half_unscale = fused ? knn_carve<float>(&c, views) : NULL;
        lf->view.half = fused ? knn_carve<__half>(&c, views * ldh) : NULL;
        size_t pn = pruned ? (size_t)nd->n_ref : 0;
        size_t pc = pruned ? col_blocks : 0, pr = pruned ? row_blocks : 0;
        knn_fused_prune *prune = &lf->prune;
        prune->col_node = knn_carve<int>(&c, pn);
        prune->col_pos = knn_carve<int>(&c, pn);
        prune->col_lo = knn_carve<double>(&c, pc * nd->p);
        prune->col_hi = knn_carve<double>(&c, pc * nd->p);
        prune->col_norm_max = knn_carve<double>(&c, pc);
        prune->row_lo = knn_carve<double>(&c, pr * nd->p);
        prune->row_hi = knn_carve<double>(&c, pr * nd->p);
        prune->row_norm_max = knn_carve<double>(&c, pr);
        prune->skip_floor = knn_carve<float>(&c, pr * pc);
        if (pass == 0 && knn_device_alloc(&lf->block, c.used, d->stream) !=
                             cudaSuccess) {
            cudaGetLastError();
            lf->block = NULL;
            return KNN_E_NOMEM;
        }
        c.block = (char *)lf->block;
    }
    lf->view.margin2_fp32 = NULL;
    lf->view.half_block = NULL;
    lf->view.ldh = ldh;
    lf->view.split = NULL;
    lf->view.fast64 = NULL;
    lf->view.sqnorm64 = NULL;
    KNN_TRY(knn_local_order(d, row, (size_t)n, nodes.data()));
    /* Zero padding of the fast vectors adds nothing to the products. */
    KNN_CUDA_TRY(d->message,
                 cudaMemsetAsync(lf->view.fast, 0,
                                 views * nd->ldf * sizeof(float), d->stream));
    KNN_CUDA_TRY(d->message,
                 cudaMemcpyAsync(lf->nodes, nodes.data(),
                                 (size_t)n * sizeof(int),
                                 cudaMemcpyHostToDevice, d->stream));
    if (pruned) KNN_TRY(knn_local_prune_orders(d, (size_t)n, nodes));
    else lf->prune.col_node = NULL;
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    return KNN_OK;
}

int knn_local_tile_rows(const knn_gpu_dev *d, int row, int rows)
{
    const knn_gpu_local *lf = &d->local;
    if (!d->course.local || row < lf->base) return rows;
    int at = row - lf->base, n = d->q0 + d->nq - lf->base;
    int r = 1;
    while (r < rows && at + r < n && !lf->cut[at + r]) r++;
    return r;
}

knn_status knn_dev_go_local(knn_gpu_dev *d, int row)
{
    double t0 = knn_seconds();
    KNN_TRY(knn_dev_idle(d));
    knn_tiles_free(&d->t);
    knn_course c = d->course;
    c.local = 1;
    c.path = KNN_PATH_PANEL;
    knn_course_set(d, c);
    KNN_TRY(knn_dev_plan_tiles(d));
    knn_status st = knn_local_alloc(d, row);
    d->seconds_setup += knn_seconds() - t0;
    if (st != KNN_E_NOMEM) return st;
    /* No room for the frame's arrays: the search climbs instead. */
    d->message[0] = '\0';
    knn_local_free(&d->local);
    c = d->course;
    c.local = 0;
    c.local_refused = 1;
    knn_course_set(d, c);
    return knn_dev_leave_fused(d, KNN_RUNG_CLIMB);
}

knn_status knn_dev_leave_local(knn_gpu_dev *d)
{
    KNN_TRY(knn_dev_idle(d));
    knn_local_free(&d->local);
    knn_course c = d->course;
    c.local = 0;
    c.local_refused = 1;
    knn_course_set(d, c);
    /* Its rows are searched again from the first, in float64: their
     * progress too. */
    knn_meet_progress(d->shared, -d->rows_reported);
    d->rows_reported = 0;
    d->local_frames = 0;
    d->half_products = 0;
    d->refined = 0;
    d->candidates = 0.0;
    return knn_dev_leave_fused(d, KNN_RUNG_CLIMB);
}

/* The tile's pruned walk: its row blocks' boxes and the blocks' largest
 * fast norms in its frame, on the stream. */
static knn_status knn_local_prune(knn_gpu_dev *d, const int *d_nodes,
                                  int rows, knn_fused_prune *prune)
{
    knn_gpu_local *lf = &d->local;
    knn_fused_prune *pr = &lf->prune;
    int n_ref = d->nodes.n_ref;
    KNN_TRY(knn_group_boxes(&d->nodes, d_nodes, rows, KNN_FUSED_ROWS,
                            pr->row_lo, pr->row_hi, d->message, d->stream));
    KNN_TRY(knn_group_max(lf->view.norm + n_ref, rows, KNN_FUSED_ROWS,
                          pr->row_norm_max, d->message, d->stream));
    KNN_TRY(knn_group_max(lf->view.norm, n_ref, KNN_FUSED_COLS,
                          pr->col_norm_max, d->message, d->stream));
    pr->p = d->nodes.p;
    pr->col_blocks = (int)knn_groups((size_t)n_ref, KNN_FUSED_COLS);
    pr->row_blocks = (int)knn_groups((size_t)rows, KNN_FUSED_ROWS);
    *prune = *pr;
    return KNN_OK;
}

knn_status knn_local_frame(knn_gpu_dev *d, const int *d_nodes, int rows,
                           const knn_gpu_nodes **view,
                           knn_fused_prune *prune)
{
    knn_gpu_local *lf = &d->local;
    memset(prune, 0, sizeof *prune);
    if (rows > lf->rows)
        return knn_gpu_fail(d->message, KNN_E_DEVICE, "local frame",
                            "a tile holds more rows than its frame",
                            __FILE__, __LINE__);
    /* Only the fused kernel reads the ref nodes in the walk's order. */
    const int *ref_pick = knn_dev_fused(d) ? lf->prune.col_node : NULL;
    KNN_TRY(knn_local_vectors(&d->nodes, d_nodes, rows, ref_pick,
                              &lf->view, lf->centre, KNN_GEMM_TF32,
                              d->message, d->stream));
    if (lf->view.half)
        KNN_TRY(knn_half_fill(&lf->view, (size_t)d->nodes.n_ref + rows,
                              d->message, d->stream));
    if (ref_pick) KNN_TRY(knn_local_prune(d, d_nodes, rows, prune));
    *view = &lf->view;
    return KNN_OK;
}
