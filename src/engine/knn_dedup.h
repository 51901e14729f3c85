/*
 * knn_dedup.h: a search whose reference holds many exact copies, run on
 * its distinct nodes once and expanded (knn_dedup.c). Same bits as the
 * plain search.
 */
#ifndef KNN_DEDUP_H
#define KNN_DEDUP_H

#include "knn.h"

/* Whether to try: knobs->duplicates where it decides, else whether an
 * even sample of the reference holds enough copies. */
int knn_dedup_suits(const knn_request *req, const knn_knobs *knobs);

/* The search (req validated by knn_search) with copies searched once.
 * *done = 0 where it did not search (copies turned out few, or their
 * groups did not fit in memory): the caller runs the plain search, and
 * out is untouched. Otherwise the answer or an error, as knn_search. */
knn_status knn_dedup_search(const knn_request *req, const knn_knobs *knobs,
                            knn_backend backend, knn_result *out,
                            knn_report *report, int *done);

#endif
