#!/usr/bin/env bats
# The fuzz targets of tests/fuzz (make fuzz): built with clang under AddressSanitizer and
# UndefinedBehaviorSanitizer into build/fuzz, then each run for a few seconds on its seed corpus
# and what it found before. Every test skips, with the reason, where clang's libFuzzer is absent.

load ../helpers

FUZZ_BUILD="$ROOT/build/fuzz"
FUZZ_SECONDS=${LORA_FUZZ_SECONDS:-2}

# Why libFuzzer cannot be used here, or nothing when it can.
no_libfuzzer() {
    if ! command -v clang > /dev/null; then
        echo "clang is not installed (Debian package clang)"
        return
    fi
    local t
    t=$(mktemp -d)
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' \
        > "$t/x.c"
    if ! clang -fsanitize=fuzzer,address,undefined "$t/x.c" -o "$t/x" > "$t/log" 2>&1; then
        echo "clang cannot link -fsanitize=fuzzer: $(head -c 200 "$t/log")"
    fi
    rm -rf "$t"
}

setup_file() {
    export NO_LIBFUZZER
    NO_LIBFUZZER=$(no_libfuzzer)
    if [ -z "$NO_LIBFUZZER" ]; then
        make -s -C "$ROOT" CUDA=0 -j2 fuzz-build > "$BATS_FILE_TMPDIR/build.log" 2>&1 ||
            { cat "$BATS_FILE_TMPDIR/build.log" >&2; return 1; }
    fi
}

# Runs one target for FUZZ_SECONDS; fails with libFuzzer's report when it finds anything.
fuzz() {
    [ -z "$NO_LIBFUZZER" ] || skip "$NO_LIBFUZZER"
    run "$ROOT/tests/fuzz/run" "$FUZZ_BUILD" "$FUZZ_SECONDS" "$1"
    echo "$output"
    if [ "$status" -ne 0 ]; then
        tail -40 "$FUZZ_BUILD/fuzz_$1.log"
        return 1
    fi
    [[ "$output" =~ ^fuzz_$1:\ ([0-9]+)\ executions ]]
    [ "${BASH_REMATCH[1]}" -gt 0 ]
}

@test "every fuzz target has a seed corpus of a few files" {
    [ -z "$NO_LIBFUZZER" ] || skip "$NO_LIBFUZZER"
    local n=0
    for f in "$ROOT"/tests/fuzz/fuzz_*.c; do
        t=$(basename "$f" .c)
        [ "$t" != fuzz_util ] || continue
        n=$((n + 1))
        [ -x "$FUZZ_BUILD/$t" ]
        ls "$ROOT/tests/fuzz/corpus/${t#fuzz_}"/* > /dev/null
    done
    [ "$n" -ge 10 ]
}

@test "fuzz_msg_decode: every typed message decoder" { fuzz msg_decode; }
@test "fuzz_msg_json: lora_msg_to_json" { fuzz msg_json; }
@test "fuzz_metrics_stdin: the metrics state through the --stdin framing" { fuzz metrics_stdin; }
@test "fuzz_safetensors: safetensors headers and offsets" { fuzz safetensors; }
@test "fuzz_tokenizer_json: tokenizer.json" { fuzz tokenizer_json; }
@test "fuzz_tokenize: text to tokenize and ids back to text" { fuzz tokenize; }
@test "fuzz_model_config: config.json" { fuzz model_config; }
@test "fuzz_adapter: adapter_config.json and adapter_model.safetensors" { fuzz adapter; }
@test "fuzz_chat: chat messages through every built-in template" { fuzz chat; }
@test "fuzz_http: request bodies of every POST endpoint of lora-frontend" { fuzz http; }
