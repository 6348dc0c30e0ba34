#!/usr/bin/env bash
# The role's variables as users give them (-e, INI, YAML), and its refusals as users see them: one
# `fatal: [host]: FAILED! => {"msg": ...}` that names the role's variables, with no templating noise.
# Sandbox nodes only (gpu_node_root): stub NVIDIA binaries, a driver and PCI files; nothing of this machine.
set -euo pipefail

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0

node() {  # node NAME GPU(yes|no)
    local root=$work/nodes/$1
    mkdir -p "$root/var/lib/rancher/k3s/agent/etc/containerd" "$root/usr/bin"
    for binary in nvidia-container-runtime nvidia-container-runtime.cdi nvidia-container-runtime.legacy; do
        printf '#!/bin/sh\nexit 0\n' > "$root/usr/bin/$binary"
        chmod 0755 "$root/usr/bin/$binary"
    done
    if [[ $2 == yes ]]; then
        mkdir -p "$root/proc/driver/nvidia/gpus/0000:17:00.0" "$root/dev" "$root/sys/bus/pci/devices/0000:17:00.0"
        echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build" > "$root/proc/driver/nvidia/version"
        : > "$root/dev/nvidia0"
        echo 0x10de > "$root/sys/bus/pci/devices/0000:17:00.0/vendor"
        echo 0x030200 > "$root/sys/bus/pci/devices/0000:17:00.0/class"
    fi
}

fresh() {
    rm -rf "$work/nodes" "$work"/result-*.json
    node gpu yes
    node cpu no
}

# INI inventory: every value is text, as in a real [group:vars] section
cat > "$work/hosts.ini" <<INI
[agent]
gpu
cpu

[agent:vars]
ansible_connection=local
ansible_python_interpreter="{{ ansible_playbook_python }}"
gpu_node_distribution=k3s
gpu_node_release=v1.33.10+k3s1
gpu_node_toolkit_install=false
gpu_node_restart=false
INI
cat > "$work/hosts.yml" <<YAML
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    gpu_node_distribution: k3s
    gpu_node_release: v1.33.10+k3s1
    gpu_node_toolkit_install: false
    gpu_node_force: false
  hosts:
    gpu: {}
    cpu: {}
YAML

run() {  # run INVENTORY [ansible-playbook args...]: output in $work/out; PLAYBOOK=k3s_gpu.nvidia.site runs the site
    local inventory=$1
    shift
    set +e
    ansible-playbook -i "$work/$inventory" -e "work_dir=$work" \
        -e "{\"gpu_node_root\": \"$work/nodes/{{ inventory_hostname }}\"}" "$@" "${PLAYBOOK:-play.yml}" > "$work/out" 2>&1
    status=$?
    set -e
}

status_of() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$work/result-$1.json"
}

expect() {  # expect DESCRIPTION CONDITION...
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAILED: $what"
        tail -60 "$work/out"
        exit 1
    fi
}

in_out() { grep -qF -- "$1" "$work/out"; }
not_in_out() { ! grep -qF -- "$1" "$work/out"; }

# 1. text booleans from INI: gpu_node_toolkit_install=false is false (it was refused as "got 'false'")
fresh
run hosts.ini
expect "INI text booleans converge (rc $status)" test "$status" -eq 0
expect "INI: the GPU host is configured" test "$(status_of gpu)" = configured
expect "INI: the CPU host is left alone" test "$(status_of cpu)" = skipped
expect "INI: no 'must be true or false'" not_in_out "must be true or false"

# 2. -e gpu_node_force=false is false (the string was truthy: a CPU host was configured)
fresh
run hosts.yml -e gpu_node_force=false
expect "-e gpu_node_force=false leaves the CPU host alone" test "$(status_of cpu)" = skipped
fresh
run hosts.yml -e gpu_node_force=true
expect "-e gpu_node_force=true configures the CPU host" test "$(status_of cpu)" = configured

