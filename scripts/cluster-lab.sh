#!/usr/bin/env bash
# The Kubernetes lab: a one-node cluster on 127.0.0.1 (real kube-apiserver, kubelet, scheduler,
# controller-manager, kine, containerd and NVIDIA's runtime wrappers; a device plugin test double and
# fake GPUs), built from the Go module proxy on first use (tests/testbins.py). Needs root.
#
#   ./scripts/cluster-lab.sh up [--kubernetes 1.34|1.36] [--release vX.Y.Z+k3s1] [--gpus N] [--strategy envvar|cdi-cri]
#                               [--node-root DIR]   (a node tree the gpu_node role converged, run as the lab's node)
#   ./scripts/cluster-lab.sh status [--logs N]   (N: also the last N lines of each log and the last N events)
#   ./scripts/cluster-lab.sh down
#
# `up` ends with two lines: BUSYBOX_IMAGE=<image ref> (imported, use imagePullPolicy: Never) and
# KUBECONFIG=<path>. The lab lives in $K3S_GPU_CLUSTER_LAB (default /tmp/k3s-gpu-cluster-lab);
# `down` removes everything it made. What it runs and fakes: tests/cluster/clusterlab.py.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
ROOT=$(repo_root)

case ${1:-} in
    -h | --help | "")
        sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
esac
[[ $(id -u) -eq 0 ]] || die "the cluster lab needs root (kubelet, containerd, mknod, cgroups)"
if [[ $1 == up ]]; then
    # loopback CNI plugin, openssl for the certificates, runc for containerd's shim
    apt_ensure containernetworking-plugins openssl runc busybox-static
    [[ -x "$ROOT/.venv/bin/python" ]] || bash "$HERE/test.sh" setup >/dev/null
    bash "$HERE/install-go.sh" >/dev/null
    # the runtimeclasses playbook applies through the API: kubernetes.core and the Python client
    kubernetes_core_ensure "$ROOT/.venv/bin/python" "$ROOT/.tmp/extra-collections"
fi
[[ -x "$ROOT/.venv/bin/python" ]] || die "no $ROOT/.venv: run ./scripts/test.sh setup"
exec "$ROOT/.venv/bin/python" "$ROOT/tests/cluster/clusterlab.py" "$@"
