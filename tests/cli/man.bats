#!/usr/bin/env bats
# The manual: every page renders without a warning, every program has a page with the sections
# an operator looks for, lora-stack's usage and page list the same options, and make install
# puts programs and pages where they belong.

load ../helpers

@test "every manual page renders without warnings (groff -man -ww -z)" {
    for page in "$ROOT"/man/*.[17]; do
        run groff -man -ww -z "$page"
        [ "$status" -eq 0 ] && [ -z "$output" ] || { echo "$page: $output"; return 1; }
    done
}

@test "every program has a page with NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, ENVIRONMENT, EXAMPLES, SEE ALSO" {
    for prog in "$LORA_BIN"/lora-*; do
        page="$ROOT/man/$(basename "$prog").1"
        [ -f "$page" ] || { echo "no page for $prog"; return 1; }
        for section in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" ENVIRONMENT EXAMPLES "SEE ALSO"; do
            grep -q "^\.SH \"\{0,1\}$section\"\{0,1\}\$" "$page" || { echo "$page: no $section"; return 1; }
        done
    done
    [ -f "$ROOT/man/lora-stack-protocol.7" ]
}

@test "lora-stack --help and lora-stack(1) OPTIONS list the same options" {
    diff <("$LORA_BIN/lora-stack" --help | grep -o -- '^  \(-h, \)\{0,1\}--[a-z][a-z-]*' |
               sed 's/.*--/--/' | sort) \
         <(man_page_options "$ROOT/man/lora-stack.1")
}

@test "make install PREFIX=... installs every program and page" {
    # The build under test, with the CUDA setting it was made with: nothing is rebuilt.
    cuda=0
    [[ "$LORA_BIN" == *-cuda/bin ]] && cuda=1
    make -C "$ROOT" --no-print-directory -s install PREFIX="$BATS_TEST_TMPDIR/p" \
        BUILD="${LORA_BIN%/bin}" CUDA=$cuda > /dev/null
    for prog in "$LORA_BIN"/lora-*; do
        [ -x "$BATS_TEST_TMPDIR/p/bin/$(basename "$prog")" ]
    done
    [ -f "$BATS_TEST_TMPDIR/p/share/man/man1/lora-stack.1" ]
    [ -f "$BATS_TEST_TMPDIR/p/share/man/man7/lora-stack-protocol.7" ]
    run "$BATS_TEST_TMPDIR/p/bin/lora-stack" --help
    [ "$status" -eq 0 ]
}
