#!/usr/bin/env bats
# lora-frontend over HTTP with a real engine and worker on ipc sockets in a temporary run
# directory (always stopped and removed): two frontends on one engine and a third with an API
# key. Each test runs one check of tests/ref/test_frontend.py, which compares against
# `lora-worker generate` and the engine's control socket.

load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    echo "$LORA_BIN" > "$D/bin"
    "$WORKER" make-model --out "$D/m" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 258 --seed 81 --max-position-embeddings 4096
    mkdir -p "$D/loras" "$D/outside/x"
    for i in 0 1; do
        "$WORKER" make-adapter --model "$D/m" --out "$D/loras/a$i" --rank 8 --seed $((90 + i))
    done
    # What runtime loading must refuse.
    ln -s "$D/outside" "$D/loras/link-out"
    : > "$D/loras/a-file"
    mkdir -p "$D/loras/empty"
    cp -r "$D/loras/a0" "$D/loras/corrupt"
    head -c 100 /dev/urandom > "$D/loras/corrupt/adapter_model.safetensors"
    "$WORKER" make-model --out "$D/other" --hidden 96 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 258 --seed 82
    "$WORKER" make-adapter --model "$D/other" --out "$D/loras/other-base" --rank 8
    "$WORKER" make-adapter --model "$D/m" --out "$D/loras/too-high-rank" --rank 32
    # EOS becomes the greedy first token of one prompt, for the ignore_eos and min_tokens checks.
    echo '[10,20,30]' > "$D/eos_prompt.json"
    tok=$("$WORKER" generate --model "$D/m" --prompt-ids 10,20,30 --max-tokens 1 --json \
        --ignore-eos | jq '.tokens[0]')
    for f in config.json generation_config.json; do
        jq ".eos_token_id = $tok" "$D/m/$f" > "$D/tmp.json" && mv "$D/tmp.json" "$D/m/$f"
    done

    mkdir -m 0700 "$D/run"
    start_logged engine "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$D/run" --max-loras 2 \
        --max-lora-rank 16 --lora-modules "a0=$D/loras/a0" --idle-notify-ms 50
    start_logged worker "$LORA_BIN/lora-worker" serve --engine "ipc://$D/run/worker.sock" --rank 0
    local fe=("$LORA_BIN/lora-frontend" --run-dir "$D/run" --enable-runtime-lora
        --lora-root "$D/loras")
    start_logged f1 "${fe[@]}" --port 0 --publish-endpoint "ipc://$D/run/frontend-f1.sock"
    start_logged f2 "${fe[@]}" --port 0
    start_logged fkey "${fe[@]}" --port 0 --api-key s3cret
    wait_frontend f1 && wait_frontend f2 && wait_frontend fkey
    cp "$D/port_f1" "$D/port1"
    cp "$D/port_f2" "$D/port2"
    cp "$D/port_fkey" "$D/port_key"
}

teardown_file() {
    for p in f1 f2 fkey worker engine; do
        [ -f "$D/$p.pid" ] && kill "$(cat "$D/$p.pid")" 2>/dev/null
    done
    wait
}

check() {
    run "$PYTHON" "$ROOT/tests/ref/test_frontend.py" "$1" "$D"
    echo "$output"
    expect_status 0
}

@test "frontend: /health, /version and /v1/models with the engine's registry" {
    check health_version_models
}

@test "frontend: completions (text, token ids, several prompts) equal lora-worker generate" {
    check completion_equals_generate
}

@test "frontend: chat completions through the chat template equal lora-worker generate" {
    check chat_equals_generate
}

@test "frontend: streaming gives the same text as a whole response, usage and [DONE] last" {
    check stream_equals_whole
}

@test "frontend: log-probabilities (completions and chat) and echo" {
    check logprobs_and_echo
}

@test "frontend: stop strings end the text before them, streamed or not" {
    check stop_strings
}

@test "frontend: EOS stops, ignore_eos goes on, min_tokens holds it back" {
    check eos_ignore_eos_min_tokens
}

@test "frontend: runtime load, use through another frontend, unload from every rank, reload" {
    check runtime_load_unload_reload
}

@test "frontend: runtime loads stay under --lora-root and bad adapters are refused clearly" {
    check path_confinement
}

@test "frontend: --api-key protects /v1 with a bearer token" {
    check api_key
}

@test "frontend: 64 concurrent streams all get the whole text" {
    check concurrent_streams
}

@test "frontend: a client that disconnects aborts its request in the engine" {
    check disconnect_aborts
}

@test "frontend: per-request stats on the publish socket" {
    check stats_published
}

@test "frontend: malformed and hostile requests get the right status, the server stays up" {
    run "$PYTHON" "$ROOT/tests/ref/hostile_http.py" "$(cat "$D/port1")"
    echo "$output"
    expect_status 0
    [ "$(grep -c '^ok ' <<< "$output")" -ge 40 ]
}

@test "frontend: the official OpenAI Node client runs completions, chat, streaming and models" {
    dir=$("$ROOT/tests/ref/node_deps.sh")
    run node "$ROOT/tests/ref/openai_client.mjs" "$dir" "http://127.0.0.1:$(cat "$D/port1")/v1"
    echo "$output"
    expect_status 0
    [[ "$output" == *"all passed"* ]]
}

@test "frontend: an engine that goes away gives 503 and /health says so" {
    kill "$(cat "$D/engine.pid")"
    for _ in $(seq 1 100); do
        code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(cat "$D/port1")/health")
        [ "$code" = 503 ] && break
        sleep 0.1
    done
    [ "$code" = 503 ]
    run curl -s -w '\n%{http_code}' "http://127.0.0.1:$(cat "$D/port1")/v1/completions" \
        -H 'Content-Type: application/json' -d '{"prompt":"x","max_tokens":2}'
    [[ "$output" == *"503" ]]
    [[ "$output" == *"not reachable"* ]]
}
