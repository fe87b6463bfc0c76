#!/usr/bin/env bash
# Reruns the fault scenarios and rewrites their results table in docs/correctness.md:
#
#     ./scripts/write-docs.sh                  # runs the scenarios (a few minutes), then rewrites
#     ./scripts/write-docs.sh --from-log FILE  # rewrites from the saved output of such a run
#
# Each scenario prints one markdown row of the table (`Scenario::report` in
# tests/faults/scenario.rs); this script collects those rows, puts them in a fixed order and
# replaces everything between the `fault-table` marker comments of docs/correctness.md with a
# stamp line (date, machine, cores, the command), the table, and the unlocked control's figures.
# A run in which any test failed rewrites nothing: its rows would describe a broken run.
# The servers and tools the scenarios need are the ones ./scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

# The test binaries whose tests print table rows. A binary that prints rows the same way joins
# the table by being named here.
row_tests=(faults)

doc=docs/correctness.md
start_marker='<!-- fault-table:start -->'
end_marker='<!-- fault-table:end -->'

# The column heads of the rows `Scenario::report` prints, in its order.
header='| scenario | backend | critical sections | overlaps | lost updates | fence inversions | recovery |'
rule='| --- | --- | --- | --- | --- | --- | --- |'

# The order of the table: scenarios and backends not listed here follow the listed ones, in the
# order the run printed them.
scenario_order='random-cuts permits-cuts server-restart stalled-holder deaf-holder skewed-clock killed-holder
    stalled-leader killed-leader leader-killed follower-partitioned fenced-pause aborted-tasks'
backend_order='redis redis-cluster mysql postgres zookeeper zookeeper-ensemble memory'
# The scenario run without the lock, to show the checker fails it; reported below the table.
control=no-lock

# The random-cut runs last 30 s for the table (the tests' default is shorter).
export DLOCK_FAULT_SECONDS=${DLOCK_FAULT_SECONDS:-30}
command="cargo nextest run --all-features"
for test in "${row_tests[@]}"; do command+=" --test $test"; done
command+=" --no-capture"

die() { echo "write-docs.sh: $*" >&2; exit 1; }

grep -qxF "$start_marker" "$doc" && grep -qxF "$end_marker" "$doc" \
    || die "$doc lacks the lines $start_marker and $end_marker"

case "${1:-}" in
    --from-log)
        [ -n "${2:-}" ] || die "--from-log needs a file"
        log=$2
        [ -r "$log" ] || die "cannot read $log"
        measured=$(date -u -r "$log" +%Y-%m-%d)
        ;;
    "")
        log=$(mktemp -t dlock-write-docs.XXXXXX.log)
        echo "write-docs.sh: running \`$command\` (a few minutes); output in $log"
        status=0
        $command 2>&1 | tee "$log" || status=$?
        [ "$status" -eq 0 ] || die "the run failed (exit $status); $doc left as it was; see $log"
        measured=$(date -u +%Y-%m-%d)
        ;;
    *) die "unknown argument $1 (see the head of this script)" ;;
esac

# nextest's last word on the run: "Summary [ 236.5s] 25 tests run: 25 passed, 1 skipped".
summary=$(grep -E '^ *Summary \[' "$log" | tail -n 1 | sed 's/^ *//' || true)
[ -n "$summary" ] || die "no nextest summary in $log: was it a complete run?"
if ! grep -qE '[0-9]+ tests? run: ([0-9]+) passed' <<<"$summary" \
    || grep -qE 'failed|timed out' <<<"$summary"; then
    die "a test failed ($summary); $doc left as it was"
fi

# Rows: lines of exactly seven cells, as `Scenario::report` prints them. A pair of scenario and
# backend printed twice keeps its last row.
rows=$(awk -v scenarios="$scenario_order" -v backends="$backend_order" -v control="$control" '
    BEGIN {
        n = split(scenarios, s, " "); for (i = 1; i <= n; i++) srank[s[i]] = i
        n = split(backends, b, " "); for (i = 1; i <= n; i++) brank[b[i]] = i
        FS = " [|] "
    }
    /^\| .* \|$/ {
        if (gsub(/ \| /, " | ") != 6) next
        line = $0
        scenario = substr($1, 3); backend = $2
        if (scenario == "scenario" || scenario == control) next
        if (!(scenario in srank)) srank[scenario] = 100 + (++new_scenarios)
        if (!(backend in brank)) brank[backend] = 100 + (++new_backends)
        key = sprintf("%03d %03d", srank[scenario], brank[backend])
        row[key] = line
    }
    END { for (key in row) printf "%s\t%s\n", key, row[key] }
' "$log" | sort | cut -f2-)
[ -n "$rows" ] || die "no table rows in $log"

# The control prints a row of its own; the page states its figures in a sentence.
control_line=$(awk -v control="$control" -F ' [|] ' '
    /^\| .* \|$/ && substr($1, 3) == control {
        line = sprintf("Without the lock, the same checker on the same workers (scenario `%s`, %s) saw %s critical sections with %s overlaps, %s lost updates and %s fence inversions.", control, $2, $3, $4, $5, $6)
    }
    END { if (line != "") print line }
' "$log")

stamp="Measured $measured on \`$(uname -srm)\`, $(nproc) cores, by \`$command\` (rewritten by \`./scripts/write-docs.sh\`)."

block=$(mktemp -t dlock-write-docs.XXXXXX.md)
{
    echo "$stamp"
    echo
    echo "$header"
    echo "$rule"
    echo "$rows"
    if [ -n "$control_line" ]; then
        echo
        echo "$control_line"
    fi
} >"$block"

awk -v start="$start_marker" -v end="$end_marker" -v block="$block" '
    $0 == start { print; while ((getline line < block) > 0) print line; skipping = 1; next }
    $0 == end { skipping = 0 }
    !skipping { print }
' "$doc" >"$doc.new"
mv "$doc.new" "$doc"
rm -f "$block"
echo "write-docs.sh: $doc rewritten with $(wc -l <<<"$rows") rows ($summary)"
