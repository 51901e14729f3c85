/*
 * knn_threads.h: thread count for the engine's OpenMP regions. Without
 * OpenMP the pragmas are ignored and every region runs on one thread.
 */
#ifndef KNN_THREADS_H
#define KNN_THREADS_H

/* Registers the fork handler; call once when the library loads. */
void knn_threads_init(void);

/* Most threads one region may use: OpenMP starts every thread asked for,
 * and a million of them crash the process. R refuses more (R/validate.R). */
#define KNN_MAX_THREADS 1024

/* The threads a region runs on: the requested count, or one per
 * processor this process may run on when requested <= 0, whatever
 * OMP_NUM_THREADS says; at most KNN_MAX_THREADS, 4 per processor, as many
 * as the address-space limit holds stacks for, and the processors other
 * runnable processes leave (but for a count requested where OpenMP's waits
 * do not spin); 1 where thread stacks are too small, and in a process
 * forked after knn_threads_init() (see knn_threads.c). */
int knn_threads(int requested);

/* Bytes of address space the limit (ulimit -v) leaves this process;
 * INFINITY without a limit. Never fails. */
double knn_address_space_left(void);

/* Bytes of address space that a region of `threads` threads reserves
 * besides the heap: for each thread but the calling one a stack and the
 * arena of its first malloc, and, where they call the BLAS (blas
 * nonzero), a BLAS buffer each (KNN_BLAS_BUFFER, knn_blas.h) that the BLAS
 * does not hold already (knn_blas_buffers). */
double knn_threads_reserve(int threads, int blas);

/* Whether knn_threads_reserve(threads, blas) fits in the address space
 * that the limit leaves now (always, without a limit). */
int knn_threads_reserve_fits(int threads, int blas);

/* The most of `threads` threads (at least 1) that each reserve
 * bytes_each within `share` of the address space left. */
int knn_threads_fitting(int threads, double bytes_each, double share);

/* This thread's number in the enclosing parallel region (0 outside one,
 * or without OpenMP). */
int knn_thread_number(void);

#endif
