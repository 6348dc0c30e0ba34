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
no_host_changed() { ! grep -qE 'changed=[1-9]' "$work/out"; }

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
expect "... the summary says what would change" in_out "gpu: configured | k3s v1.33.10+k3s1 | detected nvidia,nvidia-cdi | written nvidia-legacy | by release nvidia,nvidia-cdi | WOULD CHANGE: created /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml, created /etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml | 4 node labels"
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
expect "... sees the whole cluster and changes nothing more" in_out "cluster default: done | from cpu | unchanged | no GPU Operator from this collection | RuntimeClasses nvidia-cdi,nvidia-legacy | device plugin 0.20.0 (nvidia, envvar)"
plugin=$work/nodes/cpu/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-device-plugin.yaml
expect "... the device plugin's HelmChart is on the server" grep -qF 'runtimeClassName: "nvidia"' "$plugin"
expect "... and the GPU node is labelled where the chart schedules" grep -qF '"nvidia.com/gpu.present=true"' "$work/nodes/gpu/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml -e '{"gpu_node_gpu_sharing": {"strategy": "time-slicing", "replicas": 1}}'
expect "one GPU shared by 1 is refused (rc $status)" test "$status" -ne 0
expect "... naming the variable and the fix" in_out "gpu_node_gpu_sharing.replicas is 1; set a whole number of 2 or more"
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml -e '{"gpu_node_gpu_sharing": {"strategy": "time-slicing", "replicas": 4}}'
expect "time-slicing by 4 (rc $status)" test "$status" -eq 0
expect "... goes into the plugin's config" grep -qF "replicas: 4" "$plugin"
expect "... and the summary says so" in_out "device plugin 0.20.0 (nvidia, envvar, time-slicing x4)"
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml -e '{"gpu_node_gpu_sharing": {"strategy": "time-slicing", "replicas": 4}}'
expect "... a second run changes nothing" no_host_changed
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml -e gpu_node_device_plugin_state=absent
expect "gpu_node_device_plugin_state=absent (rc $status)" test "$status" -eq 0
expect "... removes the plugin's HelmChart" test ! -e "$plugin"
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml
expect "... and the next run brings it back (rc $status)" test -f "$plugin"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml --limit gpu -e runtimeclasses_state=absent
expect "runtimeclasses --limit gpu, state absent (rc $status)" test "$status" -eq 0
expect "... keeps the manifest (a partial run removes nothing)" test -f "$manifest"
expect "... and says so" in_out "RuntimeClass manifest left as it is"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml -e runtimeclasses_state=absent
expect "runtimeclasses state absent on the whole fleet (rc $status)" test "$status" -eq 0
expect "... removes the manifest" test ! -e "$manifest"
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml -e runtimeclasses_state=absent
expect "... and a second run changes nothing (rc $status)" test "$status" -eq 0
expect "... (no host changed)" no_host_changed
PLAYBOOK=k3s_gpu.nvidia.runtimeclasses run k3s-ansible.yml -e runtimeclasses_method=kubectl
expect "a bad runtimeclasses_method is refused (rc $status)" test "$status" -ne 0
expect "... naming the variable and its choices" in_out "runtimeclasses_method must be one of: manifest, api"
expect "... before any node is read" not_in_out "TASK [Read the NVIDIA runtime handlers"



# 10. gpu_node_state=absent takes back everything the role wrote: a k3s release that edits a user's template, one
# where the role creates the template, a drop-in release, and a plain containerd node; every file back to its bytes,
# no file or directory left over, a second absent run changes nothing, and --check writes nothing
V3_CRI="plugins.'io.containerd.cri.v1.runtime'.containerd"
absent_nodes() {
    rm -rf "$work/nodes" "$work"/result-*.json
    local name
    for name in tmpl created dropin plain; do
        node "$name" yes
        mkdir -p "$work/nodes/$name/etc/rancher/k3s" "$work/nodes/$name/var/run/cdi" "$work/nodes/$name/etc/cdi"
        echo "write-kubeconfig-mode: \"0600\"" > "$work/nodes/$name/etc/rancher/k3s/config.yaml"
        # a CDI spec of someone else's: it stays
        printf 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n' > "$work/nodes/$name/etc/cdi/vendor.yaml"
    done
    # the user's own template, with a table of theirs, CRLF-free but with odd spacing the role must keep byte for byte
    printf '{{ template "base" . }}\n\n# my own runtime\n[%s.runtimes.mine]\n  runtime_type   = "io.containerd.runc.v2"\n[%s.runtimes.mine.options]\n  BinaryName = "/usr/local/bin/mine"\n' \
        "$V3_CRI" "$V3_CRI" > "$work/nodes/tmpl/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
    chmod 0640 "$work/nodes/tmpl/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
    rm -rf "$work/nodes/plain/var/lib/rancher" "$work/nodes/plain/etc/rancher"
    mkdir -p "$work/nodes/plain/etc/containerd"
    printf 'version = 3\n\n[%s]\n  default_runtime_name = "runc"\n[%s.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n[%s.runtimes.runc.options]\n  SystemdCgroup = true\n' \
        "$V3_CRI" "$V3_CRI" "$V3_CRI" > "$work/nodes/plain/etc/containerd/config.toml"
}
cat > "$work/absent.yml" <<YAML
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    gpu_node_toolkit_install: false
    gpu_node_backup: false
  hosts:
    tmpl: {gpu_node_distribution: k3s, gpu_node_release: v1.32.2+k3s1}
    created: {gpu_node_distribution: k3s, gpu_node_release: v1.32.2+k3s1}
    dropin: {gpu_node_distribution: k3s, gpu_node_release: v1.33.10+k3s1}
    plain: {gpu_node_distribution: containerd, gpu_node_release: 2.1.4}
