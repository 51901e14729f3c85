/*
 * cuda-call-costs.cu: what the CUDA runtime and cuBLAS calls that a search
 * makes cost on their own, mean of 20 calls each, in milliseconds: why
 * each device keeps its context between searches
 * (src/cuda/knn_gpu_context.cu).
 *
 *   nvcc -O2 -std=c++17 tools/cuda-call-costs.cu -lcublas -o /tmp/costs &&
 *       /tmp/costs
 */
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#define REPS 20

static double now()
{
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch())
        .count();
}

/* Runs the statement REPS times and prints the mean. */
#define TIME(label, ...)                                                   \
    do {                                                                   \
        double t0 = now();                                                 \
        for (int i = 0; i < REPS; i++) { __VA_ARGS__; }                    \
        printf("%-40s %8.3f ms\n", label, (now() - t0) / REPS * 1000);     \
    } while (0)

int main()
{
    cudaFree(0); /* the context, outside every timing */
    cudaStream_t s;
    cublasHandle_t h;
    void *p;
    TIME("stream create + destroy", {
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaStreamDestroy(s);
    });
    TIME("cublasCreate + cublasDestroy", {
        cublasCreate(&h);
        cublasDestroy(h);
    });
    TIME("cudaMalloc + cudaFree 256 MB", {
        cudaMalloc(&p, 256 << 20);
        cudaFree(p);
    });
    TIME("cudaMalloc + cudaFree 64 KB", {
        cudaMalloc(&p, 64 << 10);
        cudaFree(p);
    });
    cudaStream_t as;
    cudaStreamCreateWithFlags(&as, cudaStreamNonBlocking);
    size_t free0 = 0, free1 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    TIME("4 x cudaMalloc + cudaFree 32 MB", {
        void *q[4];
        for (auto &b : q) cudaMalloc(&b, 32 << 20);
        for (auto &b : q) cudaFree(b);
    });
    TIME("4 x cudaMallocAsync + cudaFreeAsync 32 MB + sync", {
        void *q[4];
        for (auto &b : q) cudaMallocAsync(&b, 32 << 20, as);
        for (auto &b : q) cudaFreeAsync(b, as);
        cudaStreamSynchronize(as);
    });
    cudaMemGetInfo(&free1, &total);
    printf("%-40s %8.1f MB\n", "  device memory kept by the pool after",
           ((double)free0 - (double)free1) / 1048576.0);
    cudaStreamDestroy(as);
    TIME("cudaHostAlloc + cudaFreeHost 3 MB", {
        cudaHostAlloc(&p, 3 << 20, 0);
        cudaFreeHost(p);
    });
    TIME("cudaHostAlloc + cudaFreeHost 64 KB", {
        cudaHostAlloc(&p, 64 << 10, 0);
        cudaFreeHost(p);
    });
    TIME("host thread + cudaSetDevice + join", {
        std::thread t([] { cudaSetDevice(0); });
        t.join();
    });
    TIME("cudaGetDeviceProperties", {
        cudaDeviceProp prop;
        cudaGetDeviceProperties(&prop, 0);
    });
    std::vector<double> host(20480 * 128, 1.0); /* the 16k + 4k search */
    void *d;
    cudaMalloc(&d, host.size() * sizeof(double));
    cudaStreamCreate(&s);
    TIME("pageable upload, 20480 x 128 doubles", {
        cudaMemcpyAsync(d, host.data(), host.size() * sizeof(double),
                        cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
    });
    cudaFree(d);
    cudaStreamDestroy(s);
    return 0;
}