# 3. YAML booleans, and a misspelled variable draws a warning naming the right one
fresh
run hosts.yml -e gpu_node_forse=true
expect "YAML inventory converges (rc $status)" test "$status" -eq 0
expect "YAML: the CPU host is left alone" test "$(status_of cpu)" = skipped
expect "a misspelled variable is named with the closest one" in_out "gpu_node_forse is not a variable of the k3s_gpu.nvidia.gpu_node role and is ignored; did you mean gpu_node_force?"

# 4. a refusal is one clean failure naming the user's variables, every file as it was
fresh
before=$(find "$work/nodes" -printf '%p %s %m\n' | sort | sha256sum)
run hosts.yml -e gpu_node_release=v1.28.3+k3s1 --limit gpu
after=$(find "$work/nodes" -printf '%p %s %m\n' | sort | sha256sum)
expect "a known-bad release fails the host (rc $status)" test "$status" -ne 0
expect "... as one fatal line with the cause first" in_out 'fatal: [gpu]: FAILED! => {"changed": false, "msg": "gpu: k3s v1.28.3+k3s1: its template fails to render'
expect "... without a filter's wrapping" not_in_out "Finalization of task args"
expect "... without the filter's name" not_in_out "gpu_node_plan"
expect "... nothing changed" test "$before" = "$after"

fresh
run hosts.yml -e gpu_node_release= --limit gpu
expect "no release under a sandbox root fails (rc $status)" test "$status" -ne 0
expect "... naming gpu_node_release, not the module option" in_out "set gpu_node_release"
expect "... not 'pass release='" not_in_out "pass release="

fresh
run hosts.yml -e gpu_node_distribution=rke2 --limit gpu
expect "a k3s release for rke2 fails naming gpu_node_distribution" in_out "is a k3s release, but gpu_node_distribution is rke2"

fresh
run hosts.yml -e gpu_node_mode=hybrid --limit gpu
expect "a bad choice fails (rc $status)" test "$status" -ne 0
expect "... naming the variable" in_out "gpu_node_mode"

fresh
run hosts.yml -e gpu_node_distribution=rke2 -e gpu_node_release=v1.33.10+rke2r1 --limit gpu
expect "rke2 asked on a k3s node fails (rc $status)" test "$status" -ne 0
expect "... naming gpu_node_distribution" in_out "set gpu_node_distribution to k3s"
expect "... and no rke2 tree was created" test ! -e "$work/nodes/gpu/var/lib/rancher/rke2"
expect "... nor /etc/rancher/rke2" test ! -e "$work/nodes/gpu/etc/rancher/rke2"

# 5. a k3s-ansible inventory (groups k3s_cluster > server/agent, k3s_version) and k3s not installed yet
fresh
rm -rf "$work/nodes/gpu/var/lib/rancher"
cat > "$work/k3s-ansible.yml" <<YAML
k3s_cluster:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    k3s_version: v1.33.10+k3s1
    gpu_node_toolkit_install: false
  children:
    server:
      hosts:
        cpu: {}
    agent:
      hosts:
        gpu: {}
YAML
run k3s-ansible.yml
expect "k3s-ansible's k3s_version alone converges (rc $status)" test "$status" -eq 0
expect "... the GPU agent is configured for k3s v1.33.10" python3 -c '
import json, sys
result = json.load(open(sys.argv[1]))
assert (result["status"], result["distribution"], result["release"], result["release_from"]) == (
    "configured", "k3s", "v1.33.10+k3s1", "k3s_version"), result' "$work/result-gpu.json"
expect "... into the drop-in k3s will import" test -f "$work/nodes/gpu/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"
run k3s-ansible.yml
expect "... and a second run changes nothing" python3 -c '
import json, sys
assert json.load(open(sys.argv[1]))["changed"] is False' "$work/result-gpu.json"

