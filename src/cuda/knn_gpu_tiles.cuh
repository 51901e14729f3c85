/*
 * knn_gpu_tiles.cuh: one device's state during a search, driven by one
 * host thread from knn_gpu_search.cu, and the host files that work on it,
 * each calling only those listed after it: knn_gpu_search.cu (the
 * devices' threads and each device's course) -> knn_gpu_walk.cu (the
 * shared walk) -> knn_gpu_loop.cu (the pipeline of row tiles) ->
 * knn_gpu_plan.cu (tiles and buffers) -> knn_gpu_upload.cu (the nodes on
 * the device); knn_gpu_policy.cu (every automatic choice) calls none of
 * them. src/cuda/README.md draws the course.
 */
#ifndef KNN_GPU_TILES_CUH
#define KNN_GPU_TILES_CUH

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#include "knn_gpu.cuh"

/* Where the devices of a search meet: once each has uploaded its slice
 * of the reference (knn_gpu_upload.cu), and to share a walk
 * (knn_gpu_walk.cu): to agree on it, and once each has walked. */
enum { KNN_MEET_UPLOADED = 0, KNN_MEET_AGREE, KNN_MEET_WALKED,
       KNN_MEETINGS };
typedef struct {
    std::atomic<int> met[KNN_MEETINGS]; /* devices arrived at each */
    std::atomic<int> upload_done; /* devices that read no other's upload
                                     any more (or never will) */
    std::atomic<int> tiles_done; /* tiles of the walk done, all devices */
    std::atomic<int> walking;   /* devices planned for a shared walk */
    std::atomic<int> tile_rows; /* the fewest rows of their tiles */
    std::atomic<int> left;      /* why the walk was left (see
                                   knn_pairs_walk_all), 0 while it goes */
    std::atomic<int> released;  /* devices done reading others' lists */
    /* Each walking device's per-node arrays (published as it agrees)
     * and GPU (placed before the search), by its place. */
    knn_pairs pairs[KNN_MAX_DEVICES];
    int device[KNN_MAX_DEVICES];
    const double *upload[KNN_MAX_DEVICES]; /* each one's float64 nodes */
} knn_gpu_team;

/* What the calling thread, the device threads and the page threads
 * share. Every value that some thread waits for changes only through
 * knn_gpu_team.cu's functions, under `lock`, which wake the waiters on
 * `changed`: the one barrier of a search. */
typedef struct {
    std::mutex lock;
    std::condition_variable changed;
    std::atomic<int> stop;            /* set by the caller or a failing
                                         device: stop at the next tile */
    std::atomic<int> finished;        /* device threads that ended */
    std::atomic<long long> rows_done; /* query rows finished, all devices */
    std::atomic<int> tile_done;       /* a device has finished a tile */
    std::atomic<int> out_ready;       /* set by the caller: the result's
                                         arrays exist (knn_result.allocate)
                                         and may be written */
    knn_gpu_team team;
} knn_gpu_shared;

/* knn_gpu_team.cu: the barrier. Which events end a wait besides its
 * value: a stop (the wait then gives KNN_E_INTERRUPTED), a device's
 * leaving a shared walk (team.left: the wait gives KNN_OK and its
 * reason). */
enum { KNN_ENDS_ON_STOP = 1, KNN_ENDS_ON_LEFT = 2 };
/* Adds `add` to a shared value. */
void knn_meet_add(knn_gpu_shared *s, std::atomic<int> *value, int add);
/* Sets a shared value to v where it is 0 (the first word wins); returns
 * the value it holds. */
int knn_meet_first(knn_gpu_shared *s, std::atomic<int> *value, int v);
/* Raises the stop flag. */
void knn_meet_stop(knn_gpu_shared *s);
/* Waits until *value >= target, or an event of `ends` comes first:
 * KNN_OK where the value is reached or a device left the walk (then
 * *left, where given, gets team.left; else it is left untouched),
 * KNN_E_INTERRUPTED where the search was stopped. */
knn_status knn_meet_wait(knn_gpu_shared *s, const std::atomic<int> *value,
                         int target, int ends, int *left);
/* The same for at most ms milliseconds, no event ending it: whether the
 * value is reached. */
