/*
 * upload-costs.cu: ways to move a float64 input from ordinary (pageable)
 * host memory, as R allocates it, to the device; milliseconds, median of
 * 21 runs, for the 20480 x 128 input of the small benchmark search (21 MB)
 * and a 256 MB one. The choice of upload in src/cuda/knn_gpu_context.cu
 * rests on these numbers.
 *
 *   nvcc -O2 -std=c++17 -Xcompiler -fopenmp tools/upload-costs.cu -lgomp \
 *       -o /tmp/upload && /tmp/upload
 *
 * pageable xT: T host threads each copy 1/T of the input with
 *   cudaMemcpyAsync on their own stream (the driver stages each part).
 * staged xT: T host threads memcpy parts into a pinned buffer kept between
 *   calls and queue each part's transfer as soon as it is there.
 * register: cudaHostRegister the source, one copy, unregister.
 * ring xT: as src/cuda/knn_gpu_context.cu does it (one stream, a ring of
 *   32 slots); "after omp": right after an OpenMP region on every core, as
 *   R's input check leaves the cores; "omp ring": the ring's threads are
 *   OpenMP's own.
 * pinned source: the transfer alone, the bound of the link.
 */
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda_runtime.h>
#include <omp.h>

static double now()
{
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch())
        .count();
}

