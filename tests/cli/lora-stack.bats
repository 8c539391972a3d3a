#!/usr/bin/env bats
# lora-stack, the supervisor: up, status, logs and down on the demo model; a killed worker and a
# killed frontend are restarted and the stack serves again; down leaves no process and no socket;
# two stacks in different run directories do not collide; option routing and usage errors.
# Every stack is brought down in teardown, whatever happened.

load ../helpers
bats_require_minimum_version 1.5.0

STACK="$LORA_BIN/lora-stack"

setup() {
    RUNS=()
    # Ports of this test: a block of its own, away from the defaults.
    BASE=$((20000 + (BATS_TEST_NUMBER * 10) + ($$ % 500) * 40))
}

teardown() {
    for r in "${RUNS[@]}"; do
        "$STACK" down --run-dir "$r" > /dev/null 2>&1 || true
    done
}

up() { # RUN PORT [OPTIONS]: a stack with one frontend, no exporter port clash
    local run=$1 port=$2
    shift 2
    RUNS+=("$run")
    run --separate-stderr "$STACK" up --run-dir "$run" --port "$port" \
        --metrics-port $((port + 5)) "$@"
}

pid_of() { awk -v n="$2" '$1 == n { print $2 }' "$1/pids"; }

complete() { # PORT MODEL: one completion, its HTTP status
    curl -s -o /dev/null -w '%{http_code}' -m 30 "http://127.0.0.1:$1/v1/completions" \
        -H 'Content-Type: application/json' -d "{\"model\":\"$2\",\"prompt\":\"hi\",\"max_tokens\":3}"
}

wait_serving() { # PORT MODEL: waits up to 30 s for a 200
    for _ in $(seq 1 150); do
        [ "$(complete "$1" "$2")" = 200 ] && return 0
        sleep 0.2
    done
    return 1
}

@test "lora-stack --help and usage errors" {
    run "$STACK" --help
    expect_status 0
    [[ "$output" == *"lora-stack up"* && "$output" == *"--frontends"* ]]
    run --separate-stderr "$STACK" bogus
    expect_status 100
    [[ "$stderr" == *"unknown command 'bogus'"* ]]
    run --separate-stderr "$STACK" up --run-dir "$BATS_TEST_TMPDIR/r" --no-such-option
    expect_status 100
    [[ "$stderr" == *"no program of the stack takes '--no-such-option'"* ]]
    run --separate-stderr "$STACK" up --run-dir "$BATS_TEST_TMPDIR/r" --tp zero
    expect_status 100
    run --separate-stderr "$STACK" status --run-dir "$BATS_TEST_TMPDIR/none"
    expect_status 1
    run "$STACK" --help
    for o in --tensor-parallel-size -tp --enable-lora --disable-log-requests --uvicorn-log-level \
        --generation-config MODEL; do
        [[ "$output" == *"$o"* ]] || { echo "--help lacks $o" >&2; return 1; }
    done
}

@test "vLLM's spellings with bad values are usage errors (exit 100) naming them" {
    local r=$BATS_TEST_TMPDIR/r
    run --separate-stderr "$STACK" up --run-dir "$r" --uvicorn-log-level loud
    expect_status 100
    [[ "$stderr" == *"--uvicorn-log-level 'loud' must be one of critical, error, warning, info, debug, trace"* ]]
    run --separate-stderr "$STACK" up --run-dir "$r" --uvicorn-log-level
    expect_status 100
    run --separate-stderr "$STACK" up --run-dir "$r" --no-enable-lora
    expect_status 100
    [[ "$stderr" == *"LoRA is always on"* ]]
    run --separate-stderr "$STACK" up --run-dir "$r" --generation-config "$r/none"
    expect_status 100
    [[ "$stderr" == *"--generation-config '$r/none' must be auto, vllm or a folder"* ]]
    run --separate-stderr "$STACK" up --run-dir "$r" --tensor-parallel-size two
    expect_status 100
    [[ "$stderr" == *"'two' is not a number"* ]]
    run --separate-stderr "$STACK" up --run-dir "$r" -tp 0
    expect_status 100
    run --separate-stderr "$STACK" up --run-dir "$r" --lora-modules --port 1
    expect_status 100
    [[ "$stderr" == *"--lora-modules needs a value"* ]]
    run --separate-stderr "$STACK" up "$r/one" --model "$r/two" --run-dir "$r"
    expect_status 100
    [[ "$stderr" == *"the model is given twice"* ]]
    [ ! -e "$r/supervisor.pid" ]
}

