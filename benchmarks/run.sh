#!/usr/bin/env bash
# Benchmarks (figures are recorded in benchmarks/RESULTS.md, never asserted in tests).
#   benchmarks/run.sh            # engine + task ratio
#   benchmarks/run.sh engine     # engine only
#   benchmarks/run.sh task       # containerd_runtimes task vs ansible.builtin.stat
#   benchmarks/run.sh engine-vs REV   # this engine against commit REV's, alternate rounds
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/../scripts/lib.sh"
enter_dev_env
what=${1:-all}

if [[ $what == all || $what == engine ]]; then
    PYTHONPATH=$COLL_PATH "$VENV/bin/python" benchmarks/engine_bench.py "${ENGINE_ITERATIONS:-300}"
fi

if [[ $what == engine-vs ]]; then
    # the engine of this checkout against an earlier commit's, in alternate rounds on the same machine
    # (its speed drifts: ratios are taken round by round)
    rev=${2:?usage: benchmarks/run.sh engine-vs <commit>}
    base=$(mktemp -d)
    trap 'git worktree remove --force "$base/ansible_collections/k3s_gpu/nvidia" >/dev/null 2>&1; rm -rf "$base"' EXIT
    git worktree add --detach "$base/ansible_collections/k3s_gpu/nvidia" "$rev" >/dev/null 2>&1 || die "cannot check out $rev"
    rounds=${ENGINE_ROUNDS:-5}
    for ((round = 0; round < rounds; round++)); do
        PYTHONPATH=$COLL_PATH "$VENV/bin/python" benchmarks/engine_bench.py "${ENGINE_ITERATIONS:-200}" | sed 's/^/new /'
        (cd "$base/ansible_collections/k3s_gpu/nvidia" && PYTHONPATH=$base "$VENV/bin/python" benchmarks/engine_bench.py \
            "${ENGINE_ITERATIONS:-200}" | sed 's/^/old /')
    done | "$VENV/bin/python" -c '
import re, statistics, sys
rows = {}
for line in sys.stdin:
    match = re.match(r"(new|old) (?:cold: )?(\w[^:]*?)\s+median\s+([\d.]+) ms", line)
    if match and not line.startswith("new fleet"):
        rows.setdefault(match.group(2), {"new": [], "old": []})[match.group(1)].append(float(match.group(3)))
print("engine, this checkout (cold) vs %s, %d alternate rounds: median of the rounds (ratio: median of round ratios)" % (sys.argv[1], int(sys.argv[2])))
for label, runs in rows.items():
    ratios = [n / o for n, o in zip(runs["new"], runs["old"])]
    print("  %-40s new %6.2f ms  old %6.2f ms  ratio %.2f" % (label, statistics.median(runs["new"]),
          statistics.median(runs["old"]), statistics.median(ratios) if ratios else float("nan")))
' "$rev" "$rounds"
fi

if [[ $what == all || $what == task ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    PYTHONPATH=$COLL_PATH "$VENV/bin/python" - "$work/node" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
import engine_bench
engine_bench.make_node(sys.argv[1], engine_bench.user_template(200))
PY
    printf 'bench ansible_connection=local ansible_python_interpreter=%s bench_root=%s\n' "$VENV/bin/python" "$work/node" >"$work/inventory"
    ANSIBLE_COLLECTIONS_PATH=$COLL_PATH ANSIBLE_CALLBACK_PLUGINS=$HERE/callback_plugins ANSIBLE_CALLBACKS_ENABLED=task_timer \
        TASK_TIMER_OUT=$work/times.jsonl ANSIBLE_STDOUT_CALLBACK=ansible.builtin.minimal ANSIBLE_DISPLAY_OK_HOSTS=0 \
        "$VENV/bin/ansible-playbook" -i "$work/inventory" benchmarks/task_ratio.yml -e "bench_rounds=${TASK_ROUNDS:-20}" \
        >"$work/play.log" 2>&1 || { cat "$work/play.log"; die "benchmark playbook failed"; }
    "$VENV/bin/python" - "$work/times.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def times(name):
    return [r["seconds"] * 1000 for r in rows if r["task"] == name and r["status"] == "ok"]
stat, ours = times("Bench stat"), times("Bench containerd_runtimes")
print("task benchmark (local connection, 200-line template, 3 runtimes, no-op runs):")
print("  ansible.builtin.stat                 median %6.1f ms  (n=%d)" % (statistics.median(stat), len(stat)))
print("  k3s_gpu.nvidia.containerd_runtimes   median %6.1f ms  (n=%d)" % (statistics.median(ours), len(ours)))
print("  ratio (median of per-round ratios)   %.2fx" % statistics.median(o / s for o, s in zip(ours, stat)))
PY
fi
