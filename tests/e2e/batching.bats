#!/usr/bin/env bats
# Batching is invisible: a request gives the same tokens and log-probabilities alone and in a
# batch that mixes adapters of different ranks, the base model, prefill and decode; and paged-KV
# incremental decoding equals recomputing the whole sequence.

load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    "$WORKER" make-model --out "$D/m" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --intermediate 128 --vocab 300 --seed 21
    ranks=(1 2 4 8 8 16 32 64)
    targets=(q,k,v,o,gate,up,down q,v o,down gate,up,down q,k,v q,k,v,o,gate,up,down k,up v)
    for i in 0 1 2 3 4 5 6 7; do
        "$WORKER" make-adapter --model "$D/m" --out "$D/a$i" --rank "${ranks[$i]}" \
            --targets "${targets[$i]}" --seed $((30 + i)) $([ $((i % 2)) = 1 ] && echo --rslora)
    done
    # 9 requests: 8 adapters and the base model, prompts of 1 to 40 tokens, so that with a small
    # token budget some requests decode while others are still in prefill.
    : > "$D/batch.jsonl"
    for i in 0 1 2 3 4 5 6 7 8; do
        n=$((1 + i * 5))
        ids=$(seq -s, $((10 + i)) $((9 + i + n)))
        lora=$([ $i -lt 8 ] && echo "\"a$i\"" || echo null)
        echo "{\"prompt_ids\":[$ids],\"max_tokens\":$((3 + i)),\"lora\":$lora}" >> "$D/batch.jsonl"
    done
    LORAS=()
    for i in 0 1 2 3 4 5 6 7; do LORAS+=(--lora "a$i=$D/a$i"); done
    echo "${LORAS[*]}" > "$D/loras"
}

loras() { cat "$D/loras"; }