@test "vLLM's spellings: up MODEL, --tensor-parallel-size, --lora-modules with several values and JSON, --seed, accepted flags" {
    R=$BATS_TEST_TMPDIR/run
    M=$("$LORA_BIN/lora-worker" demo-model)
    RUNS+=("$R")
    run --separate-stderr "$STACK" up "$M" --run-dir "$R" --port "$BASE" \
        --metrics-port $((BASE + 5)) --tensor-parallel-size 2 --enable-lora \
        --disable-log-requests --uvicorn-log-level warning --seed 7 \
        --lora-modules "sql=$M/adapters/demo-sql" \
        "{\"name\":\"js\",\"path\":\"$M/adapters/demo-chat\",\"base_model_name\":\"$M\"}"
    expect_status 0
    [[ "$stderr" == *"(model $M, 2 ranks)"* ]]
    [ -n "$(pid_of "$R" worker-0)" ] && [ -n "$(pid_of "$R" worker-1)" ]
    [ "$(curl -sf "http://127.0.0.1:$BASE/v1/models" | jq -r '[.data[].id] | sort | join(",")')" = \
        "$M,js,sql" ]
    [ "$(complete "$BASE" js)" = 200 ]
    "$LORA_BIN/lora-inspect" --run-dir "$R" config --json > "$BATS_TEST_TMPDIR/config"
    [ "$(jq .seed "$BATS_TEST_TMPDIR/config")" = 7 ]
    [ "$(jq .world_size "$BATS_TEST_TMPDIR/config")" = 2 ]
}

@test "up on the demo model serves the base model and its adapters; status, logs, down" {
    R=$BATS_TEST_TMPDIR/run
    up "$R" "$BASE" --max-loras 2 --max-cpu-loras 4
    expect_status 0
    [[ "$output" == *"http://127.0.0.1:$BASE/v1"* ]]
    [ "$(stat -c %a "$R")" = 700 ]
    # The first scrape once up returns, before any request: the three demo adapters, two of
    # them in the two slots, as lora-inspect says.
    curl -sf "http://127.0.0.1:$((BASE + 5))/metrics" > "$BATS_TEST_TMPDIR/scrape"
    [ "$(grep -c '^vllm:lora_adapter_loaded{' "$BATS_TEST_TMPDIR/scrape")" -eq 3 ]
    grep -q '^vllm:num_gpu_loaded_lora_adapters{.*} 2.0$' "$BATS_TEST_TMPDIR/scrape"
    for a in demo-sql demo-chat demo-code; do
        grep -q "^vllm:lora_adapter_loaded{.*adapter_name=\"$a\"" "$BATS_TEST_TMPDIR/scrape"
    done
    [ "$(complete "$BASE" demo-sql)" = 200 ]
    [ "$(complete "$BASE" demo-chat)" = 200 ]
    run "$STACK" status --run-dir "$R"
    expect_status 0
    [[ "$output" == *engine*running* && "$output" == *worker-0*running* ]]
    run "$STACK" logs engine --run-dir "$R"
    expect_status 0
    [[ "$output" == *"lora-engine: ready"* ]]
    pids=$(awk '{ print $2 }' "$R/pids"; cat "$R/supervisor.pid")
    run "$STACK" down --run-dir "$R"
    expect_status 0
    for p in $pids; do ! kill -0 "$p" 2> /dev/null; done
    [ -z "$(find "$R" -name '*.sock')" ]
    run "$STACK" status --run-dir "$R"
    expect_status 1
}

