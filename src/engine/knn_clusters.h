/*
 * knn_clusters.h: the CPU's exact search by clusters (knn_clusters.c), for
 * Euclidean and squared Euclidean distances, Pearson, Spearman and cosine,
 * and the rule that chooses it.
 */
#ifndef KNN_CLUSTERS_H
#define KNN_CLUSTERS_H

#include "knn.h"

/* Whether the clusters serve metric m: one whose fast score is a squared
 * distance, or -r of unit vectors. */
int knn_clusters_serve(knn_metric m);

/* Whether the request may be served by clusters: a metric they serve,
 * and either forced (KNN_ALGO_CLUSTERS) or, under AUTO, from
 * KNN_KM_MIN_NODES reference nodes and up to KNN_KM_MAX_FEATURES
 * features (knn_clusters.c). Under AUTO the search itself still
 * measures, on a sample of its rows, whether the clusters prune enough,
 * and otherwise hands over to the product scan. */
int knn_clusters_suits(const knn_request *req);

/* Same contract as knn_cpu_search (knn_backend.h), for a request that
 * knn_clusters_suits(). */
knn_status knn_clusters_search(const knn_request *req, knn_result *out,
                               knn_report *report);

#endif
