/*
 * knn_gpu_loader.c: the GPU entry points of a build with CUDA. The CUDA
 * backend lives in its own shared object, knngpu_cuda.so, linked against
 * the CUDA runtime and cuBLAS; this file opens it on the first GPU call,
 * so loading the package costs a CPU session nothing of CUDA (R's memory
 * grew from 52 to 274 MB when the package linked them directly), and a
 * CUDA build still runs on the CPU on a host without the driver or the
 * libraries: the GPU calls then say why there is no GPU.
 *
 * The object is never closed: the CUDA runtime keeps threads and state
 * that do not survive being unmapped.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "knn_backend.h"

static char knn_cuda_path[4096];
static const knn_gpu_backend *knn_cuda;
static char knn_cuda_missing[256]; /* why it cannot be opened, once known */
static pthread_mutex_t knn_cuda_lock = PTHREAD_MUTEX_INITIALIZER;

void knn_gpu_set_library(const char *path)
{
    snprintf(knn_cuda_path, sizeof knn_cuda_path, "%s", path);
}

/* Opens the backend; writes why not into knn_cuda_missing. A host without
 * the NVIDIA driver (libcuda.so.1) has no GPU to offer, and asking the
 * driver's small library first spares such a host the runtime's. */
static void knn_cuda_open(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
        snprintf(knn_cuda_missing, sizeof knn_cuda_missing,
                 "no NVIDIA driver on this host (libcuda.so.1 not found)");
        return;
    }
    dlclose(driver);
    void *handle = dlopen(knn_cuda_path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(knn_cuda_missing, sizeof knn_cuda_missing,
                 "the CUDA backend could not be loaded: %s", dlerror());
        return;
    }
    knn_gpu_backend_fn entry;
    *(void **)&entry = dlsym(handle, KNN_GPU_BACKEND_SYMBOL);
    if (!entry) {
        snprintf(knn_cuda_missing, sizeof knn_cuda_missing,
                 "the CUDA backend has no %s: a knngpu_cuda.so of another "
                 "version?", KNN_GPU_BACKEND_SYMBOL);
        return;
    }
    knn_cuda = entry();
}

/* The backend, opened on first use (once, whichever thread asks), or NULL
 * with knn_cuda_missing saying why. */
static const knn_gpu_backend *knn_cuda_backend_get(void)
{
    pthread_mutex_lock(&knn_cuda_lock);
    if (!knn_cuda && !knn_cuda_missing[0]) knn_cuda_open();
    pthread_mutex_unlock(&knn_cuda_lock);
    return knn_cuda;
}

/* A call the missing backend cannot take: why, in the report. */
static knn_status knn_cuda_refuse(knn_report *report)
{
    snprintf(report->message, sizeof report->message, "%s",
             knn_cuda_missing);
    return KNN_E_NOGPU;
}

knn_status knn_gpu_search(const knn_request *req, const knn_knobs *knobs,
                          knn_result *out, knn_report *report)
{
    const knn_gpu_backend *cuda = knn_cuda_backend_get();
    if (cuda) return cuda->search(req, knobs, out, report);
    return knn_cuda_refuse(report);
}

void knn_gpu_query(knn_gpu_info *info)
{
    const knn_gpu_backend *cuda = knn_cuda_backend_get();
    if (cuda) {
        cuda->query(info);
        return;
    }
    memset(info, 0, sizeof *info);
    info->built_with_cuda = 1;
    snprintf(info->reason, sizeof info->reason, "%s", knn_cuda_missing);
}

/* Releases only what an opened backend keeps: nothing to open for that. */
void knn_gpu_release(void)
{
    if (knn_cuda) knn_cuda->release();
}

knn_status knn_gpu_pw_open(const knn_pw_gpu_request *req, knn_pw_gpu **gpu,
                           knn_pw_gpu_rows *host, int *chunk_rows,
                           knn_report *report)
{
    *gpu = NULL;
    const knn_gpu_backend *cuda = knn_cuda_backend_get();
    if (cuda) return cuda->pw_open(req, gpu, host, chunk_rows, report);
    return knn_cuda_refuse(report);
}

/* The calls below follow a successful knn_gpu_pw_open: the backend is
 * open. */
knn_status knn_gpu_pw_start(knn_pw_gpu *gpu, int first, int rows,
                            char *message)
{
    return knn_cuda->pw_start(gpu, first, rows, message);
}

knn_status knn_gpu_pw_wait(knn_pw_gpu *gpu, int ms, int *done,
                           char *message)
{
    return knn_cuda->pw_wait(gpu, ms, done, message);
}

void knn_gpu_pw_close(knn_pw_gpu *gpu, knn_status status)
{
    if (gpu) knn_cuda->pw_close(gpu, status);
}
