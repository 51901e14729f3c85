/*
 * knn_gpu_entry.cu: the one symbol the CUDA backend's shared object
 * (knngpu_cuda.so) exports. The package's own shared object opens it on
 * first GPU use (src/engine/knn_gpu_loader.c) and finds the backend's entry
 * points through this table; everything else in the object is hidden, so
 * its names never meet the package's.
 */
#include "knn_gpu.cuh"

static const knn_gpu_backend knn_cuda_table = {
    knn_gpu_search, knn_gpu_query, knn_gpu_release,
    knn_gpu_pw_open, knn_gpu_pw_start, knn_gpu_pw_wait, knn_gpu_pw_close
};

extern "C" __attribute__((visibility("default")))
const knn_gpu_backend *knn_cuda_backend(void)
{
    return &knn_cuda_table;
}
