/*
 * knn_gpu_upload.cu: a device's nodes for a search (host code): access to
 * the other devices' memory, the upload of the float64 nodes (shared by
 * devices that read each other's memory), and their preparation
 * (knn_gpu_prepare.cu).
 */
#include <stdio.h>
#include <stdlib.h>
#include "knn_gpu_tiles.cuh"

/* Lets this device's kernels and copies read GPU `peer`'s memory
 * directly (NVLink or PCIe), where the two can; *reads whether they may
 * (on one GPU they always may). Where they may not, each device uploads
 * the whole reference and a shared walk stages the other device's arrays
 * through this device's buffers (knn_team_view), CUDA staging its copies
 * through host memory; so where the knobs ask for staging (stage_peers),
 * the harness's way to run that path on one GPU. Once enabled, access
 * (to the peer's pool too, where its arrays come from) stays so for the
 * process. */
static knn_status knn_dev_enable_peer(knn_gpu_dev *d, int peer, int *reads)
{
    int can = 0;
    *reads = peer == d->device;
    if (!*reads) {
        KNN_CUDA_TRY(d->message,
                     cudaDeviceCanAccessPeer(&can, d->device, peer));
        cudaError_t e = can ? cudaDeviceEnablePeerAccess(peer, 0)
                            : cudaErrorPeerAccessUnsupported;
        *reads = e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled;
        if (e != cudaSuccess) cudaGetLastError();
        if (*reads) KNN_TRY(knn_device_share(peer, d->device, d->message));
    }
    if (d->knobs->stage_peers) *reads = 0;
    return KNN_OK;
}

/* The other devices whose memory this one reads (d->team_reads): known
 * before the upload, which they share where each reads every other's
 * (knn_upload_nodes), and before the plan, whose shared walk stages only
 * the arrays of the others it cannot read. */
static knn_status knn_dev_open_peers(knn_gpu_dev *d)
{
    const knn_gpu_team *team = &d->shared->team;
    d->team_reads = 0;
    for (int w = 0; w < d->walkers; w++) {
        int reads = 0;
        if (w == d->walker) continue;
        KNN_TRY(knn_dev_enable_peer(d, team->device[w], &reads));
        if (reads) d->team_reads |= 1u << w;
    }
    return KNN_OK;
}

/* Whether this device reads every other device's memory. */
int knn_dev_reads_peers(const knn_gpu_dev *d)
{
    unsigned others = ((1u << d->walkers) - 1u) & ~(1u << d->walker);
    return (d->team_reads & others) == others;
}

/* Devices that read each other's memory share the upload of the
 * reference: each sends its slice of the nodes from the host (nodes
 * [*first, *end) for device w, in walker order) and copies the others'
 * from their GPUs, so that the host reads the reference and sends it
 * once, not once per GPU. */
static void knn_upload_slice(const knn_gpu_dev *d, int w, size_t *first,
                             size_t *end)
{
    size_t n = (size_t)d->req->n_ref;
    *first = n * w / d->walkers;
    *end = n * (w + 1) / d->walkers;
}

/* Device w's slice of the reference from its upload into x. */
static knn_status knn_upload_copy_slice(knn_gpu_dev *d, int w, double *x)
{
    const knn_gpu_team *team = &d->shared->team;
    size_t p = (size_t)d->req->p, first = 0, end = 0;
    knn_upload_slice(d, w, &first, &end);
    KNN_CUDA_TRY(d->message, cudaMemcpyPeerAsync(
        x + p * first, d->device, team->upload[w] + p * first,
        team->device[w], p * (end - first) * sizeof(double), d->stream));
    return KNN_OK;
}

/* This device reads no other's upload any more (its copies are done, or
 * it never made them): once all are so, each may free its own. Every
 * device that searches says so once, on every path (knn_dev_free, which
 * no stop spares). */
void knn_upload_release(knn_gpu_dev *d)
{
    if (!d->upload_released && d->stream) cudaStreamSynchronize(d->stream);
    knn_meet_count_once(d->shared, &d->upload_released,
                        &d->shared->team.upload_done);
}

/* Once this device's slice is uploaded (x): publishes it and, when every
 * device has, copies theirs into x. Returns only once no device reads x
 * any more, on every path: the caller frees it. */
static knn_status knn_upload_gather(knn_gpu_dev *d, double *x)
{
    knn_gpu_team *team = &d->shared->team;
    KNN_CUDA_TRY(d->message, cudaStreamSynchronize(d->stream));
    team->upload[d->walker] = x;
    knn_status st = knn_team_meet(d, &team->met[KNN_MEET_UPLOADED],
                                  d->walkers, NULL);
    for (int w = 0; w < d->walkers && st == KNN_OK; w++)
        if (w != d->walker) st = knn_upload_copy_slice(d, w, x);
    knn_upload_release(d);
    knn_meet_wait(d->shared, &team->upload_done, d->walkers, 0, NULL);
    return st;
}

/* Copies ref and this device's query rows into one p x n_nodes array:
 * the reference through the host, or only this device's slice of it
 * where the devices share the upload. */
static knn_status knn_upload_nodes(knn_gpu_dev *d, double **x)
{
    const knn_request *req = d->req;
    size_t p = (size_t)req->p, first = 0, end = (size_t)req->n_ref;
    int shared = d->walkers > 1 && knn_dev_reads_peers(d);
    if (shared) knn_upload_slice(d, d->walker, &first, &end);
    KNN_CUDA_TRY(d->message,
                 knn_device_alloc((void **)x, p * d->n_nodes * sizeof(double),
                                  d->stream));
    knn_upload_part parts[2] = {
        {*x + p * first, req->ref + p * first, p * (end - first)},
        {*x + p * req->n_ref,
         req->query ? req->query + p * d->q0 : NULL, p * d->nq}};
    KNN_TRY(knn_context_upload(d->ctx, parts, req->query ? 2 : 1,
                               d->copy_threads, &d->shared->stop,
                               d->message));
    return shared ? knn_upload_gather(d, *x) : KNN_OK;
}

/* Whether the device runs float64 at half float32's rate or better (the
 * data-centre cards of sm_80 and sm_90 do; most other cards at 1/32 or
 * 1/64). */
static knn_status knn_dev_fp64_rate(knn_gpu_dev *d)
{
    int ratio = 0;
    KNN_CUDA_TRY(d->message,
                 cudaDeviceGetAttribute(
                     &ratio, cudaDevAttrSingleToDoublePrecisionPerfRatio,
                     d->device));
    d->fp64_fast = ratio > 0 && ratio <= 2;
    return KNN_OK;
}

knn_status knn_dev_prepare(knn_gpu_dev *d)
{
    const knn_request *req = d->req;
    double t0 = knn_seconds();
    KNN_TRY(knn_dev_fp64_rate(d));
    d->self = req->query == NULL;
    d->n_nodes = req->n_ref + (d->self ? 0 : d->nq);
    double *x = NULL;
    if (d->walkers > 1) KNN_TRY(knn_dev_open_peers(d));
    knn_status st = knn_upload_nodes(d, &x);
    if (st == KNN_OK)
        st = knn_prepare_nodes(req->metric, x, req->p, req->n_ref,
                               d->n_nodes, d->query_max_abs, d->course.gemm,
                               &d->nodes,
                               d->message, d->stream);
    if (x != d->nodes.exact) knn_device_free(x);
    d->seconds_prepare = knn_seconds() - t0;
    return st;
}
