#!/usr/bin/env bash
# Fleet benchmark (figures are recorded in benchmarks/RESULTS.md, never asserted in tests):
# k3s_gpu.nvidia.site on a simulated fleet of sandbox nodes on localhost, converge and a no-op second
# run against a floor of one ansible.builtin.stat per host. See benchmarks/fleet/README.md.
#   ./benchmarks/fleet.sh              # 10, 50, 100 and 200 hosts
#   ./benchmarks/fleet.sh 10 50        # chosen sizes
#   FORKS=20 REPS=5 ./benchmarks/fleet.sh 100
#   FLEET_REF=HEAD ./benchmarks/fleet.sh 10   # measure a commit (git archive), not the checkout's files
# Prints Markdown tables; writes every figure to .tmp/fleet-bench/fleet-<date>.json.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/../scripts/lib.sh"
enter_dev_env

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
collections=$COLL_PATH  # the checkout, as benchmarks/run.sh uses it
if [[ -n ${FLEET_REF:-} ]]; then
    # a commit, unpacked into the run's own directory: edits in the checkout do not reach the runs
    FLEET_REF=$(git rev-parse --verify "$FLEET_REF^{commit}")  # one commit, even if HEAD moves meanwhile
    export FLEET_REF
    collections=$work/collections
    mkdir -p "$collections/ansible_collections/k3s_gpu/nvidia"
    git archive --format=tar "$FLEET_REF" | tar -xf - -C "$collections/ansible_collections/k3s_gpu/nvidia"
fi
ANSIBLE_COLLECTIONS_PATH=$collections FORKS=${FORKS:-10} REPS=${REPS:-3} \
    "$VENV/bin/python" benchmarks/fleet/bench.py --work-dir "$work" "$@"
