/*
 * knn_gpu_policy.cu: every automatic choice of the GPU search, from the
 * thresholds of knn_gpu_policy.cuh (host code; nothing here allocates or
 * launches). The course of a device's search is:
 *
 * - the arithmetic it starts with (knn_gemm_choose: TF32 unless the
 *   request forces one) and whether it may change it (knn_gemm_adaptive);
 * - its path, planned before the first tile (knn_gpu_plan.cu asks):
 *   the fused kernel (knn_fused_choose) or a panel of products and a
 *   selection kernel (knn_select_choose, knn_tile_algo), and for a self
 *   search on the fused path whether it computes each pair once in a
 *   shared walk (knn_pairs_choose, knn_dev_could_pair);
 * - after each tile, whether the search stays, refines its TF32
 *   candidates in float32 from then on, or climbs to the next arithmetic
 *   (knn_dev_next_step; knn_gpu_loop.cu's knn_dev_climb carries the
 *   climb out, in the order knn_gpu.cuh gives).
 *
 * The request's knobs (knn_knobs.select) and precision force a choice
 * where tests and measurements need one; the bits are the same on every
 * course.
 */
#include "knn_gpu_tiles.cuh"

/* ---- the course -------------------------------------------------------- */

/* The one place a device's course changes: the plan (its path), the
 * policy's steps after a tile (refine, climb), a shared walk's end and
 * leaving it. */
void knn_course_set(knn_gpu_dev *d, knn_course next)
{
    d->course = next;
}

void knn_course_path(knn_gpu_dev *d, knn_gpu_path path)
{
    knn_course c = d->course;
    c.path = path;
    knn_course_set(d, c);
}

void knn_course_refine(knn_gpu_dev *d)
{
    knn_course c = d->course;
    c.refine = 1;
    knn_course_set(d, c);
}

void knn_course_refuse_walk(knn_gpu_dev *d)
{
    knn_course c = d->course;
    c.walk_refused = 1;
    knn_course_set(d, c);
}

int knn_dev_fused(const knn_gpu_dev *d)
{
    return d->course.path != KNN_PATH_PANEL;
}

int knn_slot_fused(const knn_gpu_slot *sl)
{
    return sl->course.path == KNN_PATH_FUSED;
}

int knn_slot_gathered(const knn_gpu_slot *sl)
{
    return sl->course.path == KNN_PATH_GATHER;
}

/* ---- the devices ------------------------------------------------------- */

/* Work that ends in milliseconds on one device: at most 2^35 products of
 * two values and 256 MB of input. */
int knn_work_is_small(const knn_request *req)
{
    double n_q = req->query ? req->n_query : req->n_ref;
    double nodes = req->n_ref + (req->query ? req->n_query : 0);
    return n_q * req->n_ref * req->p <= 34359738368.0 &&
           nodes * req->p * sizeof(double) <= 268435456.0;
}

/* Of `visible` GPUs the request left to the engine, those it uses: one
 * for small work (starting and joining others' threads, uploads and
 * contexts costs more than their share of milliseconds saves), else
 * all. */
size_t knn_devices_wanted(const knn_request *req, size_t visible)
{
    return knn_work_is_small(req) && visible > 1 ? 1 : visible;
}

/* ---- the start: arithmetic and path ------------------------------------ */

/* TF32 unless the request forces an arithmetic. */
knn_gemm_mode knn_gemm_choose(knn_precision force)
{
    if (force == KNN_PRECISION_FP32) return KNN_GEMM_FP32;
    if (force == KNN_PRECISION_FP64) return KNN_GEMM_FP64;
    return force == KNN_PRECISION_TF32X3 ? KNN_GEMM_TF32X3 : KNN_GEMM_TF32;
}

/* Only a search left to choose, of a product metric, changes it. */
int knn_gemm_adaptive(knn_precision force, knn_metric metric)
{
    return force == KNN_PRECISION_AUTO && knn_uses_product(metric);
}

/* The fused path where the kernel can run (product metrics in TF32,
 * k <= KNN_FUSED_MAX_K) and, unless forced, where it wins: the plain walk
 * up to KNN_FUSED_AUTO_MAX_K at up to KNN_FUSED_AUTO_MAX_FEATURES (past
 * them cuBLAS computes the products faster), a shared walk at any number
 * of features (each pair computed once), and either only with a block of
 * rows per KNN_FUSED_SMS_PER_BLOCK SMs. */
