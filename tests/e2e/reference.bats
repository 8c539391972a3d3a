#!/usr/bin/env bats
# The C runtime against the independent numpy reference (tests/ref/hf_reference.py), on models
# and adapters written by the reference's own fixture writer and by lora-worker make-model.

load ../helpers

setup_file() {
    export D=$BATS_FILE_TMPDIR
    $FIXTURE model --out "$D/llama" --arch llama --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
        --inter 96 --vocab 300 --seed 1
    $FIXTURE model --out "$D/llama-tied" --arch llama --hidden 64 --layers 2 --heads 4 \
        --kv-heads 4 --inter 96 --vocab 300 --tied --seed 2
    $FIXTURE model --out "$D/qwen2" --arch qwen2 --hidden 64 --layers 3 --heads 8 --kv-heads 2 \
        --inter 128 --vocab 320 --seed 3
    $FIXTURE model --out "$D/llama-bf16" --arch llama --hidden 64 --layers 2 --heads 4 \
        --kv-heads 2 --inter 96 --vocab 300 --dtype bf16 --seed 4
    $FIXTURE model --out "$D/llama-sharded" --arch llama --hidden 64 --layers 2 --heads 4 \
        --kv-heads 2 --inter 96 --vocab 300 --shards 3 --seed 1
    $FIXTURE model --out "$D/mistral-f16" --arch mistral --hidden 64 --layers 2 --heads 4 \
        --kv-heads 1 --inter 96 --vocab 300 --dtype f16 --head-dim 32 --seed 5
    $FIXTURE model --out "$D/qwen2-bf16-sharded" --arch qwen2 --hidden 64 --layers 2 --heads 4 \
        --kv-heads 2 --inter 96 --vocab 300 --dtype bf16 --shards 2 --seed 6
    $FIXTURE adapter --model "$D/llama" --out "$D/a-all" --rank 8 --alpha 16 --seed 11
    $FIXTURE adapter --model "$D/llama" --out "$D/a-rs" --rank 4 --alpha 8 --rslora \
        --targets q_proj,v_proj,down_proj --seed 12
    $FIXTURE adapter --model "$D/qwen2" --out "$D/q-all" --rank 16 --alpha 8 --seed 13
    cat > "$D/batch.jsonl" <<'JSON'
{"prompt_ids":[256,5,17,99,3],"max_tokens":6,"lora":null}
{"prompt_ids":[256,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58],"max_tokens":4,"lora":null}
{"prompt_ids":[7],"max_tokens":8,"lora":null}
JSON
}

# Runs the C runtime and the reference on one model and compares them.
agree() {
    local model=$1 tol=$2; shift 2
    "$WORKER" generate --model "$D/$model" --batch "$D/batch.jsonl" --json --ignore-eos \
        --logprobs 5 "$@" > "$BATS_TEST_TMPDIR/c.jsonl"
    $REF generate --model "$D/$model" --batch "$D/batch.jsonl" --logprobs 5 \
        > "$BATS_TEST_TMPDIR/ref.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/c.jsonl" "$BATS_TEST_TMPDIR/ref.jsonl" --tol "$tol"
}

@test "llama, untied, grouped-query: same greedy tokens and log-probabilities as the reference" {
    agree llama 1e-4
}

@test "llama, tied embeddings: agrees with the reference" {
    agree llama-tied 1e-4
}

@test "qwen2 with q/k/v bias, 4 query heads per KV head: agrees with the reference" {
    agree qwen2 1e-4
}

@test "bfloat16 weights: agrees with the reference" {
    agree llama-bf16 1e-4
}

@test "sharded checkpoint (3 files and an index): agrees with the reference" {
    agree llama-sharded 1e-4
}

@test "sharded checkpoint gives exactly the unsharded model's outputs" {
    "$WORKER" generate --model "$D/llama" --batch "$D/batch.jsonl" --json --ignore-eos > "$BATS_TEST_TMPDIR/a"
    "$WORKER" generate --model "$D/llama-sharded" --batch "$D/batch.jsonl" --json --ignore-eos > "$BATS_TEST_TMPDIR/b"
    cmp "$BATS_TEST_TMPDIR/a" "$BATS_TEST_TMPDIR/b"
}

