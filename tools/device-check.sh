#!/usr/bin/env bash
# Checks knngpu on a machine with an NVIDIA GPU: installs the package with
# CUDA, runs the whole test suite (the GPU tests run, not skip), the C-level
# parity harness (tools/gpu-harness.c: knn_gpu_search against a plain
# float64 reference), and compute-sanitizer memcheck and racecheck on a
# small knnGraph (panel, split TF32, float64, local frames on the panel
# and fused paths; copies searched once; pairwise-complete keys) and on
# the harness's walk shared by two devices (after the harness step);
# initcheck (reads of device memory never written) on the same, as a
# step of its own, which takes several times longer.
# Logs and summary.txt go to $OUT (default /tmp/knngpu-check).
#
# Through the device tool, from this machine (R does not exist there):
#   cd /work/main && ../shared/device/pack-r ALL Biobase BiocGenerics
#   run: carry [".device"], command
#     tar -xJf .device/r.tar.xz -C / && /opt/r-compat/setup && \
#       tools/device-check.sh
# Options: KNNGPU_CHECK_STEPS="install tests harness sanitizer" (the
# default; "memcheck" runs the sanitizer step's memcheck alone, and
# "initcheck" runs initcheck),
# KNNGPU_TEST_FILTER (a testthat filter, e.g. "gpu"), KNNGPU_LIB (the
# library to install into), KNNGPU_STEP_SECONDS (limit per step, 300).
set -u
OUT=${OUT:-/tmp/knngpu-check}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
steps=${KNNGPU_CHECK_STEPS:-install tests harness sanitizer}
lib=${KNNGPU_LIB:-$(mktemp -d)}
summary="$OUT/summary.txt"
: > "$summary"
jobs=$(nproc)

# step NAME COMMAND...: runs COMMAND with its output in $OUT/NAME.log and
# appends "NAME: ok|FAILED (rc, seconds): last line of the log".
step() {
    local name=$1 start rc
    shift
    start=$(date +%s)
    timeout "${KNNGPU_STEP_SECONDS:-300}" bash -c '"$@"' step "$@" \
        > "$OUT/$name.log" 2>&1
    rc=$?
    printf '%-12s %s (rc %d, %d s): %s\n' "$name" \
        "$([ $rc -eq 0 ] && echo ok || echo FAILED)" "$rc" \
        "$(( $(date +%s) - start ))" "$(tail -n 1 "$OUT/$name.log")" \
        >> "$summary"
    return $rc
}

install_pkg() {
    MAKEFLAGS="-j$jobs" R CMD INSTALL --library="$lib" . &&
        R_LIBS="$lib" Rscript -e 'library(knngpu); print(gpuInfo());
            stopifnot(gpuAvailable())'
}

run_tests() {
    if [ -n "${KNNGPU_TEST_FILTER:-}" ]; then
        R_LIBS="$lib" NOT_CRAN=true Rscript -e "testthat::test_local(
            'tests/testthat', filter = '$KNNGPU_TEST_FILTER',
            load_package = 'installed', reporter = 'summary',
            stop_on_failure = TRUE)"
    else
        R_LIBS="$lib" NOT_CRAN=true Rscript tools/run-tests.R
    fi
}

