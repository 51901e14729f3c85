/*
 * knn_gpu_tiles.cuh: one device's state during a search, driven by one
 * host thread from knn_gpu_search.cu: its nodes and buffers
 * (knn_gpu_plan.cu) and the loop over its row tiles (knn_gpu_loop.cu).
 */
#ifndef KNN_GPU_TILES_CUH
#define KNN_GPU_TILES_CUH

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>
#include "knn_gpu.cuh"

/* Where the devices of a search meet: once each has uploaded its slice
 * of the reference (knn_gpu_plan.cu), and to share a walk
 * (knn_gpu_loop.cu): to agree on it, and once each has walked. */
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

/* Counts a device in `count` once (*counted: whether it has been). */
static inline void knn_team_count_once(int *counted, std::atomic<int> *count)
{
    if (*counted) return;
    *counted = 1;
    (*count)++;
}

/* Waits until `devices` devices have counted themselves in `count`. No
 * stop ends the wait: each device counts itself on every path, its
 * thread's end included (knn_dev_free). */
static inline void knn_team_wait_all(const std::atomic<int> *count,
                                     int devices)
{
    while (*count < devices)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
}

/* What the calling thread and the device threads share. */
typedef struct {
    std::atomic<int> stop;            /* set by the caller: stop at the
                                         next tile */
    std::atomic<long long> rows_done; /* query rows finished, all devices */
    std::atomic<int> out_ready;       /* set by the caller: the result's
                                         arrays exist (knn_result.allocate)
                                         and may be written */
    knn_gpu_team team;
} knn_gpu_shared;

/* The caller's result arrays made resident, and a graph's ends written,
 * while the devices search (knn_gpu_pages.cu), once a first tile is done:
 * started once the arrays exist, joined after the devices (or, should an
 * exception leave first, on the way out: a joinable thread destroyed
 * would end the process). knn_pages_wrote_ends: whether the threads
 * wrote all of the ends (knn_result.ends_written). */
struct knn_pages;
void knn_pages_start(knn_pages *job, const knn_result *out, size_t entries,
                     int k, const knn_gpu_shared *shared);
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

/* One of the two pinned result slots: the host copies one out while the
 * device fills the other. */
typedef struct {
    int row0, rows;
    knn_gemm_mode gemm;     /* the arithmetic the tile ran with */
    int fused;              /* the tile ran on the fused path */
    int refined;            /* its selection may rescore TF32 candidates
                               in float32 (knn_gpu_select.cu, knn_refine) */
    int refine_select;      /* knn_gpu_dev's when it ran */
    int gathered;           /* its candidates came from a shared walk's
                               lists (knn_gpu_pairs.cu) */
    int *index, *count;
    int *wide;              /* TF32 candidates before the refinement */
    int *survivors;         /* fused: the slots each row needed */
    double *distance, *weight;
    /* The re-rank's results on the device, rows x k: each slot has its
     * own, so that their transfer (on the copy stream) overlaps the next
     * tile's work. */
    int *d_index;
    double *d_distance, *d_weight;
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
    /* The fused path's survivors (knn_gpu_fused.cu): their slots, uniform
     * or a redo's exact ones, the buffer (re-sized by a redo) and the
     * slots each row needed. */
    int surv_slots;
    int *surv_offsets_uniform, *surv_offsets_exact, *h_surv_offsets;
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
    int upload_released;    /* nor their uploads (knn_gpu_plan.cu) */
    int q0, nq;             /* query rows [q0, q0 + nq) */
    int self;
    int n_nodes;
    double query_max_abs;   /* distances, query search: max |query| */
    knn_score_kind score_kind;
    knn_gemm_mode gemm;
    int gemm_adaptive;      /* may still climb to a finer arithmetic */
    unsigned gemm_before;   /* the arithmetics it climbed from
                               (knn_gemm_bit) */
    int fp64_fast;          /* the device runs float64 at half float32's
                               rate or better: float64 may stand in for
                               split TF32 where its arrays do not fit */
    int fused;              /* tiles take the fused path (TF32 only) */
    int half_products;      /* a tile whose results were kept took the
                               fused path's fp16 products (nodes.half) */
    int refine_select;      /* TF32 found too many candidates for the
                               plain selection: tiles take the panel path
                               and the radix kernel, which refines them */
    int refined;            /* a tile's refinement dropped candidates */
    int wave_rows;          /* fused: rows of one full wave of blocks
                               (every SM holding all the blocks it can) */
    knn_pairs pairs;        /* a shared walk's per-node arrays (pairs.block
                               set: this search computes each pair once) */
    int pairs_refused;      /* a shared walk overflowed or did not fit:
                               not again */
    int gathering;          /* the walk is done: tiles gather its lists */
    int pairs_once;         /* the search ended with a shared walk */
    knn_gpu_context *ctx;   /* the device's stream, handle, staging */
    cudaStream_t stream;    /* ctx's */
    cudaStream_t copy_stream; /* ctx's: results to the host */
    cublasHandle_t blas;
    knn_gpu_nodes nodes;
    knn_gpu_tiles t;
    int row_tile;           /* the plan's R, kept after t is freed */
    int copy_threads;       /* host threads for the upload and for
                               copying results out */
    knn_status status;
    char message[512];
    double seconds_setup, seconds_prepare, seconds_search, seconds_rerank;
    double seconds_collect;
    double candidates;      /* candidates re-ranked, summed */
} knn_gpu_dev;

/* knn_gpu_plan.cu: uploads and prepares the device's nodes; plans the
 * row tile (and the path) and allocates the tile's buffers; frees them. */
knn_status knn_dev_prepare(knn_gpu_dev *d);
knn_status knn_dev_plan(knn_gpu_dev *d);
knn_status knn_dev_plan_tiles(knn_gpu_dev *d);
void knn_tiles_free(knn_gpu_tiles *t);
/* Candidate slot arrays for n_slots slots, and the sort's scratch for a
 * full tile or `min_temp` bytes, whichever is more; and their release. */
knn_status knn_slots_alloc(knn_gpu_dev *d, int64_t n_slots,
                           size_t min_temp);
void knn_slots_free(knn_gpu_tiles *t);
/* The fused path's survivor buffer of n slots; and its release. */
knn_status knn_survivors_alloc(knn_gpu_dev *d, int64_t n);
void knn_survivors_free(knn_gpu_tiles *t);
/* Waits until both of the device's streams are idle. */
knn_status knn_dev_idle(knn_gpu_dev *d);
void knn_dev_free(knn_gpu_dev *d);

/* knn_gpu_loop.cu: the row tiles of the device's query rows. */
knn_status knn_dev_search(knn_gpu_dev *d);
/* Arrives at a meeting of the devices (`met`) and waits until `target`
 * have; a stop ends the wait (KNN_E_INTERRUPTED), and so, where left is
 * given, does a device's leaving a shared walk (*left its reason). */
knn_status knn_team_meet(knn_gpu_dev *d, std::atomic<int> *met, int target,
                         int *left);
/* A device that shares a walk is done reading the others' lists; where
 * they may read its own, waits until every device is done with them (its
 * lists may then be freed). */
void knn_team_release(knn_gpu_dev *d);

#endif
