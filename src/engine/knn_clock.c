/*
 * knn_clock.c: the monotonic clock behind every report timing. Its own
 * file because the CUDA backend's shared object links it too.
 */
#define _POSIX_C_SOURCE 199309L
#include <time.h>
#include "knn_backend.h"

double knn_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