# 6. the site playbook checks the cluster settings before any host is touched (rke2-ansible's group names,
# no k3s_gpu_servers: the RuntimeClass play used to fail after the role had written its files)
fresh
before=$(find "$work/nodes" -printf '%p %s %m\n' | sort | sha256sum)
PLAYBOOK=k3s_gpu.nvidia.site run hosts.yml -e k3s_gpu_servers=rke2_servers
after=$(find "$work/nodes" -printf '%p %s %m\n' | sort | sha256sum)
expect "site with a server group that matches nothing fails (rc $status)" test "$status" -ne 0
expect "... saying which variable to set" in_out "k3s_gpu_servers (now rke2_servers) matches no host of the inventory; set it to the group or pattern of your k3s/rke2 servers"
expect "... before the role touched a node" test "$before" = "$after"

# 7. the site summary of a check-mode run says what would change and that a restart would be needed
fresh
rm -rf "$work/nodes/gpu/var/lib/rancher"
before=$(find "$work/nodes" -printf '%p %s %m\n' | sort | sha256sum)
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml --check
after=$(find "$work/nodes" -printf '%p %s %m\n' | sort | sha256sum)
expect "site --check on a k3s-ansible inventory (rc $status)" test "$status" -eq 0
expect "... the summary says what would change" in_out "gpu: configured | k3s v1.33.10+k3s1 | detected nvidia,nvidia-cdi | written nvidia-legacy | by release nvidia,nvidia-cdi | WOULD CHANGE: created /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml, created /etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml | 3 node labels"
expect "... and that a restart would be needed" in_out "RESTART NEEDED (check mode)"
expect "... the CPU server is skipped with the reason" in_out "cpu: skipped (no NVIDIA GPU on the PCI bus and no driver loaded) | k3s v1.33.10+k3s1"
expect "... the cluster's row says which manifest would change" in_out "cluster default: done | from cpu | WOULD CHANGE: created $work/nodes/cpu/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml"
expect "... and nothing was written" test "$before" = "$after"

# 8. site --limit: the summary still comes, for the limited hosts
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml --limit gpu
expect "site --limit gpu (rc $status)" test "$status" -eq 0
expect "... still prints the summary row of the limited host" in_out '"gpu: configured | k3s v1.33.10+k3s1'
expect "... and no row for a host outside the limit" not_in_out '"cpu: '
manifest=$work/nodes/cpu/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml
expect "... the limited host's cluster gets its RuntimeClasses on its server, outside the limit" grep -qF 'handler: "nvidia-legacy"' "$manifest"
expect "... and the cluster row says the run was partial" in_out "cluster default: done | from cpu | changed: created $manifest"
expect "... (partial: nothing removed)" in_out "partial run: nothing removed"

# 9. a partial run only adds: with --limit, runtimeclasses_state=absent leaves the manifest; a full run removes it
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml
expect "site without a limit (rc $status)" test "$status" -eq 0
expect "... sees the whole cluster and changes nothing more" in_out "cluster default: done | from cpu | unchanged | no GPU Operator from this collection | RuntimeClasses nvidia-cdi,nvidia-legacy"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml --limit gpu -e runtimeclasses_state=absent
expect "runtimeclasses --limit gpu, state absent (rc $status)" test "$status" -eq 0
expect "... keeps the manifest (a partial run removes nothing)" test -f "$manifest"
expect "... and says so" in_out "RuntimeClass manifest left as it is"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml -e runtimeclasses_state=absent
expect "runtimeclasses state absent on the whole fleet (rc $status)" test "$status" -eq 0
expect "... removes the manifest" test ! -e "$manifest"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml -e runtimeclasses_state=absent
expect "... and a second run changes nothing (rc $status)" test "$status" -eq 0
expect "... (no host changed)" not_in_out "changed=1"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml -e runtimeclasses_method=kubectl
expect "a bad runtimeclasses_method is refused (rc $status)" test "$status" -ne 0
expect "... naming the variable and its choices" in_out "runtimeclasses_method must be one of: manifest, api"
expect "... before any node is read" not_in_out "TASK [Read the NVIDIA runtime handlers"

