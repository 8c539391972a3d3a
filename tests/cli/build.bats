#!/usr/bin/env bats
# The build switches: CUDA=auto|0|1 and SANITIZE, checked on the commands make would run
# (make -n), so no second full build is needed; the real CUDA build is the one tests run on
# when nvcc is installed.

load ../helpers

@test "CUDA=0 builds no CUDA object and links no CUDA runtime" {
    run make -C "$ROOT" -n -B CUDA=0 BUILD="$BATS_TEST_TMPDIR/b" all
    expect_status 0
    [[ "$output" == *"CUDA=0 -> cpu only"* ]]
    [[ "$output" != *nvcc* ]]
    [[ "$output" != *cudart* ]]
}

@test "CUDA=1 compiles backend/cuda with nvcc and links the CUDA runtime" {
    command -v nvcc >/dev/null || skip "nvcc is not installed"
    run make -C "$ROOT" -n -B CUDA=1 BUILD="$BATS_TEST_TMPDIR/b" all
    expect_status 0
    [[ "$output" == *"CUDA=1 -> cuda kernels on"* ]]
    [[ "$output" == *"nvcc"*"backend/cuda/cuda_device.cu"* ]]
    [[ "$output" == *"-DLORA_CUDA=1"* ]]
    [[ "$output" == *"-lcudart_static"* ]]
}

@test "CUDA=1 links from the directory that holds nvcc's own runtime, even through a wrapper" {
    command -v nvcc >/dev/null || skip "nvcc is not installed"
    # A wrapper script elsewhere on the PATH, as distributions install nvcc.
    mkdir -p "$BATS_TEST_TMPDIR/wrap"
    printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v nvcc)" > "$BATS_TEST_TMPDIR/wrap/nvcc"
    chmod +x "$BATS_TEST_TMPDIR/wrap/nvcc"
    run env PATH="$BATS_TEST_TMPDIR/wrap:/usr/bin:/bin" make -C "$ROOT" -n -B CUDA=1 \
        BUILD="$BATS_TEST_TMPDIR/b" "$BATS_TEST_TMPDIR/b/bin/lora-engine"
    expect_status 0
    # The word just before -lcudart_static; the temporary paths may themselves hold "-L".
    libdir=$(grep -oE -- ' -L[^ ]+ -lcudart_static' <<< "$output" | tail -n 1 | cut -d' ' -f2 | cut -c3-)
    [ -f "$libdir/libcudart_static.a" ]
}

@test "CUDA=auto follows whether nvcc is on the PATH" {
    run env PATH=/usr/bin:/bin make -C "$ROOT" -n -B CUDA=auto NVCC=no-such-nvcc BUILD="$BATS_TEST_TMPDIR/b" all
    expect_status 0
    [[ "$output" == *"CUDA=auto -> cpu only"* ]]
    [[ "$output" != *nvcc\ * ]]
    if command -v nvcc >/dev/null; then
        run make -C "$ROOT" -n -B CUDA=auto BUILD="$BATS_TEST_TMPDIR/b" all
        [[ "$output" == *"CUDA=auto -> cuda kernels on"* ]]
    fi
}

@test "a CUDA value other than auto, 0 or 1 is refused" {
    run make -C "$ROOT" -n -B CUDA=yes all
    [ "$status" -ne 0 ]
    [[ "$output" == *"CUDA must be auto, 0 or 1"* ]]
}

@test "SANITIZE builds into its own directory with the sanitizer flags" {
    run make -C "$ROOT" -n -B CUDA=0 SANITIZE=address,undefined all
    expect_status 0
    [[ "$output" == *"build dir build/san"* ]]
    [[ "$output" == *"-fsanitize=address,undefined"* ]]
}

@test "the binary under test reports the backends it was built with" {
    run "$WORKER" --version
    expect_status 0
    [[ "$output" == "lora-worker "*"(backends: cpu"* ]]
    if [[ "$LORA_BIN" == *-cuda/bin ]]; then
        [[ "$output" == *"cuda"* ]]
    else
        [[ "$output" != *"cuda"* ]]
    fi
}

@test "AVX2, FMA and OpenMP flags reach the CPU backend's files only" {
    run make -C "$ROOT" -n -B CUDA=0 BUILD="$BATS_TEST_TMPDIR/b" all
    expect_status 0
    cpu=$(grep -E -- '-c backend/cpu/matmul_cpu\.c' <<< "$output")
    [[ "$cpu" == *-mavx2* && "$cpu" == *-mfma* && "$cpu" == *-fopenmp* ]]
    for f in lib/base/fs.c lib/wire/msg.c lib/runtime/forward.c cmd/lora-engine/step.c; do
        line=$(grep -E -- "-c $f " <<< "$output")
        [ -n "$line" ] || { echo "no compile line for $f"; false; }
        [[ "$line" != *-mavx2* && "$line" != *-fopenmp* ]] || { echo "$line"; false; }
    done
}