bool knn_meet_wait_for(knn_gpu_shared *s, const std::atomic<int> *value,
                       int target, int ms);
/* Counts a device in `count` once (*counted: whether it has been). */
void knn_meet_count_once(knn_gpu_shared *s, int *counted,
                         std::atomic<int> *count);
/* Query rows finished (negative: taken back), and a first tile done. */
void knn_meet_progress(knn_gpu_shared *s, long long rows);

/* The caller's result arrays made resident, and a graph's ends written,
 * while the devices search (knn_gpu_pages.cu), once a first tile is done:
 * started once the arrays exist, joined after the devices (or, should an
 * exception leave first, on the way out: a joinable thread destroyed
 * would end the process). knn_pages_wrote_ends: whether the threads
 * wrote all of the ends (knn_result.ends_written). */
struct knn_pages;
void knn_pages_start(knn_pages *job, const knn_result *out, size_t entries,
                     int k, knn_gpu_shared *shared);
void knn_pages_join(knn_pages *job);
int knn_pages_wrote_ends(const knn_pages *job);
#define KNN_PAGES_THREADS_MAX 4
struct knn_pages {
    std::thread thread[KNN_PAGES_THREADS_MAX];
    std::vector<std::pair<char *, size_t>> pieces; /* to make resident */
    int *from = nullptr, *rank = nullptr; /* a graph's ends, to write */
    size_t entries = 0;
    int k = 0, base = 0;
    size_t end_pieces = 0;
    std::atomic<size_t> next{0};      /* the first piece no thread has
                                         taken; the ends' come last */
    std::atomic<size_t> ends_done{0}; /* the ends' pieces written */
    std::atomic<int> populate{1};     /* madvise takes
                                         MADV_POPULATE_WRITE */
    ~knn_pages() { knn_pages_join(this); }
};

/* A device's course: how its search finds candidates from here on. One
 * value, changed only by knn_course_set (knn_gpu_policy.cu); each tile
 * keeps the course it ran on (knn_gpu_slot.course), which the policy
 * compares with the device's. */
typedef enum {
    KNN_PATH_PANEL = 0, /* a panel of products, then a selection kernel */
    KNN_PATH_FUSED,     /* the fused kernel (a shared walk's tiles too) */
    KNN_PATH_GATHER     /* tiles gather a finished shared walk's lists */
} knn_gpu_path;
typedef struct {
    knn_gpu_path path;
    knn_gemm_mode gemm;     /* the products' arithmetic */
    int may_climb;          /* the arithmetic may still change */
    unsigned climbed_from;  /* the arithmetics left behind (knn_gemm_bit) */
    int refine;             /* TF32 found too many candidates for the
                               plain selection: tiles take the panel path
                               and the radix kernel, which refines them */
    int walk_refused;       /* a shared walk overflowed or did not fit:
                               not again */
    int local;              /* TF32 tiles in local frames, in the rows'
                               spatial order (knn_gpu_local.cu) */
    int local_refused;      /* local frames were crowded too, or did not
                               fit: not again */
} knn_course;

/* One of the two pinned result slots: the host copies one out while the
 * device fills the other. */
typedef struct {
    int row0, rows;
    knn_course course;      /* the device's when the tile was queued */
    int refined;            /* its selection may rescore TF32 candidates
                               in float32 (knn_gpu_select.cu, knn_refine) */
    int apart;              /* its rows are rows set apart (knn_gpu_apart),
                               place and d_nodes theirs */
    int *index, *count;
    int *wide;              /* TF32 candidates before the refinement */
    int *survivors;         /* fused: the slots each row needed */
    /* The slots each row had: the uniform ones of the run (the tiles'
     * uniform slots may grow after it was queued), or INT_MAX for a run
     * with each row's exact counts. */
    int slots, surv_slots;
    /* A tile in the spatial order (knn_gpu_local.cu): its rows' places
     * in the caller's result (host) and their nodes (device); NULL for
     * rows [row0, row0 + rows) in order. */
    const int *place;
    const int *d_nodes;
    double *distance, *weight;
    /* The re-rank's results on the device, rows x k: each slot has its
     * own, so that their transfer (on the copy stream) overlaps the next
     * tile's work. */
    int *d_index;
    double *d_distance, *d_weight;
    /* Fused: the bound each row's candidates passed (device), the seeds
     * of a run again with exact slots (knn_fused_seed). */
    float *d_bound;
    /* start, selected: on the stream; ranked: the re-rank and the counts'
     * transfer done (the stream); done: the results' transfer done (the
     * copy stream, after `ranked`). */
    cudaEvent_t start, selected, ranked, done;
} knn_gpu_slot;

