#!/usr/bin/env bats
# lora-frontend under hostile clients, with a real engine and worker on ipc sockets in a
# temporary run directory (always stopped and removed): the whole-request deadline, the
# per-address connection cap, the prompt bound and the memory of large bodies, and the status a
# stream gets from an unhealthy engine (last: it kills the worker).

load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    "$WORKER" make-model --out "$D/m" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 258 --seed 81 --max-position-embeddings 4096
    "$WORKER" make-adapter --model "$D/m" --out "$D/a0" --rank 8 --seed 90
    mkdir -m 0700 "$D/run"
    # One sequence at a time, so that requests queue behind a long one.
    start_logged engine "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$D/run" --max-model-len 512 \
        --max-num-seqs 1 --lora-modules "a0=$D/a0"
    start_logged worker "$LORA_BIN/lora-worker" serve --engine "ipc://$D/run/worker.sock" --rank 0
    # f1: small connection limits and a short deadline; f2: the defaults.
    start_logged f1 "$LORA_BIN/lora-frontend" --run-dir "$D/run" --port 0 --max-connections 16 \
        --max-connections-per-ip 4 --request-timeout 3 --http-timeout 60
    start_logged f2 "$LORA_BIN/lora-frontend" --run-dir "$D/run" --port 0 --enable-runtime-lora
    wait_frontend f1 && wait_frontend f2
}

teardown_file() {
    for p in f1 f2 worker engine; do
        [ -f "$D/$p.pid" ] && kill "$(cat "$D/$p.pid")" 2>/dev/null
    done
    wait 2>/dev/null
}

