/*
 * knn_threads.c: how many threads the engine may use. libgomp's thread
 * pool does not survive fork(): a child (parallel::mclapply) that opens a
 * parallel region after its parent had one hangs for ever. So a child
 * forked after the package loaded runs every region on its own thread.
 */
#include <pthread.h>
#include "knn_threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static volatile int knn_forked_child = 0;

static void knn_mark_child(void)
{
    knn_forked_child = 1;
}

void knn_threads_init(void)
{
    pthread_atfork(NULL, NULL, knn_mark_child);
}

int knn_threads(int requested)
{
    if (knn_forked_child) return 1;
    if (requested > KNN_MAX_THREADS) requested = KNN_MAX_THREADS;
#ifdef _OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    return requested > 0 ? requested : 1;
#endif
}

int knn_thread_number(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
