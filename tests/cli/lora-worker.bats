#!/usr/bin/env bats
# The command line of lora-worker: help and version, usage errors (exit 100), bad input (exit 1),
# system failures (exit 111), environment mirrors, the --json format, the demo model, make-model
# and make-adapter, determinism, and the man page against the options the program lists.

load ../helpers
bats_require_minimum_version 1.5.0

setup_file() {
    export D=$BATS_FILE_TMPDIR
    # Defaults are tiny: hidden 64, 2 layers, vocab 320 (<s> 256, </s> 257), context 4096.
    "$WORKER" make-model --out "$D/m"
    "$WORKER" make-model --out "$D/short" --max-position-embeddings 8 --seed 2
    "$WORKER" make-adapter --model "$D/m" --out "$D/a" --rank 4 --seed 3
}

setup() {
    # A mirror variable left in the caller's environment would change what every test sees.
    for v in $(compgen -e); do
        case "$v" in LORA_WORKER_*) unset "$v" ;; esac
    done
}

# Runs a Python snippet over the JSON lines of $output, in the list `rs`; every line must parse.
check_json() {
    printf '%s\n' "$output" | "$PYTHON" -c "import json, sys
rs = [json.loads(line) for line in sys.stdin]
$1"
}

# The options a command lists in its --help, one per line, sorted.
help_options() {
    "$WORKER" "$1" --help | sed -n 's/^  \(--[a-z][a-z-]*\).*/\1/p' | sort
}

# The options the man page defines under the .SS heading of command $1, one per line, sorted:
# the first option on the line after each .TP of that subsection.
man_options() {
    sed 's/\\-/-/g' "$ROOT/man/lora-worker.1" | awk -v cmd="$1" '
        /^\.S[HS]/ { gsub(/"/, ""); inside = ($1 == ".SS" && $2 == cmd); next }
        inside && /^\.TP/ { tp = 1; next }
        inside && tp { tp = 0; if (match($0, /--[a-z][a-z-]*/)) print substr($0, RSTART, RLENGTH) }
    ' | sort
}

# ---- help, version, commands

@test "--help and -h print the commands on stdout and exit 0" {
    for flag in --help -h; do
        run --separate-stderr "$WORKER" "$flag"
        expect_status 0
        [[ "$output" == "usage: lora-worker COMMAND"* ]]
        [[ "$output" == *generate* && "$output" == *make-model* && "$output" == *make-adapter* ]]
        [ -z "$stderr" ]
    done
}

@test "--version prints one version line and exits 0" {
    run --separate-stderr "$WORKER" --version
    expect_status 0
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" =~ ^lora-worker\ [0-9]+\.[0-9]+\.[0-9]+\ \(backends:\ cpu ]]
}

@test "no argument: usage on stderr, nothing on stdout, exit 100" {
    run --separate-stderr "$WORKER"
    expect_status 100
    [ -z "$output" ]
    [[ "$stderr" == "usage: lora-worker COMMAND"* ]]
}

@test "an unknown command exits 100 and names it" {
    run --separate-stderr "$WORKER" frobnicate --json
    expect_status 100
    expect_message "unknown command 'frobnicate'"
}

@test "each command's --help exits 0 on stdout and lists its options" {
    run --separate-stderr "$WORKER" generate --help
    expect_status 0
    [ -z "$stderr" ]
    for o in --model --lora --prompt-ids --batch --max-tokens --temperature --top-p --top-k \
        --seed --logprobs --ignore-eos --json --max-lora-rank --max-num-batched-tokens \
        --block-size --device --help; do
        [[ "$output" == *"  $o"* ]] || { echo "generate --help lacks $o" >&2; return 1; }
    done
    run --separate-stderr "$WORKER" make-model --help
    expect_status 0
    for o in --out --arch --hidden --layers --heads --kv-heads --intermediate --vocab --head-dim \
        --max-position-embeddings --rope-theta --tied --dtype --shards --seed; do
        [[ "$output" == *"  $o"* ]] || { echo "make-model --help lacks $o" >&2; return 1; }
    done
    run --separate-stderr "$WORKER" make-adapter --help
    expect_status 0
    for o in --model --out --rank --alpha --rslora --targets --dtype --seed; do
        [[ "$output" == *"  $o"* ]] || { echo "make-adapter --help lacks $o" >&2; return 1; }
    done
}

# ---- usage errors: exit 100, a message naming the option, nothing on stdout

@test "an unknown option exits 100 and names it" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --frobnicate
    expect_status 100
    expect_message "'--frobnicate'"
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --frobnicate=3
    expect_status 100
    expect_message "'--frobnicate'"
    run --separate-stderr "$WORKER" make-model --out "$BATS_TEST_TMPDIR/x" --frobnicate
    expect_status 100
    expect_message "'--frobnicate'"
    [ ! -e "$BATS_TEST_TMPDIR/x" ]
}

@test "an option without its value exits 100 and names it" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --max-tokens
    expect_status 100
    expect_message "--max-tokens"
}

