#!/usr/bin/env bats
# lora-stack, the supervisor: up, status, logs and down on the demo model; a killed worker and a
# killed frontend are restarted and the stack serves again; down leaves no process and no socket;
# two stacks in different run directories do not collide; a worker that dies before the engine is
# ready fails up at once; option routing and usage errors; an
# unsafe run directory is refused, down signals only the run directory's own supervisor, and an
# engine that stays unhealthy while every process runs is restarted. Every stack is brought
# down in teardown, whatever happened.

load ../helpers
bats_require_minimum_version 1.5.0

STACK="$LORA_BIN/lora-stack"

setup() {
    RUNS=() FAKES=() CLEAN=()
    # Ports of this test: a block of its own, away from the defaults and below the kernel's
    # ephemeral range (32768 up), where a client connection could hold one first.
    BASE=$((20000 + (BATS_TEST_NUMBER * 10) + ($$ % 300) * 40))
}

teardown() {
    for r in "${RUNS[@]}"; do
        "$STACK" down --run-dir "$r" > /dev/null 2>&1 || true
    done
    for p in "${FAKES[@]}"; do
        pkill -KILL -P "$p" 2> /dev/null || true
        kill -KILL "$p" 2> /dev/null || true
        wait "$p" 2> /dev/null || true
    done
    [ ${#CLEAN[@]} = 0 ] || rm -rf "${CLEAN[@]}"
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
    run --separate-stderr "$STACK" up --run-dir "$r" --gpu-memory-utilization 0.8
    expect_status 100
    [[ "$stderr" == *"--gpu-memory-utilization sizes a GPU's KV cache and the workers compute on the CPU: give --kv-cache-bytes or --kv-cache-fraction instead"* ]]
    [ ! -e "$r/supervisor.pid" ]
}

@test "vLLM's spellings: up MODEL, --tensor-parallel-size, --lora-modules with several values and JSON, --seed, accepted flags" {
    R=$BATS_TEST_TMPDIR/run
    M=$("$LORA_BIN/lora-worker" demo-model)
    RUNS+=("$R")
    run --separate-stderr "$STACK" up "$M" --run-dir "$R" --port "$BASE" \
        --metrics-port $((BASE + 5)) --tensor-parallel-size 2 --enable-lora \
        --disable-log-requests --uvicorn-log-level warning --seed 7 --device cpu \
        --lora-modules "sql=$M/adapters/demo-sql" \
        "{\"name\":\"js\",\"path\":\"$M/adapters/demo-chat\",\"base_model_name\":\"$M\"}"
    expect_status 0
    [[ "$stderr" == *"(model $M, 2 ranks) on cpu ("*" thread"* ]]
    [ -n "$(pid_of "$R" worker-0)" ] && [ -n "$(pid_of "$R" worker-1)" ]
    # Every rank got the device and says what it holds on it.
    for w in worker-0 worker-1; do
        tr '\0' ' ' < "/proc/$(pid_of "$R" "$w")/cmdline" | grep -q -- ' --device cpu '
        grep -q "set up on cpu (" "$R/logs/$w.log"
    done
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

# ---- the run directory and the health-checked restart

# A fake supervisor: a shell whose command line is "... lora-stack _supervise DIR", asleep, run
# by USER when given (setpriv execs it, so the pid is the shell's). Its output is not bats'
# (bats waits for whatever holds that), and teardown kills its sleep with it.
fake_supervisor() { # DIR [USER]
    local cmd=(bash -c 'sleep 300; :' lora-stack _supervise "$1")
    if [ -n "${2:-}" ]; then
        setpriv --reuid "$2" --regid "$(id -g "$2")" --clear-groups -- "${cmd[@]}" \
            > /dev/null 2>&1 3>&- &
    else
        "${cmd[@]}" > /dev/null 2>&1 3>&- &
    fi
    FAKES+=($!)
}

@test "--unhealthy-timeout is listed in --help; a bad value, as the flag or its mirror, exits 100" {
    run "$STACK" --help
    [[ "$output" == *"  --unhealthy-timeout S "* && "$output" == *LORA_STACK_UNHEALTHY_TIMEOUT* ]]
    local r=$BATS_TEST_TMPDIR/r
    for v in soon -1 1.5 ""; do
        run --separate-stderr "$STACK" up --run-dir "$r" --unhealthy-timeout "$v"
        expect_status 100
        expect_message "--unhealthy-timeout '$v' must be a number of seconds"
    done
    run --separate-stderr "$STACK" up --run-dir "$r" --unhealthy-timeout
    expect_status 100
    expect_message "--unhealthy-timeout needs a value"
    LORA_STACK_UNHEALTHY_TIMEOUT=later run --separate-stderr "$STACK" up --run-dir "$r"
    expect_status 100
    expect_message "LORA_STACK_UNHEALTHY_TIMEOUT 'later' must be a number of seconds"
    [ ! -e "$r/supervisor.pid" ]
}

@test "--device: a device no worker could use is refused (exit 100) with the worker's reason, before anything starts" {
    run "$STACK" --help
    [[ "$output" == *"  --device DEVICE "* && "$output" == *LORA_STACK_DEVICE* ]]
    local r=$BATS_TEST_TMPDIR/r
    if ! "$LORA_BIN/lora-worker" device --device cuda > /dev/null 2>&1; then
        run --separate-stderr "$STACK" up --run-dir "$r" --device cuda
        expect_status 100
        [[ "$stderr" == "lora-stack: fatal: --device cuda: "* ]]
        [[ "$stderr" == *"this build has no CUDA backend (built with CUDA=0)"* ||
            "$stderr" == *"no NVIDIA driver is installed"* ||
            "$stderr" == *"no CUDA-capable device is detected"* ||
            "$stderr" == *"CUDA driver version"* ]]
    fi
    run --separate-stderr "$STACK" up --run-dir "$r" --device gpu
    expect_status 100
    expect_message "--device gpu: unknown device 'gpu' (cpu, cuda or cuda:N)"
    LORA_STACK_DEVICE=cuda:1 run --separate-stderr "$STACK" up --run-dir "$r"
    expect_status 100
    expect_message "--device cuda:1: "
    run --separate-stderr "$STACK" up --run-dir "$r" --device
    expect_status 100
    expect_message "--device needs a value"
    [ ! -e "$r" ]
}

@test "precision flags reach every rank; a value a worker would refuse fails up (exit 100) before anything starts" {
    local r=$BATS_TEST_TMPDIR/p
    run --separate-stderr "$STACK" up --run-dir "$r" --dtype bf16
    expect_status 100
    expect_message "--dtype 'bf16' must be auto, float32, bfloat16 or float16"
    run --separate-stderr "$STACK" up --run-dir "$r" --quantization awq
    expect_status 100
    expect_message "--quantization 'awq' is not supported"
    [ ! -e "$r" ]
    up "$r" "$BASE" --tp 2 --quantization int8 --kv-cache-dtype bfloat16 --lora-dtype float16
    expect_status 0
    [[ "$stderr" == *"ready in $r "* ]]
    wait_serving "$BASE" demo-sql
    for rank in 0 1; do
        grep -q "rank $rank: set up on .* of int8 weights, .* of bfloat16 KV cache, .* float16 adapter slots" \
            "$r/logs/worker-$rank.log"
    done
}

@test "a worker that exits before the engine is ready fails up at once, naming the worker" {
    local r=$BATS_TEST_TMPDIR/r
    # A flag only the workers take, with a value they refuse: each rank exits with a usage error
    # before its hello. Waiting would last the ready timeout (three times over for up's own
    # wait); failing at once takes a second or two.
    SECONDS=0
    LORA_STACK_READY_TIMEOUT=120 up "$r" "$BASE" --load-timeout-ms banana
    [ "$SECONDS" -lt 60 ]
    expect_status 111
    expect_message "the stack did not start (failed worker-0)"
    grep -q "fatal: worker-0 exited before lora-engine was ready" "$r/supervisor.log"
    grep -q -- "--load-timeout-ms" "$r/logs/worker-0.log"
    # The supervisor stops what it started and exits; nothing is left running or bound.
    timeout 30 tail --pid="$(cat "$r/supervisor.pid")" -f /dev/null
    [ -z "$(find "$r" -name '*.sock')" ]
    ! pgrep -f "lora-engine .*--run-dir $r" > /dev/null
}

@test "a run directory writable by group or others is refused with the reason (exit 100), by every program" {
    local r=$BATS_TEST_TMPDIR/open
    mkdir -m 0777 "$r"
    # Ports of this test's own, and a down in teardown, should up start anything after all.
    RUNS+=("$r" "$BATS_TEST_TMPDIR/shared/run")
    for cmd in up status logs down; do
        run --separate-stderr "$STACK" "$cmd" --run-dir "$r" --port "$BASE" \
            --metrics-port $((BASE + 5))
        expect_status 100
        expect_message "run directory '$r' is writable by group or others (mode 0777)"
    done
    [ -z "$(ls -A "$r")" ] && [ "$(stat -c %a "$r")" = 777 ]
    # Below a directory others may write to without the sticky bit: refused too.
    mkdir -m 0777 "$BATS_TEST_TMPDIR/shared"
    run --separate-stderr "$STACK" up --run-dir "$BATS_TEST_TMPDIR/shared/run" --port "$BASE" \
        --metrics-port $((BASE + 5))
    expect_status 100
    expect_message "lies in '$BATS_TEST_TMPDIR/shared', which group or others may write to (mode 0777, not sticky)"
    # The engine, the frontends and the exporter check their --run-dir the same way.
    local m
    m=$("$LORA_BIN/lora-worker" demo-model)
    run --separate-stderr "$LORA_BIN/lora-engine" --model "$m" --run-dir "$r"
    expect_status 100
    expect_message "run directory '$r' is writable by group or others (mode 0777)"
    run --separate-stderr "$LORA_BIN/lora-frontend" --run-dir "$r" --port 0
    expect_status 100
    expect_message "run directory '$r' is writable by group or others (mode 0777)"
    run --separate-stderr "$LORA_BIN/lora-metrics" --run-dir "$r" --listen 127.0.0.1:0
    expect_status 100
    expect_message "run directory '$r' is writable by group or others (mode 0777)"
    [ -z "$(ls -A "$r")" ]
}

@test "a run directory another user owns is refused (exit 100) by lora-stack and the programs" {
    [ "$(id -u)" = 0 ] || skip "needs root to give a directory to another user"
    local r=$BATS_TEST_TMPDIR/theirs m
    mkdir -m 0700 "$r"
    chown nobody "$r"
    local want="run directory '$r' is owned by uid $(id -u nobody), not by you (uid 0)"
    RUNS+=("$r" "$BATS_TEST_TMPDIR/link")
    for cmd in up status logs down; do
        run --separate-stderr "$STACK" "$cmd" --run-dir "$r" --port "$BASE" \
            --metrics-port $((BASE + 5))
        expect_status 100
        expect_message "$want"
    done
    # A link of theirs to a directory of ours is refused as well: they could repoint it.
    mkdir -m 0700 "$BATS_TEST_TMPDIR/ours"
    ln -s "$BATS_TEST_TMPDIR/ours" "$BATS_TEST_TMPDIR/link"
    chown -h nobody "$BATS_TEST_TMPDIR/link"
    run --separate-stderr "$STACK" up --run-dir "$BATS_TEST_TMPDIR/link" --port "$BASE" \
        --metrics-port $((BASE + 5))
    expect_status 100
    expect_message "'$BATS_TEST_TMPDIR/link' is a symbolic link owned by uid $(id -u nobody)"
    [ -z "$(ls -A "$r")" ] && [ -z "$(ls -A "$BATS_TEST_TMPDIR/ours")" ]
    m=$("$LORA_BIN/lora-worker" demo-model)
    want="run directory '$r' is owned by uid $(id -u nobody), not by uid 0 (the caller)"
    run --separate-stderr "$LORA_BIN/lora-engine" --model "$m" --run-dir "$r"
    expect_status 100
    expect_message "$want"
    run --separate-stderr "$LORA_BIN/lora-frontend" --run-dir "$r" --port 0
    expect_status 100
    expect_message "$want"
    run --separate-stderr "$LORA_BIN/lora-metrics" --run-dir "$r" --listen 127.0.0.1:0
    expect_status 100
    expect_message "$want"
}

@test "the default run directory: XDG_RUNTIME_DIR when it is the caller's, else /tmp/lora-stack-UID, refused when another user made it" {
    [ "$(id -u)" = 0 ] || skip "needs root to run as another user"
    local uid xdg
    uid=$(id -u nobody)
    # Somewhere nobody can reach: the test's own directory is root's alone.
    xdg=$(mktemp -d /tmp/lora-stack-test.XXXXXX)/xdg
    CLEAN+=("${xdg%/xdg}")
    chmod 0711 "${xdg%/xdg}"
    mkdir -m 0700 "$xdg"
    chown nobody "$xdg"
    XDG_RUNTIME_DIR=$xdg run --separate-stderr runuser -u nobody -- "$STACK" status
    expect_status 1
    expect_message "no stack runs in '$xdg/lora-stack'"
    # Not theirs: the /tmp one, which root made first, so up refuses it and starts nothing.
    chown root "$xdg"
    [ ! -e "/tmp/lora-stack-$uid" ] || skip "/tmp/lora-stack-$uid exists already"
    mkdir -m 0700 "/tmp/lora-stack-$uid"
    CLEAN+=("/tmp/lora-stack-$uid")
    RUNS+=("/tmp/lora-stack-$uid")
    XDG_RUNTIME_DIR=$xdg run --separate-stderr runuser -u nobody -- "$STACK" up --port "$BASE" \
        --metrics-port $((BASE + 5))
    rmdir "/tmp/lora-stack-$uid"
    expect_status 100
    expect_message "run directory '/tmp/lora-stack-$uid' is owned by uid 0, not by you (uid $uid)"
}

@test "down signals only this run directory's supervisor, never another process that supervisor.pid names" {
    local r=$BATS_TEST_TMPDIR/run other=$BATS_TEST_TMPDIR/other p
    mkdir -m 0700 "$r" "$other"
    sleep 300 > /dev/null 2>&1 3>&- &
    FAKES+=($!)
    fake_supervisor "$other"
    # One of another user's, naming this very run directory.
    [ "$(id -u)" != 0 ] || fake_supervisor "$r" nobody
    for p in "${FAKES[@]}"; do
        # The fake's command line is in place once /proc shows it.
        for _ in $(seq 1 100); do
            grep -qa _supervise "/proc/$p/cmdline" 2> /dev/null || [ "$p" = "${FAKES[0]}" ] && break
            sleep 0.05
        done
        echo "$p" > "$r/supervisor.pid"
        run --separate-stderr "$STACK" down --run-dir "$r"
        expect_status 0
        [[ "$stderr" == *"supervisor.pid' names pid $p, which is not this run directory's supervisor; not signalling it"* ]]
        is_running "$p"
        run "$STACK" status --run-dir "$r"
        expect_status 1
    done
}

@test "an engine that stays unhealthy while every process runs is restarted, its runtime adapters kept" {
    R=$BATS_TEST_TMPDIR/run
    UNHEALTHY=$BATS_TEST_TMPDIR/unhealthy
    export LORA_ENGINE_TEST_UNHEALTHY_FILE=$UNHEALTHY
    M=$("$LORA_BIN/lora-worker" demo-model)
    up "$R" "$BASE" --unhealthy-timeout 2 --lora-modules "sql=$M/adapters/demo-sql" \
        --enable-runtime-lora --lora-root "$M/adapters"
    expect_status 0
    run curl -s -o /dev/null -w '%{http_code}' -m 30 "http://127.0.0.1:$BASE/v1/load_lora_adapter" \
        -H 'Content-Type: application/json' \
        -d "{\"lora_name\":\"extra\",\"lora_path\":\"$M/adapters/demo-code\"}"
    [ "$output" = 200 ]
    # An engine that says it is unhealthy while every process runs (the engine's test hook: a
    # hung or failed rank is declared dead by the engine and replaced without a health check).
    old=$(pid_of "$R" engine)
    touch "$UNHEALTHY"
    wait_for_text "$R/supervisor.log" "warning: the engine is not healthy (" 30
    # Gone before the new engine answers its first health check.
    wait_for_text "$R/supervisor.log" "warning: the engine is still not healthy (" 30
    rm "$UNHEALTHY"
    wait_for_text "$R/supervisor.log" "as it was not healthy" 60
    grep -q "still not healthy (LORA_ENGINE_TEST_UNHEALTHY_FILE exists); restarting the engine" \
        "$R/supervisor.log"
    grep "as it was not healthy for [0-9]* s while every process ran" "$R/supervisor.log" |
        grep -q "restored: 2 adapters .*extra"
    wait_serving "$BASE" extra
    [ "$(complete "$BASE" sql)" = 200 ]
    [ "$(pid_of "$R" engine)" != "$old" ]
    # The old engine was stopped for good, not left behind.
    for _ in $(seq 1 100); do is_running "$old" || break; sleep 0.1; done
    ! is_running "$old"
    run "$STACK" status --run-dir "$R"
    expect_status 0
}
