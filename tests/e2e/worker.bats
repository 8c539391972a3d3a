#!/usr/bin/env bats
# lora-worker serve driven by tests/ref/fake_engine.py, an engine written in Python against the
# documented protocol: the worker's tokens equal lora-worker generate's, tensor parallelism gives
# the same tokens, and residency, pinning, unload, notifications and liveness behave.

load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    "$WORKER" make-model --out "$D/m" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 300 --seed 41
    LORAS=""
    : > "$D/batch.jsonl"
    for i in 0 1 2 3 4 5 6 7; do
        "$WORKER" make-adapter --model "$D/m" --out "$D/a$i" --rank $((2 << (i % 4))) \
            --seed $((50 + i)) $([ $((i % 3)) = 0 ] && echo --targets q,v,down)
        LORAS="$LORAS --lora a$i=$D/a$i"
        ids=$(seq -s, $((3 + i)) $((5 + 3 * i)))
        echo "{\"prompt_ids\":[$ids],\"max_tokens\":$((4 + i)),\"lora\":\"a$i\"}" >> "$D/batch.jsonl"
    done
    echo '{"prompt_ids":[1,2,3],"max_tokens":5,"lora":null}' >> "$D/batch.jsonl"
    echo "$LORAS" > "$D/loras"
    # shellcheck disable=SC2046
    "$WORKER" generate --model "$D/m" $(cat "$D/loras") --batch "$D/batch.jsonl" --json \
        --ignore-eos --logprobs 3 > "$D/expected.jsonl"
}

engine() {
    # shellcheck disable=SC2046
    $PYTHON "$ROOT/tests/ref/fake_engine.py" generate --worker "$WORKER" --model "$D/m" \
        $(cat "$D/loras") --batch "$D/batch.jsonl" --logprobs 3 "$@"
}

@test "a served worker gives the tokens and log-probabilities of lora-worker generate, 8 adapters mixed" {
    engine > "$BATS_TEST_TMPDIR/served.jsonl"
    $REF compare "$D/expected.jsonl" "$BATS_TEST_TMPDIR/served.jsonl" --tol 1e-5
}

@test "tensor parallelism: two ranks give the tokens of one" {
    engine --tp 2 > "$BATS_TEST_TMPDIR/tp2.jsonl"
    $REF compare "$D/expected.jsonl" "$BATS_TEST_TMPDIR/tp2.jsonl" --tol 1e-4
}

@test "residency, pinning, unload, notifications, malformed traffic and liveness" {
    run $PYTHON "$ROOT/tests/ref/test_worker.py" "$WORKER" "$D/m" "$D/a1" "$D/a2" "$D/a3"
    echo "$output"
    expect_status 0
    [[ "$output" == *"1..8"* ]]
}
