/*
 * gpu-harness.c: checks and times the CUDA backend without R, on the GPU
 * machine (tools/device-check.sh builds and runs it).
 *
 *   gpu-harness check        parity of knn_gpu_search() with a plain float64
 *                            reference built on knn_exact.h, for every
 *                            metric, many k, self and query search, tied
 *                            data, small budgets, every selection path,
 *                            a two-block split; an interrupt, a
 *                            memory check and the release of what a search
 *                            keeps. Prints one line per case, then a summary.
 *   gpu-harness bench N P K METRIC [NQ]
 *                            engine-only timing on N(0,1) data (seed 1);
 *                            NQ > 0: search of NQ queries in N references.
 *
 * The reference ranks exactly as knn.h defines (reported distances of the
 * canonical keys, ascending, ties by the smaller index) by sorting every row in full, so it shares no
 * code with the backend beyond knn_exact.h's arithmetic.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include "knn_backend.h"
#include "knn_exact.h"

double knn_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static const char *metric_name[] = {"pearson", "cosine", "euclidean",
                                    "spearman", "abspearson", "manhattan",
                                    "sqeuclidean"};

static uint64_t rng_state = 1;

static double rng_unif(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_norm(void)
{
    return sqrt(-2.0 * log(rng_unif())) * cos(6.283185307179586 * rng_unif());
}

/* ---- reference -------------------------------------------------------- */

typedef struct {
    double key;
    int index;
} ref_pair;