typedef enum {
    KNN_HOST_CONTEXT = 0,   /* the device context's, kept */
    KNN_HOST_PINNED,        /* this search's, cudaHostAlloc */
    KNN_HOST_PLAIN          /* this search's, malloc */
} knn_host_owner;

typedef struct {
    void *device_block;     /* one allocation each, carved into the arrays
                               below (see knn_tiles_carve) */
    void *host_block;       /* the result slots' memory, whose owner */
    knn_host_owner host_own; /* says how it is freed */
    void *slots_block;      /* the candidate arrays, re-sized by a redo */
    int rows;               /* row tile R */
    int slots;              /* uniform candidate slots per row */
    float *panel;           /* R x n_ref, or R x n_ref doubles where
                               planned for float64 */
    size_t panel_floats;    /* its size */
    int *offsets_uniform;   /* r * slots */
    int *offsets_exact;     /* a redo's per-row counts, summed */
    int *h_offsets;         /* pinned, R + 1 */
    int *h_pairs_lost;      /* pinned: a shared walk's list overflowed */
    int *seg_end, *count;
    int *sort_end;          /* knn_rerank_args.sort_end */
    int *wide;              /* knn_select_args.wide */
    int64_t n_slots_alloc;
    /* The fused path's survivors (knn_gpu_fused.cu): their uniform slots
     * (a redo's take its candidates' offsets), the buffer (re-sized by a
     * redo) and the slots each row needed. */
    int surv_slots;
    int grow_refused;       /* growing them did not fit (knn_grow_uniform) */
    int *surv_offsets_uniform, *h_surv_offsets;
    void *surv_block;
    uint64_t *survivor;
    int64_t surv_alloc;
    int *survivors;
    float *fused_best;      /* the rows' k smallest where the fused
                               kernel's shared memory cannot hold them */
    int *cand_index;
    double *cand_key;
    uint64_t *sort_key, *sort_key_out;
    int *sort_val, *sort_val_out;
    void *sort_temp;
    size_t sort_temp_bytes;
    knn_gpu_slot slot[2];
} knn_gpu_tiles;

/* Local frames (knn_gpu_local.cu): from row `base` of the device's
 * query rows on, its tiles take the rows in a spatial order (place: the
 * caller's row of each position, on the host; nodes: its node, on the
 * device), each tile in its own frame: the nodes less the tile rows'
 * mean, in float32 (the reference's, then the tile's rows after them),
 * so that the candidate margins scale with the tile's spread instead of
 * the data's. */
typedef struct {
    int base;
    int *place;             /* rows from base, host */
    unsigned char *cut;     /* 1 where a tile must start, host */
    int *nodes;             /* the same as nodes, device */
    int rows;               /* tile rows the arrays hold */
    knn_gpu_nodes view;     /* the nodes with fast, sqnorm, norm, norm_max
                               and margin2 those of the frame: ref nodes,
                               then the tile's rows from n_ref */
    double *centre;         /* the frame's translation (p) */
    /* On the fused path (distances), a pruned walk's arrays: the ref
     * nodes in a k-d order (prune.col_node NULL where the walk is plain)
     * and the boxes of its column blocks, once; each tile's row blocks'
     * boxes, the blocks' largest fast norms in its frame and the walk's
     * scratch. */
    knn_fused_prune prune;
    void *block;            /* the device arrays' allocation */
} knn_gpu_local;

/* Rows set apart (knn_gpu_loop.cu): the few rows of a tile that found
 * far more candidates than their slots hold while its other rows fit
 * (nodes far out among heavy tails, whose margins grow with their norms;
 * rows with many exact ties). Their tile keeps its other rows' results
 * instead of running again whole; after the device's last tile they are
 * searched together on the panel path in float32, whose margins are a
 * small fraction of TF32's, from their fast vectors gathered here. A
 * shared walk's lost nodes (knn_pairs.lost) join them after the walk.
 * Rows past the device's query rows (q0 + nq + i) stand for rows[i]. */
