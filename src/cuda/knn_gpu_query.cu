/*
 * knn_gpu_query.cu: what the CUDA backend can use. knn_gpu_query() lists
 * the visible devices (host calls only, no kernels); a device is usable
 * from compute capability KNN_MIN_MAJOR.0 (knn_gpu.cuh).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "knn_gpu.cuh"

static void knn_reason(knn_gpu_info *info, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->reason, sizeof info->reason, fmt, ap);
    va_end(ap);
}

static void knn_query_device(int d, knn_gpu_device *out)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
        cudaGetLastError();
        snprintf(out->name, sizeof out->name, "device %d (unreadable)", d);
        return;
    }
    snprintf(out->name, sizeof out->name, "%.120s", prop.name);
    out->memory_total = (double)prop.totalGlobalMem;
    out->major = prop.major;
    out->minor = prop.minor;
    out->multiprocessors = prop.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(d) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        out->memory_free = (double)free_b;
    cudaGetLastError();
}

extern "C" void knn_gpu_query(knn_gpu_info *info)
{
    memset(info, 0, sizeof *info);
    info->built_with_cuda = 1;
    if (knn_gpu_claim_process(info->reason, sizeof info->reason) != KNN_OK)
        return;
    cudaRuntimeGetVersion(&info->runtime_version);
    cudaDriverGetVersion(&info->driver_version);
    if (info->driver_version == 0) {
        knn_reason(info, "no NVIDIA driver is installed");
        return;
    }

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorInsufficientDriver) {
        knn_reason(info, "the NVIDIA driver supports CUDA %d.%d, older than "
                   "the CUDA %d.%d runtime knngpu was built with",
                   info->driver_version / 1000,
                   info->driver_version % 1000 / 10,
                   info->runtime_version / 1000,
                   info->runtime_version % 1000 / 10);
        cudaGetLastError();
        return;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        knn_reason(info, "no CUDA device is visible");
        cudaGetLastError();
        return;
    }
    if (e != cudaSuccess) {
        knn_reason(info, "cudaGetDeviceCount failed: %s",
                   cudaGetErrorString(e));
        cudaGetLastError();
        return;
    }

    int previous = 0, usable = 0;
    cudaGetDevice(&previous);
    info->n_devices = count < KNN_MAX_DEVICES ? count : KNN_MAX_DEVICES;
    for (int d = 0; d < info->n_devices; d++) {
        knn_query_device(d, &info->device[d]);
        usable += info->device[d].major >= KNN_MIN_MAJOR;
    }
    cudaSetDevice(previous);
    if (usable == 0)
        knn_reason(info, "no device has compute capability %d.0 or newer "
                   "(device 0: %s, %d.%d)", KNN_MIN_MAJOR,
                   info->device[0].name, info->device[0].major,
                   info->device[0].minor);
}