post() { # PORT PATH JSON: the status line's code and the body, in $status_code and $body
    local out
    out=$(curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' --data-binary @- \
        "http://127.0.0.1:$1$2" <<< "$3")
    status_code=${out##*$'\n'}
    body=${out%$'\n'*}
}

@test "limits: a client that trickles header lines is cut at --request-timeout" {
    run "$PYTHON" "$ROOT/tests/ref/slow_clients.py" deadline "$(cat "$D/port_f1")" 3 3
    echo "$output"
    expect_status 0
}

@test "limits: one client address holds at most --max-connections-per-ip connections" {
    run "$PYTHON" "$ROOT/tests/ref/slow_clients.py" per-ip "$(cat "$D/port_f1")" 4
    echo "$output"
    expect_status 0
}

@test "limits: a normal client is served while trickling clients fill every connection" {
    run "$PYTHON" "$ROOT/tests/ref/slow_clients.py" crowd "$(cat "$D/port_f1")" 16
    echo "$output"
    expect_status 0
}

@test "limits: prompt text longer than the context can hold is refused before tokenizing" {
    local port big limit
    port=$(cat "$D/port_f2")
    big=$(head -c 3000000 /dev/zero | tr '\0' a)
    post "$port" /tokenize "{\"prompt\":\"$big\"}"
    echo "$status_code $body"
    [ "$status_code" = 400 ]
    [ "$(jq -r .error.param <<< "$body")" = prompt ]
    [[ "$(jq -r .error.message <<< "$body")" == *"maximum context length of 512 tokens"* ]]
    limit=$(jq -r .error.message <<< "$body" | sed -n 's/.*more than the \([0-9]*\) bytes.*/\1/p')
    [ -n "$limit" ] && [ "$limit" -ge 512 ] && [ "$limit" -lt 3000000 ]
    # The limit itself is tokenized (and counted beyond the context, as vLLM's /tokenize does).
    post "$port" /tokenize "{\"prompt\":\"$(head -c "$limit" <<< "$big")\"}"
    [ "$status_code" = 200 ]
    [ "$(jq .count <<< "$body")" -gt 512 ]
    post "$port" /tokenize "{\"prompt\":\"$(head -c $((limit + 1)) <<< "$big")\"}"
    [ "$status_code" = 400 ]
    post "$port" /v1/completions "{\"model\":\"$D/m\",\"prompt\":\"$big\",\"max_tokens\":1}"
    echo "$status_code $body"
    [ "$status_code" = 400 ]
    [ "$(jq -r .error.param <<< "$body")" = prompt ]
    [[ "$(jq -r .error.message <<< "$body")" == *"more than the $limit bytes"* ]]
}

@test "limits: eight concurrent 15.7 MB /tokenize bodies keep the frontend under 200 MB" {
    run "$PYTHON" "$ROOT/tests/ref/slow_clients.py" memory "$(cat "$D/port_f2")" \
        "$(cat "$D/f2.pid")" 200
    echo "$output"
    expect_status 0
}

waiting() { # PORT: the engine's waiting requests, from the frontend's /metrics
    curl -s "http://127.0.0.1:$1/metrics" |
        awk '/^vllm:num_requests_waiting[{ ]/ { n = $NF } END { print n + 0 }'
}

@test "limits: a queued stream whose adapter is unloaded gets 404 NotFoundError, not 200" {
    local port pids=() i
    port=$(cat "$D/port_f2")
    # Sixteen long requests ahead of it (about 0.3 s each here, one at a time): the unload
    # arrives while the request for a0 still waits, with seconds to spare.
    for i in $(seq 1 16); do
        curl -s -o /dev/null -H 'Content-Type: application/json' -d "{\"model\":\"$D/m\",
            \"prompt\":\"hello\",\"max_tokens\":500,\"ignore_eos\":true}" \
            "http://127.0.0.1:$port/v1/completions" &
        pids+=($!)
    done
    for _ in $(seq 1 200); do [ "$(waiting "$port")" -ge 8 ] && break; sleep 0.05; done
    curl -s -D "$D/unload.head" -o "$D/unload.body" -H 'Content-Type: application/json' \
        -d '{"model":"a0","prompt":"hello","max_tokens":4,"stream":true}' \
        "http://127.0.0.1:$port/v1/completions" &
    local target=$!
    sleep 0.3
    post "$port" /v1/unload_lora_adapter '{"lora_name":"a0"}'
    echo "unload: $status_code $body"
    wait "$target"
    kill "${pids[@]}" 2>/dev/null || true
    cat "$D/unload.head" "$D/unload.body"
    [ "$status_code" = 200 ]
    head -1 "$D/unload.head" | grep -q ' 404'
    [ "$(jq -r .error.type "$D/unload.body")" = NotFoundError ]
    [ "$(jq -r .error.code "$D/unload.body")" = 404 ]
    [[ "$(jq -r .error.message "$D/unload.body")" == *unloaded* ]]
}

@test "limits: a stream cut by a dead rank ends with one 503 error event; a new one gets 503 before any 200" {
    local port
    port=$(cat "$D/port_f2")
    # A stream that has started when its rank dies: 200, tokens, then vLLM's error event.
    curl -s -N -D "$D/cut.head" -o "$D/cut.body" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$D/m\",\"prompt\":\"hello\",\"max_tokens\":500,\"ignore_eos\":true,\"stream\":true}" \
        "http://127.0.0.1:$port/v1/completions" &
    local cut=$!
    for _ in $(seq 1 400); do grep -q '^data: {' "$D/cut.body" 2> /dev/null && break; sleep 0.01; done
    # Stopped, the rank goes silent mid-stream (declared dead after 3 s), then it is killed.
    kill -STOP "$(cat "$D/worker.pid")"
    wait "$cut"
    kill -9 "$(cat "$D/worker.pid")"
    head -1 "$D/cut.head" | grep -q ' 200'
    grep '^data: {"error"' "$D/cut.body" > "$D/cut.error"
    cat "$D/cut.error"
    [ "$(wc -l < "$D/cut.error")" = 1 ]
    [ "$(sed 's/^data: //' "$D/cut.error" | jq -r .error.type)" = ServiceUnavailableError ]
    [ "$(sed 's/^data: //' "$D/cut.error" | jq -r .error.code)" = 503 ]
    for _ in $(seq 1 300); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 503 ] &&
            break
        sleep 0.1
    done
    curl -s -D "$D/stream.head" -o "$D/stream.body" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$D/m\",\"prompt\":\"hello\",\"max_tokens\":4,\"stream\":true}" \
        "http://127.0.0.1:$port/v1/completions"
    cat "$D/stream.head" "$D/stream.body"
    head -1 "$D/stream.head" | grep -q ' 503'
    [ "$(jq -r .error.type "$D/stream.body")" = ServiceUnavailableError ]
    [[ "$(jq -r .error.message "$D/stream.body")" == *unhealthy* ]]
}
