#!/usr/bin/env bash
# Sweep of the simulator's accuracy scenarios over seeds and aggregators,
# at most two runs at once (the machine is shared), then a summary per
# aggregator count and scenario, default run and hostile run apart.
#
#   docs/simulate/sweep.sh OUT [flags of `xtask simulate`...]
#
# Env: XTASK (default target/release/xtask), SEEDS (default "1..24"),
# AGGREGATORS (default "1 2 3"), JOBS (default 2).
# Each run is `xtask simulate --only scenarios --no-ledger-check --seed S
# --aggregators K --out OUT/kK/sS FLAGS`, which runs the default conditions
# and then the hostile preset (under OUT/kK/sS/hostile). The summary
# (OUT/summary.md) gives, per K and scenario: the mean of visitors queued
# below 98 % with room for the whole line (`queued_below_98_line_fits`),
# the worst peak admits/min ÷ limit and peak active ÷ total, and the mean
# out-of-cycle asks, asks sent again, confirmations and confirmations sent
# again per run (from the on-demand lease table on stdout).
set -euo pipefail
out=${1:?usage: sweep.sh OUT [flags...]}
shift
xtask=${XTASK:-target/release/xtask}
seeds=${SEEDS:-1..24}
first=${seeds%..*}
last=${seeds#*..}
aggregators=${AGGREGATORS:-1 2 3}
jobs=${JOBS:-2}
mkdir -p "$out"
export XTASK_BIN=$xtask
for k in $aggregators; do
  for s in $(seq "$first" "$last"); do
    echo "$k $s"
  done
done | xargs -P "$jobs" -L 1 bash -c '
  # The flags first, then the K and the seed xargs appends.
  k=${@: -2:1} s=${@: -1}
  dir=$0/k$k/s$s
  mkdir -p "$dir"
  "$XTASK_BIN" simulate --only scenarios --no-ledger-check --seed "$s" --aggregators "$k" \
    --out "$dir" "${@:1:$#-2}" > "$dir/stdout.txt" 2> "$dir/stderr.txt"
' "$out" "$@"

summarize() {
  # $1: k, $2: "" (default) or "hostile"
  local k=$1 which=$2
  for s in $(seq "$first" "$last"); do
    local dir=$out/k$k/s$s
    local csv=$dir/${which:+$which/}scenarios.csv
    # The on-demand lease tables: the first is the default run's, the
    # second the hostile run's.
    local nth=1
    [ -n "$which" ] && nth=2
    awk -F, -v seed="$s" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
      { print "csv", $col["scenario"], seed, $col["queued_below_98_line_fits"], $col["peak_admits_ratio"], $col["peak_active_ratio"] }' "$csv"
    awk -v nth="$nth" -v seed="$s" '/^On-demand lease/ { table++; on = 1; rows = 0; next }
      on && /^\|/ { rows = 1 }
      on && rows && !/^\|/ { on = 0 }
      on && table == nth && /^\| [0-9]\./ {
        split($0, f, "|"); key = f[2]
        sub(/^ [0-9]\. /, "", key)
        if (key ~ /^steady/) key = "steady"; else if (key ~ /colo/) key = "colo-spike";
        else if (key ~ /worldwide/) key = "uniform-spike"; else if (key ~ /burst/) key = "burst-7-1"
        print "lease", key, seed, f[3] + 0, f[4] + 0, f[5] + 0, f[6] + 0
      }' "$dir/stdout.txt"
  done | awk -v k="$k" -v which="${which:-default}" -v n="$((last - first + 1))" '
    $1 == "csv" { q[$2] += $4; if ($5 > pa[$2]) pa[$2] = $5; if ($6 > pc[$2]) pc[$2] = $6 }
    $1 == "lease" { asks[$2] += $4; again[$2] += $5; conf[$2] += $6; confagain[$2] += $7 }
    END {
      split("steady colo-spike uniform-spike burst-7-1", keys, " ")
      for (i = 1; i <= 4; i++) {
        s = keys[i]
        printf "| %d | %s | %s | %.2f | %.3f | %.3f | %.1f | %.1f | %.1f | %.1f |\n", k, which, s,
          q[s] / n, pa[s], pc[s], asks[s] / n, again[s] / n, conf[s] / n, confagain[s] / n
      }
    }'
}

{
  echo "| K | run | scenario | queued with room for the line (mean) | worst peak admits ÷ limit | worst peak active ÷ total | asks (mean) | asked again | confirmations | confirmed again |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
  for k in $aggregators; do
    summarize "$k" ""
    summarize "$k" hostile
  done
} > "$out/summary.md"
cat "$out/summary.md"
