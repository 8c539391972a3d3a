#!/usr/bin/env bats
# GET /metrics on lora-frontend's own port, with a real engine and worker on ipc sockets in a
# temporary run directory per test (every process recorded in a pid file and stopped in
# teardown): the exposition with no lora-metrics process at all, before any request and after a
# load and a completion; the same engine-wide families and values as lora-metrics on the same
# stack; --lora-info; the API key (option and VLLM_API_KEY) on /v1 but not on /metrics;
# --served-model-name as the model_name label; promtool; an engine that restarts under a
# running frontend.

load ../helpers
bats_require_minimum_version 1.5.0

FRONTEND="$LORA_BIN/lora-frontend"
DIFF="$PYTHON $ROOT/tests/ref/scrape_diff.py"

# The families that are per process by nature, left out when a frontend's scrape is compared
# with lora-metrics': the latency histograms and vllm:request_params_max_tokens come from the
# request_stats of the frontends a process hears (a frontend: its own requests only;
# lora-metrics: every frontend it subscribes to, none here). The value of
# vllm:lora_requests_info (the time of the scrape) is never compared; its labels are.
PER_PROCESS="vllm:time_to_first_token_seconds vllm:inter_token_latency_seconds
    vllm:e2e_request_latency_seconds vllm:request_queue_time_seconds
    vllm:request_prefill_time_seconds vllm:request_decode_time_seconds
    vllm:request_inference_time_seconds vllm:request_params_max_tokens"

setup_file() {
    make_model_and_adapters "$BATS_FILE_TMPDIR" a b
}

setup() {
    for v in $(compgen -e); do
        case "$v" in LORA_FRONTEND_* | LORA_METRICS_* | VLLM_*) unset "$v" ;; esac
    done
    T=$BATS_TEST_TMPDIR
    M=$BATS_FILE_TMPDIR
    PIDS=$T/pids
    : > "$PIDS"
    RUN=$T/run
}

teardown() {
    stop_pids "$PIDS"
}

# An engine (--max-loras 2, adapter a at start-up) and its worker, in $RUN.
start_engine() {
    start_engine_group "$RUN" "$PIDS" "$M/m" --max-loras 2 --lora-modules "a=$M/a" "$@"
}

# NAME ARGS...: a frontend on this run directory with runtime loading; waits for its ready
# line and sets PORT_NAME.
start_frontend() {
    local name=$1
    shift
    "$FRONTEND" --run-dir "$RUN" --port 0 --enable-runtime-lora --lora-root "$M" "$@" \
        > "$T/$name.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    wait_for_text "$T/$name.log" "lora-frontend: ready: http://" 60
    printf -v "PORT_$name" '%s' "$(ready_port "$T/$name.log")"
}

scrape() { # PORT FILE
    curl -sf "http://127.0.0.1:$1/metrics" > "$2"
}

# Polls /metrics on port $1 into $T/scrape until every further argument (a fixed string) is in
# it, 10 s at most.
scrape_until() {
    local port=$1 deadline=$((SECONDS + 10)) s
    shift
    while :; do
        scrape "$port" "$T/scrape" || true
        local all=1
        for s in "$@"; do
            grep -qF -- "$s" "$T/scrape" || { all=0; break; }
        done
        [ "$all" = 1 ] && return 0
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "not on /metrics within 10 s: $*; the scrape:" >&2
            grep -v '^#' "$T/scrape" | grep -v _bucket >&2
            return 1
        fi
        sleep 0.05
    done
}

complete() { # PORT MODEL [CURL OPTIONS]: one completion of 4 tokens; prints the status
    curl -s -o "$T/completion" -w '%{http_code}' "http://127.0.0.1:$1/v1/completions" \
        -H 'Content-Type: application/json' "${@:3}" \
        -d "{\"model\":\"$2\",\"prompt\":[1,2,3],\"max_tokens\":4,\"ignore_eos\":true}"
}

