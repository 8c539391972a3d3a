#!/usr/bin/env bats
# The layering rule of docs/design.md ("Layers"), checked by tests/layout/check_includes: the tree
# keeps it, and the checker catches each kind of wrong include planted in a copy of the tree.

setup() {
    root=$BATS_TEST_DIRNAME/../..
    copy=$BATS_TEST_TMPDIR/tree
    mkdir -p "$copy"
}

copy_tree() {
    cp -r "$root/lib" "$root/backend" "$root/cmd" "$root/tests" "$copy/"
}

@test "every #include of the tree follows the layering rule" {
    run "$root/tests/layout/check_includes" "$root"
    [ "$status" -eq 0 ] || { echo "$output"; false; }
}

plant() { # file include: the include added to the copy, then the checker must fail naming it
    copy_tree
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

# ---- the direction of calls inside lora-engine (tests/layout/check_calls)

@test "every call and include of lora-engine goes to a lower file" {
    run "$root/tests/layout/check_calls" "$root"
    [ "$status" -eq 0 ] || { echo "$output"; false; }
}

plant_code() { # file code: appended to a copy of the engine, then check_calls must fail
    mkdir -p "$copy/cmd"
    cp -r "$root/cmd/lora-engine" "$copy/cmd/"
    printf '%s\n' "$2" >> "$copy/cmd/lora-engine/$1"
    run "$root/tests/layout/check_calls" "$copy"
    echo "$output"
    [ "$status" -eq 1 ]
}

@test "a lower file calling a higher one is caught (workers.c calling step_run)" {
    plant_code workers.c $'static void planted(struct engine *e)\n{\n    step_run(e);\n}'
    [[ "$output" == *"cmd/lora-engine/workers.c: calls step_run() of step.c, which is not below it (level 5 calls level 2)"* ]]
}

@test "files of one level calling each other are caught (frontends.c calling workers_poll)" {
    plant_code frontends.c $'static void planted(struct engine *e)\n{\n    workers_poll(e);\n}'
    [[ "$output" == *"cmd/lora-engine/frontends.c: calls workers_poll() of workers.c"* ]]
}

@test "a lower file including a higher file's header is caught" {
    plant_code publish.c '#include "frontends.h"'
    [[ "$output" == *"cmd/lora-engine/publish.c: includes \"frontends.h\", the header of a file not below it"* ]]
}

@test "a non-static function without its file's prefix is caught" {
    plant_code registry.c $'void lookup_any(void)\n{\n}'
    [[ "$output" == *"cmd/lora-engine/registry.c: defines lookup_any(), which does not start with registry_"* ]]
}

@test "a call named only in a comment or a string is not a call" {
    mkdir -p "$copy/cmd"
    cp -r "$root/cmd/lora-engine" "$copy/cmd/"
    printf '%s\n' '/* step_run(e) runs in the loop */' \
        'static const char *planted = "loop_run(e)";' >> "$copy/cmd/lora-engine/publish.c"
    run "$root/tests/layout/check_calls" "$copy"
    [ "$status" -eq 0 ] || { echo "$output"; false; }
}