@test "a positional argument or a value given to a flag exits 100" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 stray
    expect_status 100
    expect_message "'stray'"
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --json=yes
    expect_status 100
    expect_message "--json"
}

@test "a non-integer --max-tokens exits 100 and names the option and the value" {
    for v in abc 3.5 -1 1000001 ""; do
        run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --max-tokens "$v"
        expect_status 100
        expect_message "--max-tokens"
        [[ "$stderr" == *"'$v'"* ]]
    done
}

@test "an out-of-range --temperature exits 100 and names the option" {
    for v in 200 -0.5 nan inf x; do
        run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --temperature "$v"
        expect_status 100
        expect_message "--temperature"
    done
}

@test "both or neither of --prompt-ids and --batch exits 100 and names them" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --batch "$D/x"
    expect_status 100
    expect_message "--prompt-ids"
    [[ "$stderr" == *--batch* ]]
    run --separate-stderr "$WORKER" generate --model "$D/m"
    expect_status 100
    expect_message "--prompt-ids"
}

@test "a malformed --prompt-ids exits 100 and names the option" {
    for v in 1,a 1,,2 -1 "" abc; do
        run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids "$v"
        expect_status 100
        expect_message "--prompt-ids"
    done
}

@test "--lora without NAME=DIR exits 100 and names the option" {
    for v in demo "=$D/a" "a="; do
        run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --lora "$v"
        expect_status 100
        expect_message "--lora"
    done
}

@test "usage errors are reported before any file is read" {
    run --separate-stderr "$WORKER" generate --model "$BATS_TEST_TMPDIR/none" --prompt-ids 1 \
        --lora demo
    expect_status 100
    expect_message "--lora"
    run --separate-stderr "$WORKER" generate --model "$BATS_TEST_TMPDIR/none" --prompt-ids 1,a
    expect_status 100
    expect_message "--prompt-ids"
}

# ---- environment mirrors

@test "LORA_WORKER_MAX_TOKENS sets --max-tokens, and the command line overrides it" {
    LORA_WORKER_MAX_TOKENS=3 run --separate-stderr "$WORKER" generate --model "$D/m" \
        --prompt-ids 1,2,3 --ignore-eos --json
    expect_status 0
    check_json 'assert [len(r["tokens"]) for r in rs] == [3], rs'
    LORA_WORKER_MAX_TOKENS=3 run --separate-stderr "$WORKER" generate --model "$D/m" \
        --prompt-ids 1,2,3 --ignore-eos --json --max-tokens 5
    expect_status 0
    check_json 'assert [len(r["tokens"]) for r in rs] == [5], rs'
}

@test "a bad value in a mirror variable exits 100 and names the variable" {
    LORA_WORKER_MAX_TOKENS=many run --separate-stderr "$WORKER" generate --model "$D/m" \
        --prompt-ids 1
    expect_status 100
    expect_message "LORA_WORKER_MAX_TOKENS"
}

@test "flags and lists have mirrors too: LORA_WORKER_JSON, LORA_WORKER_LORA" {
    LORA_WORKER_JSON=1 run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 \
        --max-tokens 2
    expect_status 0
    check_json 'assert rs[0]["version"] == 1'
    LORA_WORKER_JSON=1 run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 \
        --max-tokens 2 --json=0
    expect_status 0
    [[ "$output" == "request 0 (base):"* ]]
    echo '{"prompt_ids":[1,2],"lora":"x"}' > "$BATS_TEST_TMPDIR/b.jsonl"
    LORA_WORKER_LORA="x=$D/a,y=$D/a" run --separate-stderr "$WORKER" generate --model "$D/m" \
        --batch "$BATS_TEST_TMPDIR/b.jsonl" --max-tokens 2
    expect_status 0
    [[ "$output" == "request 0 (x):"* ]]
}

# ---- output

