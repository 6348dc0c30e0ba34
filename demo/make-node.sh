#!/usr/bin/env bash
# Builds the demo node: a sandbox tree that stands for / of a k3s GPU agent.
# FAKED here, because they cannot run on this machine: the k3s binary, the NVIDIA driver and the
# NVIDIA toolkit binaries (shell stubs with the real names, paths and modes).
set -euo pipefail
node=${1:?usage: make-node.sh DIR}
rm -rf "$node"
mkdir -p "$node"/usr/bin "$node"/usr/local/bin "$node"/etc/systemd/system "$node"/etc/default \
    "$node"/var/lib/rancher/k3s/agent/etc/containerd "$node"/proc/driver/nvidia "$node"/dev "$node"/etc/cdi \
    "$node"/run/systemd/system

stub() { printf '#!/bin/sh\n# demo stub of %s\nexit 0\n' "$(basename "$1")" >"$node$1"; chmod 0755 "$node$1"; }
# nvidia-container-toolkit-base + nvidia-container-toolkit-operator-extensions
stub /usr/bin/nvidia-container-runtime
stub /usr/bin/nvidia-container-runtime.cdi
stub /usr/bin/nvidia-container-runtime.legacy
stub /usr/bin/nvidia-ctk
stub /usr/local/bin/k3s

cat >"$node"/etc/systemd/system/k3s-agent.service <<'UNIT'
[Unit]
Description=Lightweight Kubernetes
[Service]
Type=exec
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-/etc/systemd/system/k3s-agent.service.env
ExecStart=/usr/local/bin/k3s agent
Restart=always
UNIT
printf 'K3S_URL=https://k3s-server.example:6443\n' >"$node"/etc/systemd/system/k3s-agent.service.env
chmod 0600 "$node"/etc/systemd/system/k3s-agent.service.env

# The site's own template: the base template and a gVisor runtime (k3s does not detect runsc);
# every byte of it must survive.
cat >"$node"/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl <<'TMPL'
# Site template (owned by the platform team)
{{ template "base" . }}

# gVisor for untrusted workloads
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'runsc']
  runtime_type = "io.containerd.runsc.v1"
TMPL
chmod 0600 "$node"/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl

printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (demo)\n' \
    >"$node"/proc/driver/nvidia/version
: >"$node"/dev/nvidia0
: >"$node"/dev/nvidiactl
: >"$node"/dev/nvidia-uvm
printf -- '---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n- name: all\n' >"$node"/etc/cdi/nvidia.yaml