int knn_fused_choose(knn_select_force force, knn_metric metric,
                     knn_gemm_mode gemm, int k, int p, int rows,
                     int sm_count, int shared_walk)
{
    if (force == KNN_SELECT_FORCE_WARP || force == KNN_SELECT_FORCE_RADIX)
        return 0;
    if (!knn_uses_product(metric) || gemm != KNN_GEMM_TF32 ||
        k > KNN_FUSED_MAX_K || p >= KNN_FUSED_HALF_MAX_FEATURES)
        return 0;
    if (force == KNN_SELECT_FORCE_FUSED ||
        force == KNN_SELECT_FORCE_FUSED_ROWS)
        return 1;
    long long blocks = (rows + KNN_FUSED_ROWS - 1) / KNN_FUSED_ROWS;
    return ((k <= KNN_FUSED_AUTO_MAX_K &&
             p <= KNN_FUSED_AUTO_MAX_FEATURES) || shared_walk) &&
           blocks * KNN_FUSED_SMS_PER_BLOCK >= sm_count;
}

/* The warp kernel for small k and tall row tiles, else the radix one. */
knn_select_algo knn_select_choose(knn_select_force force, int rows, int k)
{
    if (force == KNN_SELECT_FORCE_RADIX) return KNN_SELECT_RADIX;
    if (force == KNN_SELECT_FORCE_WARP && k <= KNN_WARP_MAX_K)
        return KNN_SELECT_WARP;
    /* The reference's width enters through the plan: a row tile's rows x
     * columns are capped at 2^31 floats, so rows >= KNN_WARP_MIN_ROWS
     * already means at most 131072 columns, the narrow references where
     * the warp kernel was measured to win. */
    if (k <= KNN_WARP_AUTO_MAX_K && rows >= KNN_WARP_MIN_ROWS)
        return KNN_SELECT_WARP;
    return KNN_SELECT_RADIX;
}

/* A shared walk for a self search on the fused path in more than one
 * tile, up to KNN_PAIRS_MAX_K; unless forced, past KNN_PAIRS_AUTO_SMALL_K
 * only from KNN_PAIRS_AUTO_MIN_NODES nodes, where the owners' work per
 * row and the search's fixed costs weigh less. */
int knn_pairs_choose(knn_select_force force, int self, int k, int n_ref,
                     int tile_rows)
{
    if (force == KNN_SELECT_CHOOSE && k > KNN_PAIRS_AUTO_SMALL_K &&
        n_ref < KNN_PAIRS_AUTO_MIN_NODES)
        return 0;
    return self && force != KNN_SELECT_FORCE_FUSED_ROWS &&
           k <= KNN_PAIRS_MAX_K && tile_rows < n_ref && n_ref > 1;
}

/* Whether a search on the fused path would take a shared walk
 * (knn_gpu_pairs.cu) in tiles of `rows` rows (0: of whatever size). */
int knn_dev_could_pair(const knn_gpu_dev *d, int rows)
{
    const knn_request *req = d->req;
    return !d->course.walk_refused && !d->course.local &&
           knn_pairs_choose(d->knobs->select, d->self, req->k, req->n_ref,
                            rows);
}

/* ---- each tile: the selection and the next step ------------------------ */

/* Whether a tile in arithmetic `gemm` may rescore its candidates in
 * float32 (knn_gpu_select.cu, knn_refine): TF32 tiles of a product metric;
 * the radix kernel does (knn_tile_refined). */
int knn_refine_possible(const knn_gpu_dev *d, knn_gemm_mode gemm)
{
    return gemm == KNN_GEMM_TF32 && d->nodes.margin2_fp32 != NULL &&
           !d->course.local;
}

/* Rows apart (knn_gpu_apart) for the `over` rows of slot sl's tile that
 * overflowed their slots, where they are few among its rows
 * (KNN_APART_SHARE) or their float32 products cost less than the tile's
 * own run took (`seconds`), which a run again costs at least
 * (KNN_APART_SECONDS_PER_PRODUCT): on the product metrics, the
 * arithmetic left to the engine (float32 stands in for the course's for
 * those rows only), in a tile of the device's own rows, in node order or
 * a local frame's, that took float32 products or coarser (a float64
 * tile's crowded rows would crowd float32 too). A local tile's crowded
 * rows are those far from its translation, whose TF32 margins grow with
 * their norms there; float32 resolves them where the tile's run again
 * would repeat every row. Where thousands of a local tile's rows crowd
 * (genes at many levels), its run again re-ranks hundreds of millions
 * of candidates. The rows a shared walk gathers have their own redo, and
 * rows apart run again with their exact slots. */
