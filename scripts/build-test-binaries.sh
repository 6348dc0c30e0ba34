#!/usr/bin/env bash
# Builds the test suite's binaries from the Go module proxy into a cache outside the clone
# ($K3S_GPU_TEST_BINARIES, else ~/.cache/k3s-gpu-nvidia/test-binaries), keyed by name and version:
#
#   containerd-2.2            github.com/containerd/containerd/v2 v2.2.7: containerd, ctr, containerd-shim-runc-v2
#   containerd-2.3            github.com/containerd/containerd/v2 v2.3.4: the same
#   nvidia-container-toolkit  github.com/NVIDIA/nvidia-container-toolkit v1.20.0: nvidia-ctk,
#                             nvidia-container-runtime(.cdi, .legacy), nvidia-cdi-hook, nvidia-container-runtime-hook
#   helm-render               tests/helm_render on helm.sh/helm/v4 v4.3.2: our offline `helm template`
#
#   ./scripts/build-test-binaries.sh            # every key (cached ones cost a sha256 check)
#   ./scripts/build-test-binaries.sh helm-render
#   ./scripts/build-test-binaries.sh --list
#
# One line per build with its time; versions.json in the cache records module, version, Go version
# and the sha256 of every binary. The table of builds is tests/testbins.py (BUILDS). Nothing is
# installed system-wide; Go's own caches (GOCACHE, GOMODCACHE) make a rebuild short.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
ROOT=$(repo_root)

case ${1:-} in
    -h | --help)
        sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --list) exec python3 "$ROOT/tests/testbins.py" list ;;
esac
bash "$HERE/install-go.sh"
PATH=$(dirname "$(go_path)"):$PATH
export PATH
exec python3 "$ROOT/tests/testbins.py" build "$@"
