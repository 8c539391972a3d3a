#!/usr/bin/env bats
# What `make demo` runs (examples/demo.sh): the stack on the demo model, a completion for the
# base model and one for an adapter, then the stack is down and nothing is left running.

load ../helpers

@test "the demo starts the stack, answers for the base model and an adapter, and stops it" {
    port=$((30000 + ($$ % 1000) * 10))
    run "$ROOT/examples/demo.sh" "$LORA_BIN" "$port" $((port + 5))
    echo "$output"
    expect_status 0
    [ "$(grep -c '"object":"text_completion"' <<< "$output")" = 2 ]
    [[ "$output" == *'"model":"demo-sql"'* ]]
    [[ "$output" == *"the stack is stopped"* ]]
    ! pgrep -f "lora-stack-demo\." > /dev/null
}
