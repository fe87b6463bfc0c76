#!/usr/bin/env bash
# Fuzzes the two little languages of #[distributed_lock] — the key template and the duration
# literal — each for a bounded time, with libFuzzer through cargo-fuzz:
#
#     ./scripts/fuzz.sh [seconds-per-target]     # default 60
#
# Not part of .ci/run: fuzzing is open-ended, and the crate under fuzz/ is its own workspace.
# What each target checks is written at the top of fuzz/fuzz_targets/*.rs.
#
# cargo-fuzz passes the compiler unstable flags (-Zsanitizer=address and the like). The only
# toolchain on the project's machines is stable, so RUSTC_BOOTSTRAP=1 lets stable accept them.
#
# New interesting inputs go to fuzz/corpus/<target> (kept between runs, not committed); the
# committed seeds are in fuzz/seeds/<target>. A crash is written to fuzz/artifacts/<target>/ and
# replays with `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> <file>` from fuzz/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
targets=(key_template duration)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1

cargo fuzz build -O
crashes=0
summary=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "artifacts/$target"
    log=$(mktemp)
    echo "fuzz.sh: $target for ${seconds}s"
    status=0
    cargo fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -max_len=512 -dict="$target.dict" -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    found=0
    if [ "$status" -ne 0 ]; then
        found=1
        crashes=$((crashes + 1))
        grep -E "panicked at|^(SUMMARY|==[0-9]+==ERROR)|Test unit written to" "$log" | head -20 || tail -30 "$log"
    fi
    summary+=("$(printf '%-14s %12s execs %6ss %3s crash(es)' "$target" "${runs:-?}" "${took:-$seconds}" "$found")")
    rm -f "$log"
done
echo
echo "fuzz.sh: target          executions   time  crashes"
printf 'fuzz.sh: %s\n' "${summary[@]}"
[ "$crashes" -eq 0 ]
