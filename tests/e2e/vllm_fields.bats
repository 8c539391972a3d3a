#!/usr/bin/env bats
# vLLM's request fields on lora-frontend over HTTP with a real engine and worker: each field
# vLLM implements and we implement changes the answer as vLLM's does, each one we do not is
# refused with 400 naming it, and --generation-config supplies the defaults of the fields a
# request leaves out, as vLLM's does. Each test runs one check of tests/ref/test_vllm_fields.py.

bats_require_minimum_version 1.5.0
load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    echo "$LORA_BIN" > "$D/bin"
    "$WORKER" make-model --out "$D/m" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 258 --seed 81 --max-position-embeddings 4096 > /dev/null
    # The model's own defaults: only max_new_tokens counts (50 and 1.0 are Hugging Face's).
    jq '. + {max_new_tokens: 5, top_k: 50, temperature: 1.0, do_sample: true}' \
        "$D/m/generation_config.json" > "$D/tmp.json"
    mv "$D/tmp.json" "$D/m/generation_config.json"
    mkdir -p "$D/gc"
    echo '{"temperature": 0.0, "top_k": 5, "top_p": 1.0, "max_new_tokens": 7}' \
        > "$D/gc/generation_config.json"

    mkdir -m 0700 "$D/run"
    start_logged engine "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$D/run" \
        --generation-config "$D/gc"
    start_logged worker "$WORKER" serve --engine "ipc://$D/run/worker.sock" --rank 0
    local fe=("$LORA_BIN/lora-frontend" --run-dir "$D/run" --port 0)
    start_logged plain "${fe[@]}" --generation-config vllm
    start_logged dir "${fe[@]}" --generation-config "$D/gc"
    start_logged auto "${fe[@]}"
    wait_frontend plain && wait_frontend dir && wait_frontend auto
}

teardown_file() {
    stop_pids "$D/pids"
}

check() {
    run "$PYTHON" "$ROOT/tests/ref/test_vllm_fields.py" "$1" "$D"
    echo "$output"
    expect_status 0
}

@test "vllm fields: include_stop_str_in_output keeps the stop string, streamed or not" {
    check include_stop_str
}

@test "vllm fields: allowed_token_ids restricts every token, log-probabilities stay raw" {
    check allowed_token_ids
}

@test "vllm fields: truncate_prompt_tokens keeps the last N prompt tokens" {
    check truncate_prompt_tokens
}

@test "vllm fields: prompt_logprobs in vLLM's shape, equal to echo's, with the rank" {
    check prompt_logprobs
}

@test "vllm fields: return_tokens_as_token_ids writes token_id:N in the log-probabilities" {
    check return_tokens_as_token_ids
}

@test "vllm fields: response_format text is accepted, other formats refused" {
    check response_format_text
}

@test "vllm fields: suffix, beam search, structured output, tools, lora and the rest refused" {
    check refused_fields
}

@test "vllm fields: --generation-config defaults apply to fields a request leaves out" {
    check generation_config_defaults
}

@test "vllm fields: lora-inspect config shows the engine's generation config" {
    check generation_config_shown
}

@test "vllm fields: a generation config default we cannot honour stops the start, named" {
    mkdir -p "$D/rp"
    echo '{"repetition_penalty": 1.1}' > "$D/rp/generation_config.json"
    run --separate-stderr "$LORA_BIN/lora-engine" --model "$D/m" --run-dir "$D/run" \
        --generation-config "$D/rp"
    expect_status 1
    expect_message "'repetition_penalty' is 1.1"
    [[ "$stderr" == *"$D/rp/generation_config.json"* ]]
    run --separate-stderr "$LORA_BIN/lora-frontend" --run-dir "$D/run" --port 0 \
        --generation-config "$D/rp"
    expect_status 1
    expect_message "'repetition_penalty' is 1.1"
}