template <typename F>
static double median_ms(F run)
{
    std::vector<double> t;
    run(); /* warm-up */
    for (int i = 0; i < 21; i++) {
        double t0 = now();
        run();
        t.push_back((now() - t0) * 1000);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static void pageable_split(double *dst, const double *src, size_t n, int nt,
                           cudaStream_t *streams)
{
    std::vector<std::thread> th;
    for (int i = 0; i < nt; i++) {
        size_t a = n * i / nt, b = n * (i + 1) / nt;
        th.emplace_back([=] {
            cudaMemcpyAsync(dst + a, src + a, (b - a) * sizeof(double),
                            cudaMemcpyHostToDevice, streams[i]);
            cudaStreamSynchronize(streams[i]);
        });
    }
    for (auto &t : th) t.join();
}

/* Parts of `chunk` doubles, handed out in order to nt threads; each
 * transfer goes on one stream, queued by the thread that filled it. */
static void staged(double *dst, const double *src, double *pinned, size_t n,
                   int nt, size_t chunk, cudaStream_t *streams)
{
    size_t parts = (n + chunk - 1) / chunk;
    std::vector<std::thread> th;
    for (int i = 0; i < nt; i++) {
        th.emplace_back([=] {
            for (size_t c = i; c < parts; c += nt) {
                size_t a = c * chunk, len = std::min(chunk, n - a);
                memcpy(pinned + a, src + a, len * sizeof(double));
                cudaMemcpyAsync(dst + a, pinned + a, len * sizeof(double),
                                cudaMemcpyHostToDevice, streams[i]);
            }
            cudaStreamSynchronize(streams[i]);
        });
    }
    for (auto &t : th) t.join();
}

/* As knn_gpu_context.cu does it: one stream for every thread, 32 slots of
 * 1 MB whose events guard their reuse, thread i of nt filling parts i,
 * i + nt, ... */
static void ring_share(double *dst, const double *src, double *pinned,
                       size_t n, int i, int nt, cudaStream_t stream,
                       cudaEvent_t *slot_free)
{
    const size_t chunk = (size_t)1 << 17;
    size_t parts = (n + chunk - 1) / chunk;
    for (size_t c = i; c < parts; c += nt) {
        size_t a = c * chunk, len = std::min(chunk, n - a);
        double *slot = pinned + (c % 32) * chunk;
        cudaEventSynchronize(slot_free[c % 32]);
        memcpy(slot, src + a, len * sizeof(double));
        cudaMemcpyAsync(dst + a, slot, len * sizeof(double),
                        cudaMemcpyHostToDevice, stream);
        cudaEventRecord(slot_free[c % 32], stream);
    }
}

/* The ring on threads of its own. */
static void ring(double *dst, const double *src, double *pinned, size_t n,
                 int nt, cudaStream_t stream, cudaEvent_t *slot_free)
{
    std::vector<std::thread> th;
    for (int i = 1; i < nt; i++)
        th.emplace_back(ring_share, dst, src, pinned, n, i, nt, stream,
                        slot_free);
    ring_share(dst, src, pinned, n, 0, nt, stream, slot_free);
    for (auto &t : th) t.join();
    cudaStreamSynchronize(stream);
}

/* The ring on OpenMP's threads: after another parallel region (R's input
 * check) they are still spinning, and threads of its own would compete
 * with them for the cores. */
static void ring_omp(double *dst, const double *src, double *pinned,
                     size_t n, int nt, cudaStream_t stream,
                     cudaEvent_t *slot_free)
{
    #pragma omp parallel num_threads(nt)
    ring_share(dst, src, pinned, n, omp_get_thread_num(), nt, stream,
               slot_free);
    cudaStreamSynchronize(stream);
}

/* What R's input check leaves behind: a parallel region on every core. */
static double omp_region(const std::vector<double> &x)
{
    double s = 0;
    #pragma omp parallel for reduction(+ : s)
    for (size_t i = 0; i < x.size(); i++) s += x[i];
    return s;
}

static void measure(size_t n)
{
    std::vector<double> host(n);
    for (size_t i = 0; i < n; i++) host[i] = (double)(i % 1000) * 0.001;
    double *dst, *pinned;
    cudaMalloc(&dst, n * sizeof(double));
    cudaHostAlloc(&pinned, n * sizeof(double), cudaHostAllocDefault);
    cudaStream_t streams[8];
    for (auto &s : streams)
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    printf("\n%.1f MB\n", n * 8 / 1048576.0);
    for (int nt : {1, 2, 4, 8})
        printf("  pageable x%d              %8.3f ms\n", nt,
               median_ms([&] { pageable_split(dst, host.data(), n, nt,
                                              streams); }));
    for (int nt : {1, 2, 4, 8})
        for (size_t chunk : {(size_t)1 << 17, (size_t)1 << 19})
            printf("  staged x%d, %4zu KB parts %8.3f ms\n", nt,
                   chunk * 8 / 1024,
                   median_ms([&] { staged(dst, host.data(), pinned, n, nt,
                                          chunk, streams); }));
    cudaEvent_t slot_free[32];
    for (auto &e : slot_free)
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    for (int nt : {1, 4, 8}) {
        printf("  ring x%d                   %8.3f ms\n", nt, median_ms([&] {
            ring(dst, host.data(), pinned, n, nt, streams[0], slot_free);
        }));
        printf("  ring x%d after omp         %8.3f ms\n", nt, median_ms([&] {
            omp_region(host);
            ring(dst, host.data(), pinned, n, nt, streams[0], slot_free);
        }));
        printf("  omp ring x%d after omp     %8.3f ms\n", nt, median_ms([&] {
            omp_region(host);
            ring_omp(dst, host.data(), pinned, n, nt, streams[0], slot_free);
        }));
    }
    printf("  omp region alone          %8.3f ms\n",
           median_ms([&] { omp_region(host); }));
    for (auto &e : slot_free) cudaEventDestroy(e);
    printf("  register + copy           %8.3f ms\n", median_ms([&] {
        cudaHostRegister(host.data(), n * sizeof(double), 0);
        cudaMemcpy(dst, host.data(), n * sizeof(double),
                   cudaMemcpyHostToDevice);
        cudaHostUnregister(host.data());
    }));
    printf("  pinned source             %8.3f ms\n", median_ms([&] {
        cudaMemcpy(dst, pinned, n * sizeof(double), cudaMemcpyHostToDevice);
    }));
    for (auto &s : streams) cudaStreamDestroy(s);
    cudaFreeHost(pinned);
    cudaFree(dst);
}

int main()
{
    cudaFree(0); /* the context, outside every timing */
    printf("host threads: %u\n", std::thread::hardware_concurrency());
    measure((size_t)20480 * 128);
    measure((size_t)32 << 20);
    return 0;
}
