#!/bin/sh
# Runs the whole test suite and the hostile battery (tools/hostile.R)
# against a build of knngpu's C engine and glue instrumented with
# AddressSanitizer and UndefinedBehaviorSanitizer (KNNGPU_CUDA=no: the CUDA
# backend is checked by compute-sanitizer on the GPU machine,
# tools/device-check.sh). Ends with "sanitizers: N findings" and exits 1
# on any finding or failure. Run from the root of the checkout, with the
# packages of tools/install.sh installed; .ci/run calls it.
#
# R itself is not instrumented, so the ASan runtime is preloaded into every
# R process (the battery's children inherit it). Leak checking is off: R
# frees neither its heap nor what packages keep for the session at exit,
# so every run would report those; the engine's own cleanup is checked by
# the tests that measure memory after errors and interrupts instead.
set -u
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g -O1"
cat > "$work/Makevars" <<MK
CFLAGS = $flags
LDFLAGS = -fsanitize=address,undefined
MK
mkdir -p "$work/lib"
KNNGPU_CUDA=no R_MAKEVARS_USER="$work/Makevars" \
    R CMD INSTALL --no-test-load --library="$work/lib" . \
    > "$work/install.log" 2>&1 || {
    cat "$work/install.log"
    echo "sanitizers: the instrumented build failed"
    exit 1
}
./cleanup
asan=$(gcc -print-file-name=libasan.so)
export LD_PRELOAD="$asan"
# allocator_may_return_null: R asks malloc for impossible sizes on purpose
# (a test checks the error that names the memory a layout would need), and
# R turns a NULL into its "cannot allocate" error; ASan would abort instead.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:log_path=$work/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$work/ubsan"
export R_LIBS="$work/lib"
# Timing assertions skip under the instrumented build (several times slower).
export KNNGPU_SANITIZED=1
status=0
Rscript tools/run-tests.R > "$work/tests.log" 2>&1 || status=1
tail -n 1 "$work/tests.log"
Rscript tools/hostile.R --jobs=2 > "$work/hostile.log" 2>&1 || status=1
grep -E "^FAILED|hostile battery" "$work/hostile.log"
unset LD_PRELOAD
findings=$(cat "$work"/asan.* "$work"/ubsan.* 2>/dev/null |
    grep -cE "^(==[0-9]+==ERROR|.*runtime error:)")
if [ "$findings" -gt 0 ]; then
    cat "$work"/asan.* "$work"/ubsan.* 2>/dev/null | head -n 60
    status=1
fi
[ "$status" -eq 0 ] || grep -E -A 6 "^── [0-9]+\. (Failure|Error)" \
    "$work/tests.log" | head -n 40
echo "sanitizers: $findings findings"
exit $status
