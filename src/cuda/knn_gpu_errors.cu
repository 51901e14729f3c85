/*
 * knn_gpu_errors.cu: how the CUDA backend fails. The first failure of a
 * device is kept in its message with the call, file and line, and CUDA and
 * cuBLAS codes become engine statuses (out of memory, or a device error).
 * The fork guard records the process that first touched CUDA: a child
 * forked after that (parallel::mclapply) inherits a CUDA state it cannot
 * use, and any CUDA call there may hang or crash, so the child is refused
 * before one.
 */
#include <stdio.h>
#include <unistd.h>
#include <atomic>
#include "knn_gpu.cuh"

static std::atomic<long> knn_cuda_pid(0);

knn_status knn_gpu_claim_process(char *message, size_t size)
{
    long me = (long)getpid(), none = 0;
    if (knn_cuda_pid.compare_exchange_strong(none, me) || none == me)
        return KNN_OK;
    snprintf(message, size,
             "CUDA was initialised in the parent of this forked process "
             "(e.g. parallel::mclapply) and cannot be used in the child; use "
             "device = \"cpu\" here, or workers started fresh "
             "(parallel::makeCluster, BiocParallel::SnowParam)");
    return KNN_E_NOGPU;
}

int knn_gpu_owns_process(void)
{
    return knn_cuda_pid.load() == (long)getpid();
}

knn_status knn_gpu_fail(char *message, knn_status status, const char *what,
                        const char *detail, const char *file, int line)
{
    snprintf(message, 512, "%s: %s (%s:%d)", what, detail, file, line);
    return status;
}

knn_status knn_gpu_fail_cuda(char *message, cudaError_t e, const char *call,
                             const char *file, int line)
{
    /* Clears a non-sticky error so later cleanup calls are not refused. */
    cudaGetLastError();
    return knn_gpu_fail(message,
                        e == cudaErrorMemoryAllocation ? KNN_E_NOMEM
                                                       : KNN_E_DEVICE,
                        call, cudaGetErrorString(e), file, line);
}

knn_status knn_gpu_fail_blas(char *message, cublasStatus_t s,
                             const char *call, const char *file, int line)
{
    return knn_gpu_fail(message,
                        s == CUBLAS_STATUS_ALLOC_FAILED ? KNN_E_NOMEM
                                                        : KNN_E_DEVICE,
                        call, cublasGetStatusString(s), file, line);
}