int knn_rows_go_apart(const knn_gpu_dev *d, const knn_gpu_slot *sl, int over,
                      double seconds)
{
    const knn_request *req = d->req;
    double apart_seconds = (double)over * req->n_ref * req->p *
                           KNN_APART_SECONDS_PER_PRODUCT;
    return !d->knobs->keep_rows_in_tiles &&
           knn_gemm_adaptive(req->precision, req->metric) &&
           sl->course.gemm != KNN_GEMM_FP64 && !knn_slot_gathered(sl) &&
           !sl->apart &&
           ((long long)over * KNN_APART_SHARE <= sl->rows ||
            apart_seconds <= seconds);
}

/* Whether a shared walk with `lost` nodes lost (knn_pairs.lost: their
 * lists miss candidates) is left for the plain walk: any, where rows may
 * not go apart (knn_rows_go_apart: the arithmetic forced); else more than
 * a KNN_APART_SHARE-th of the nodes, which searched apart would cost
 * about what the plain walk's second product of every pair does. */
int knn_walk_too_lossy(const knn_gpu_dev *d, int lost)
{
    if (lost == 0) return 0;
    return !knn_gemm_adaptive(d->req->precision, d->req->metric) ||
           (long long)lost * KNN_APART_SHARE > d->req->n_ref;
}

/* Local frames (knn_gpu_local.cu) for a distance metric whose tiles are
 * crowded: nodes that lie close together relative to their distance from
 * the data's centre (cell types, replicates of a few states, genes at
 * similar levels) crowd every float32 arithmetic through its margin,
 * which grows with the nodes' norms in the frame; a tile's own frame
 * shrinks those norms to the tile's spread.
 *  - From TF32 on the fused path, before split TF32: local tiles stay on
 *    the fused path (one wave of blocks each), which costs a fraction of
 *    split TF32's three products on the panel path, each pair in every
 *    tile alike. Only where the fused kernel pays without a shared walk
 *    (knn_fused_choose's plain walk).
 *  - From split TF32, before float64: local tiles take TF32 on the panel
 *    path, which costs less than float64's products; data that split
 *    TF32 resolves stays there.
 * Only once: crowded local tiles send the search on to the next
 * arithmetic from its first row (knn_dev_leave_local). */
int knn_local_possible(const knn_gpu_dev *d)
{
    const knn_request *req = d->req;
    if (!knn_uses_product(req->metric) || knn_is_correlation(req->metric) ||
        !d->course.may_climb || d->course.local || d->course.local_refused ||
        d->knobs->select != KNN_SELECT_CHOOSE)
        return 0;
    if (d->course.gemm == KNN_GEMM_TF32X3) return 1;
    return d->course.gemm == KNN_GEMM_TF32 && knn_dev_fused(d) &&
           req->k <= KNN_FUSED_AUTO_MAX_K &&
           req->p <= KNN_FUSED_AUTO_MAX_FEATURES;
}

/* Whether the first local tile on the fused path, which tries local
 * frames before split TF32, leaves too many candidates: past
 * KNN_LOCAL_PER_K k + KNN_LOCAL_EXTRA a row, or past one a row per
 * KNN_LOCAL_NODES_PER_CANDIDATE of the n_ref nodes where that is more,
 * its re-rank costs more than split TF32's products would (cell types
 * whose cells spread as widely as the types lie apart). Only the first
 * local tile decides: a crowded later one is exact too, and starting
 * again would waste every tile done. */
static int knn_local_too_wide(double found, int rows, int k, int n_ref)
{
    double per_row = fmax(KNN_LOCAL_PER_K * k + KNN_LOCAL_EXTRA,
                          n_ref / KNN_LOCAL_NODES_PER_CANDIDATE);
    return found > rows * per_row;
}

/* The selection kernel of a panel tile of `rows` rows. Once TF32 has
 * found too many candidates for the plain selection (course.refine),
 * the radix kernel, which refines them, replaces the warp kernel, unless
 * the request forced that one. */
knn_select_algo knn_tile_algo(const knn_gpu_dev *d, int rows)
{
    const knn_request *req = d->req;
    knn_select_force force = d->knobs->select;
    knn_select_algo algo = knn_select_choose(force, rows, req->k);
    if (algo == KNN_SELECT_WARP && d->course.refine &&
        force == KNN_SELECT_CHOOSE)
        return KNN_SELECT_RADIX;
    return algo;
}