# The harness links the CUDA sources for this GPU only; the sanitizer
# step runs its two-device shared walk too.
harness_build=$(mktemp -d)
run_harness() {
    local build=$harness_build
    for f in src/cuda/*.cu; do
        nvcc -O3 -std=c++17 -Xcompiler -fPIC,-fopenmp -Isrc/engine \
            -gencode arch=compute_90,code=sm_90 -c "$f" \
            -o "$build/$(basename "$f" .cu).o" &
    done
    wait
    gcc -O2 -fopenmp -ffp-contract=off -Isrc/engine \
        -I/usr/local/cuda/include tools/gpu-harness.c "$build"/*.o \
        -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 \
        -lcudart -lcublas -lstdc++ -lm -o "$build/gpu-harness" &&
        "$build/gpu-harness" check
}

# The sanitizers' R script, in a file: Rscript -e takes at most 10000
# bytes once its spaces are encoded.
sanitize_script=$(mktemp --suffix=.R)
cat > "$sanitize_script" <<'RSCRIPT'
suppressPackageStartupMessages(library(knngpu))
set.seed(1)
x <- matrix(rnorm(1500 * 20), 1500)
t <- matrix(sample(0:2, 1200 * 6, TRUE), 1200)
t[, 1] <- 0; t[, 2] <- 1
for (m in c("pearson", "euclidean", "manhattan", "spearman"))
    g <- knnGraph(x, k = 20, metric = m, device = "gpu",
                  progress = FALSE)
g <- knnGraph(x, k = 600, device = "gpu", progress = FALSE)
g <- knnGraph(t, k = 5, metric = "cosine", device = "gpu",
              progress = FALSE)
for (m in c("pearson", "euclidean")) {
    g <- knnGraph(x, k = 20, metric = m, device = "gpu",
                  precision = "tf32x3", progress = FALSE)
    g <- knnGraph(x, k = 20, metric = m, device = "gpu",
                  precision = "fp64", progress = FALSE)
}
## replicates of three profiles: TF32, split TF32, float64
cl <- x[rep(1:3, 500), ] + rnorm(1500 * 20, sd = 1e-4)
g <- knnGraph(cl, k = 10, metric = "cosine", device = "gpu",
              progress = FALSE)
## Euclidean: split TF32, then local frames (a graph and a
## query search); exact copies searched once
g <- knnGraph(cl, k = 10, metric = "euclidean", device = "gpu",
              progress = FALSE)
s <- knnSearch(cl, query = cl[1:200, ] + 1e-6, k = 10,
               device = "gpu", progress = FALSE)
g <- knnGraph(x[rep(1:30, 50), ], k = 10, device = "gpu",
              progress = FALSE)
## local frames on the fused path (four cell types of 1200
## rows), a graph and a query search
ct <- matrix(rnorm(4 * 20), 4)[rep(1:4, 1200), ] +
    rnorm(4800 * 20, sd = 1e-3)
g <- knnGraph(ct, k = 10, metric = "euclidean", device = "gpu",
              progress = FALSE)
s <- knnSearch(ct, query = ct + 1e-5, k = 10,
               metric = "euclidean", device = "gpu",
               progress = FALSE)
## rows apart: three nodes a thousand times out among heavy
## tails pass their slots in TF32 and are searched in float32
h <- matrix(rt(3000 * 10, df = 2), 3000)
h[c(5, 1500, 2999), ] <- h[c(5, 1500, 2999), ] * 1000
g <- knnGraph(h, k = 10, device = "gpu", progress = FALSE)
Sys.setenv(KNNGPU_SELECT = "fused")
for (m in c("pearson", "euclidean"))
    g <- knnGraph(x, k = 20, metric = m, device = "gpu",
                  progress = FALSE)
g <- knnGraph(t, k = 5, metric = "cosine", device = "gpu",
              progress = FALSE)
## rows past their slots (400 exact copies of each of three
## profiles, each searched): the tile runs again, each row
## from the bound of the first run
options(knngpu.duplicates = "each")
g <- knnGraph(x[rep(1:3, 400), ], k = 5, metric = "euclidean",
              device = "gpu", progress = FALSE)
options(knngpu.duplicates = NULL)
## tiles of a few hundred rows beside the per-node arrays:
## each pair computed once (k = 100: the k smallest of each row in
## device memory, four entries a lane in the merge)
options(knngpu.gpu.memory = 1e7)
for (m in c("pearson", "euclidean"))
    g <- knnGraph(x, k = 20, metric = m, device = "gpu",
                  progress = FALSE)
options(knngpu.gpu.memory = 1.8e7)
g <- knnGraph(x, k = 100, metric = "euclidean", device = "gpu",
              progress = FALSE)
## pairwise-complete: every pair keyed in chunks of 9 rows
## (knn_pw_chunk_rows), Pearson and bicor, then whole, then
## query searches in one chunk, the reference tile in shared
## memory and (p = 1500) in global memory
h <- x
h[sample(length(h), 1500)] <- NA
options(knngpu.gpu.memory = 2 * 1500 * (8 * 20 + 8) + 4096 +
                            9 * (8 * 1500 + 24 * 10))
g <- knnGraph(h, k = 10, use = "pairwise.complete.obs",
              device = "gpu", progress = FALSE)
options(knngpu.gpu.memory = 2 * 1500 * (12 * 20 + 12) + 4096 +
                            9 * (8 * 1500 + 24 * 10))
g <- knnGraph(h, k = 10, metric = "bicor", progress = FALSE,
              use = "pairwise.complete.obs", device = "gpu")
options(knngpu.gpu.memory = NULL)
## a self search keyed whole, each pair once
for (m in c("pearson", "bicor"))
    g <- knnGraph(h, k = 10, metric = m, progress = FALSE,
                  use = "pairwise.complete.obs", device = "gpu")
for (m in c("cosine", "bicor"))
    s <- knnSearch(h, query = h[1:100, ], k = 10, metric = m,
                   use = "pairwise.complete.obs", device = "gpu",
                   progress = FALSE)
w <- matrix(rnorm(60 * 1500), 60)
w[sample(length(w), 4000)] <- NA
s <- knnSearch(w, k = 5, use = "pairwise.complete.obs",
               device = "gpu", progress = FALSE)
cat("sanitized run done\n")
RSCRIPT

sanitize() {
    local tool=$1
    compute-sanitizer --tool "$tool" --error-exitcode 9 \
        --target-processes all \
        env R_LIBS="$lib" Rscript "$sanitize_script" &&
        { [ ! -x "$harness_build/gpu-harness" ] ||
          compute-sanitizer --tool "$tool" --error-exitcode 9 \
              "$harness_build/gpu-harness" walk; }
}

# Steps run in child shells, under a time limit.
export lib jobs harness_build sanitize_script
export -f install_pkg run_tests run_harness sanitize

nvidia-smi -L > "$OUT/device.txt" 2>&1
nvcc --version | tail -n 2 >> "$OUT/device.txt"
for s in $steps; do
    case $s in
    install) step install install_pkg || break ;;
    tests) step tests run_tests ;;
    harness) step harness run_harness ;;
    sanitizer)
        step memcheck sanitize memcheck
        step racecheck sanitize racecheck ;;
    memcheck) step memcheck sanitize memcheck ;;
    initcheck) step initcheck sanitize initcheck ;;
    esac
done
cat "$OUT/device.txt" "$summary"
! grep -q FAILED "$summary"
