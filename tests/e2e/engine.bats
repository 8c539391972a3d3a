#!/usr/bin/env bats
# lora-engine with real lora-worker processes on ipc sockets in temporary run directories
# (always removed), driven by tests/ref/test_engine.py through the frontend, control and publish
# sockets: tokens, tensor parallelism, residency, unload, the max_loras bound, starvation,
# preemption, a killed worker and idle notifications.

load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    "$WORKER" make-model --out "$D/m" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 300 --seed 61
    LORAS=""
    : > "$D/batch.jsonl"
    for i in 0 1 2 3 4 5 6 7; do
        "$WORKER" make-adapter --model "$D/m" --out "$D/a$i" --rank $((2 << (i % 4))) \
            --seed $((70 + i)) $([ $((i % 3)) = 1 ] && echo --targets o,gate,up)
        LORAS="$LORAS --lora a$i=$D/a$i"
        ids=$(seq -s, $((3 + i)) $((5 + 3 * i)))
        echo "{\"prompt_ids\":[$ids],\"max_tokens\":$((4 + i)),\"lora\":\"a$i\"}" >> "$D/batch.jsonl"
    done
    echo '{"prompt_ids":[1,2,3],"max_tokens":5,"lora":null}' >> "$D/batch.jsonl"
    # shellcheck disable=SC2086
    "$WORKER" generate --model "$D/m" $LORAS --batch "$D/batch.jsonl" --json --ignore-eos \
        --logprobs 3 > "$D/expected.jsonl"
}

@test "engine and workers end to end (see tests/ref/test_engine.py for each check)" {
    run $PYTHON "$ROOT/tests/ref/test_engine.py" "$LORA_BIN" "$D/m" "$D/expected.jsonl" \
        "$D/batch.jsonl" "$D"/a0 "$D"/a1 "$D"/a2 "$D"/a3 "$D"/a4 "$D"/a5 "$D"/a6 "$D"/a7
    echo "$output"
    expect_status 0
    [[ "$output" == *"1..12"* ]]
    [[ "$output" != *"not ok"* ]]
}