typedef struct {
    int *rows;              /* the caller's query rows, host */
    int n, cap;
    unsigned char *mark;    /* [nq]: 1 where row q0 + i is apart, host */
    int *nodes;             /* their nodes, device */
    float *fast;            /* their fast vectors, ldf floats each */
    float *sqnorm;          /* distances: |f|^2; else NULL */
    double *norm;           /* distances: |node - means|; else NULL */
    double *margin2;        /* twice their float32 margins */
    void *block;            /* the device arrays' allocation */
} knn_gpu_apart;

typedef struct {
    const knn_request *req;
    const knn_knobs *knobs; /* never NULL */
    knn_result *out;
    knn_gpu_shared *shared;
    int device;
    int walker, walkers;    /* its place among the devices that search,
                               and their number */
    int team_walk;          /* it shares a walk with the others */
    unsigned team_reads;    /* the others (bit w: device w) whose memory
                               its kernels read directly */
    int team_released;      /* it no longer reads the others' lists */
    int upload_released;    /* nor their uploads (knn_gpu_upload.cu) */
    int q0, nq;             /* query rows [q0, q0 + nq) */
    int self;
    int n_nodes;
    double query_max_abs;   /* distances, query search: max |query| */
    knn_score_kind score_kind;
    knn_course course;      /* see knn_course */
    int fp64_fast;          /* the device runs float64 at half float32's
                               rate or better: float64 may stand in for
                               split TF32 where its arrays do not fit */
    int half_products;      /* a tile whose results were kept took the
                               fused path's fp16 products (nodes.half) */
    int refined;            /* a tile's refinement dropped candidates */
    int wave_rows;          /* fused: rows of one full wave of blocks
                               (every SM holding all the blocks it can) */
    knn_pairs pairs;        /* a shared walk's per-node arrays (pairs.block
                               set: this search computes each pair once) */
    int pairs_once;         /* the search ended with a shared walk */
    knn_gpu_context *ctx;   /* the device's stream, handle, staging */
    cudaStream_t stream;    /* ctx's */
    cudaStream_t copy_stream; /* ctx's: results to the host */
    cublasHandle_t blas;
    knn_gpu_nodes nodes;
    knn_gpu_local local;    /* local frames' arrays (knn_gpu_local.cu) */
    knn_gpu_apart apart;    /* rows set apart (knn_gpu_loop.cu) */
    knn_gpu_tiles t;
    int row_tile;           /* the plan's R, kept after t is freed */
    int copy_threads;       /* host threads for the upload and for
                               copying results out */
    knn_status status;
    char message[512];
    double seconds_setup, seconds_prepare, seconds_search, seconds_rerank;
    double seconds_collect;
    double candidates;      /* candidates re-ranked, summed */
    long long rows_reported; /* query rows its tiles reported done */
    int local_frames;       /* a tile whose results were kept took a
                               local frame */
    int rows_apart;         /* rows its search set apart (knn_gpu_apart) */
} knn_gpu_dev;

/* The node of the device's query row `row`: the row itself in a self
 * search, else the row's place after the ref nodes. */
static inline int knn_dev_row_node(const knn_gpu_dev *d, int row)
{
    return d->self ? row : d->req->n_ref + (row - d->q0);
}

/* What a device's search does after a tile (knn_dev_next_step). */
typedef enum {
    KNN_RUNG_STAY = 0,
    KNN_RUNG_REFINE, /* refine TF32 candidates from now on */
    KNN_RUNG_CLIMB,  /* the next arithmetic from now on (knn_dev_climb) */
    KNN_RUNG_LOCAL,  /* local frames for the rows not yet done */
    KNN_RUNG_UNLOCAL /* local frames were crowded: the device's rows
                        again from the first, a rung higher */
} knn_rung_step;

/* knn_gpu_team.cu: arrives at a meeting of the devices (`met`) and waits
 * until `target` have; a stop ends the wait (KNN_E_INTERRUPTED), and so,
 * where left is given, does a device's leaving a shared walk (*left its
 * reason). */
knn_status knn_team_meet(knn_gpu_dev *d, std::atomic<int> *met, int target,
                         int *left);

