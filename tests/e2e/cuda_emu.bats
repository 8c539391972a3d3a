#!/usr/bin/env bats
# A --device cuda rank under lora-engine, on machines without a GPU: lora-worker-emu is
# lora-worker linked with the CPU emulation of CUDA (backend/cuda/emu), whose devices have
# LORA_CUDA_EMU_MEMORY_MB of memory and count what is allocated. Covers --gpu-memory-utilization:
# the KV cache gets the share of the device's total memory that weights, adapter slots and
# activations leave, the share must be free at start, and a CPU rank refuses the flag; and
# adapters copied into slots beside the steps. With LORA_CUDA_WORKER set to a real lora-worker
# (tests/gpu/check.sh), the tests that do not depend on the emulated device's size run on a GPU.

load ../helpers
bats_require_minimum_version 1.5.0

EMU_WORKER=${LORA_CUDA_WORKER:-${LORA_BUILD:-build/main}/tests/bin/lora-worker-emu}
[[ $EMU_WORKER == /* ]] || EMU_WORKER=$ROOT/$EMU_WORKER

# Skips a test that needs the emulated device's size (or another process's share of it).
emulated_only() {
    [ -z "${LORA_CUDA_WORKER:-}" ] || skip "needs the emulated device's size"
}

setup_file() {
    export D=$BATS_FILE_TMPDIR
    "$WORKER" make-model --out "$D/m" > /dev/null
    "$WORKER" make-adapter --model "$D/m" --out "$D/a" --rank 4 --seed 5 > /dev/null
    "$WORKER" make-adapter --model "$D/m" --out "$D/b" --rank 8 --seed 6 > /dev/null
}

setup() {
    [ -x "$EMU_WORKER" ] || skip "no $EMU_WORKER (make all builds it)"
    export LORA_CUDA_EMU_MEMORY_MB=1024
    RUN=$BATS_TEST_TMPDIR/run
    mkdir -m 700 "$RUN"
    PIDS=$BATS_TEST_TMPDIR/pids
    : > "$PIDS"
}

teardown() {
    stop_pids "$PIDS"
}

# start_group WORKER [WORKER_OPTIONS...] -- ENGINE_OPTIONS...: one rank and an engine on $D/m
# in $RUN.
start_group() {
    local w=("$1" serve --engine "ipc://$RUN/worker.sock" --rank 0)
    shift
    while [ "$1" != -- ]; do w+=("$1"); shift; done
    shift
    OMP_WAIT_POLICY=passive "${w[@]}" > "$RUN/worker.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$RUN" --startup-timeout-ms 20000 "$@" \
        > "$RUN/engine.out" 2> "$RUN/engine.err" 3>&- &
    echo $! >> "$PIDS"
}

# The KV blocks the engine's ready line says it has, once it is ready.
ready_blocks() {
    wait_for_text "$RUN/engine.err" "lora-engine: ready:" 30 || { cat "$RUN"/*.err "$RUN"/*.log; return 1; }
    sed -n 's/^lora-engine: ready: .*, \([0-9]*\) KV blocks of .*/\1/p' "$RUN/engine.err"
}

# Bytes of one KV block of $D/m at block size 16, in bfloat16 (a GPU rank's default).
block_bytes() {
    jq '2 * .num_hidden_layers * .num_key_value_heads * (.hidden_size / .num_attention_heads)
        * 16 * 2' "$D/m/config.json"
}

blocks_at() {
    start_group "$EMU_WORKER" --device cuda -- \
        --gpu-memory-utilization "$1"
    ready_blocks
    # MB of everything the rank holds: weights, KV cache, activations, adapter slots and the
    # backend's own buffers.
    sed -n 's/.*: \([0-9.]*\) MB of .* weights, \([0-9.]*\) MB of .* KV cache, \([0-9.]*\) MB of activations and .* slots (\([0-9.]*\) MB); the backend.s own \([0-9.]*\) MB$/\1 \2 \3 \4 \5/p' \
        "$RUN/worker.log" | awk '{ print $1 + $2 + $3 + $4 + $5 }' > "$BATS_TEST_TMPDIR/setup_mb_$1"
    stop_pids "$PIDS"
    : > "$PIDS"
    rm -rf "$RUN" && mkdir -m 700 "$RUN"
}

@test "--gpu-memory-utilization: the KV cache takes what the device's share leaves" {
    emulated_only
    local bb n3 n6 total=$((1024 << 20))
    bb=$(block_bytes)
    n3=$(blocks_at 0.2)
    n6=$(blocks_at 0.5)
    echo "block $bb bytes; 0.2: $n3 blocks, 0.5: $n6 blocks" >&2
    [ "$n3" -ge 1 ]
    # Everything but the KV cache is the same in both runs: the 0.3 more of the total is KV.
    local want=$((total * 3 / 10 / bb))
    [ $((n6 - n3)) -ge $((want - 1)) ] && [ $((n6 - n3)) -le $((want + 1)) ]
    # What the rank holds, KV cache included, fills the share: within the rounding of its log
    # line (0.1 MB a figure) and one block.
    local mb
    mb=$(cat "$BATS_TEST_TMPDIR/setup_mb_0.5")
    echo "set up: $mb MB" >&2
    awk -v mb="$mb" -v want="$((total / 2))" 'BEGIN { d = mb - want / 1e6; exit !(d > -0.3 && d < 0.3) }'
}

@test "--gpu-memory-utilization: the rank reports its device's memory, and serves" {
    start_group "$EMU_WORKER" --device cuda -- --gpu-memory-utilization 0.5 --num-kv-blocks 40 \
        --lora-modules "a=$D/a"
    [ "$(ready_blocks)" = 40 ]
    grep -q "^lora-engine: rank 0: 40 KV blocks; [0-9.]* GiB of its device's [0-9.]* GiB free after setup; adapters are copied into slots alongside steps$" \
        "$RUN/engine.err"
    grep -q "set up on cuda" "$RUN/worker.log"
    "$LORA_BIN/lora-frontend" --run-dir "$RUN" --port 0 > "$RUN/frontend.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    wait_for_text "$RUN/frontend.log" "lora-frontend: ready: http://" 30
    local code
    code=$(curl -s -o "$RUN/completion" -w '%{http_code}' \
        "http://127.0.0.1:$(ready_port "$RUN/frontend.log")/v1/completions" \
        -H 'Content-Type: application/json' \
        -d '{"model":"a","prompt":[1,2,3],"max_tokens":4,"ignore_eos":true}')
    [ "$code" = 200 ] || { cat "$RUN/completion" "$RUN"/*.log; false; }
    [ "$(jq .usage.completion_tokens "$RUN/completion")" = 4 ]
}

# One greedy completion of 6 tokens of prompt [1,2,3] on port $1 for model $2, into file $3.
complete() {
    curl -s -o "$3" -w '%{http_code}' "http://127.0.0.1:$1/v1/completions" \
        -H 'Content-Type: application/json' \
        -d "{\"model\":\"$2\",\"prompt\":[1,2,3],\"max_tokens\":6,\"ignore_eos\":true,\"temperature\":0,\"return_token_ids\":true}"
}

@test "adapters copied into slots alongside steps: requests wait for their copy, tokens as generate's, activate timed" {
    # One slot for two adapters: each request for the other one evicts and copies again.
    start_group "$EMU_WORKER" --device cuda -- --gpu-memory-utilization 0.2 --max-loras 1 --max-cpu-loras 2 \
        --lora-modules "a=$D/a" --lora-modules "b=$D/b"
    ready_blocks > /dev/null
    grep -q "adapters are copied into slots alongside steps" "$RUN/engine.err"
    "$LORA_BIN/lora-frontend" --run-dir "$RUN" --port 0 > "$RUN/frontend.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    wait_for_text "$RUN/frontend.log" "lora-frontend: ready: http://" 30
    local port m pids=()
    port=$(ready_port "$RUN/frontend.log")
    for round in 1 2; do
        for m in a b "$D/m" b a; do
            complete "$port" "$m" "$RUN/out_${round}_${m//\//_}_$RANDOM" > /dev/null &
            pids+=($!)
        done
        wait "${pids[@]}"
        pids=()
    done
    for m in a b; do
        "$EMU_WORKER" generate --model "$D/m" --device cuda --lora "$m=$D/$m" --json --ignore-eos \
            --batch <(echo "{\"prompt_ids\":[1,2,3],\"max_tokens\":6,\"lora\":\"$m\"}") |
            jq -c .tokens > "$RUN/want_$m"
        local n=0 f
        for f in "$RUN"/out_*_"${m}"_*; do
            [ "$(jq -c '.choices[0].token_ids' "$f")" = "$(cat "$RUN/want_$m")" ] ||
                { echo "$m: $(cat "$f") against $(cat "$RUN/want_$m")"; false; }
            n=$((n + 1))
        done
        [ "$n" = 4 ]
    done
    # Each copy's activate timing reached the metrics (the start-up ones included).
    local count
    count=$(curl -s "http://127.0.0.1:$port/metrics" |
        sed -n 's/^vllm:lora_adapter_load_seconds_count{.*transition="activate".*} \([0-9.]*\)$/\1/p' |
        awk '{ s += $1 } END { print s + 0 }')
    echo "activate timings: $count" >&2
    [ "${count%.*}" -ge 2 ]
}

@test "--gpu-memory-utilization: a share that is not free, or that leaves no room, fails setup" {
    emulated_only
    # Another process holds 300 MB of the device.
    LORA_CUDA_EMU_OTHERS_MB=300 start_group "$EMU_WORKER" --device cuda -- \
        --gpu-memory-utilization 0.75
    wait_for_text "$RUN/engine.err" "lora-engine: fatal:" 30 || { cat "$RUN"/*.err; false; }
    grep -q "cuda:0 has 0.71 GiB free of 1.00 GiB, less than --gpu-memory-utilization 0.75 asks for (0.75 GiB)" \
        "$RUN/engine.err"
    stop_pids "$PIDS"
    : > "$PIDS"
    rm -rf "$RUN" && mkdir -m 700 "$RUN"
    start_group "$EMU_WORKER" --device cuda -- \
        --gpu-memory-utilization 0.0001
    wait_for_text "$RUN/engine.err" "lora-engine: fatal:" 30 || { cat "$RUN"/*.err; false; }
    grep -q "leaves no room for the KV cache: the weights, adapter slots and activations take" \
        "$RUN/engine.err"
}

@test "--gpu-memory-utilization: a CPU rank refuses it, naming the flags that size its cache" {
    start_group "$WORKER" -- --gpu-memory-utilization 0.5
    wait_for_text "$RUN/engine.err" "lora-engine: fatal:" 30 || { cat "$RUN"/*.err; false; }
    grep -q "rank 0 computes on the CPU: give --kv-cache-bytes or --kv-cache-fraction instead" \
        "$RUN/engine.err"
}

@test "lora-stack up --device cuda: --gpu-memory-utilization is 0.9 unless another budget is given; a GPU per rank" {
    # The stack's programs, with the emulated worker as its lora-worker; a small device, since
    # the emulation makes every step pay for the size of what it allocated.
    export LORA_CUDA_EMU_MEMORY_MB=192
    local bin=$BATS_TEST_TMPDIR/bin p port=$((20000 + ($$ % 300) * 40 + 7))
    mkdir "$bin"
    for p in "$LORA_BIN"/*; do ln -s "$p" "$bin/"; done
    rm "$bin/lora-stack" "$bin/lora-worker"
    cp "$LORA_BIN/lora-stack" "$bin/"
    ln -s "$EMU_WORKER" "$bin/lora-worker"
    "$bin/lora-stack" up "$D/m" --run-dir "$RUN/s" --device cuda --port "$port" \
        --metrics-port $((port + 5)) 2> "$BATS_TEST_TMPDIR/up.err" ||
        { cat "$BATS_TEST_TMPDIR/up.err" "$RUN"/s/logs/*; "$bin/lora-stack" down --run-dir "$RUN/s"; false; }
    local engine_cmd
    engine_cmd=$(tr '\0' ' ' < "/proc/$(awk '$1 == "engine" { print $2 }' "$RUN/s/pids")/cmdline")
    "$bin/lora-stack" down --run-dir "$RUN/s"
    [[ "$engine_cmd" == *" --gpu-memory-utilization 0.9"* ]]
    grep -q "^lora-engine: rank 0: [0-9]* KV blocks; [0-9.]* GiB of its device's [0-9.]* GiB free" \
        "$RUN/s/logs/engine.log"
    # Another budget replaces it.
    "$bin/lora-stack" up "$D/m" --run-dir "$RUN/s" --device cuda --port "$port" \
        --metrics-port $((port + 5)) --kv-cache-bytes 1000000 2> "$BATS_TEST_TMPDIR/up.err" ||
        { cat "$BATS_TEST_TMPDIR/up.err"; "$bin/lora-stack" down --run-dir "$RUN/s"; false; }
    engine_cmd=$(tr '\0' ' ' < "/proc/$(awk '$1 == "engine" { print $2 }' "$RUN/s/pids")/cmdline")
    "$bin/lora-stack" down --run-dir "$RUN/s"
    [[ "$engine_cmd" != *"--gpu-memory-utilization"* && "$engine_cmd" == *"--kv-cache-bytes 1000000"* ]]
    # One GPU per rank: rank R on cuda:R, the last one checked before anything starts.
    LORA_CUDA_EMU_DEVICES=1 run "$bin/lora-stack" up "$D/m" --run-dir "$RUN/s" --device cuda \
        --tp 2 --port "$port" --metrics-port $((port + 5))
    [ "$status" = 100 ] && [[ "$output" == *"--device cuda:1: device 1 does not exist (1 CUDA device)"* ]]
    if [ -z "${LORA_CUDA_WORKER:-}" ]; then
        # Two emulated devices: each rank opens its own, then setup stops at the all-reduce,
        # which the emulation does not have.
        LORA_CUDA_EMU_DEVICES=2 run "$bin/lora-stack" up "$D/m" --run-dir "$RUN/s" \
            --device cuda --tp 2 --port "$port" --metrics-port $((port + 5))
        [ "$status" != 0 ]
        grep -q "rank 0 on cuda:0: setup failed: NCCL is not part of the CUDA emulation" \
            "$RUN/s/logs/worker-0.log"
        grep -q "rank 1 on cuda:1: setup failed: NCCL is not part of the CUDA emulation" \
            "$RUN/s/logs/worker-1.log"
    fi
}

@test "lora-engine: one KV budget at most" {
    run --separate-stderr "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$RUN" \
        --gpu-memory-utilization 0.5 \
        --kv-cache-bytes 1000000
    expect_status 100
    expect_message "--gpu-memory-utilization is a KV cache budget of its own: give it without --kv-cache-fraction and --kv-cache-bytes"
    run "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$RUN" --gpu-memory-utilization 1.5
    expect_status 100
}
