/*
 * knn_threads.h: thread count for the engine's OpenMP regions. Without
 * OpenMP the pragmas are ignored and every region runs on one thread.
 */
#ifndef KNN_THREADS_H
#define KNN_THREADS_H

#ifdef _OPENMP
#include <omp.h>
#endif

/* The requested count, or the OpenMP default when requested <= 0. */
static inline int knn_threads(int requested)
{
#ifdef _OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;
#endif
}

#endif
