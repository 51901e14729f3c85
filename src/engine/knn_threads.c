/*
 * knn_threads.c: how many threads the engine may use. One function
 * decides (knn_threads), for every parallel region of the engine, from the
 * request and this process's limits; OMP_NUM_THREADS plays no part.
 *
 * libgomp's thread pool does not survive fork(): a child
 * (parallel::mclapply) that opens a parallel region after its parent had
 * one hangs for ever. So a child forked after the package loaded runs
 * every region on its own thread. libgomp also ends the process when it
 * cannot start a thread asked for (an address-space limit, ulimit -v, too
 * small for the stacks) or when a thread's stack overflows (OMP_STACKSIZE
 * set small): the count is kept to what the limits hold, and where
 * stacks are too small for the work, regions run on the calling thread,
 * which has the process's own stack.
 *
 * Waiting threads spin (libgomp's barriers, before they sleep; R starts
 * libgomp, so OMP_WAIT_POLICY is read before the package can set it): on
 * a machine whose cores other processes keep busy, a thread the scheduler
 * parks holds every other one at each barrier, and two threads can take
 * many times as long as one (inst/bench/shared_load.R). So a search takes no
 * more threads than there are cores that other runnable processes leave,
 * at least one; the bits do not depend on the count. Where the waits do
 * not spin (OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0 in the environment
 * R started in), more threads than free cores still gain, and a count the
 * user asked for is kept as asked.
 */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>
#include "knn_backend.h"
#include "knn_blas.h"
#include "knn_threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Threads per processor a region may use: more only wait for cores. */
#define KNN_THREADS_PER_PROC 4
/* The share of an address-space limit the threads' stacks may reserve. */
#define KNN_STACK_SHARE 0.25
/* The smallest stack a worker thread runs the engine and the BLAS on. */
#define KNN_MIN_STACK (1024.0 * 1024.0)
/* glibc's stack for a thread where the stack limit is unlimited. */
#define KNN_UNLIMITED_STACK (32.0 * 1024.0 * 1024.0)
/* The address space glibc reserves for a thread's malloc arena (64-bit). */
#define KNN_MALLOC_ARENA (64.0 * 1024.0 * 1024.0)

static volatile int knn_forked_child = 0;
static double knn_stack_bytes = 0.0; /* a worker's stack, 0: not known */
static int knn_waits_passive = 0;    /* libgomp's waiting threads sleep */

static void knn_mark_child(void)
{
    knn_forked_child = 1;
}

/* OMP_STACKSIZE in bytes (a number with an optional B, K, M or G; K when
 * there is none, as libgomp reads it), or 0 where unset or unreadable.
 * This is the OpenMP runtime's own setting, read from the environment
 * because OpenMP has no call that returns it: libgomp gives its worker
 * threads stacks of this size, read once when it starts. */
static double knn_omp_stacksize(void)
{
    const char *v = getenv("OMP_STACKSIZE");
    if (!v || !*v) return 0.0;
    char *end;
    double n = strtod(v, &end);
    while (*end == ' ') end++;
    double unit = 1024.0;
    switch (*end) {
    case 'b': case 'B': unit = 1.0; break;
    case 'k': case 'K': case '\0': unit = 1024.0; break;
    case 'm': case 'M': unit = 1024.0 * 1024.0; break;
    case 'g': case 'G': unit = 1024.0 * 1024.0 * 1024.0; break;
    default: return 0.0;
    }
    return n > 0.0 ? n * unit : 0.0;
}

/* Whether libgomp's waiting threads sleep at once: OMP_WAIT_POLICY
 * passive, or a GOMP_SPINCOUNT of 0. Like OMP_STACKSIZE, these are the
 * runtime's own settings, which it read when it started and which OpenMP
 * has no call to return. */
static int knn_omp_waits_passive(void)
{
    const char *policy = getenv("OMP_WAIT_POLICY");
    if (policy && strcasecmp(policy, "passive") == 0) return 1;
    const char *spins = getenv("GOMP_SPINCOUNT");
    if (!spins || !*spins) return 0;
    char *end;
    double count = strtod(spins, &end);
    return end != spins && count == 0.0;
}

void knn_threads_init(void)
{
    pthread_atfork(NULL, NULL, knn_mark_child);
    knn_waits_passive = knn_omp_waits_passive();
    knn_stack_bytes = knn_omp_stacksize();
    if (knn_stack_bytes > 0.0) return;
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) != 0) return;
    knn_stack_bytes = rl.rlim_cur == RLIM_INFINITY ? KNN_UNLIMITED_STACK
                                                   : (double)rl.rlim_cur;
}

double knn_address_space_left(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return INFINITY;
    double used = 0.0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long pages = 0;
        if (fscanf(f, "%lu", &pages) == 1)
            used = (double)pages * (double)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
    double left = (double)rl.rlim_cur - used;
    return left > 0.0 ? left : 0.0;
}

double knn_threads_reserve(int threads, int blas)
{
    double n = threads > 1 ? threads : 1;
    double stack = knn_stack_bytes > 0.0 ? knn_stack_bytes
                                         : KNN_UNLIMITED_STACK;
    double buffers = blas ? fmax(0.0, n - knn_blas_buffers()) : 0.0;
    return (n - 1.0) * (stack + KNN_MALLOC_ARENA) +
           buffers * KNN_BLAS_BUFFER;
}