@test "a frontend alone (no lora-metrics) serves /metrics: residency at once, a load, its own requests" {
    start_engine
    start_frontend f
    # The first scrape after the ready line is already true.
    scrape "$PORT_f" "$T/first"
    m="model_name=\"$M/m\",engine=\"0\""
    grep -qxF "vllm:lora_adapter_loaded{$m,adapter_name=\"a\",level=\"gpu\",pinned=\"false\"} 1.0" "$T/first"
    grep -q "^vllm:lora_requests_info{$m,max_lora=\"2\",running_lora_adapters=\"a\",waiting_lora_adapters=\"\"} " "$T/first"
    grep -qxF "vllm:num_requests_running{$m} 0.0" "$T/first"
    grep -qxF "vllm:num_gpu_loaded_lora_adapters{$m} 1.0" "$T/first"
    grep -q '^vllm:cache_config_info{engine="0",block_size="[0-9]*",num_gpu_blocks="[0-9]*"} 1.0$' "$T/first"
    grep -qxF "vllm:e2e_request_latency_seconds_count{$m} 0.0" "$T/first"

    run curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT_f/v1/load_lora_adapter" \
        -H 'Content-Type: application/json' -d "{\"lora_name\":\"b\",\"lora_path\":\"$M/b\"}"
    [ "$output" = 200 ]
    scrape_until "$PORT_f" "adapter_name=\"b\",level=\"gpu\"" \
        'running_lora_adapters="a,b",waiting_lora_adapters=""'
    [ "$(complete "$PORT_f" b)" = 200 ]
    [ "$(complete "$PORT_f" b)" = 200 ]
    scrape_until "$PORT_f" "vllm:e2e_request_latency_seconds_count{$m} 2.0" \
        "vllm:request_success_total{$m,finished_reason=\"length\"} 2.0" \
        "vllm:generation_tokens_total{$m} 8.0" \
        "lora_adapter_generation_tokens_total{$m,adapter_name=\"b\"} 8.0"
    promtool_clean "$T/scrape"
}

@test "its engine-wide families equal lora-metrics' on the same stack, idle and after requests" {
    start_engine
    "$LORA_BIN/lora-metrics" --engine "ipc://$RUN/publish.sock" --listen 127.0.0.1:0 \
        > /dev/null 2> "$T/metrics.log" 3>&- &
    echo $! >> "$PIDS"
    start_frontend f
    wait_for_text "$T/metrics.log" "lora-metrics: ready: http://" 30
    local mport
    mport=$(ready_port "$T/metrics.log")
    same() { # until both scrapes agree, 10 s at most
        local deadline=$((SECONDS + 10))
        until scrape "$PORT_f" "$T/fe" && scrape "$mport" "$T/lm" &&
              $DIFF "$T/fe" "$T/lm" --skip $PER_PROCESS > "$T/diff"; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                cat "$T/diff" >&2
                return 1
            fi
            sleep 0.1
        done
    }
    same
    # A scraper that never stops meanwhile: engine messages then wait for renders in the
    # frontend's queue, and must still all arrive, in order.
    (while :; do curl -s "http://127.0.0.1:$PORT_f/metrics" > /dev/null; done) 3>&- &
    echo $! >> "$PIDS"
    [ "$(complete "$PORT_f" a)" = 200 ]
    curl -sf "http://127.0.0.1:$PORT_f/v1/load_lora_adapter" -H 'Content-Type: application/json' \
        -d "{\"lora_name\":\"b\",\"lora_path\":\"$M/b\"}" > /dev/null
    [ "$(complete "$PORT_f" b)" = 200 ]
    [ "$(complete "$PORT_f" "$M/m")" = 200 ]
    scrape_until "$PORT_f" "vllm:request_success_total{model_name=\"$M/m\",engine=\"0\",finished_reason=\"length\"} 3.0"
    kill "$(tail -n 1 "$PIDS")"
    same
    grep -q 'adapter_name="b"' "$T/lm"
    # The comparison can fail: a frontend of the other meaning (started late, so its counters
    # differ too) has another vllm:lora_requests_info.
    start_frontend g --lora-info inflight
    scrape "$PORT_g" "$T/g"
    ! $DIFF "$T/g" "$T/lm" --skip $PER_PROCESS > "$T/diff"
    grep -q "^only in $T/g: vllm:lora_requests_info{.*running_lora_adapters=''," "$T/diff"
    grep -q "^only in $T/lm: vllm:lora_requests_info{.*running_lora_adapters='a,b'," "$T/diff"
}

@test "renders that hold the lock never stop completions; the engine's messages that waited all arrive" {
    start_engine
    "$LORA_BIN/lora-metrics" --engine "ipc://$RUN/publish.sock" --listen 127.0.0.1:0 \
        > /dev/null 2> "$T/metrics.log" 3>&- &
    echo $! >> "$PIDS"
    # Every render holds the lock 300 ms longer, and a scraper renders without a pause: the
    # lock is almost never free while the completions run.
    LORA_FRONTEND_TEST_RENDER_DELAY_MS=300 start_frontend f
    wait_for_text "$T/metrics.log" "lora-metrics: ready: http://" 30
    (while :; do curl -s "http://127.0.0.1:$PORT_f/metrics" > /dev/null; done) 3>&- &
    local hammer=$!
    echo "$hammer" >> "$PIDS"
    for model in a "$M/m" a; do
        [ "$(complete "$PORT_f" "$model")" = 200 ]
    done
    kill "$hammer"
    local mport deadline=$((SECONDS + 15))
    mport=$(ready_port "$T/metrics.log")
    until scrape "$PORT_f" "$T/fe" && scrape "$mport" "$T/lm" &&
          $DIFF "$T/fe" "$T/lm" --skip $PER_PROCESS > "$T/diff"; do
        [ "$SECONDS" -lt "$deadline" ] || { cat "$T/diff"; return 1; }
    done
    grep -qF "vllm:request_success_total{model_name=\"$M/m\",engine=\"0\",finished_reason=\"length\"} 3.0" "$T/fe"
    grep -qF "vllm:e2e_request_latency_seconds_count{model_name=\"$M/m\",engine=\"0\"} 3.0" "$T/fe"
    # At its end the frontend says how many messages waited, and that its engine link never
    # waited for the lock.
    kill -TERM "$(sed -n 4p "$PIDS")"
    wait_for_text "$T/f.log" "messages waited for a render" 10
    grep -q '/metrics: [1-9][0-9]* messages waited for a render (the longest [0-9]* ms); the engine link waited for the lock 0 times' "$T/f.log"
}

@test "--lora-info inflight (and LORA_FRONTEND_LORA_INFO) gives the activity meaning" {
    start_engine
    start_frontend res
    LORA_FRONTEND_LORA_INFO=inflight start_frontend act
    start_frontend flag --lora-info inflight
    scrape "$PORT_res" "$T/res"
    grep -q 'running_lora_adapters="a",waiting_lora_adapters=""' "$T/res"
    for p in "$PORT_act" "$PORT_flag"; do
        scrape "$p" "$T/act"
        grep -q 'running_lora_adapters="",waiting_lora_adapters=""' "$T/act"
    done
}

@test "an API key (--api-key or VLLM_API_KEY) guards /v1 but leaves /metrics open, as vLLM" {
    start_engine
    start_frontend key --api-key s3cret
    VLLM_API_KEY=env-key start_frontend env
    VLLM_API_KEY=env-key start_frontend both --api-key s3cret
    url() { echo "http://127.0.0.1:$1"; }
    code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
    [ "$(code "$(url "$PORT_key")/v1/models")" = 401 ]
    [ "$(code -H 'Authorization: Bearer s3cret' "$(url "$PORT_key")/v1/models")" = 200 ]
    [ "$(code "$(url "$PORT_env")/v1/models")" = 401 ]
    [ "$(code -H 'Authorization: Bearer env-key' "$(url "$PORT_env")/v1/models")" = 200 ]
    [ "$(complete "$PORT_env" a -H 'Authorization: Bearer env-key')" = 200 ]
    # Both given: the option wins, as in vLLM.
    [ "$(code -H 'Authorization: Bearer env-key' "$(url "$PORT_both")/v1/models")" = 401 ]
    [ "$(code -H 'Authorization: Bearer s3cret' "$(url "$PORT_both")/v1/models")" = 200 ]
    # OPTIONS passes the key check, as vLLM's middleware lets it through (no route: 405).
    [ "$(code -X OPTIONS "$(url "$PORT_key")/v1/models")" = 405 ]
    for p in "$PORT_key" "$PORT_env" "$PORT_both"; do
        [ "$(code "$(url "$p")/metrics")" = 200 ]
        [ "$(code "$(url "$p")/version")" = 200 ]
    done
    # An empty VLLM_API_KEY is no key.
    VLLM_API_KEY= start_frontend none
    [ "$(code "$(url "$PORT_none")/v1/models")" = 200 ]
}

@test "--served-model-name is the model_name label of every series; promtool accepts the scrape" {
    start_engine
    start_frontend f --served-model-name served-x
    scrape "$PORT_f" "$T/s"
    n=$(grep -c '^vllm:[a-z_]*{model_name=' "$T/s")
    [ "$n" -gt 20 ]
    [ "$(grep -c '^vllm:[a-z_]*{model_name="served-x",' "$T/s")" -eq "$n" ]
    [ "$(grep -c '^lora_[a-z_]*{model_name="served-x",' "$T/s")" -eq \
      "$(grep -c '^lora_[a-z_]*{model_name=' "$T/s")" ]
    ! grep -q "model_name=\"$M/m\"" "$T/s"
    run curl -s -o /dev/null -w '%{content_type}' "http://127.0.0.1:$PORT_f/metrics"
    [ "$output" = "text/plain; version=0.0.4; charset=utf-8" ]
    promtool_clean "$T/s"
}

@test "an engine that restarts: the frontend's /metrics starts its counters again, residency returns" {
    start_engine
    start_frontend f
    m="model_name=\"$M/m\",engine=\"0\""
    [ "$(complete "$PORT_f" a)" = 200 ]
    scrape_until "$PORT_f" "vllm:request_success_total{$m,finished_reason=\"length\"} 1.0"
    # The worker and the engine (the first two pids) stop; the frontend stays.
    head -n 2 "$PIDS" > "$T/engine_pids"
    stop_pids "$T/engine_pids"
    OMP_WAIT_POLICY=passive "$WORKER" serve --engine "ipc://$RUN/worker.sock" --rank 0 \
        > "$RUN/worker2.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    "$LORA_BIN/lora-engine" --model "$M/m" --run-dir "$RUN" --publish-interval-ms 200 \
        --max-loras 2 --lora-modules "b=$M/b" > "$RUN/engine2.log" 2>&1 3>&- &
    echo $! >> "$PIDS"
    # A new epoch: the counters from 0, the new engine's residency (b, not a).
    scrape_until "$PORT_f" "vllm:request_success_total{$m,finished_reason=\"length\"} 0.0" \
        "vllm:lora_adapter_loaded{$m,adapter_name=\"b\",level=\"gpu\",pinned=\"false\"} 1.0"
    ! grep -q 'adapter_name="a"' "$T/scrape"
    # The frontend takes the new engine for its requests within a few seconds.
    local deadline=$((SECONDS + 15))
    until [ "$(complete "$PORT_f" b)" = 200 ]; do
        [ "$SECONDS" -lt "$deadline" ] || { cat "$T/completion"; return 1; }
        sleep 0.2
    done
    scrape_until "$PORT_f" "vllm:request_success_total{$m,finished_reason=\"length\"} 1.0"
}
