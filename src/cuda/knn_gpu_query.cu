/*
 * knn_gpu_query.cu: what the CUDA backend can use. knn_gpu_query() lists
 * the visible devices (host calls only, no kernels); a device is usable
 * from compute capability KNN_MIN_MAJOR.0 (knn_gpu.cuh). The devices a
 * search may use, and their names in its report.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <mutex>
#include <string>
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
        out->memory_free = (double)(free_b + knn_device_idle_bytes(d));
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

knn_status knn_usable_devices(const int *devices, int n_devices,
                              std::vector<int> &ids, knn_report *rep)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        knn_gpu_info info;
        knn_gpu_query(&info);
        snprintf(rep->message, sizeof rep->message, "no usable GPU: %s",
                 info.reason[0] ? info.reason : "no CUDA device is visible");
        return KNN_E_NOGPU;
    }
    if (n_devices <= 0) {
        for (int d = 0; d < count && d < KNN_MAX_DEVICES; d++) ids.push_back(d);
    } else {
        /* A device listed twice runs two row blocks side by side; the R
         * layer refuses that, the C tests use it to split on one GPU. */
        for (int i = 0; i < n_devices && i < KNN_MAX_DEVICES; i++) {
            int d = devices[i];
            if (d < 0 || d >= count) {
                snprintf(rep->message, sizeof rep->message,
                         "GPU %d does not exist (%d visible, numbered from "
                         "0)", d, count);
                return KNN_E_INVALID;
            }
            ids.push_back(d);
        }
    }
    std::vector<int> usable;
    for (int d : ids) {
        int major = 0;
        cudaError_t e = cudaDeviceGetAttribute(
            &major, cudaDevAttrComputeCapabilityMajor, d);
        if (e == cudaSuccess && major >= KNN_MIN_MAJOR)
            usable.push_back(d);
    }
    cudaGetLastError();
    if (usable.empty()) {
        snprintf(rep->message, sizeof rep->message,
                 "no usable GPU: none of the devices has compute capability "
                 "%d.0 or newer", KNN_MIN_MAJOR);
        return KNN_E_NOGPU;
    }
    if (n_devices > 0 && usable.size() != ids.size()) {
        snprintf(rep->message, sizeof rep->message,
                 "a GPU in 'devices' has compute capability below %d.0",
                 KNN_MIN_MAJOR);
        return KNN_E_NOGPU;
    }
    ids = usable;
    return KNN_OK;
}

/* Device d's name, read once: cudaGetDeviceProperties reads every
 * property, too slow to ask on each search. */
static const char *knn_device_name(int d)
{
    static std::mutex lock;
    static std::string names[KNN_MAX_DEVICES];
    std::lock_guard<std::mutex> hold(lock);
    if (d < 0 || d >= KNN_MAX_DEVICES) return "GPU";
    if (names[d].empty()) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
            cudaGetLastError();
            return "GPU";
        }
        names[d] = prop.name;
    }
    return names[d].c_str();
}

void knn_device_names(const std::vector<int> &ids, knn_report *rep)
{
    const char *name = knn_device_name(ids[0]);
    if (ids.size() == 1) {
        snprintf(rep->device, sizeof rep->device, "%.100s (GPU %d)", name,
                 ids[0]);
        return;
    }
    int n = snprintf(rep->device, sizeof rep->device, "%d x %.80s (GPUs",
                     (int)ids.size(), name);
    for (size_t i = 0; i < ids.size() && n < (int)sizeof rep->device; i++)
        n += snprintf(rep->device + n, sizeof rep->device - n, "%s%d",
                      i ? ", " : " ", ids[i]);
    if (n < (int)sizeof rep->device)
        snprintf(rep->device + n, sizeof rep->device - n, ")");
}
