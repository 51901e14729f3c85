/*
 * knn_blas.c: the BLAS's own threads during a CPU search (knn_blas.h).
 *
 * A multi-threaded BLAS (OpenBLAS, Debian's fast BLAS for R) starts its
 * threads for every product and leaves them spinning afterwards, while the
 * engine's OpenMP threads scan the product; on few cores the two sets of
 * threads take turns on each core (a third of a 2-core search went to
 * spinning and the scheduler). With the BLAS held to one thread for the
 * search, each OpenMP thread multiplies its own rows and scans them while
 * they are still in its cache. OpenBLAS is found by its own symbols in the
 * process (R loaded it); any other BLAS is left alone, and the search then
 * takes one product per tile from it as before.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT in older glibc */
#endif
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include "knn_blas.h"

#ifndef RTLD_DEFAULT
#define RTLD_DEFAULT NULL
#endif

typedef void (*knn_blas_set_fn)(int);
typedef int (*knn_blas_get_fn)(void);

static knn_blas_set_fn knn_blas_setter(void)
{
    knn_blas_set_fn set = NULL;
    *(void **)&set = dlsym(RTLD_DEFAULT, "openblas_set_num_threads");
    return set;
}

int knn_blas_hold_one_thread(void)
{
    knn_blas_get_fn get = NULL;
    *(void **)&get = dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
    knn_blas_set_fn set = knn_blas_setter();
    if (!get || !set) return 0;
    int before = get();
    if (before < 1) return 0;
    set(1);
    return before;
}

void knn_blas_release(int before)
{
    knn_blas_set_fn set = knn_blas_setter();
    if (before > 0 && set) set(before);
}

static atomic_int knn_blas_running;
static atomic_int knn_blas_most;

void knn_blas_enter(void)
{
    int now = atomic_fetch_add(&knn_blas_running, 1) + 1;
    int most = atomic_load(&knn_blas_most);
    while (now > most &&
           !atomic_compare_exchange_weak(&knn_blas_most, &most, now)) {
    }
}

void knn_blas_leave(void)
{
    atomic_fetch_sub(&knn_blas_running, 1);
}

int knn_blas_buffers(void)
{
    return atomic_load(&knn_blas_most);
}
