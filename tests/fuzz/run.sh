#!/usr/bin/env bash
# Runs every fuzz target for FUZZ_SECS seconds (`make fuzz`; tests/fuzz/README.md).
#
# New inputs go to a scratch corpus ($FUZZ_SCRATCH/<target>, listed first, the only directory
# libFuzzer writes to); the committed corpus (tests/fuzz/corpus/<target>) is read, never written.
# Crashes land in tests/fuzz/artifacts/<target>/ (ignored by git). Exits non-zero if any target
# found a failure. Without a nightly toolchain it says so and runs the proptest equivalent.
set -u

cd "$(dirname "$0")/../.."
SECS=${FUZZ_SECS:-60}
SCRATCH=${FUZZ_SCRATCH:-/tmp/memkeep-fuzz}
CARGO=${CARGO:-cargo}
# The parsers are safe Rust: no sanitizer, for speed. The command stream drives LMDB's C code,
# so it runs under AddressSanitizer.
TARGETS=${FUZZ_TARGETS:-"memcache_parser:none resp_parser:none binary_parser:none command_stream:address"}

if ! $CARGO +nightly --version >/dev/null 2>&1; then
    echo "make fuzz: cargo-fuzz needs a nightly toolchain (rustup toolchain install nightly)."
    echo "make fuzz: running the proptest equivalent instead (tests/fuzz_props.rs, 20000 cases)."
    PROPTEST_CASES=20000 exec $CARGO test --release --test fuzz_props
fi
if ! $CARGO fuzz --version >/dev/null 2>&1; then
    $CARGO install cargo-fuzz --locked || exit 1
fi

mkdir -p "$SCRATCH"
failed=0
summary=()
for spec in $TARGETS; do
    target=${spec%%:*}
    sanitizer=${spec##*:}
    mkdir -p "$SCRATCH/$target"
    log="$SCRATCH/$target.log"
    echo "== fuzz $target for ${SECS}s (sanitizer: $sanitizer; log: $log)"
    $CARGO +nightly fuzz run --fuzz-dir tests/fuzz -s "$sanitizer" "$target" \
        "$SCRATCH/$target" "tests/fuzz/corpus/$target" -- \
        -max_total_time="$SECS" -max_len=4096 -print_final_stats=1 >"$log" 2>&1
    status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    line="$target: ${runs:-?} executions in ${took:-?} s"
    if [ "$status" -ne 0 ]; then
        failed=1
        line="$line: FAILED (exit $status)"
        grep -E "panicked|assertion|ERROR|Test unit written|Error" "$log" | cut -c1-400 | head -20
    fi
    echo "$line"
    summary+=("$line")
done
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
