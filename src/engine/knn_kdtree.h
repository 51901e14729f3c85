/*
 * knn_kdtree.h: the CPU's exact k-d tree search for distance metrics in
 * few dimensions (knn_kdtree.c), and the rule that chooses it.
 */
#ifndef KNN_KDTREE_H
#define KNN_KDTREE_H

#include "knn.h"

/* Where the tree beats the product scan on N(0,1) and on tied data alike,
 * as measured by inst/bench/lowdim.R on the project's 2-core machine
 * (RESULTS.md): up to 6 features from 500 reference nodes (2 to 80 times
 * faster), and 7 or 8 features from 8000 (2 to 5 times). */
#define KNN_KD_MAX_FEATURES 6
#define KNN_KD_MIN_NODES 500
#define KNN_KD_WIDE_FEATURES 8
#define KNN_KD_WIDE_MIN_NODES 8000

/* Whether the request is served by the tree: a distance metric (Euclidean,
 * squared Euclidean, Manhattan) and either forced (KNN_ALGO_TREE) or
 * chosen by the measured thresholds above. */
int knn_kdtree_suits(const knn_request *req);

/* Same contract as knn_cpu_search (knn_backend.h), for a request that
 * knn_kdtree_suits(). */
knn_status knn_kdtree_search(const knn_request *req, knn_result *out,
                             knn_report *report);

#endif
