/*
 * knn_gpu_team.cu: the one barrier of a search (host code). The calling
 * thread, the device threads and the page threads wait for each other
 * only here: for the devices to meet (the shared upload, the agreement
 * on a shared walk, each tile of it, its end), for every device to be
 * done reading the others' memory, for the caller's result arrays, for a
 * first tile, and for the device threads to end. Each wait is a
 * condition variable over values that change only through these
 * functions, under its mutex, so that no change goes unseen; a wait
 * that may be cut short also watches the stop flag (and, in a shared
 * walk, a device's leaving it).
 */
#include "knn_gpu_tiles.cuh"

void knn_meet_add(knn_gpu_shared *s, std::atomic<int> *value, int add)
{
    std::lock_guard<std::mutex> g(s->lock);
    *value += add;
    s->changed.notify_all();
}

int knn_meet_first(knn_gpu_shared *s, std::atomic<int> *value, int v)
{
    std::lock_guard<std::mutex> g(s->lock);
    if (*value == 0) *value = v;
    s->changed.notify_all();
    return *value;
}

void knn_meet_stop(knn_gpu_shared *s)
{
    knn_meet_first(s, &s->stop, 1);
}

/* Whether a wait on `ends` is cut short. */
static bool knn_meet_ended(const knn_gpu_shared *s, int ends)
{
    return ((ends & KNN_ENDS_ON_STOP) && s->stop) ||
           ((ends & KNN_ENDS_ON_LEFT) && s->team.left);
}

knn_status knn_meet_wait(knn_gpu_shared *s, const std::atomic<int> *value,
                         int target, int ends, int *left)
{
    std::unique_lock<std::mutex> g(s->lock);
    s->changed.wait(g, [&] {
        return *value >= target || knn_meet_ended(s, ends);
    });
    if (*value >= target) return KNN_OK;
    if ((ends & KNN_ENDS_ON_STOP) && s->stop) return KNN_E_INTERRUPTED;
    if (left) *left = s->team.left;
    return KNN_OK;
}

bool knn_meet_wait_for(knn_gpu_shared *s, const std::atomic<int> *value,
                       int target, int ms)
{
    std::unique_lock<std::mutex> g(s->lock);
    return s->changed.wait_for(g, std::chrono::milliseconds(ms),
                               [&] { return *value >= target; });
}

void knn_meet_count_once(knn_gpu_shared *s, int *counted,
                         std::atomic<int> *count)
{
    if (*counted) return;
    *counted = 1;
    knn_meet_add(s, count, 1);
}

void knn_meet_progress(knn_gpu_shared *s, long long rows)
{
    s->rows_done += rows;
    if (rows > 0 && !s->tile_done) knn_meet_first(s, &s->tile_done, 1);
}

/* The devices of a shared walk meet between its tiles too, where the
 * wait is short (they walk alike). */
knn_status knn_team_meet(knn_gpu_dev *d, std::atomic<int> *met, int target,
                         int *left)
{
    knn_gpu_shared *s = d->shared;
    knn_meet_add(s, met, 1);
    return knn_meet_wait(s, met, target,
                         KNN_ENDS_ON_STOP | (left ? KNN_ENDS_ON_LEFT : 0),
                         left);
}
