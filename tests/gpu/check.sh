#!/usr/bin/env bash
# check.sh: the CUDA backend on a machine with an NVIDIA GPU, in one go (about 5 minutes on one
# H100, most of it generating the 7B model once): builds with CUDA=1, runs tests/backend/test_cuda
# (every kernel against backend/ref, the forward pass against the CPU backend), runs the shared
# interface test tests/backend/test_backend for its cuda rows, tests/e2e/cuda_emu.bats with the
# real worker (an engine, frontend and stack over GPU ranks), then tests/bench/bench_cuda (decode
# tokens/s at batch 1, 8 and 64 on the 0.5B and 7B shapes in bfloat16, the N-adapter overhead at
# batch 64, shrink/expand bandwidth). Exits non-zero when the build, test_cuda or the benchmark
# fails; test_backend's result is reported (its batch-invariance check is bit for bit, which
# cuBLAS does not promise: see backend/backend.h).
#
#   tests/gpu/check.sh [--quick]     --quick: the 0.5B shape only
#
# The report goes to stdout and, when OUT is set, to $OUT/cuda-report.txt; the build and test logs
# to $OUT too. LORA_BENCH_CACHE (default /tmp/lora-bench-cache) keeps the generated models.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-}
log_dir=${out:-$(mktemp -d)}
report=$log_dir/cuda-report.txt
shapes=0.5b,7b
[ "${1:-}" = --quick ] && shapes=0.5b
: > "$report"
say() { printf '%s\n' "$*" | tee -a "$report"; }
status=0

say "== CUDA backend check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4)"
say "$(git log -1 --format='commit %h %s' 2>/dev/null)"

t0=$SECONDS
if ! make -j"$(nproc)" CUDA=1 > "$log_dir/build.log" 2>&1; then
    say "build: FAILED (see build.log)"; tail -20 "$log_dir/build.log"; exit 1
fi
say "build: ok in $((SECONDS - t0)) s ($(grep -c nvcc "$log_dir/build.log") nvcc compilations)"
B=build/main-cuda

t0=$SECONDS
timeout 600 "$B/tests/backend/test_cuda" > "$log_dir/test_cuda.log" 2>&1
rc=$?
say "test_cuda: exit $rc in $((SECONDS - t0)) s: $(grep -c '^ok' "$log_dir/test_cuda.log") ok," \
    "$(grep -c '^not ok' "$log_dir/test_cuda.log") not ok," \
    "$(grep -ci '^ok.*# skip' "$log_dir/test_cuda.log") skipped"
grep -E '^not ok|^# (forward|cuda:|.*differ)|SKIP|check failed|element' "$log_dir/test_cuda.log" |
    head -40 | tee -a "$report"
[ $rc -eq 0 ] || status=1

t0=$SECONDS
timeout 600 "$B/tests/backend/test_backend" > "$log_dir/test_backend.log" 2>&1
rc=$?
say "test_backend (informational): exit $rc in $((SECONDS - t0)) s; its cuda rows:"
grep -E '^(not )?ok .* cuda |^# cuda' "$log_dir/test_backend.log" | head -40 | tee -a "$report"

t0=$SECONDS
if command -v bats > /dev/null; then
    LORA_CUDA_WORKER=$PWD/$B/bin/lora-worker LORA_BUILD=$B LORA_BIN=$PWD/$B/bin \
        timeout 300 bats --tap tests/e2e/cuda_emu.bats > "$log_dir/cuda_e2e.log" 2>&1
    rc=$?
    say "tests/e2e/cuda_emu.bats on the GPU: exit $rc in $((SECONDS - t0)) s:" \
        "$(grep -c '^ok' "$log_dir/cuda_e2e.log") ok, $(grep -c '^not ok' "$log_dir/cuda_e2e.log") not ok"
    grep -A8 '^not ok' "$log_dir/cuda_e2e.log" | head -40 | tee -a "$report"
    [ $rc -eq 0 ] || status=1
else
    say "tests/e2e/cuda_emu.bats: not run (no bats on this machine)"
fi

t0=$SECONDS
timeout 900 "$B/tests/bench/bench_cuda" --shapes "$shapes" > "$log_dir/bench_cuda.log" 2>&1
rc=$?
say "bench_cuda: exit $rc in $((SECONDS - t0)) s"
tee -a "$report" < "$log_dir/bench_cuda.log"
[ $rc -eq 0 ] || status=1

say "== $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