int knn_threads_reserve_fits(int threads, int blas)
{
    return knn_threads_reserve(threads, blas) <= knn_address_space_left();
}

int knn_threads_fitting(int threads, double bytes_each, double share)
{
    double fit = share * knn_address_space_left() / bytes_each;
    if (!(fit < threads)) return threads;
    return fit < 1.0 ? 1 : (int)fit;
}

/* Counting this process's runnable threads reads one file per thread
 * (tens of them with OpenMP and BLAS workers), a cost a small search on
 * the GPU would pay in each step that asks for threads; those steps
 * follow each other closely, so a count this recent is taken again where
 * the system's runnable count is still the one it was taken beside. */
#define KNN_OWN_RUNNABLE_SECONDS 0.02

/* This process's runnable threads, the calling one included, counted up
 * to `most` (Linux's /proc/self/task; 1 where it cannot be read). */
static int knn_own_runnable_now(int most)
{
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return 1;
    int count = 0, at = dirfd(dir);
    struct dirent *entry;
    while (count < most && (entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        char path[48], line[512];
        snprintf(path, sizeof path, "%.20s/stat", entry->d_name);
        int fd = openat(at, path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t len = read(fd, line, sizeof line - 1);
        close(fd);
        if (len <= 0) continue;
        line[len] = '\0';
        /* The state follows the name, which may hold ") ". */
        const char *end = strrchr(line, ')');
        if (end && end[1] == ' ' && end[2] == 'R') count++;
    }
    closedir(dir);
    return count > 1 ? count : 1;
}

/* knn_own_runnable_now up to `running`, the system's runnable threads,
 * or its count of the last KNN_OWN_RUNNABLE_SECONDS where that was taken
 * beside the same system count. A count taken before a parallel region
 * does not stand for the time after it, when the region's workers still
 * spin: the system's count has grown by them, and they are counted
 * again. */
static int knn_own_runnable(int running)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static double taken = -1.0;
    static int count = 1, beside = 0;
    double now = knn_seconds();
    pthread_mutex_lock(&lock);
    if (taken < 0.0 || now - taken > KNN_OWN_RUNNABLE_SECONDS ||
        running != beside) {
        count = knn_own_runnable_now(running);
        taken = now;
        beside = running;
    }
    int own = count < running ? count : running;
    pthread_mutex_unlock(&lock);
    return own;
}

/* The runnable threads of the whole system but this process's own
 * (Linux's /proc/loadavg), or -1 where it cannot be read. This process's
 * other runnable threads are the workers of its last parallel region or
 * BLAS call, which spin a while after their work before they sleep: they
 * are the threads the next region runs on, not load, and counted as load
 * they left a search that follows another region (its input's layout,
 * knn_input.c) one thread. */
static int knn_others_runnable(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return -1;
    int running = 0;
    int read = fscanf(f, "%*f %*f %*f %d/", &running);
    fclose(f);
    if (read != 1 || running < 1) return -1;
    return running > 1 ? running - knn_own_runnable(running) : 0;
}

/* Reads of the runnable count before other threads count as load. A
 * kernel thread (a kworker, memory compaction, RCU), often woken by this
 * search's own allocations, is runnable only a moment, and a count that
 * catches one would leave a 2-core search one thread; another process
 * that keeps a core busy is runnable at every read. Between reads this
 * thread yields its core once. */
#define KNN_RUNNABLE_READS 3

/* Processors that other runnable threads leave to this one: procs less
 * the fewest found by KNN_RUNNABLE_READS reads, at least 1 (procs where
 * the count cannot be read). */
static int knn_procs_left(int procs)
{
    int others = knn_others_runnable();
    for (int r = 1; r < KNN_RUNNABLE_READS && others > 0; r++) {
        sched_yield();
        int again = knn_others_runnable();
        if (again >= 0 && again < others) others = again;
    }
    if (others < 0) return procs;
    int left = procs - others;
    return left < 1 ? 1 : left < procs ? left : procs;
}

int knn_threads(int requested)
{
    if (knn_forked_child) return 1;
    if (knn_stack_bytes > 0.0 && knn_stack_bytes < KNN_MIN_STACK) return 1;
#ifdef _OPENMP
    int procs = omp_get_num_procs();
#else
    int procs = 1;
#endif
    if (procs < 1) procs = 1;
    int n = requested > 0 ? requested : procs;
    int cap = procs < KNN_MAX_THREADS / KNN_THREADS_PER_PROC
        ? procs * KNN_THREADS_PER_PROC : KNN_MAX_THREADS;
    if (knn_stack_bytes > 0.0)
        cap = knn_threads_fitting(cap, knn_stack_bytes, KNN_STACK_SHARE);
    if (n > cap) n = cap;
    if (n > 1 && (requested <= 0 || !knn_waits_passive)) {
        int left = knn_procs_left(procs);
        if (n > left) n = left;
    }
    return n;
}

int knn_thread_number(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
