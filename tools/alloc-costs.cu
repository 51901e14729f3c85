/*
 * alloc-costs.cu: what a device array costs to take and give back, from
 * cudaMalloc and cudaFree or from a stream-ordered pool that keeps 1 GiB
 * (as src/cuda/knn_gpu_context.cu's does), on one device and on every
 * device at once (one host thread each), without and with peer access
 * (the pool then shared with the other devices); milliseconds, the
 * largest over the devices, two rounds each. The split in
 * knn_device_alloc (the pool for arrays it keeps, cudaMalloc for larger
 * ones) rests on these numbers.
 *
 *   nvcc -O2 -std=c++17 -arch=sm_90 tools/alloc-costs.cu -o /tmp/alloc && \
 *       /tmp/alloc
 *
 * take: cudaMalloc, or cudaMallocFromPoolAsync and its stream's wait;
 * zero: cudaMemsetAsync of the whole array and its wait;
 * give back: cudaFree, or cudaFreeAsync after the device's wait (the
 *   pool releasing what it does not keep at the wait);
 * trim: cudaMemPoolTrimTo the 1 GiB kept.
 */
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define MAX_DEVICES 8
#define KEEP_BYTES (1ull << 30)

static double now_ms()
{
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) printf("error in %s: %s\n", what,
                                 cudaGetErrorString(e));
}

static cudaMemPool_t pools[MAX_DEVICES];

/* Device d's pool, keeping KEEP_BYTES, its arrays readable by the first
 * `readers` devices. */
static void make_pool(int d, int readers)
{
    cudaSetDevice(d);
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = d;
    check(cudaMemPoolCreate(&pools[d], &props), "cudaMemPoolCreate");
    uint64_t keep = KEEP_BYTES;
    check(cudaMemPoolSetAttribute(pools[d], cudaMemPoolAttrReleaseThreshold,
                                  &keep), "cudaMemPoolSetAttribute");
    for (int r = 0; r < readers; r++) {
        if (r == d) continue;
        cudaMemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = r;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        check(cudaMemPoolSetAccess(pools[d], &access, 1),
              "cudaMemPoolSetAccess");
    }
}

/* One array of `bytes` on device d, from the pool or not: t[0..4) the
 * milliseconds of take, zero, give back and trim. */
static void one_array(int d, size_t bytes, bool pooled, double *t)
{
    cudaSetDevice(d);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void *ptr = NULL;
    double a = now_ms();
    if (pooled) {
        check(cudaMallocFromPoolAsync(&ptr, bytes, pools[d], s), "take");
        cudaStreamSynchronize(s);
    } else {
        check(cudaMalloc(&ptr, bytes), "cudaMalloc");
    }
    double b = now_ms();
    check(cudaMemsetAsync(ptr, 0, bytes, s), "zero");
    cudaStreamSynchronize(s);
    double c = now_ms();
    if (pooled) {
        cudaDeviceSynchronize();
        check(cudaFreeAsync(ptr, 0), "cudaFreeAsync");
        cudaDeviceSynchronize();
    } else {
        check(cudaFree(ptr), "cudaFree");
    }
    double e = now_ms();
    if (pooled) {
        check(cudaMemPoolTrimTo(pools[d], KEEP_BYTES), "trim");
        cudaDeviceSynchronize();
    }
    double f = now_ms();
    t[0] = b - a;
    t[1] = c - b;
    t[2] = e - c;
    t[3] = f - e;
    cudaStreamDestroy(s);
}

int main()
{
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n > MAX_DEVICES) n = MAX_DEVICES;
    for (int d = 0; d < n; d++) {
        cudaSetDevice(d);
        cudaFree(0);
    }
    const size_t sizes[] = {1ull << 28, 1ull << 30, 5ull << 30, 18ull << 30};
    for (int peers = 0; peers < 2; peers++) {
        for (int d = 0; peers && d < n; d++)
            for (int o = 0; o < n; o++) {
                if (o == d) continue;
                cudaSetDevice(d);
                cudaDeviceEnablePeerAccess(o, 0);
                cudaGetLastError();
            }
        for (int d = 0; d < n; d++) {
            if (pools[d]) {
                cudaSetDevice(d);
                cudaMemPoolDestroy(pools[d]);
            }
            make_pool(d, peers ? n : 0);
        }
        for (int devices = 1; devices <= n; devices = devices < n ? n : n + 1)
            for (size_t bytes : sizes)
                for (int pooled = 0; pooled < 2; pooled++)
                    for (int round = 0; round < 2; round++) {
                        std::vector<std::thread> threads;
                        std::vector<double> t(4 * devices);
                        double a = now_ms();
                        for (int d = 0; d < devices; d++)
                            threads.emplace_back(one_array, d, bytes,
                                                 pooled != 0, &t[4 * d]);
                        for (std::thread &th : threads) th.join();
                        double all = now_ms() - a;
                        double most[4] = {0, 0, 0, 0};
                        for (int d = 0; d < devices; d++)
                            for (int i = 0; i < 4; i++)
                                if (t[4 * d + i] > most[i])
                                    most[i] = t[4 * d + i];
                        printf("peers %d devices %d %6.2f GB %-10s round %d: "
                               "take %7.2f zero %6.2f give back %7.2f "
                               "trim %7.2f all %7.2f ms\n",
                               peers, devices, bytes / 1073741824.0,
                               pooled ? "pool" : "cudaMalloc", round, most[0],
                               most[1], most[2], most[3], all);
                    }
    }
    return 0;
}
