/*
 * knn_cpu.h: the CPU's product scan (knn_cpu.c) for the engine's other CPU
 * searches, which hand it the nodes they prepared where they give way to
 * it.
 */
#ifndef KNN_CPU_H
#define KNN_CPU_H

#include "knn_prepare.h"

/* The threads the product scan takes for req: knn_threads(), within
 * what the BLAS's buffers leave where it multiplies. Never fails. */
int knn_cpu_threads(const knn_request *req);

/* The request's space and nodes prepared for products on `threads`
 * threads, as the scan prepares them: knn_space_init, then
 * knn_nodes_prepare of the reference and, in a query search, of the query
 * nodes (else *query is left empty). Returns KNN_E_NOMEM or
 * KNN_E_INTERRUPTED with what was made left for the caller to free. */
knn_status knn_cpu_prepare_nodes(const knn_request *req, int threads,
                                 knn_space *space, knn_nodes *ref,
                                 knn_nodes *query);

/* Same contract as knn_cpu_search (knn_backend.h), on `threads` threads
 * (knn_cpu_threads, counted by the caller) and the request's space and
 * nodes from knn_cpu_prepare_nodes, which the scan takes over and frees
 * on every path. */
knn_status knn_cpu_search_prepared(const knn_request *req, int threads,
                                   knn_space space, knn_nodes ref,
                                   knn_nodes query, knn_result *out,
                                   knn_report *report);

#endif