@test "--json lines parse and hold the documented keys" {
    printf '%s\n' '{"prompt_ids":[256,5,17,99]}' '{"prompt_ids":[7],"lora":"a"}' \
        '{"prompt_ids":[9,8],"lora":null,"max_tokens":2,"logprobs":1}' > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --model "$D/m" --lora "a=$D/a" \
        --batch "$BATS_TEST_TMPDIR/b.jsonl" --max-tokens 6 --logprobs 4 --ignore-eos --json
    expect_status 0
    [ -z "$stderr" ]
    check_json '
assert len(rs) == 3, rs
for r, n_prompt, k, n in zip(rs, [4, 1, 2], [6, 6, 2], [4, 4, 1]):
    assert list(r) == ["version", "prompt_logprobs", "tokens", "top_logprobs", "finish_reason"], r
    assert r["version"] == 1
    lps = r["prompt_logprobs"]
    assert len(lps) == n_prompt and lps[0] is None, lps
    assert all(isinstance(x, float) and x <= 0 for x in lps[1:]), lps
    assert len(r["tokens"]) == k and all(0 <= t < 320 for t in r["tokens"]), r
    assert r["finish_reason"] == "length", r
    assert len(r["top_logprobs"]) == k, r
    for tok, top in zip(r["tokens"], r["top_logprobs"]):
        assert len(top) == n, top
        assert all(len(p) == 2 and 0 <= p[0] < 320 and p[1] <= 0 for p in top), top
        assert [p[1] for p in top] == sorted((p[1] for p in top), reverse=True), top
        assert len({p[0] for p in top}) == n, top
        assert top[0][0] == tok, (tok, top)  # greedy picks the most likely token
'
}

@test "without --ignore-eos, 'stop' means the last token is </s>, 'length' means max_tokens" {
    : > "$BATS_TEST_TMPDIR/b.jsonl"
    for i in $(seq 0 11); do
        echo "{\"prompt_ids\":[$((i * 7)),$((i + 1)),3],\"temperature\":1,\"seed\":$i}" \
            >> "$BATS_TEST_TMPDIR/b.jsonl"
    done
    run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --max-tokens 8 --json
    expect_status 0
    check_json '
assert len(rs) == 12
for r in rs:
    t = r["tokens"]
    if r["finish_reason"] == "stop":
        assert 1 <= len(t) <= 8 and t[-1] == 257 and 257 not in t[:-1], r
    else:
        assert r["finish_reason"] == "length" and len(t) == 8 and 257 not in t, r
'
}

@test "--logprobs beyond the vocabulary lists every token once and no more" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1,2 --max-tokens 2 \
        --ignore-eos --logprobs 1000 --json
    expect_status 0
    check_json '
for top in rs[0]["top_logprobs"]:
    ids = [p[0] for p in top]
    assert len(ids) == 320 and sorted(ids) == list(range(320)), (len(ids), top[-3:])
'
}

@test "without --json, one line per request names the adapter and the finish reason" {
    printf '%s\n' '{"prompt_ids":[1]}' '{"prompt_ids":[2],"lora":"sql"}' > "$BATS_TEST_TMPDIR/b"
    run --separate-stderr "$WORKER" generate --model "$D/m" --lora "sql=$D/a" \
        --batch "$BATS_TEST_TMPDIR/b" --max-tokens 3 --ignore-eos
    expect_status 0
    [ "${#lines[@]}" -eq 2 ]
    [[ "${lines[0]}" =~ ^request\ 0\ \(base\):\ [0-9]+\ [0-9]+\ [0-9]+\ \[length\]$ ]]
    [[ "${lines[1]}" =~ ^request\ 1\ \(sql\):\ [0-9]+\ [0-9]+\ [0-9]+\ \[length\]$ ]]
}

@test "--batch - reads the requests from standard input" {
    printf '%s\n' '{"prompt_ids":[1,2,3]}' '' '{"prompt_ids":[4],"max_tokens":2}' \
        > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --max-tokens 3 --ignore-eos --json
    expect_status 0
    from_file=$output
    run --separate-stderr bash -c '"$1" generate --model "$2" --batch - --max-tokens 3 \
        --ignore-eos --json < "$3"' _ "$WORKER" "$D/m" "$BATS_TEST_TMPDIR/b.jsonl"
    expect_status 0
    [ "${#lines[@]}" -eq 2 ]
    [ "$output" = "$from_file" ]
}

# ---- bad input: exit 1, a message naming what is wrong and where, nothing on stdout