@test "a batch mixing 8 adapters, the base model, prefill and decode equals each request alone" {
    # shellcheck disable=SC2046
    "$WORKER" generate --model "$D/m" $(loras) --batch "$D/batch.jsonl" --json --ignore-eos \
        --logprobs 4 --max-num-batched-tokens 24 > "$BATS_TEST_TMPDIR/batched.jsonl"
    : > "$BATS_TEST_TMPDIR/alone.jsonl"
    while read -r line; do
        echo "$line" > "$BATS_TEST_TMPDIR/one.jsonl"
        # shellcheck disable=SC2046
        "$WORKER" generate --model "$D/m" $(loras) --batch "$BATS_TEST_TMPDIR/one.jsonl" --json \
            --ignore-eos --logprobs 4 >> "$BATS_TEST_TMPDIR/alone.jsonl"
    done < "$D/batch.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/batched.jsonl" "$BATS_TEST_TMPDIR/alone.jsonl" --tol 1e-5
    # The adapters differ from each other and from the base: outputs are not all one stream.
    [ "$(cut -d'"' -f1-8 "$BATS_TEST_TMPDIR/batched.jsonl" | sort -u | wc -l)" -gt 1 ]
}

@test "the batch agrees with the reference on every adapter" {
    # shellcheck disable=SC2046
    "$WORKER" generate --model "$D/m" $(loras) --batch "$D/batch.jsonl" --json --ignore-eos \
        --logprobs 4 --max-num-batched-tokens 24 > "$BATS_TEST_TMPDIR/c.jsonl"
    # shellcheck disable=SC2046
    $REF generate --model "$D/m" $(loras) --batch "$D/batch.jsonl" --logprobs 4 \
        > "$BATS_TEST_TMPDIR/ref.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/c.jsonl" "$BATS_TEST_TMPDIR/ref.jsonl" --tol 1e-4
}

@test "paged-KV incremental decoding equals full recomputation" {
    "$WORKER" generate --model "$D/m" --lora "a7=$D/a7" --prompt-ids 5,6,7,8,9 --max-tokens 24 \
        --ignore-eos --logprobs 1 --json --block-size 4 > "$BATS_TEST_TMPDIR/inc.json"
    ids=$($PYTHON -c 'import json,sys; print(",".join(map(str,[5,6,7,8,9]+json.load(sys.stdin)["tokens"])))' \
        < "$BATS_TEST_TMPDIR/inc.json")
    "$WORKER" generate --model "$D/m" --lora "a7=$D/a7" --prompt-ids "$ids" --max-tokens 0 \
        --json --block-size 4 > "$BATS_TEST_TMPDIR/full.json"
    echo '{"prompt_ids":[1],"lora":"a7"}' > "$BATS_TEST_TMPDIR/one.jsonl"
    $PYTHON - "$BATS_TEST_TMPDIR/inc.json" "$BATS_TEST_TMPDIR/full.json" <<'PY'
import json, sys
inc = json.load(open(sys.argv[1]))
full = json.load(open(sys.argv[2]))
chosen = [step[0][1] for step in inc["top_logprobs"]]   # greedy: the top token is the chosen one
recomputed = full["prompt_logprobs"][5:]
assert len(chosen) == len(recomputed) == 24, (len(chosen), len(recomputed))
worst = max(abs(a - b) for a, b in zip(chosen, recomputed))
assert worst < 1e-5, worst
print("max difference", worst)
PY
}

@test "a seeded sampled request gives the same tokens alone and in a batch" {
    printf '%s\n' '{"prompt_ids":[3,4,5],"max_tokens":12,"lora":"a1","temperature":0.9,"top_p":0.95,"top_k":40,"seed":7}' \
        > "$BATS_TEST_TMPDIR/one.jsonl"
    cat "$D/batch.jsonl" "$BATS_TEST_TMPDIR/one.jsonl" > "$BATS_TEST_TMPDIR/mix.jsonl"
    # shellcheck disable=SC2046
    alone=$("$WORKER" generate --model "$D/m" $(loras) --batch "$BATS_TEST_TMPDIR/one.jsonl" --json --ignore-eos)
    # shellcheck disable=SC2046
    mixed=$("$WORKER" generate --model "$D/m" $(loras) --batch "$BATS_TEST_TMPDIR/mix.jsonl" --json --ignore-eos | tail -1)
    tok() { $PYTHON -c 'import json,sys; print(json.loads(sys.stdin.read())["tokens"])'; }
    [ "$(echo "$alone" | tok)" = "$(echo "$mixed" | tok)" ]
    # ... and sampling is not greedy decoding in disguise.
    greedy=$(sed 's/"temperature":0.9/"temperature":0/' "$BATS_TEST_TMPDIR/one.jsonl" > "$BATS_TEST_TMPDIR/g.jsonl"
        # shellcheck disable=SC2046
        "$WORKER" generate --model "$D/m" $(loras) --batch "$BATS_TEST_TMPDIR/g.jsonl" --json --ignore-eos)
    [ "$(echo "$alone" | tok)" != "$(echo "$greedy" | tok)" ]
}

# Heads of 64 and 128 values take the 16-lane attention where the CPU has AVX-512, several query
# heads of a KV head per pass (4 of 64 values, 2 of 128); the batch above has heads of 16.
wide_heads_invariant() {
    local m=$1
    : > "$BATS_TEST_TMPDIR/batch.jsonl"
    for i in 0 1 2 3 4 5; do
        ids=$(seq -s, $((10 + i)) $((10 + i * 9)))
        echo "{\"prompt_ids\":[$ids],\"max_tokens\":$((4 + i))}" >> "$BATS_TEST_TMPDIR/batch.jsonl"
    done
    "$WORKER" generate --model "$m" --batch "$BATS_TEST_TMPDIR/batch.jsonl" --json --ignore-eos \
        --logprobs 4 --max-num-batched-tokens 24 > "$BATS_TEST_TMPDIR/batched.jsonl"
    : > "$BATS_TEST_TMPDIR/alone.jsonl"
    while read -r line; do
        echo "$line" > "$BATS_TEST_TMPDIR/one.jsonl"
        "$WORKER" generate --model "$m" --batch "$BATS_TEST_TMPDIR/one.jsonl" --json \
            --ignore-eos --logprobs 4 >> "$BATS_TEST_TMPDIR/alone.jsonl"
    done < "$BATS_TEST_TMPDIR/batch.jsonl"
    cmp "$BATS_TEST_TMPDIR/batched.jsonl" "$BATS_TEST_TMPDIR/alone.jsonl"
    $REF generate --model "$m" --batch "$BATS_TEST_TMPDIR/batch.jsonl" --logprobs 4 \
        > "$BATS_TEST_TMPDIR/ref.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/batched.jsonl" "$BATS_TEST_TMPDIR/ref.jsonl" --tol 1e-4
}

@test "heads of 64 values, 4 query heads to a KV head: batch equals alone, bit for bit, and the reference" {
    "$WORKER" make-model --out "$BATS_TEST_TMPDIR/m64" --hidden 256 --layers 2 --heads 4 \
        --kv-heads 1 --intermediate 128 --vocab 300 --seed 41
    wide_heads_invariant "$BATS_TEST_TMPDIR/m64"
}

@test "heads of 128 values, 2 query heads to a KV head, in bf16 on disk: batch equals alone and the reference" {
    "$WORKER" make-model --out "$BATS_TEST_TMPDIR/m128" --hidden 128 --layers 2 --heads 4 \
        --kv-heads 2 --head-dim 128 --intermediate 128 --vocab 300 --dtype bf16 --seed 42
    wide_heads_invariant "$BATS_TEST_TMPDIR/m128"
}
