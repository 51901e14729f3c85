/*
 * knn_gpu_none.c: the GPU entry points of a build without CUDA. configure
 * compiles this file instead of src/cuda/ when no CUDA toolkit was found (or
 * KNNGPU_CUDA=no), so the package still loads and says why it has no GPU.
 */
#include <stdio.h>
#include <string.h>
#include "knn_backend.h"

#ifdef KNN_CUDA_DISABLED
#define KNN_NO_CUDA_REASON "built without CUDA, as KNNGPU_CUDA=no asked"
#else
#define KNN_NO_CUDA_REASON \
    "built without CUDA: no CUDA toolkit was found at install time"
#endif

knn_status knn_gpu_search(const knn_request *req, const knn_knobs *knobs,
                          knn_result *out, knn_report *report)
{
    (void)req;
    (void)knobs;
    (void)out;
    snprintf(report->message, sizeof report->message, "%s",
             KNN_NO_CUDA_REASON);
    return KNN_E_NOGPU;
}

void knn_gpu_query(knn_gpu_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->reason, sizeof info->reason, "%s", KNN_NO_CUDA_REASON);
}

void knn_gpu_release(void)
{
}

void knn_gpu_set_library(const char *path)
{
    (void)path;
}