/* knn_gpu_upload.cu: the device's nodes, uploaded (shared among devices
 * that read each other's memory) and prepared; whether it reads every
 * other device's memory; its word that it reads no other's upload any
 * more (on every path, once). */
knn_status knn_dev_prepare(knn_gpu_dev *d);
int knn_dev_reads_peers(const knn_gpu_dev *d);
void knn_upload_release(knn_gpu_dev *d);

/* knn_gpu_plan.cu: plans the row tile (on the path the policy chose) and
 * allocates the tile's buffers; the same on the panel path for at most
 * `rows` rows set apart (knn_gpu_apart); frees them. */
knn_status knn_dev_plan(knn_gpu_dev *d);
knn_status knn_dev_plan_tiles(knn_gpu_dev *d);
knn_status knn_dev_plan_apart(knn_gpu_dev *d, int rows);
void knn_tiles_free(knn_gpu_tiles *t);
/* Candidate slot arrays for n_slots slots, and the sort's scratch for a
 * full tile or `min_temp` bytes, whichever is more; and their release. */
knn_status knn_slots_alloc(knn_gpu_dev *d, int64_t n_slots,
                           size_t min_temp);
void knn_slots_free(knn_gpu_tiles *t);
/* The fused path's survivor buffer of n slots; and its release. */
knn_status knn_survivors_alloc(knn_gpu_dev *d, int64_t n);
void knn_survivors_free(knn_gpu_tiles *t);
/* Uniform slots for the tiles after a local fused tile that ran again
 * for its slots, grown to what its rows needed (cand and surv: the most
 * candidates and first-run survivors of a row), where memory allows and
 * the request set no budget of its own (knngpu.gpu.memory, which the plan
 * has spent). The device is idle. Never fails: where growing does not
 * fit, the slots stay, and the tiles grow no more. */
knn_status knn_grow_uniform(knn_gpu_dev *d, int cand, int surv);
/* Waits until both of the device's streams are idle. */
knn_status knn_dev_idle(knn_gpu_dev *d);

/* knn_gpu_policy.cu: the one change of a device's course; whether the device
 * is on the fused path (a shared walk's too), whether a slot's tile ran the
 * fused kernel or gathered a walk's lists; and the choices that read the
 * course. Whether a search on the fused path would take a shared walk in
 * tiles of `rows` rows (0: any); whether the `over` rows of slot sl that
 * overflowed their slots go apart (knn_gpu_apart; the tile's run took
 * `seconds`), and whether a shared walk with `lost` nodes lost is left;
 * whether a tile in `gemm` may refine its TF32 candidates in float32; the
 * selection kernel of a panel tile of `rows` rows, and whether it refines; a
 * slot's TF32 candidates before any refinement, given `found` after it; what
 * the search does after the tile in slot sl (found: its rows' candidates;
 * overflow: a row overflowed its slots). */
void knn_course_set(knn_gpu_dev *d, knn_course next);
/* Whether the request's work ends in milliseconds on one device; how many
 * of `visible` GPUs a request that left them to the engine uses. */
int knn_work_is_small(const knn_request *req);
size_t knn_devices_wanted(const knn_request *req, size_t visible);
/* The course with one thing changed: the path; TF32 candidates refined
 * from now on; no shared walk any more. */
void knn_course_path(knn_gpu_dev *d, knn_gpu_path path);
void knn_course_refine(knn_gpu_dev *d);
void knn_course_refuse_walk(knn_gpu_dev *d);
int knn_dev_fused(const knn_gpu_dev *d);
int knn_slot_fused(const knn_gpu_slot *sl);
int knn_slot_gathered(const knn_gpu_slot *sl);
int knn_dev_could_pair(const knn_gpu_dev *d, int rows);
int knn_rows_go_apart(const knn_gpu_dev *d, const knn_gpu_slot *sl,
                      int over, double seconds);
int knn_walk_too_lossy(const knn_gpu_dev *d, int lost);
int knn_refine_possible(const knn_gpu_dev *d, knn_gemm_mode gemm);
knn_select_algo knn_tile_algo(const knn_gpu_dev *d, int rows);
int knn_tile_refined(const knn_gpu_dev *d, int rows, knn_gemm_mode gemm);
double knn_slot_wide(const knn_gpu_slot *sl, double found);
knn_rung_step knn_dev_next_step(const knn_gpu_dev *d,
                                const knn_gpu_slot *sl, double found,
                                int overflow);