@test "a model directory that does not exist exits 1 naming config.json" {
    run --separate-stderr "$WORKER" generate --model "$BATS_TEST_TMPDIR/none" --prompt-ids 1
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/none/config.json"
}

@test "invalid JSON on line 2 of a batch file exits 1 naming FILE:2" {
    printf '%s\n' '{"prompt_ids":[1]}' '{"prompt_ids":[1,' > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$BATS_TEST_TMPDIR/b.jsonl"
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/b.jsonl:2:"
    [[ "$stderr" == *"invalid JSON"* ]]
}

@test "a batch line naming an adapter not given with --lora exits 1 naming it" {
    printf '%s\n' '{"prompt_ids":[1],"lora":"a"}' '{"prompt_ids":[1],"lora":"zzz"}' \
        > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --model "$D/m" --lora "a=$D/a" \
        --batch "$BATS_TEST_TMPDIR/b.jsonl"
    expect_status 1
    expect_message "b.jsonl:2: adapter 'zzz'"
}

@test "prompt_ids holding a string exits 1 naming the entry" {
    echo '{"prompt_ids":[1,"two",3]}' > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$BATS_TEST_TMPDIR/b.jsonl"
    expect_status 1
    expect_message "b.jsonl:1: prompt_ids[1]"
}

@test "other malformed batch lines and files exit 1 naming the line or the file" {
    local b=$BATS_TEST_TMPDIR/b.jsonl
    for line in '[1,2]' '{}' '{"prompt_ids":[]}' '{"prompt_ids":[1],"lora":5}' \
        '{"prompt_ids":[1],"max_tokens":-1}' '{"prompt_ids":[1],"top_p":0}' \
        '{"prompt_ids":[1],"ignore_eos":1}'; do
        echo "$line" > "$b"
        run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$b"
        expect_status 1
        expect_message "$b:1:"
    done
    : > "$b"
    run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$b"
    expect_status 1
    expect_message "no requests"
    run --separate-stderr "$WORKER" generate --model "$D/m" --batch "$BATS_TEST_TMPDIR/none"
    expect_status 1
    expect_message "'$BATS_TEST_TMPDIR/none'"
}

@test "a token id outside the vocabulary exits 1 naming the token" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1,320
    expect_status 1
    expect_message "token 320 is outside the vocabulary (320)"
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1,319 --max-tokens 1
    expect_status 0
}

@test "a prompt plus max_tokens beyond max_position_embeddings exits 1" {
    run --separate-stderr "$WORKER" generate --model "$D/short" --prompt-ids 1,2,3 --max-tokens 6
    expect_status 1
    expect_message "exceeds the context length 8"
    run --separate-stderr "$WORKER" generate --model "$D/short" --prompt-ids 1,2,3 --max-tokens 5
    expect_status 0
}

@test "an adapter directory that does not exist exits 1 with a clear message" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 \
        --lora "x=$BATS_TEST_TMPDIR/none"
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/none/adapter_config.json"
    [[ "$stderr" == *"No such file or directory"* ]]
    [[ "$stderr" != *"line -1"* ]]
}

@test "an adapter above --max-lora-rank exits 1 naming the rank" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --lora "x=$D/a" \
        --max-lora-rank 2
    expect_status 1
    expect_message "rank 4"
}

@test "a write error on standard output is a system failure (111)" {
    [ -w /dev/full ] || skip "no /dev/full"
    run bash -c '"$1" generate --model "$2" --prompt-ids 1 --max-tokens 2 --json > /dev/full' \
        _ "$WORKER" "$D/m"
    expect_status 111
}

# ---- the demo model

@test "without --model, the demo model is written once under LORA_DEMO_DIR and reused" {
    export LORA_DEMO_DIR=$BATS_TEST_TMPDIR/cache/demo
    run --separate-stderr "$WORKER" generate --prompt-ids 1,2,3 --max-tokens 4 --json
    expect_status 0
    check_json 'assert len(rs) == 1 and len(rs[0]["tokens"]) <= 4, rs'
    first=$output
    [ -f "$LORA_DEMO_DIR/config.json" ]
    [ "$(ls "$BATS_TEST_TMPDIR/cache")" = demo ] # no temporary copy left behind
    stamp=$(stat -c '%i %y' "$LORA_DEMO_DIR/config.json" "$LORA_DEMO_DIR/model.safetensors")
    run --separate-stderr "$WORKER" generate --prompt-ids 1,2,3 --max-tokens 4 --json
    expect_status 0
    [ "$output" = "$first" ]
    [ "$(stat -c '%i %y' "$LORA_DEMO_DIR/config.json" "$LORA_DEMO_DIR/model.safetensors")" = \
        "$stamp" ]
}