@test "a killed worker and a killed frontend are restarted and the stack serves again" {
    R=$BATS_TEST_TMPDIR/run
    up "$R" "$BASE" --tp 2
    expect_status 0
    old=$(pid_of "$R" worker-1)
    kill -KILL "$old"
    wait_serving "$BASE" demo-sql
    [ "$(pid_of "$R" worker-1)" != "$old" ]
    grep -q "worker-1 exited; restarting the engine and its ranks" "$R/supervisor.log"
    old=$(pid_of "$R" frontend-0)
    kill -KILL "$old"
    for _ in $(seq 1 100); do
        [ "$(pid_of "$R" frontend-0)" != "$old" ] && break
        sleep 0.1
    done
    wait_serving "$BASE" demo-code
    grep -q "frontend-0 exited; restarting frontend-0" "$R/supervisor.log"
    run "$STACK" status --run-dir "$R"
    expect_status 0
}

@test "two stacks in different run directories do not collide; SIGTERM stops one cleanly" {
    up "$BATS_TEST_TMPDIR/a" "$BASE"
    expect_status 0
    up "$BATS_TEST_TMPDIR/b" $((BASE + 20)) --frontends 2
    expect_status 0
    [ "$(complete "$BASE" demo-sql)" = 200 ]
    [ "$(complete $((BASE + 21)) demo-sql)" = 200 ]
    sup=$(cat "$BATS_TEST_TMPDIR/a/supervisor.pid")
    kids=$(awk '{ print $2 }' "$BATS_TEST_TMPDIR/a/pids")
    kill -TERM "$sup"
    timeout 30 tail --pid="$sup" -f /dev/null
    for p in $kids; do ! kill -0 "$p" 2> /dev/null; done
    [ -z "$(find "$BATS_TEST_TMPDIR/a" -name '*.sock')" ]
    [ "$(complete $((BASE + 20)) demo-sql)" = 200 ]
    run --separate-stderr "$STACK" up --run-dir "$BATS_TEST_TMPDIR/b" --port $((BASE + 30))
    expect_status 1
    [[ "$stderr" == *"already running"* ]]
}

@test "up --generation-config DIR reaches the engine and the frontends" {
    mkdir -p "$BATS_TEST_TMPDIR/gc"
    echo '{"temperature": 0.0, "max_new_tokens": 2}' > "$BATS_TEST_TMPDIR/gc/generation_config.json"
    up "$BATS_TEST_TMPDIR/g" "$BASE" --generation-config "$BATS_TEST_TMPDIR/gc"
    expect_status 0
    # The frontend caps max_tokens 3 at the file's 2.
    n=$(curl -s -m 30 "http://127.0.0.1:$BASE/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"hi","max_tokens":3,"ignore_eos":true}' | jq '.usage.completion_tokens')
    [ "$n" = 2 ]
    run "$LORA_BIN/lora-inspect" config --run-dir "$BATS_TEST_TMPDIR/g" --json
    expect_status 0
    [ "$(jq -r .generation_config <<< "$output")" = "$BATS_TEST_TMPDIR/gc/generation_config.json" ]
    [ "$(jq .default_max_tokens <<< "$output")" = 2 ]
}

@test "--served-model-name and --lora-info reach the frontend's /metrics and lora-metrics alike" {
    R=$BATS_TEST_TMPDIR/run
    up "$R" "$BASE" --served-model-name served-x --lora-info inflight
    expect_status 0
    for port in "$BASE" $((BASE + 5)); do
        curl -sf "http://127.0.0.1:$port/metrics" > "$BATS_TEST_TMPDIR/s"
        n=$(grep -c '^vllm:[a-z_]*{model_name=' "$BATS_TEST_TMPDIR/s")
        [ "$n" -gt 20 ]
        [ "$(grep -c '^vllm:[a-z_]*{model_name="served-x",' "$BATS_TEST_TMPDIR/s")" -eq "$n" ]
        # Idle, in the inflight meaning: nothing running, nothing waiting (resident would name
        # the demo adapters in the slots).
        grep -q '^vllm:lora_requests_info{model_name="served-x",engine="0",max_lora="[0-9]*",running_lora_adapters="",waiting_lora_adapters=""} ' \
            "$BATS_TEST_TMPDIR/s"
    done
    [ "$(complete "$BASE" served-x)" = 200 ]
}