@test "mistral, float16, one KV head, head_dim not hidden/heads: agrees with the reference" {
    agree mistral-f16 1e-4
}

@test "qwen2, bfloat16, sharded: agrees with the reference" {
    agree qwen2-bf16-sharded 1e-4
}

@test "chunked prefill (4-token budget) and block size 1 agree with the reference" {
    agree llama 1e-4 --max-num-batched-tokens 4 --block-size 1
}

@test "LoRA on all seven projections agrees with the reference" {
    sed 's/"lora":null/"lora":"a"/' "$D/batch.jsonl" > "$BATS_TEST_TMPDIR/b.jsonl"
    "$WORKER" generate --model "$D/llama" --lora "a=$D/a-all" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --json --ignore-eos --logprobs 3 > "$BATS_TEST_TMPDIR/c.jsonl"
    $REF generate --model "$D/llama" --lora "a=$D/a-all" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --logprobs 3 > "$BATS_TEST_TMPDIR/ref.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/c.jsonl" "$BATS_TEST_TMPDIR/ref.jsonl" --tol 1e-4
}

# Unmerged LoRA in C against the same model with W + scale·B·A folded in offline.
merged_equal() {
    local model=$1 adapter=$2
    $REF merge --model "$D/$model" --lora "$D/$adapter" --out "$BATS_TEST_TMPDIR/merged"
    sed 's/"lora":null/"lora":"a"/' "$D/batch.jsonl" > "$BATS_TEST_TMPDIR/b.jsonl"
    "$WORKER" generate --model "$D/$model" --lora "a=$D/$adapter" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --json --ignore-eos --logprobs 5 > "$BATS_TEST_TMPDIR/lora.jsonl"
    "$WORKER" generate --model "$BATS_TEST_TMPDIR/merged" --batch "$D/batch.jsonl" \
        --json --ignore-eos --logprobs 5 > "$BATS_TEST_TMPDIR/merged.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/lora.jsonl" "$BATS_TEST_TMPDIR/merged.jsonl" --tol 1e-4
    # The adapter must matter, or the comparison proves nothing.
    ! cmp -s "$BATS_TEST_TMPDIR/lora.jsonl" <("$WORKER" generate --model "$D/$model" \
        --batch "$D/batch.jsonl" --json --ignore-eos --logprobs 5)
}

@test "LoRA equals the offline-merged model (rank 8, all projections)" {
    merged_equal llama a-all
}

@test "rsLoRA on a subset of projections equals the offline-merged model" {
    merged_equal llama a-rs
}

@test "LoRA on qwen2 (rank 16) equals the offline-merged model" {
    merged_equal qwen2 q-all
}

@test "models written by lora-worker make-model agree with the reference" {
    "$WORKER" make-model --out "$D/gen" --arch qwen2 --hidden 64 --layers 2 --heads 4 \
        --kv-heads 2 --intermediate 96 --vocab 300 --dtype bf16 --shards 2 --seed 9
    # In bfloat16 as the model: the adapter slots take the base model's dtype.
    "$WORKER" make-adapter --model "$D/gen" --out "$D/gen-a" --rank 8 --targets q,k,v,o,gate,up,down \
        --dtype bf16 --seed 3
    agree gen 1e-4
    sed 's/"lora":null/"lora":"a"/' "$D/batch.jsonl" > "$BATS_TEST_TMPDIR/b.jsonl"
    "$WORKER" generate --model "$D/gen" --lora "a=$D/gen-a" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --json --ignore-eos --logprobs 3 > "$BATS_TEST_TMPDIR/c.jsonl"
    $REF generate --model "$D/gen" --lora "a=$D/gen-a" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --logprobs 3 > "$BATS_TEST_TMPDIR/ref.jsonl"
    $REF compare "$BATS_TEST_TMPDIR/c.jsonl" "$BATS_TEST_TMPDIR/ref.jsonl" --tol 1e-4
}
