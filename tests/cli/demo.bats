#!/usr/bin/env bats
# What `make demo` runs (examples/demo.sh): the stack on the demo model, a completion for the
# base model and one for an adapter, the LoRA lines of a scrape and lora-inspect's residency,
# then the stack is down and nothing is left running; and the README's first command on a fresh
# clone (tests/fresh_clone.sh).

load ../helpers

# The demo's output holds two completions, the exporter's LoRA lines and the residency table.
check_demo_output() {
    [ "$(grep -c '"object":"text_completion"' <<< "$output")" = 2 ]
    [[ "$output" == *'"model":"demo-sql"'* ]]
    [[ "$output" == *'vllm:lora_requests_info{'*'running_lora_adapters="'*'demo-sql'* ]]
    [[ "$output" == *'vllm:num_gpu_loaded_lora_adapters{'* ]]
    [[ "$output" == *'vllm:lora_adapter_loaded{'*'adapter_name="demo-sql",level="gpu"'* ]]
    grep -Eq '^0 +0 +demo-sql +gpu ' <<< "$output"
    [[ "$output" == *"the stack is stopped"* ]]
    ! pgrep -f "lora-stack-demo\." > /dev/null
}

@test "the demo starts the stack, answers for the base model and an adapter, and stops it" {
    port=$((24000 + ($$ % 400) * 10))
    run "$ROOT/examples/demo.sh" "$LORA_BIN" "$port" $((port + 5))
    echo "$output"
    expect_status 0
    check_demo_output
}

@test "on a fresh clone with no build and no demo model, make demo runs to completion" {
    git -C "$ROOT" rev-parse HEAD > /dev/null 2>&1 || skip "not a git checkout"
    port=$((28000 + ($$ % 400) * 10))
    run "$ROOT/tests/fresh_clone.sh" "$port" $((port + 5))
    echo "$output"
    expect_status 0
    [[ "$output" == *"lora-stack: ready in"* ]]
    check_demo_output
}
