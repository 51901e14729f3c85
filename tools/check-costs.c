/*
 * check-costs.c: what the engine's checks before every search cost (src/
 * engine/knn_search.c): the sample for exact copies (knn_dedup_suits) and
 * the scan for nodes a correlation cannot use (knn_degenerate_nodes, for
 * Pearson; a distance metric has none to find). Microseconds, median of
 * `reps` calls, on uniform nodes of the references of inst/bench/small.R,
 * with the nodes in cache (warm) and after 64 MB of other writes (cold, as
 * after R's allocations between searches); "sparse" nodes are 90% zeros,
 * so that many share their leading features.
 *
 *   gcc -O2 -fopenmp -Isrc/engine -DKNN_NO_CUDA tools/check-costs.c \
 *       $(ls src/engine/*.c | grep -v knn_gpu_loader) -lblas -lm \
 *       -o /tmp/check-costs && /tmp/check-costs
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "knn.h"
#include "knn_dedup.h"

#define FLUSH_BYTES ((size_t)64 << 20)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *flush_buffer;

static void flush(void)
{
    for (size_t i = 0; i < FLUSH_BYTES; i += 64) flush_buffer[i]++;
}

static double median(double *t, int n)
{
    qsort(t, n, sizeof *t, by_value);
    return t[n / 2];
}

static void measure(int p, int n, int cold, int sparse, int reps)
{
    double *x = malloc((size_t)p * n * sizeof(double));
    double *t_copies = malloc(reps * sizeof(double));
    double *t_degenerate = malloc(reps * sizeof(double));
    if (!x || !t_copies || !t_degenerate) exit(1);
    srand(1);
    for (size_t i = 0; i < (size_t)p * n; i++) {
        x[i] = (double)rand() / RAND_MAX - 0.5;
        if (sparse && rand() % 10) x[i] = 0.0;
    }
    knn_request req;
    memset(&req, 0, sizeof req);
    req.ref = x;
    req.p = p;
    req.n_ref = n;
    req.k = 16;
    req.metric = KNN_PEARSON;
    knn_knobs knobs;
    memset(&knobs, 0, sizeof knobs);
    int found = 0;
    for (int r = 0; r < reps; r++) {
        if (cold) flush();
        double t0 = now();
        found += knn_dedup_suits(&req, &knobs);
        t_copies[r] = now() - t0;
        if (cold) flush();
        t0 = now();
        found += knn_degenerate_nodes(KNN_PEARSON, x, p, n, NULL, 0, 0);
        t_degenerate[r] = now() - t0;
    }
    printf("%6d nodes x %3d features, %-4s %-6s copies %7.1f us, "
           "degenerate %7.1f us%s\n", n, p, cold ? "cold" : "warm",
           sparse ? "sparse" : "dense", 1e6 * median(t_copies, reps),
           1e6 * median(t_degenerate, reps),
           found ? " (found some)" : "");
    free(x);
    free(t_copies);
    free(t_degenerate);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 101;
    flush_buffer = calloc(FLUSH_BYTES, 1);
    if (!flush_buffer) return 1;
    for (int cold = 0; cold <= 1; cold++) {
        measure(128, 16384, cold, 0, reps);
        measure(50, 100000, cold, 0, reps);
    }
    measure(128, 16384, 1, 1, reps);
    free(flush_buffer);
    return 0;
}