YAML
tree() {  # every path with its type and mode, then every file's checksum
    (cd "$work/nodes" && find . -printf '%y %p %m\n' | LC_ALL=C sort && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
}
result_is() {  # result_is HOST PYTHON-CONDITION-ON-r
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert eval(sys.argv[2]), r' "$work/result-$1.json" "$2"
}
unchanged() {  # unchanged HOST...: the role changed nothing there (the play's own result copy always changes)
    local host
    for host in "$@"; do
        result_is "$host" 'r["changed"] is False and not r.get("files")' 2>/dev/null || return 1
    done
}
TMPL=$work/nodes/tmpl/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl

absent_nodes
tree > "$work/tree-before"
cp "$TMPL" "$work/tmpl-original"
run absent.yml
expect "present on the four sandbox nodes (rc $status)" test "$status" -eq 0
expect "... the user's template is edited" grep -q "runtimes.nvidia-legacy" "$TMPL"
expect "... its bytes before the edit are kept, mode 0600" cmp -s "$TMPL.k3s-gpu-nvidia.orig" "$work/tmpl-original"
expect "... (mode 0600)" test "$(stat -c %a "$TMPL.k3s-gpu-nvidia.orig")" = 600
expect "... with the checksum of what the role left" sh -c "cd '$(dirname "$TMPL")' && sha256sum -c --quiet config-v3.toml.tmpl.k3s-gpu-nvidia.sha256"
expect "... a template is created where there was none" grep -q "Managed by Ansible" "$work/nodes/created/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
expect "... the drop-in node got its drop-in" test -f "$work/nodes/dropin/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"
expect "... the plain config is edited and its original kept" cmp -s <(grep -c nvidia-legacy "$work/nodes/plain/etc/containerd/config.toml.k3s-gpu-nvidia.orig") <(echo 0)
run absent.yml
expect "... a second present run changes nothing" unchanged tmpl created dropin plain
expect "... and leaves the kept original as it was" cmp -s "$TMPL.k3s-gpu-nvidia.orig" "$work/tmpl-original"
# the spec the role's cdi.yml generates (with its marker line): absent removes it, and only it
for name in tmpl created dropin plain; do
    printf '%s\n---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n' \
        "# Generated by k3s_gpu.nvidia (gpu_node role) with nvidia-ctk cdi generate; gpu_node_state=absent removes it" \
        > "$work/nodes/$name/var/run/cdi/nvidia.yaml"
done
tree > "$work/tree-present"

run absent.yml -e gpu_node_state=absent --check --diff
expect "absent --check (rc $status)" test "$status" -eq 0
expect "... writes nothing" cmp -s "$work/tree-present" <(tree)
expect "... shows the template going back to its original in the diff" in_out '-[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy]'
expect "... and says a restart would be needed" in_out "restart k3s to apply it (check mode)"

run absent.yml -e gpu_node_state=absent
expect "absent (rc $status)" test "$status" -eq 0
expect "... every file back to its bytes, nothing left over" diff -u "$work/tree-before" <(tree)
expect "... the template is reported restored" result_is tmpl 'r["status"] == "absent" and r["state"] == "absent" and len(r["restored"]) == 1 and not r["changed_since_written"]'
expect "... the plain config too" result_is plain 'r["restored"] == ["/etc/containerd/config.toml"]'
expect "... the created template and the drop-in were removed" result_is dropin '"removed" in [f["action"] for f in r["files"]]'
run absent.yml -e gpu_node_state=absent
expect "a second absent run (rc $status)" test "$status" -eq 0
expect "... changes nothing" unchanged tmpl created dropin plain

# a template the user edits between present and absent: their edit stays, only the role's table goes, with a warning
absent_nodes
run absent.yml --limit tmpl -e gpu_node_backup=true
sed -i 's#/usr/local/bin/mine"#/usr/local/bin/mine2"#' "$TMPL"
run absent.yml --limit tmpl -e gpu_node_state=absent
expect "absent after the user's edit (rc $status)" test "$status" -eq 0
expect "... warns by name that the template changed since" in_out "config-v3.toml.tmpl changed since k3s_gpu.nvidia last wrote it"
expect "... keeps the user's edit and drops the role's table" diff -u <(sed 's#/usr/local/bin/mine"#/usr/local/bin/mine2"#' "$work/tmpl-original") "$TMPL"
expect "... removes the kept original and the record" test ! -e "$TMPL.k3s-gpu-nvidia.orig" -a ! -e "$TMPL.k3s-gpu-nvidia.sha256"
expect "... and says so in the result" result_is tmpl 'len(r["changed_since_written"]) == 1 and not r["restored"]'
run absent.yml --limit tmpl -e gpu_node_state=absent
expect "... a second absent run changes nothing" unchanged tmpl

# 11. site with gpu_node_state=absent: the nodes are taken back and their cluster's RuntimeClass manifest removed
fresh
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml
expect "site converges (rc $status)" test "$status" -eq 0
expect "... with the RuntimeClass manifest on the server" test -f "$manifest"
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml -e gpu_node_state=absent
expect "site -e gpu_node_state=absent (rc $status)" test "$status" -eq 0
expect "... removes the cluster's RuntimeClass manifest" test ! -e "$manifest"
expect "... and the device plugin's HelmChart" test ! -e "$plugin"
expect "... says what it took back from the GPU node" in_out '"gpu: absent | k3s v1.33.10+k3s1 | taken back: removed'
expect "... and the cluster's removal" in_out "cluster default: done | from cpu | changed: removed $manifest"
PLAYBOOK=k3s_gpu.nvidia.site run k3s-ansible.yml -e gpu_node_state=absent
expect "... a second absent run (rc $status)" test "$status" -eq 0
expect "... changes nothing" no_host_changed