@test "the demo adapters load from LORA_DEMO_DIR/adapters and change the output" {
    # A fresh directory: the demo is written before the adapters are read, so this works at once.
    export LORA_DEMO_DIR=$BATS_TEST_TMPDIR/demo
    printf '%s\n' '{"prompt_ids":[1,2,3]}' '{"prompt_ids":[1,2,3],"lora":"sql"}' \
        '{"prompt_ids":[1,2,3],"lora":"chat"}' '{"prompt_ids":[1,2,3],"lora":"code"}' \
        > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --batch "$BATS_TEST_TMPDIR/b.jsonl" \
        --lora "sql=$LORA_DEMO_DIR/adapters/demo-sql" \
        --lora "chat=$LORA_DEMO_DIR/adapters/demo-chat" \
        --lora "code=$LORA_DEMO_DIR/adapters/demo-code" --max-tokens 4 --ignore-eos --json
    expect_status 0
    check_json '
assert len(rs) == 4
base = rs[0]["prompt_logprobs"]
for r in rs[1:]:
    assert r["prompt_logprobs"] != base, r  # each adapter changes the model
'
    grep -q '"r": 16' "$LORA_DEMO_DIR/adapters/demo-chat/adapter_config.json"
}

@test "without LORA_DEMO_DIR, the demo lives under XDG_CACHE_HOME, else HOME/.cache" {
    local t=$BATS_TEST_TMPDIR
    run env -u LORA_DEMO_DIR XDG_CACHE_HOME="$t/xdg" HOME="$t/home" \
        "$WORKER" generate --prompt-ids 1 --max-tokens 1
    expect_status 0
    [ -f "$t/xdg/lora-stack/demo-v2/config.json" ]
    [ ! -e "$t/home/.cache" ]
    run env -u LORA_DEMO_DIR -u XDG_CACHE_HOME HOME="$t/home" \
        "$WORKER" generate --prompt-ids 1 --max-tokens 1
    expect_status 0
    [ -f "$t/home/.cache/lora-stack/demo-v2/config.json" ]
}

@test "a demo model that cannot be written is a system failure (111)" {
    touch "$BATS_TEST_TMPDIR/file"
    LORA_DEMO_DIR=$BATS_TEST_TMPDIR/file/demo run --separate-stderr "$WORKER" generate \
        --prompt-ids 1
    expect_status 111
    expect_message "$BATS_TEST_TMPDIR/file/demo"
}

# ---- make-model and make-adapter

@test "make-model writes the Hugging Face layout with the requested shape" {
    local m=$BATS_TEST_TMPDIR/m
    run --separate-stderr "$WORKER" make-model --out "$m" --arch qwen2 --hidden 32 --heads 4 \
        --kv-heads 1 --vocab 300 --dtype bf16 --tied
    expect_status 0
    [ -z "$output" ]
    for f in config.json model.safetensors tokenizer.json tokenizer_config.json \
        generation_config.json; do
        [ -s "$m/$f" ] || { echo "missing $f" >&2; return 1; }
    done
    [ ! -e "$m/model.safetensors.index.json" ]
    "$PYTHON" -c '
import json, sys
c = json.load(open(sys.argv[1] + "/config.json"))
assert c["architectures"] == ["Qwen2ForCausalLM"], c
assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]) == (32, 4, 1), c
assert c["vocab_size"] == 300 and c["tie_word_embeddings"] is True, c
json.load(open(sys.argv[1] + "/tokenizer.json"))
' "$m"
    run --separate-stderr "$WORKER" generate --model "$m" --prompt-ids 1,2 --max-tokens 2 --json
    expect_status 0
}