/* knn_gpu_loop.cu: the pipeline of the device's row tiles. The row tiles
 * of its query rows, starting with a probe of one wave where `probe`;
 * leaving the fused path for the panel path, refining or climbing as
 * `step` (a knn_rung_step) says, with the tiles planned again. And the
 * pieces a shared walk's tiles share with the pipeline: a tile's
 * selection arguments (rows from global query row row0, node node0, slot
 * offsets, arithmetic); the fused kernel's scratch with these survivor
 * slots; a device-to-host copy on the stream; the course a slot's tile
 * runs on; the candidates of a slot's rows. The rows apart of a device
 * (knn_gpu_apart) are searched at the end of knn_dev_tiles. */
knn_status knn_dev_tiles(knn_gpu_dev *d, int probe);
/* Rows apart: the device's query row `row` joins them (once); their
 * arrays' release. */
knn_status knn_apart_add(knn_gpu_dev *d, int row);
void knn_apart_free(knn_gpu_apart *a);
knn_status knn_dev_leave_fused(knn_gpu_dev *d, int step);
knn_select_args knn_tile_select_args(const knn_gpu_dev *d, int row0,
                                     int node0, int rows,
                                     const int *offsets, knn_gemm_mode gemm);
knn_fused_scratch knn_fused_scratch_of(const knn_gpu_tiles *t,
                                       const int *surv_offsets,
                                       float *bound, int seeded);
knn_status knn_copy_back(knn_gpu_dev *d, void *dst, const void *src,
                         size_t bytes);
void knn_slot_begin(const knn_gpu_dev *d, knn_gpu_slot *sl, int row0,
                    int rows, int slots, int surv_slots);
double knn_slot_found(const knn_gpu_slot *sl);

/* knn_gpu_local.cu: local frames. Going local from row `row` (the tiles
 * in flight dropped; where the arrays do not fit, the search climbs
 * instead); leaving them for the plain course from the device's first
 * row; the frame of a tile of the spatial order, on the stream (the
 * nodes of its rows at d_nodes): the nodes view whose rows start at
 * n_ref, and on the fused path its pruned walk (*prune; col_node NULL
 * where the walk is plain); freeing the arrays. */
knn_status knn_dev_go_local(knn_gpu_dev *d, int row);
knn_status knn_dev_leave_local(knn_gpu_dev *d);
knn_status knn_local_frame(knn_gpu_dev *d, const int *d_nodes, int rows,
                           const knn_gpu_nodes **view,
                           knn_fused_prune *prune);
void knn_local_free(knn_gpu_local *lf);
/* The rows of a tile from row `row`, at most `rows`: in the spatial
 * order, up to the next subtree's start. */
int knn_local_tile_rows(const knn_gpu_dev *d, int row, int rows);
/* Whether the device's search may take local frames: a distance metric of
 * products, its arithmetic left to the engine, split TF32 now. */
int knn_local_possible(const knn_gpu_dev *d);

/* knn_gpu_walk.cu: the shared walk. Several devices agree on one (each
 * says whether its plan took one; they walk together only where all did,
 * and a device that planned one alone plans again without it). The walk
 * of every tile: *left gets why it was left (a knn_rung_step where the
 * search must refine or climb, -1 where too many nodes are lost), 0 when
 * it is done. Several devices, after the walk: each takes the others'
 * lists of its rows' nodes (*left as the walk's). A walk done: the lost
 * nodes of the device's rows join its rows apart. Leaving a walk that
 * could not finish: the search starts again from its first row. A device
 * done reading the others' lists: where they read its own, it waits until
 * every device is done with them. */
knn_status knn_team_agree(knn_gpu_dev *d);
knn_status knn_pairs_walk_all(knn_gpu_dev *d, int *left);
knn_status knn_team_exchange(knn_gpu_dev *d, int *left);
knn_status knn_walk_set_apart(knn_gpu_dev *d);
knn_status knn_dev_leave_pairs(knn_gpu_dev *d, int left);
void knn_team_release(knn_gpu_dev *d);

#endif
