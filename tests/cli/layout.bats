#!/usr/bin/env bats
# The layering rule of docs/design.md ("Layers"), checked by tests/layout/check_includes: the tree
# keeps it, and the checker catches each kind of wrong include planted in a copy of the tree.

setup() {
    root=$BATS_TEST_DIRNAME/../..
    copy=$BATS_TEST_TMPDIR/tree
    mkdir -p "$copy"
    cp -r "$root/lib" "$root/backend" "$root/cmd" "$root/tests" "$copy/"
}

@test "every #include of the tree follows the layering rule" {
    run "$root/tests/layout/check_includes" "$root"
    [ "$status" -eq 0 ] || { echo "$output"; false; }
}

plant() { # file include: the include added to the copy, then the checker must fail naming it
    echo "#include \"$2\"" >> "$copy/$1"
    run "$root/tests/layout/check_includes" "$copy"
    echo "$output"
    [ "$status" -eq 1 ]
    [[ "$output" == *"$1: includes \"$2\""* ]]
}

@test "a lower layer including a higher one is caught" {
    plant lib/base/fs.c wire/msg.h
    [[ "$output" == *"a lower layer includes a higher one"* ]]
}

@test "sibling subsystems including each other are caught" {
    plant lib/sched/scheduler.c text/tokenizer.h
    [[ "$output" == *"sibling subsystems include each other"* ]]
}

@test "a lib subsystem other than runtime reaching into backend/ is caught" {
    plant lib/metrics/exposition.c backend/cpu/kernels_cpu.h
    [[ "$output" == *"only lib/runtime sees backend/"* ]]
}

@test "one program including another's header is caught" {
    plant cmd/lora-engine/step.c cmd/lora-frontend/frontend.h
    [[ "$output" == *"sibling subsystems include each other"* ]]
}