@test "make-model --shards 2 writes two files and an index, and the same model" {
    local t=$BATS_TEST_TMPDIR
    "$WORKER" make-model --out "$t/one" --seed 4
    run --separate-stderr "$WORKER" make-model --out "$t/two" --seed 4 --shards 2
    expect_status 0
    [ -f "$t/two/model-00001-of-00002.safetensors" ]
    [ -f "$t/two/model-00002-of-00002.safetensors" ]
    [ ! -e "$t/two/model.safetensors" ]
    "$PYTHON" -c '
import json, sys
wm = json.load(open(sys.argv[1]))["weight_map"]
assert set(wm.values()) == {"model-00001-of-00002.safetensors",
                            "model-00002-of-00002.safetensors"}, set(wm.values())
assert "model.embed_tokens.weight" in wm and "lm_head.weight" in wm
' "$t/two/model.safetensors.index.json"
    a=$("$WORKER" generate --model "$t/one" --prompt-ids 5,6,7 --max-tokens 4 --logprobs 2 --json)
    b=$("$WORKER" generate --model "$t/two" --prompt-ids 5,6,7 --max-tokens 4 --logprobs 2 --json)
    [ "$a" = "$b" ]
}

@test "make-adapter writes a PEFT adapter_config.json and adapter_model.safetensors" {
    local a=$BATS_TEST_TMPDIR/a
    run --separate-stderr "$WORKER" make-adapter --model "$D/m" --out "$a" --rank 4 --alpha 8 \
        --rslora --targets q,v,down
    expect_status 0
    [ -z "$output" ]
    "$PYTHON" -c '
import json, re, struct, sys
c = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert c["peft_type"] == "LORA" and c["r"] == 4 and c["lora_alpha"] == 8, c
assert c["use_rslora"] is True, c
assert sorted(c["target_modules"]) == ["down_proj", "q_proj", "v_proj"], c
with open(sys.argv[1] + "/adapter_model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    keys = set(json.loads(f.read(n))) - {"__metadata__"}
want = {"base_model.model.model.layers.%d.%s.lora_%s.weight" % (l, m, ab)
        for l in range(2) for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
        for ab in "AB"}
assert keys == want, sorted(keys ^ want)
' "$a"
    run --separate-stderr "$WORKER" generate --model "$D/m" --lora "x=$a" --prompt-ids 1 --json
    expect_status 0
}

@test "make-model and make-adapter reject a bad --arch, --dtype or --targets with exit 100" {
    local t=$BATS_TEST_TMPDIR
    run --separate-stderr "$WORKER" make-model --out "$t/x" --arch gpt2
    expect_status 100
    expect_message "--arch"
    run --separate-stderr "$WORKER" make-model --out "$t/x" --dtype f64
    expect_status 100
    expect_message "--dtype"
    run --separate-stderr "$WORKER" make-adapter --model "$D/m" --out "$t/x" --dtype int8
    expect_status 100
    expect_message "--dtype"
    for v in q,foo "" ,; do
        run --separate-stderr "$WORKER" make-adapter --model "$D/m" --out "$t/x" --targets "$v"
        expect_status 100
        expect_message "--targets"
    done
    [ ! -e "$t/x" ]
}

@test "a bad name at the end of a long --targets list is rejected too" {
    local long
    long=$(printf 'q,%.0s' $(seq 127))qfoo
    run --separate-stderr "$WORKER" make-adapter --model "$D/m" --out "$BATS_TEST_TMPDIR/x" \
        --targets "$long"
    expect_status 100
    expect_message "--targets"
}

@test "make-model and make-adapter without their required options exit 100" {
    run --separate-stderr "$WORKER" make-model
    expect_status 100
    expect_message "--out"
    run --separate-stderr "$WORKER" make-adapter --out "$BATS_TEST_TMPDIR/x"
    expect_status 100
    expect_message "--model"
    run --separate-stderr "$WORKER" make-adapter --model "$D/m"
    expect_status 100
    expect_message "--out"
    run --separate-stderr "$WORKER" make-model --out "$BATS_TEST_TMPDIR/x" --hidden 1
    expect_status 100
    expect_message "--hidden"
}

@test "make-adapter for a model that does not exist exits 1 naming config.json" {
    run --separate-stderr "$WORKER" make-adapter --model "$BATS_TEST_TMPDIR/none" \
        --out "$BATS_TEST_TMPDIR/x"
    expect_status 1
    expect_message "$BATS_TEST_TMPDIR/none/config.json"
}

@test "the same seed writes identical files, another seed different weights" {
    local t=$BATS_TEST_TMPDIR
    for d in m1 m2; do "$WORKER" make-model --out "$t/$d" --seed 7 --shards 2 --dtype f16; done
    "$WORKER" make-model --out "$t/m3" --seed 8 --shards 2 --dtype f16
    for d in a1 a2; do "$WORKER" make-adapter --model "$t/m1" --out "$t/$d" --seed 9; done
    "$WORKER" make-adapter --model "$t/m1" --out "$t/a3" --seed 10
    for f in config.json model-00001-of-00002.safetensors model-00002-of-00002.safetensors \
        model.safetensors.index.json tokenizer.json tokenizer_config.json generation_config.json; do
        cmp "$t/m1/$f" "$t/m2/$f"
    done
    cmp "$t/a1/adapter_model.safetensors" "$t/a2/adapter_model.safetensors"
    cmp "$t/a1/adapter_config.json" "$t/a2/adapter_config.json"
    ! cmp -s "$t/m1/model-00001-of-00002.safetensors" "$t/m3/model-00001-of-00002.safetensors"
    ! cmp -s "$t/a1/adapter_model.safetensors" "$t/a3/adapter_model.safetensors"
}

# ---- determinism

@test "sampling with a seed repeats exactly; another seed gives other tokens" {
    gen() {
        "$WORKER" generate --model "$D/m" --prompt-ids 1,2,3 --max-tokens 16 --ignore-eos \
            --temperature 0.8 --seed "$1" --json
    }
    a=$(gen 5)
    b=$(gen 5)
    c=$(gen 6)
    [ "$a" = "$b" ]
    [ "$a" != "$c" ]
    output=$a
    check_json 'assert len(rs[0]["tokens"]) == 16'
}

@test "a seeded request gives the same tokens alone and among other requests" {
    one='{"prompt_ids":[1,2,3],"temperature":0.8,"seed":5,"max_tokens":16,"ignore_eos":true}'
    alone=$(echo "$one" | "$WORKER" generate --model "$D/m" --batch - --json)
    printf '%s\n' '{"prompt_ids":[9,9,9,9,9,9]}' "$one" '{"prompt_ids":[4],"lora":"a"}' \
        > "$BATS_TEST_TMPDIR/b.jsonl"
    run --separate-stderr "$WORKER" generate --model "$D/m" --lora "a=$D/a" \
        --batch "$BATS_TEST_TMPDIR/b.jsonl" --temperature 1 --json --max-num-batched-tokens 4
    expect_status 0
    [ "${lines[1]}" = "$alone" ]
}

# ---- the compute device

@test "--device cpu computes what the default does; device describes the cpu backend" {
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1,2,3 --max-tokens 4 \
        --logprobs 2 --json
    expect_status 0
    local plain=$output
    run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1,2,3 --max-tokens 4 \
        --logprobs 2 --json --device cpu
    expect_status 0
    [ "$output" = "$plain" ]
    LORA_WORKER_DEVICE=cpu run --separate-stderr "$WORKER" generate --model "$D/m" \
        --prompt-ids 1,2,3 --max-tokens 4 --logprobs 2 --json
    expect_status 0
    [ "$output" = "$plain" ]
    run --separate-stderr "$WORKER" device --device cpu
    expect_status 0
    [ "${#lines[@]}" -eq 1 ]
    [[ "$output" =~ ^cpu\ \((AVX2|AVX-512)(,\ [A-Za-z0-9\ ]+)*,\ [0-9]+\ threads?\):\ [0-9.]+\ GB\ of\ memory ]]
    [ -z "$stderr" ]
}

# Without a CUDA build the reason is the build; with one, what the machine lacks (no driver, no
# device, not that device). On a machine where a CUDA device opens there is nothing to refuse.
expect_no_cuda() {
    expect_status 100
    expect_message "--device $1: "
    [[ "$stderr" == *"this build has no CUDA backend (built with CUDA=0)"* ||
        ( "$LORA_BIN" == *-cuda/bin &&
            ( "$stderr" == *"no NVIDIA driver is installed"* ||
                "$stderr" == *"no CUDA-capable device is detected"* ||
                "$stderr" == *"does not exist"* || "$stderr" == *"CUDA driver version"* ) ) ]]
    [ "$(printf '%s\n' "$stderr" | wc -l)" -eq 1 ]
}

@test "--device cuda fails at once with one clear line and exit 100, for every command" {
    if "$WORKER" device --device cuda > /dev/null 2>&1; then
        skip "a CUDA device opens here"
    fi
    for dev in cuda cuda:0 cuda:3; do
        run --separate-stderr "$WORKER" generate --model "$D/m" --prompt-ids 1 --device "$dev"
        expect_no_cuda "$dev"
        run --separate-stderr "$WORKER" device --device "$dev"
        expect_no_cuda "$dev"
        # serve never says hello: it exits before it connects (no engine listens here).
        run --separate-stderr timeout 10 "$WORKER" serve --engine "ipc://$BATS_TEST_TMPDIR/none" \
            --device "$dev"
        expect_no_cuda "$dev"
    done
    LORA_WORKER_DEVICE=cuda run --separate-stderr "$WORKER" device
    expect_no_cuda cuda
}

@test "a bad --device is refused with exit 100, naming it, before any file is read" {
    for dev in gpu CPU cuda: cuda:x cuda:-1 cuda:12345 "cpu " ""; do
        run --separate-stderr "$WORKER" generate --model "$BATS_TEST_TMPDIR/none" --prompt-ids 1 \
            --device "$dev"
        expect_status 100
        expect_message "unknown device '$dev' (cpu, cuda or cuda:N)"
        run --separate-stderr timeout 10 "$WORKER" serve --engine "ipc://$BATS_TEST_TMPDIR/none" \
            --device "$dev"
        expect_status 100
        expect_message "unknown device '$dev'"
    done
    LORA_WORKER_DEVICE=tpu run --separate-stderr "$WORKER" device
    expect_status 100
    expect_message "--device tpu: unknown device 'tpu'"
}

@test "--version names the backends this build has and the CPU's paths, as the device line does" {
    run --separate-stderr "$WORKER" --version
    expect_status 0
    desc=$("$WORKER" device --device cpu | sed 's/: [0-9.]* GB of memory.*//')
    [[ "$output" == *"(backends: $desc)" || "$output" == *"(backends: $desc, "*")" ]]
    LORA_NO_AVX512=1 run --separate-stderr "$WORKER" --version
    [[ "$output" == *"(backends: cpu (AVX2"* ]]
}

# ---- the man page

@test "the man page documents exactly the options each command lists in --help" {
    for cmd in generate make-model make-adapter device; do
        diff <(help_options "$cmd") <(man_options "$cmd") ||
            { echo "man page options of $cmd differ from --help (< help, > man)" >&2; return 1; }
    done
}

@test "every option listed by --help appears in the man page" {
    for cmd in generate make-model make-adapter device serve; do
        for o in $(help_options "$cmd"); do
            grep -qF -- "$(printf '%s' "$o" | sed 's/-/\\-/g')" "$ROOT/man/lora-worker.1" ||
                { echo "$o of $cmd is not in the man page" >&2; return 1; }
        done
    done
}

@test "the man page renders without warnings" {
    command -v groff > /dev/null || skip "groff is not installed"
    run groff -man -ww -z "$ROOT/man/lora-worker.1"
    expect_status 0
    [ -z "$output" ]
}

@test "serve --help lists --lora-root, --lora-allow-symlinks and --load-timeout-ms, as the man page" {
    run --separate-stderr "$WORKER" serve --help
    expect_status 0
    for o in "--lora-root DIR" --lora-allow-symlinks "--load-timeout-ms MS"; do
        [[ "$output" == *"  $o"* ]] || { echo "serve --help lacks $o" >&2; return 1; }
    done
    diff <(help_options serve) <(man_options serve)
}

@test "serve: a bad --lora-root or --load-timeout-ms exits 100 and names it, also from the mirrors" {
    run --separate-stderr "$WORKER" serve --engine ipc:///nonexistent --lora-root /nonexistent
    expect_status 100
    expect_message "--lora-root '/nonexistent' is not a directory"
    run --separate-stderr "$WORKER" serve --engine ipc:///nonexistent --lora-root "$D/m/config.json"
    expect_status 100
    expect_message "is not a directory"
    run --separate-stderr "$WORKER" serve --engine ipc:///nonexistent --load-timeout-ms 5
    expect_status 100
    expect_message "--load-timeout-ms"
    run --separate-stderr "$WORKER" serve --engine ipc:///nonexistent --load-timeout-ms soon
    expect_status 100
    expect_message "--load-timeout-ms"
    LORA_WORKER_LOAD_TIMEOUT_MS=0 run --separate-stderr "$WORKER" serve --engine ipc:///x
    expect_status 100
    expect_message "LORA_WORKER_LOAD_TIMEOUT_MS"
    LORA_WORKER_LORA_ROOT=/nonexistent run --separate-stderr "$WORKER" serve --engine ipc:///x
    expect_status 100
    expect_message "--lora-root '/nonexistent' is not a directory"
    run --separate-stderr "$WORKER" serve --engine ipc:///x --lora-allow-symlinks=maybe
    expect_status 100
    expect_message "--lora-allow-symlinks"
}
