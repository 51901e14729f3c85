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

/* Every refusal: the reason into message (a report's, of its size). */
static knn_status knn_no_cuda(char *message)
{
    snprintf(message, sizeof ((knn_report *)0)->message, "%s",
             KNN_NO_CUDA_REASON);
    return KNN_E_NOGPU;
}

knn_status knn_gpu_search(const knn_request *req, const knn_knobs *knobs,
                          knn_result *out, knn_report *report)
{
    (void)req;
    (void)knobs;
    (void)out;
    return knn_no_cuda(report->message);
}

void knn_gpu_query(knn_gpu_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->reason, sizeof info->reason, "%s", KNN_NO_CUDA_REASON);
}

void knn_gpu_release(void)
{
}

knn_status knn_gpu_pw_open(const knn_pw_gpu_request *req, knn_pw_gpu **gpu,
                           knn_pw_gpu_rows *host, int *chunk_rows,
                           knn_report *report)
{
    (void)req;
    (void)host;
    (void)chunk_rows;
    *gpu = NULL;
    return knn_no_cuda(report->message);
}

/* Never reached: knn_gpu_pw_open opens nothing here. */
knn_status knn_gpu_pw_start(knn_pw_gpu *gpu, int first, int rows,
                            char *message)
{
    (void)gpu;
    (void)first;
    (void)rows;
    return knn_no_cuda(message);
}

knn_status knn_gpu_pw_wait(knn_pw_gpu *gpu, int ms, int *done,
                           char *message)
{
    (void)gpu;
    (void)ms;
    *done = 0;
    return knn_no_cuda(message);
}

void knn_gpu_pw_close(knn_pw_gpu *gpu, knn_status status)
{
    (void)gpu;
    (void)status;
}

void knn_gpu_set_library(const char *path)
{
    (void)path;
}