/* Whether a tile of `rows` rows in arithmetic `gemm` refines its TF32
 * candidates: the panel path's radix kernel does. */
int knn_tile_refined(const knn_gpu_dev *d, int rows, knn_gemm_mode gemm)
{
    return !knn_dev_fused(d) && knn_refine_possible(d, gemm) &&
           knn_tile_algo(d, rows) == KNN_SELECT_RADIX;
}

/* The TF32 candidates of the slot's rows before any refinement, given
 * `found` after it. A fused tile's rows count their survivors, which hold
 * every candidate (a node under the final threshold passed every looser
 * one before) where the candidates' own count stops at the slots. */
double knn_slot_wide(const knn_gpu_slot *sl, double found)
{
    if (!sl->refined && !knn_slot_fused(sl)) return found;
    double wide = 0.0;
    for (int r = 0; r < sl->rows; r++)
        wide += sl->refined ? sl->wide[r] : sl->survivors[r];
    return wide;
}

/* Whether refining `wide` TF32 candidates of `rows` rows costs more than
 * split TF32's products would. Rescoring a candidate reads its p fast
 * values; the split adds two products of p values for every one of the
 * n_ref columns, on tensor cores. Both grow with p, so the crossover is a
 * share of n_ref (KNN_REFINE_NODES_PER_CANDIDATE). */
static int knn_refine_too_costly(double wide, int rows, int n_ref)
{
    return wide > rows * (n_ref / KNN_REFINE_NODES_PER_CANDIDATE);
}

/* A tile is crowded when its rows average more candidates than
 * knn_rung_too_wide allows or, on the panel path, one overflows its
 * slots: the re-rank of the extra candidates, or the tile's redo, would
 * cost more than the faster products save. (A fused tile's survivors
 * overflow for other reasons too: the thresholds they passed were looser
 * at first.) A crowded split TF32 or float32 tile has the search climb
 * to float64, or a distance metric's to local frames first
 * (knn_local_possible). A crowded TF32 tile of a distance metric on the
 * fused path has the search take local frames; any other crowded TF32
 * tile that did not refine has the search refine from then on, where the
 * request left the selection to the engine; a crowded tile that did
 * refine has it climb. Either way the search climbs once its TF32
 * candidates are so many that refining them costs more than split TF32's
 * products (knn_refine_too_costly). A tile
 * that ran before the search last changed course tells nothing of the
 * course it is on now; nor does one gathered from a shared walk, whose
 * tiles were judged as they ran. */
knn_rung_step knn_dev_next_step(const knn_gpu_dev *d,
                                const knn_gpu_slot *sl, double found,
                                int overflow)
{
    if (!d->course.may_climb || knn_slot_gathered(sl) ||
        sl->course.gemm != d->course.gemm ||
        sl->course.refine != d->course.refine ||
        sl->course.local != d->course.local)
        return KNN_RUNG_STAY;
    const knn_request *req = d->req;
    int crowded = overflow || knn_rung_too_wide(found, sl->rows, req->k);
    /* A local tile's single rows past their slots are ties, which no
     * frame resolves: their exact counts redo the tile. */
    if (sl->course.local && knn_slot_fused(sl))
        return sl->row0 == d->local.base &&
                       knn_local_too_wide(found, sl->rows, req->k,
                                          req->n_ref)
                   ? KNN_RUNG_UNLOCAL : KNN_RUNG_STAY;
    if (sl->course.local)
        return knn_rung_too_wide(found, sl->rows, req->k) ? KNN_RUNG_UNLOCAL
                                                          : KNN_RUNG_STAY;
    if (sl->course.gemm != KNN_GEMM_TF32)
        return !crowded ? KNN_RUNG_STAY
               : knn_local_possible(d) ? KNN_RUNG_LOCAL : KNN_RUNG_CLIMB;
    double wide = knn_slot_wide(sl, found);
    int costly = knn_refine_too_costly(wide, sl->rows, req->n_ref);
    if (!crowded)
        return sl->refined && costly &&
                       knn_rung_too_wide(wide, sl->rows, req->k)
                   ? KNN_RUNG_CLIMB : KNN_RUNG_STAY;
    if (knn_local_possible(d)) return KNN_RUNG_LOCAL;
    if (!costly && !sl->refined && !d->course.refine &&
        d->knobs->select == KNN_SELECT_CHOOSE)
        return KNN_RUNG_REFINE;
    return KNN_RUNG_CLIMB;
}
