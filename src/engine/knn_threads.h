/*
 * knn_threads.h: thread count for the engine's OpenMP regions. Without
 * OpenMP the pragmas are ignored and every region runs on one thread.
 */
#ifndef KNN_THREADS_H
#define KNN_THREADS_H

/* Registers the fork handler; call once when the library loads. */
void knn_threads_init(void);

/* The requested count, or the OpenMP default when requested <= 0; always 1
 * in a process forked after knn_threads_init() (see knn_threads.c). */
int knn_threads(int requested);

#endif