static int ref_cmp(const void *a, const void *b)
{
    const ref_pair *x = a, *y = b;
    if (x->key < y->key) return -1;
    if (x->key > y->key) return 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Canonical nodes: u, sum, css (correlations) or as given (distances). */
static void ref_canon(knn_metric m, const double *x, int p, int n,
                      double *u, double *sum, double *css)
{
    double *tmp = malloc(sizeof(double) * p);
    for (int j = 0; j < n; j++) {
        const double *xj = x + (size_t)j * p;
        double *uj = u + (size_t)j * p;
        if (knn_is_correlation(m)) {
            for (int f = 0; f < p; f++)
                tmp[f] = m == KNN_SPEARMAN ? knn_rank2(xj, p, f) : xj[f];
            knn_canon_corr(m, tmp, p, uj, &sum[j], &css[j]);
        } else {
            for (int f = 0; f < p; f++) uj[f] = xj[f];
        }
    }
    free(tmp);
}

/* Full reference: rows x kmax column-major index/distance/weight. */
static void ref_search(knn_metric m, const double *ref, int n_ref,
                       const double *query, int n_query, int p, int kmax,
                       int *index, double *distance, double *weight)
{
    int self = query == NULL;
    int nq = self ? n_ref : n_query;
    double *ur = malloc(sizeof(double) * p * n_ref);
    double *sr = malloc(sizeof(double) * n_ref), *cr = malloc(sizeof(double) * n_ref);
    ref_canon(m, ref, p, n_ref, ur, sr, cr);
    double *uq = ur, *sq = sr, *cq = cr;
    if (!self) {
        uq = malloc(sizeof(double) * p * n_query);
        sq = malloc(sizeof(double) * n_query);
        cq = malloc(sizeof(double) * n_query);
        ref_canon(m, query, p, n_query, uq, sq, cq);
    }
#pragma omp parallel for schedule(dynamic, 8)
    for (int i = 0; i < nq; i++) {
        ref_pair *pairs = malloc(sizeof(ref_pair) * n_ref);
        int c = 0;
        const double *ui = uq + (size_t)i * p;
        for (int j = 0; j < n_ref; j++) {
            if (self && j == i) continue;
            const double *uj = ur + (size_t)j * p;
            pairs[c].key = knn_key_distance(m, knn_is_correlation(m)
                ? knn_key_corr(m, ui, uj, p, sq[i], cq[i], sr[j], cr[j])
                : knn_key_dist(m, ui, uj, p));
            pairs[c].index = j;
            c++;
        }
        qsort(pairs, c, sizeof(ref_pair), ref_cmp);
        for (int r = 0; r < kmax; r++) {
            size_t at = (size_t)r * nq + i;
            index[at] = pairs[r].index;
            const double *uj = ur + (size_t)pairs[r].index * p;
            double key = knn_is_correlation(m)
                ? knn_key_corr(m, ui, uj, p, sq[i], cq[i], sr[pairs[r].index],
                               cr[pairs[r].index])
                : knn_key_dist(m, ui, uj, p);
            knn_key_output(m, key, &distance[at], &weight[at]);
        }
        free(pairs);
    }
    free(ur);
    free(sr);
    free(cr);
    if (!self) {
        free(uq);
        free(sq);
        free(cq);
    }
}

/* ---- cases ------------------------------------------------------------ */

static int n_pass = 0, n_fail = 0;

typedef struct {
    int polls, stop_after;
} poll_ctx;

static int poll_interrupted(void *ctx)
{
    poll_ctx *c = ctx;
    return ++c->polls > c->stop_after;
}

static void no_progress(void *ctx, double done, double total)
{
    (void)ctx;
    (void)done;
    (void)total;
}

/* What the next requests force (check_case and check_metric set them):
 * the knobs of every search, and its arithmetic. */
static knn_knobs knobs;
static knn_precision force_gemm = KNN_PRECISION_AUTO;

static knn_request make_request(knn_metric m, const double *ref, int n_ref,
                                const double *query, int n_query, int p,
                                int k, double budget, int n_dev,
                                const int *devs)
{
    knn_request req;
    memset(&req, 0, sizeof req);
    req.metric = m;
    req.p = p;
    req.k = k;
    req.ref = ref;
    req.n_ref = n_ref;
    req.query = query;
    req.n_query = n_query;
    req.memory_bytes = budget;
    req.n_devices = n_dev;
    for (int i = 0; i < n_dev; i++) req.devices[i] = devs[i];
    req.cb.progress = no_progress;
    req.precision = force_gemm;
    return req;
}

/* edges: the result in edge order (row-major) with 1-based indices, as
 * knnGraph asks for it; else column-major and 0-based. */
static knn_status gpu_run(knn_metric m, const double *ref, int n_ref,
                          const double *query, int n_query, int p, int k,
                          double budget, int n_dev, const int *devs,
                          int edges, int *index, double *distance,
                          double *weight, knn_report *rep)
{
    knn_request req = make_request(m, ref, n_ref, query, n_query, p, k,
                                   budget, n_dev, devs);
    knn_result out = {index, distance, weight, edges, edges};
    memset(rep, 0, sizeof *rep);
    return knn_gpu_search(&req, &knobs, &out, rep);
}

/* The three result arrays of a search, nk elements each. */
static void alloc_results(size_t nk, int **index, double **distance,
                          double **weight)
{
    *index = malloc(sizeof(int) * nk);
    *distance = malloc(sizeof(double) * nk);
    *weight = malloc(sizeof(double) * nk);
}

/* GPU 0's free memory as a search counts it: with what its pool keeps
 * idle for the next search (knn_gpu_context.cu). */
static size_t gpu0_free(void)
{
    knn_gpu_info info;
    knn_gpu_query(&info);
    cudaSetDevice(0);
    return (size_t)info.device[0].memory_free;
}

static void free_results(int *index, double *distance, double *weight)
{
    free(index);
    free(distance);
    free(weight);
}

/* Compares GPU output for k with the reference's first k columns. */
static void check_case(const char *data, knn_metric m, const double *ref,
                       int n_ref, const double *query, int n_query, int p,
                       int k, double budget, int n_dev, const int *devs,
                       const char *select, int edges, const int *ri,
                       const double *rd, const double *rw)
{
    int nq = query ? n_query : n_ref;
    size_t nk = (size_t)nq * k;
    int *gi;
    double *gd, *gw;
    alloc_results(nk, &gi, &gd, &gw);
    for (size_t t = 0; t < nk; t++) {
        gi[t] = -7;
        gd[t] = gw[t] = NAN;
    }
    knobs.select = !select ? KNN_SELECT_CHOOSE
                 : strcmp(select, "warp") == 0 ? KNN_SELECT_FORCE_WARP
                 : strcmp(select, "fused") == 0 ? KNN_SELECT_FORCE_FUSED
                 : strcmp(select, "fused_rows") == 0
                     ? KNN_SELECT_FORCE_FUSED_ROWS
                 : KNN_SELECT_FORCE_RADIX;
    knn_report rep;
    double t0 = knn_seconds();
    knn_status st = gpu_run(m, ref, n_ref, query, n_query, p, k, budget,
                            n_dev, devs, edges, gi, gd, gw, &rep);
    double secs = knn_seconds() - t0;
    long bad = 0, first = -1;
    if (st == KNN_OK) {
        for (size_t t = 0; t < nk; t++) {
            size_t at = edges ? (t % nq) * k + t / nq : t;
            int ok = gi[at] == ri[t] + edges &&
                memcmp(&gd[at], &rd[t], sizeof(double)) == 0 &&
                memcmp(&gw[at], &rw[t], sizeof(double)) == 0;
            if (!ok && first < 0) first = (long)t;
            bad += !ok;
        }
    }
    int pass = st == KNN_OK && bad == 0;
    pass ? n_pass++ : n_fail++;
    const char *gemm = force_gemm == KNN_PRECISION_FP32 ? "fp32"
                     : force_gemm == KNN_PRECISION_TF32 ? "tf32"
                     : force_gemm == KNN_PRECISION_TF32X3 ? "tf32x3"
                     : force_gemm == KNN_PRECISION_FP64 ? "fp64" : NULL;
    printf("%s %-6s %-11s %s k=%-5d n=%d p=%d budget=%.0f dev=%d sel=%s "
           "gemm=%s out=%s tile=%d cand=%.1f once=%d %.3fs [%.6s%s]",
           pass ? "PASS" : "FAIL", data, metric_name[m],
           query ? "query" : "self ", k, n_ref, p, budget, n_dev,
           select ? select : "auto", gemm ? gemm : "auto",
           edges ? "edges" : "matrix", rep.row_tile, rep.candidates,
           rep.pairs_once, secs,
           rep.precision, strstr(rep.precision, "then") ? " climbed" : "");
    if (st != KNN_OK) printf(" status=%d %s", (int)st, rep.message);
    if (bad) {
        long r = first % nq, c = first / nq;
        size_t at = edges ? (size_t)r * k + c : (size_t)first;
        printf(" mismatches=%ld first row=%ld rank=%ld gpu=(%d,%.17g) "
               "ref=(%d,%.17g)", bad, r, c, gi[at], gd[at], ri[first],
               rd[first]);
    }
    printf("\n");
    fflush(stdout);
    free_results(gi, gd, gw);
}

/* At least the bytes of a shared walk's per-node arrays (knn_pairs_bytes:
 * k scores, a threshold, a list of up to 2 (2k + 256) entries of 8 bytes
 * and three ints a node), which come out of a search's budget. */
static double pairs_bytes_max(int n, int k)
{
    return (double)n * (4.0 * k + 16.0 * (2 * k + 256) + 16.0) + 4096.0;
}

static void check_metric(const char *data, knn_metric m, const double *ref,
                         int n_ref, const double *query, int n_query, int p,
                         const int *ks, int nks, int extras)
{
    int nq = query ? n_query : n_ref;
    int kmax = 0;
    for (int i = 0; i < nks; i++) kmax = ks[i] > kmax ? ks[i] : kmax;
    size_t nk = (size_t)nq * kmax;
    int *ri = malloc(sizeof(int) * nk);
    double *rd = malloc(sizeof(double) * nk), *rw = malloc(sizeof(double) * nk);
    ref_search(m, ref, n_ref, query, n_query, p, kmax, ri, rd, rw);
    int dev0[2] = {0, 0};
    for (int i = 0; i < nks; i++) {
        int k = ks[i];
        /* The reference's first k columns are the top k: column-major with
         * nq rows, so a prefix of the array. */
        check_case(data, m, ref, n_ref, query, n_query, p, k, 0, 0, NULL,
                   NULL, 0, ri, rd, rw);
        if (extras) {
            check_case(data, m, ref, n_ref, query, n_query, p, k, 2e6, 0,
                       NULL, "radix", 0, ri, rd, rw);
            if (k <= 32)
                check_case(data, m, ref, n_ref, query, n_query, p, k, 5e5, 0,
                           NULL, "warp", 0, ri, rd, rw);
            /* The fused kernel (products and selection in one; the panel
             * path where it cannot run): one tile, then many, where a
             * self search computes each pair once, and many with every
             * row walking every node. */
            check_case(data, m, ref, n_ref, query, n_query, p, k, 0, 0, NULL,
                       "fused", 0, ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k,
                       2e6 + pairs_bytes_max(n_ref, k), 0, NULL, "fused", 0,
                       ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k, 2e6, 0,
                       NULL, "fused_rows", 0, ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k, 3e6, 2,
                       dev0, "fused", 1, ri, rd, rw);
            /* Two devices with room for a shared walk (lists, and the
             * staging a device needs where it cannot read the other's). */
            check_case(data, m, ref, n_ref, query, n_query, p, k,
                       2e6 + 1.6 * pairs_bytes_max(n_ref, k), 2, dev0,
                       "fused", 0, ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k, 3e6, 2,
                       dev0, NULL, 0, ri, rd, rw);
            /* Edge order: one tile, then several tiles on two devices. */
            check_case(data, m, ref, n_ref, query, n_query, p, k, 0, 0, NULL,
                       NULL, 1, ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k, 3e6, 2,
                       dev0, NULL, 1, ri, rd, rw);
            /* Forced arithmetic: float32, split TF32 and float64 (one
             * tile, then several on two devices), and TF32 without the
             * climb, for every metric. */
            force_gemm = KNN_PRECISION_FP32;
            check_case(data, m, ref, n_ref, query, n_query, p, k, 0, 0, NULL,
                       NULL, 0, ri, rd, rw);
            force_gemm = KNN_PRECISION_FP64;
            check_case(data, m, ref, n_ref, query, n_query, p, k, 0, 0, NULL,
                       NULL, 0, ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k, 3e6, 2,
                       dev0, NULL, 1, ri, rd, rw);
            force_gemm = KNN_PRECISION_TF32X3;
            check_case(data, m, ref, n_ref, query, n_query, p, k, 0, 0, NULL,
                       NULL, 0, ri, rd, rw);
            check_case(data, m, ref, n_ref, query, n_query, p, k, 3e6, 2,
                       dev0, NULL, 0, ri, rd, rw);
            force_gemm = KNN_PRECISION_TF32;
            check_case(data, m, ref, n_ref, query, n_query, p, k, 2e6, 0,
                       NULL, NULL, 0, ri, rd, rw);
            force_gemm = KNN_PRECISION_AUTO;
        }
    }
    free(ri);
    free(rd);
    free(rw);
}

static double *random_data(int p, int n)
{
    double *x = malloc(sizeof(double) * p * n);
    for (size_t t = 0; t < (size_t)p * n; t++) x[t] = rng_norm();
    return x;
}

/* Small integers 0..3 with every fourth node a copy of an earlier one: heavy
 * ties, duplicates at distance 0; no constant node. */
static double *tied_data(int p, int n)
{
    double *x = malloc(sizeof(double) * p * n);
    for (int j = 0; j < n; j++) {
        double *xj = x + (size_t)j * p;
        if (j % 4 == 3) {
            memcpy(xj, x + (size_t)(j / 2) * p, sizeof(double) * p);
            continue;
        }
        for (int f = 0; f < p; f++) xj[f] = floor(4.0 * rng_unif());
        xj[0] = 0.0;
        xj[1] = 1.0;
    }
    return x;
}

/* Nine distinct nodes (x0 = 0, x1 = 1, two values in 0..2) over n nodes:
 * tie groups larger than the uniform candidate slots, so rows overflow and
 * the tile is run again with exact slots. */
static double *heavy_data(int n)
{
    double *x = malloc(sizeof(double) * 4 * n);
    for (int j = 0; j < n; j++) {
        x[4 * j] = 0.0;
        x[4 * j + 1] = 1.0;
        x[4 * j + 2] = floor(3.0 * rng_unif());
        x[4 * j + 3] = floor(3.0 * rng_unif());
    }
    return x;
}

/* Nodes at levels spread over 0..100 with noise of 0.01: neighbours are
 * close against the nodes' norms, so TF32 candidates overflow their slots
 * and a distance search goes on in float32 (after its first tile, or with
 * that tile run again). */
static double *levels_data(int p, int n)
{
    double *x = malloc(sizeof(double) * p * n);
    for (int j = 0; j < n; j++) {
        double level = 100.0 * rng_unif();
        for (int f = 0; f < p; f++)
            x[(size_t)j * p + f] = level + 0.01 * rng_norm();
    }
    return x;
}

/* Three clusters of copies of a profile, each copy moved by noise of sd
 * 1e-4: neighbours differ inside float32's margins and far outside
 * float64's, so a search climbs from TF32 through split TF32 to float64
 * (after its first tile, or with tiles run again). */
static double *clusters_data(int p, int n)
{
    double *x = malloc(sizeof(double) * p * n), centre[3][64];
    for (int c = 0; c < 3; c++)
        for (int f = 0; f < p && f < 64; f++) centre[c][f] = rng_norm();
    for (int j = 0; j < n; j++)
        for (int f = 0; f < p; f++)
            x[(size_t)j * p + f] = centre[j % 3][f % 64] + 1e-4 * rng_norm();
    return x;
}

/* The runtime checks' common case: a self search of n random nodes of p
 * features for k neighbours on device 0, with room for its results. */
typedef struct {
    int n, p, k;
    double *x;
    int *index;
    double *distance, *weight;
} self_case;

static self_case self_case_make(int n, int p, int k)
{
    self_case c = {n, p, k, random_data(p, n), NULL, NULL, NULL};
    alloc_results((size_t)n * k, &c.index, &c.distance, &c.weight);
    return c;
}

static knn_status self_case_run(const self_case *c, knn_report *rep)
{
    int dev0 = 0;
    return gpu_run(KNN_EUCLIDEAN, c->x, c->n, NULL, 0, c->p, c->k, 0, 1,
                   &dev0, 0, c->index, c->distance, c->weight, rep);
}

static void self_case_free(self_case *c)
{
    free(c->x);
    free_results(c->index, c->distance, c->weight);
}

/* A search stopped at its second poll: one device and a small budget
 * (many tiles), or GPU 0 twice with the whole GPU (a shared walk, which
 * the devices leave from their walk, from a meeting or from the
 * exchange of lists), large enough to outlast the poll. */
static void check_interrupt(int n, int n_dev, double budget)
{
    self_case c = self_case_make(n, 64, 10);
    int dev0[2] = {0, 0};
    knn_request req = make_request(KNN_EUCLIDEAN, c.x, c.n, NULL, 0, c.p,
                                   c.k, budget, n_dev, dev0);
    poll_ctx pc = {0, 2};
    req.cb.interrupted = poll_interrupted;
    req.cb.ctx = &pc;
    knn_result out = {c.index, c.distance, c.weight, 0, 0};
    knn_report rep;
    size_t free0 = 0, free1 = 0, total = 0;
    cudaSetDevice(0);
    free0 = gpu0_free();
    double t0 = knn_seconds();
    memset(&rep, 0, sizeof rep);
    knn_status st = knn_gpu_search(&req, &knobs, &out, &rep);
    double secs = knn_seconds() - t0;
    free1 = gpu0_free();
    int pass = st == KNN_E_INTERRUPTED && free0 == free1;
    pass ? n_pass++ : n_fail++;
    printf("%s interrupt, %d device(s): status=%d (%s) after %.3fs, %d "
           "polls; device free before %zu after %zu\n",
           pass ? "PASS" : "FAIL", n_dev, (int)st, rep.message, secs,
           pc.polls, free0, free1);
    self_case_free(&c);
}

/* With device 0 nearly full, a search must fail with KNN_E_NOMEM and a
 * reason, not crash, and leave the device's free memory as it found it
 * (checked on the second of two runs: the first may leave what CUDA and
 * cuBLAS keep for the process, as the interrupt check allows too). */
static void check_out_of_memory(void)
{
    self_case c = self_case_make(300000, 64, 10);
    size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
    void *hog = NULL;
    /* Nothing kept from earlier searches: the device is as full as the
     * hog makes it. */
    knn_gpu_release();
    cudaSetDevice(0);
    cudaMemGetInfo(&free0, &total);
    /* Leaves 64 MB: less than the 154 MB input. */
    int hogged = cudaMalloc(&hog, free0 - ((size_t)64 << 20)) == cudaSuccess;
    knn_report rep;
    knn_status st = KNN_OK;
    for (int run = 0; run < 2; run++) {
        free1 = gpu0_free();
        st = self_case_run(&c, &rep);
        free2 = gpu0_free();
        printf("  out of memory, run %d: device free before %zu after %zu\n",
               run + 1, free1, free2);
    }
    cudaFree(hog);
    int pass = hogged && st == KNN_E_NOMEM && rep.message[0] != '\0' &&
               free1 == free2;
    pass ? n_pass++ : n_fail++;
    printf("%s out of memory: status=%d (%s); device free before %zu after "
           "%zu\n", pass ? "PASS" : "FAIL", (int)st, rep.message, free1,
           free2);
    self_case_free(&c);
}

/* A search keeps the device's stream, cuBLAS handle and staging for the
 * next one, and knn_gpu_release() frees them: the device's free memory
 * after a search and a release is the same every time, and no more than
 * while the context is kept. */
static void check_release(void)
{
    self_case c = self_case_make(2000, 16, 5);
    size_t released1 = 0, kept = 0, released2 = 0, total = 0;
    knn_report rep;
    cudaSetDevice(0);
    knn_status st1 = self_case_run(&c, &rep);
    knn_gpu_release();
    cudaMemGetInfo(&released1, &total);
    knn_status st2 = self_case_run(&c, &rep);
    cudaMemGetInfo(&kept, &total);
    knn_gpu_release();
    cudaMemGetInfo(&released2, &total);
    int pass = st1 == KNN_OK && st2 == KNN_OK && released1 == released2 &&
               kept <= released2;
    pass ? n_pass++ : n_fail++;
    printf("%s release: device free after release %zu and %zu, while kept "
           "%zu (%.1f MB kept)\n", pass ? "PASS" : "FAIL", released1,
           released2, kept, ((double)released2 - (double)kept) / 1048576.0);
    self_case_free(&c);
}

/* What a caller that allocates its result late hands the engine
 * (knn_result.allocate), and how often it was asked. */
typedef struct {
    int *index;
    double *distance, *weight;
    int fail, calls;
} late_arrays;

static int late_allocate(void *ctx, knn_result *out)
{
    late_arrays *a = ctx;
    a->calls++;
    if (a->fail) return 1;
    out->index = a->index;
    out->distance = a->distance;
    out->weight = a->weight;
    return 0;
}

/* A result allocated late, while the device searches on a thread of its
 * own: the bits of arrays given at the start, the allocator asked once;
 * one that cannot be allocated stops the search (KNN_E_INTERRUPTED) and
 * leaves the device's free memory as it found it. */
static void check_late_result(void)
{
    self_case c = self_case_make(100000, 16, 10);
    size_t nk = (size_t)c.n * c.k;
    late_arrays a = {NULL, NULL, NULL, 0, 0};
    alloc_results(nk, &a.index, &a.distance, &a.weight);
    knn_report rep;
    knn_status st0 = self_case_run(&c, &rep);
    int dev0 = 0;
    knn_request req = make_request(KNN_EUCLIDEAN, c.x, c.n, NULL, 0, c.p,
                                   c.k, 0, 1, &dev0);
    knn_result out;
    memset(&out, 0, sizeof out);
    out.allocate = late_allocate;
    out.allocate_ctx = &a;
    knn_status st1 = knn_gpu_search(&req, &knobs, &out, &rep);
    int same = st0 == KNN_OK && st1 == KNN_OK && a.calls == 1 &&
               memcmp(a.index, c.index, nk * sizeof(int)) == 0 &&
               memcmp(a.distance, c.distance, nk * sizeof(double)) == 0 &&
               memcmp(a.weight, c.weight, nk * sizeof(double)) == 0;
    size_t free0 = 0, free1 = 0, total = 0;
    cudaSetDevice(0);
    free0 = gpu0_free();
    memset(&out, 0, sizeof out);
    out.allocate = late_allocate;
    out.allocate_ctx = &a;
    a.fail = 1;
    knn_status st2 = knn_gpu_search(&req, &knobs, &out, &rep);
    free1 = gpu0_free();
    int pass = same && st2 == KNN_E_INTERRUPTED && a.calls == 2 &&
               free0 == free1;
    pass ? n_pass++ : n_fail++;
    printf("%s late result: same bits %d; refused: status=%d (%s), device "
           "free before %zu after %zu\n", pass ? "PASS" : "FAIL", same,
           (int)st2, rep.message, free0, free1);
    free_results(a.index, a.distance, a.weight);
    self_case_free(&c);
}

/* The last progress a search reported. */
static void last_progress(void *ctx, double done, double total)
{
    (void)total;
    *(double *)ctx = done;
}

/* A self search shared by two devices (one GPU twice): each walks its
 * share of every tile's rows and takes the other's lists of its rows'
 * nodes, read directly or (knobs.stage_peers, as between GPUs that
 * cannot read each other's memory) copied through its staging buffer.
 * Either way the walk is shared (pairs_once) and gives one device's bits,
 * and the progress ends at the rows' number. */
static void check_shared_walk(void)
{
    int n = 6000, p = 32, k = 10, dev0[2] = {0, 0};
    double *x = random_data(p, n);
    size_t nk = (size_t)n * k;
    const knn_metric metrics[] = {KNN_EUCLIDEAN, KNN_PEARSON};
    /* run 0: one device; 1: two, lists read; 2: two, lists staged */
    for (int i = 0; i < 2; i++) {
        int *gi[3];
        double *gd[3], *gw[3];
        knn_report rep[3];
        knn_status st[3];
        double done[3];
        knobs.select = KNN_SELECT_FORCE_FUSED;
        for (int r = 0; r < 3; r++) {
            done[r] = -1.0;
            alloc_results(nk, &gi[r], &gd[r], &gw[r]);
            knn_request req = make_request(
                metrics[i], x, n, NULL, 0, p, k,
                2e6 + 1.6 * pairs_bytes_max(n, k), r ? 2 : 1, dev0);
            req.cb.progress = last_progress;
            req.cb.ctx = &done[r];
            knn_result out = {gi[r], gd[r], gw[r], 0, 0};
            memset(&rep[r], 0, sizeof rep[r]);
            knobs.stage_peers = r == 2;
            st[r] = knn_gpu_search(&req, &knobs, &out, &rep[r]);
            knobs.stage_peers = 0;
        }
        knobs.select = KNN_SELECT_CHOOSE;
        for (int r = 1; r < 3; r++) {
            int same = st[0] == KNN_OK && st[r] == KNN_OK &&
                memcmp(gi[0], gi[r], nk * sizeof(int)) == 0 &&
                memcmp(gd[0], gd[r], nk * sizeof(double)) == 0 &&
                memcmp(gw[0], gw[r], nk * sizeof(double)) == 0;
            int pass = same && rep[0].pairs_once && rep[r].pairs_once &&
                       done[r] == (double)n;
            pass ? n_pass++ : n_fail++;
            printf("%s shared walk, two devices, %s, lists %s: same bits "
                   "%d, walked once %d/%d, tiles %d/%d, progress %.0f of "
                   "%d (%s)\n", pass ? "PASS" : "FAIL",
                   metric_name[metrics[i]], r == 1 ? "read" : "staged",
                   same, rep[0].pairs_once, rep[r].pairs_once,
                   rep[0].row_tile, rep[r].row_tile, done[r], n,
                   rep[r].message);
        }
        for (int r = 0; r < 3; r++) free_results(gi[r], gd[r], gw[r]);
    }
    free(x);
}

/* A value that is not finite, early or late in ref or in a query of a
 * large input: the upload finds it (KNN_E_NONFINITE) on one device and
 * on two (which share the upload of ref, each sending one half: the
 * first node is the first device's, the last the second's), and device
 * memory is as before. */
static void check_nonfinite(void)
{
    int n = 50000, p = 64, k = 5, nq = 100, dev0[2] = {0, 0};
    double *x = random_data(p, n), *q = random_data(p, nq);
    size_t nk = (size_t)nq * k;
    int *gi;
    double *gd, *gw;
    alloc_results(nk, &gi, &gd, &gw);
    const double bad_values[] = {NAN, INFINITY, -INFINITY};
    /* Clean runs first: what CUDA and cuBLAS load on first use of a kernel
     * stays for the process (see check_out_of_memory). */
    knn_report warm;
    for (int d = 1; d <= 2; d++)
        gpu_run(KNN_EUCLIDEAN, x, n, q, nq, p, k, 0, d, dev0, 0, gi, gd, gw,
                &warm);
    const char *place_name[] = {"ref's first node", "ref's last node",
                                "query"};
    for (int c = 0; c < 6; c++) {
        int place = c % 3, devices = 1 + c / 3;
        double bad = bad_values[(c + c / 3) % 3];
        double *where = place == 0   ? x + 1
                        : place == 1 ? x + (size_t)p * n - 2
                                     : q + (size_t)p * nq - 3;
        double keep = *where;
        *where = bad;
        size_t free0 = 0, free1 = 0, total = 0;
        knn_report rep;
        cudaSetDevice(0);
        free0 = gpu0_free();
        knn_status st = gpu_run(KNN_EUCLIDEAN, x, n, q, nq, p, k, 0,
                                devices, dev0, 0, gi, gd, gw, &rep);
        free1 = gpu0_free();
        *where = keep;
        int pass = st == KNN_E_NONFINITE && free0 == free1;
        pass ? n_pass++ : n_fail++;
        printf("%s non-finite %g in %s, %d device(s): status=%d (%s)\n",
               pass ? "PASS" : "FAIL", bad, place_name[place], devices,
               (int)st, rep.message);
    }
    free(x);
    free(q);
    free_results(gi, gd, gw);
}

static void check_all(void)
{
    knn_gpu_info info;
    knn_gpu_query(&info);
    printf("gpu: runtime %d driver %d devices %d reason '%s'\n",
           info.runtime_version, info.driver_version, info.n_devices,
           info.reason);
    for (int d = 0; d < info.n_devices; d++)
        printf("  %d: %s cc %d.%d %d SMs %.1f/%.1f GB free\n", d,
               info.device[d].name, info.device[d].major,
               info.device[d].minor, info.device[d].multiprocessors,
               info.device[d].memory_free / 1e9,
               info.device[d].memory_total / 1e9);

    int n = 1500, p = 37, n_ref = 900, n_q = 333;
    double *rnd = random_data(p, n);
    double *tie = tied_data(12, 1200);
    double *qry = random_data(p, n_q);
    int ks[] = {1, 5, 16, 33, 100, 1000, 1499};
    int kt[] = {1, 3, 16, 100, 1000, 1199};
    int kq[] = {1, 10, 100, 899};
    double *heavy = heavy_data(3000);
    int kh[] = {1, 16, 500};
    double *levels = levels_data(16, 3000);
    int kl[] = {1, 5, 40};
    check_metric("levels", KNN_EUCLIDEAN, levels, 3000, NULL, 0, 16, kl, 3,
                 1);
    check_metric("levels", KNN_SQEUCLIDEAN, levels, 3000, NULL, 0, 16, kl, 3,
                 1);
    free(levels);
    double *clusters = clusters_data(24, 3000);
    int kc[] = {1, 10};
    for (int m = 0; m < KNN_N_METRICS; m++)
        check_metric("clusters", (knn_metric)m, clusters, 3000, NULL, 0, 24,
                     kc, 2, 1);
    free(clusters);
    for (int m = 0; m < KNN_N_METRICS; m++) {
        check_metric("heavy", (knn_metric)m, heavy, 3000, NULL, 0, 4, kh, 3,
                     1);
        check_metric("random", (knn_metric)m, rnd, n, NULL, 0, p, ks, 7, 1);
        check_metric("tied", (knn_metric)m, tie, 1200, NULL, 0, 12, kt, 6, 1);
        check_metric("random", (knn_metric)m, rnd, n_ref, qry, n_q, p, kq, 4,
                     0);
    }
    check_interrupt(300000, 1, 2e8);
    check_interrupt(1000000, 2, 0);
    check_out_of_memory();
    check_release();
    check_late_result();
    check_shared_walk();
    check_nonfinite();
    printf("summary: %d passed, %d failed\n", n_pass, n_fail);
    free(rnd);
    free(heavy);
    free(tie);
    free(qry);
}

static void bench(int n, int p, int k, knn_metric m, int nq)
{
    double *ref = random_data(p, n);
    double *query = nq > 0 ? random_data(p, nq) : NULL;
    int rows = nq > 0 ? nq : n;
    size_t nk = (size_t)rows * k;
    int *gi;
    double *gd, *gw;
    alloc_results(nk, &gi, &gd, &gw);
    knn_report rep;
    /* KNNGPU_BENCH_DEVICES=N: GPU 0 listed N times (a split on one GPU),
     * else every GPU. */
    const char *env = getenv("KNNGPU_BENCH_DEVICES");
    int n_dev = env ? atoi(env) : 0, devs[KNN_MAX_DEVICES] = {0};
    if (n_dev < 0 || n_dev > KNN_MAX_DEVICES) n_dev = 0;
    for (int rep_i = 0; rep_i < 2; rep_i++) {
        double t0 = knn_seconds();
        knn_status st = gpu_run(m, ref, n, query, nq, p, k, 0, n_dev, devs,
                                0, gi, gd, gw, &rep);
        double secs = knn_seconds() - t0;
        printf("bench %s n=%d nq=%d p=%d k=%d: status=%d %.3f s (prepare "
               "%.3f search %.3f rerank %.3f) cand=%.1f tile=%dx%d once=%d "
               "%s\n",
               metric_name[m], n, nq, p, k, (int)st, secs,
               rep.seconds_prepare, rep.seconds_search, rep.seconds_rerank,
               rep.candidates, rep.row_tile, rep.col_tile, rep.pairs_once,
               st ? rep.message : rep.device);
        fflush(stdout);
    }
    free(ref);
    free(query);
    free_results(gi, gd, gw);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "check") == 0) {
        check_all();
        return n_fail > 0;
    }
    /* The shared walk of two devices alone: what device-check.sh runs
     * under compute-sanitizer (its R runs take one device). */
    if (argc >= 2 && strcmp(argv[1], "walk") == 0) {
        check_shared_walk();
        return n_fail > 0;
    }
    if (argc >= 6 && strcmp(argv[1], "bench") == 0) {
        int m = 0;
        while (m < KNN_N_METRICS && strcmp(metric_name[m], argv[5]) != 0) m++;
        if (m == KNN_N_METRICS) return 2;
        bench(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), (knn_metric)m,
              argc >= 7 ? atoi(argv[6]) : 0);
        return 0;
    }
    fprintf(stderr,
            "usage: gpu-harness check | walk | bench N P K METRIC [NQ]\n");
    return 2;
}
