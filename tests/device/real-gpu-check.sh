#!/usr/bin/env bash
# What the collection sees on a machine with a real NVIDIA GPU and driver. Not part of CI (CI has no GPU): a session
# that is lent such a machine runs it there, as root, on a throwaway machine, and records what it saw in
# tests/device/RESULTS.md. It changes the machine: it puts NVIDIA's toolkit binaries in $TOOLKIT_BIN_DIR, a CDI spec in
# /var/run/cdi and an empty k3s data dir in /var/lib/rancher/k3s.
#
#   tests/device/real-gpu-check.sh prepare   # here: wheels of ansible-core and the toolkit built from the Go module
#                                            # proxy (scripts/build-test-binaries.sh) into .tmp/device-kit
#   tests/device/real-gpu-check.sh prepare-container   # here, optional: containerd 2.2, runc, busybox (.tmp/device-kit-ctr)
#   tests/device/real-gpu-check.sh run       # there: the checks below, results under $OUT (default .tmp/device-out)
#
# The run: machine facts; runtime_info with no toolkit; the toolkit's binaries installed and `nvidia-ctk cdi generate`
# run against the real driver; runtime_info again (runtimes detected as k3s $K3S_RELEASE will, the CDI spec and whether
# it fits the loaded driver); the doctor playbook in check mode (the node layers, no cluster); the doctor's first fix;
# the gpu_node role, twice (installs off: the CDI spec it generates, the containerd files it writes, the second run);
# with the container kit, one container through runc and one through nvidia-container-runtime.cdi.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KIT=${DEVICE_KIT:-$ROOT/.tmp/device-kit}
OUT=${OUT:-$ROOT/.tmp/device-out}
RELEASE=${K3S_RELEASE:-v1.33.10+k3s1}
TOOLKIT_BIN_DIR=${TOOLKIT_BIN_DIR:-/usr/bin}

prepare() {
    set -e
    mkdir -p "$KIT"
    "$ROOT/scripts/build-test-binaries.sh" nvidia-container-toolkit
    local bin
    bin=$(dirname "$(python3 "$ROOT/tests/testbins.py" path nvidia-container-toolkit nvidia-ctk)")
    tar -C "$bin" -cJf "$KIT/toolkit.tar.xz" .
    # the device's python3 is 3.12 with jinja2, PyYAML and packaging; the versions are the test venv's
    "$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 -d "$KIT" \
        "$(grep -i '^ansible-core==' "$ROOT/tests/requirements.txt")" \
        "$("$ROOT/.venv/bin/python" -m pip freeze | grep -i '^resolvelib==')" \
        "$(grep -i '^tomlkit==' "$ROOT/tests/requirements.txt")"
    ls -l "$KIT"
}

# containerd 2.2 (built from the Go module proxy), Debian's runc and static busybox: a container on the real GPU
prepare_container() {
    set -e
    local kit=$KIT-ctr bin
    mkdir -p "$kit" "$ROOT/.tmp/busybox-deb"
    "$ROOT/scripts/build-test-binaries.sh" containerd-2.2
    bin=$(dirname "$(python3 "$ROOT/tests/testbins.py" path containerd-2.2 containerd)")
    tar -C "$bin" -cf - . | nice xz -1 -T1 >"$kit/containerd.tar.xz"
    command -v runc >/dev/null || apt-get install -y -q runc
    cp "$(command -v runc)" "$(ldd "$(command -v runc)" | awk '/libseccomp/ {print $3}')" "$kit/"
    (cd "$ROOT/.tmp/busybox-deb" && apt-get download -q busybox-static && dpkg-deb -x busybox-static_*.deb .)
    cp "$ROOT/.tmp/busybox-deb/bin/busybox" "$kit/"
    ls -l "$kit"
}

step() { printf '\n== %s\n' "$*"; }

# the doctor playbook on this node in check mode, node layers only; its report under $OUT
doctor() {
    ansible-playbook -i "$1" "$ROOT/playbooks/doctor.yml" -e gpu_node_distribution=k3s -e "gpu_node_release=$RELEASE" \
        -e doctor_cluster=false -e doctor_fail=false -e "doctor_report_path=$OUT/$2" 2>&1 | grep -A12 'Show the report'
}

# One container through containerd's runc shim with the given BinaryName, as k3s's runtime table sets it; it lists
# what of the GPU it sees: device nodes, the driver's libraries mounted from the CDI spec.
container_sees() {
    local base=$1 binary=$2 name=$3
    # shellcheck disable=SC2016  # the container's shell expands these
    ctr -a "$base/containerd.sock" run --rm --rootfs --runc-binary "$binary" \
        --env NVIDIA_VISIBLE_DEVICES=all "$base/rootfs" "$name" /bin/busybox sh -c \
        'echo "devices: $(ls /dev | grep nvidia | tr "\n" " ")"; echo "libcuda: $(ls /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu 2>/dev/null | grep "^libcuda.so" | tr "\n" " ")"'
    echo "rc=$?"
}

container_check() {
    local kit=$KIT-ctr base=/tmp/k3sgpu-ctr
    if [ ! -d "$kit" ]; then
        echo "no $kit: no container run (tests/device/real-gpu-check.sh prepare-container makes it)"
        return 0
    fi
    step "a container on containerd 2.2: runc, then the toolkit's nvidia-container-runtime.cdi as the shim's BinaryName"
    mkdir -p "$base/bin" "$base/rootfs/bin" "$base/rootfs/dev" "$base/rootfs/proc" "$base/rootfs/sys" "$base/rootfs/tmp"
    tar -C "$base/bin" -xJf "$kit/containerd.tar.xz" --no-same-owner
    cp "$kit/runc" "$base/bin/"
    cp "$kit/busybox" "$base/rootfs/bin/busybox"
    ldconfig -p | grep -q libseccomp.so.2 || export LD_LIBRARY_PATH=$kit
    export PATH=$base/bin:$PATH
    printf 'version = 3\nroot = "%s/root"\nstate = "%s/state"\n[grpc]\n  address = "%s/containerd.sock"\n' \
        "$base" "$base" "$base" >"$base/config.toml"
    setsid containerd --config "$base/config.toml" >"$OUT/containerd.log" 2>&1 &
    for _ in $(seq 60); do [ -S "$base/containerd.sock" ] && break; sleep 0.5; done
    containerd --version
    container_sees "$base" runc plain-runc
    container_sees "$base" /usr/bin/nvidia-container-runtime.cdi nvidia-cdi
    kill "$!" 2>/dev/null
}


run_checks() {
    mkdir -p "$OUT"
    step "machine"
    {
        uname -a; grep PRETTY_NAME /etc/os-release; cat /proc/driver/nvidia/version
        ls -l /dev/nvidia*; find /dev/char -lname '*nvidia*' -printf '%p -> %l\n'; ls /proc/driver/nvidia/gpus
        nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid --format=csv
        find /usr/local/nvidia -maxdepth 2 -printf '%M %p\n' 2>&1 | head -40
        ldconfig -p | grep -E 'libnvidia-ml|libcuda\.so'
    } >"$OUT/machine.txt" 2>&1
    cat "$OUT/machine.txt"

    step "ansible-core from wheels"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k3sgpu-site "$KIT"/*.whl || return 1
    export PYTHONPATH=/tmp/k3sgpu-site PATH=/tmp/k3sgpu-site/bin:$PATH
    mkdir -p /tmp/k3sgpu-collections/ansible_collections/k3s_gpu
    ln -sfn "$ROOT" /tmp/k3sgpu-collections/ansible_collections/k3s_gpu/nvidia
    export ANSIBLE_COLLECTIONS_PATH=/tmp/k3sgpu-collections ANSIBLE_NOCOWS=1 ANSIBLE_RETRY_FILES_ENABLED=0 \
        ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0
    ansible --version | head -1
    local inventory=/tmp/k3sgpu-inventory.ini
    printf 'gpu ansible_connection=local ansible_python_interpreter=%s\n' "$(command -v python3)" >"$inventory"

    local reader=/tmp/k3sgpu-read.yml
    cat >"$reader" <<'YAML'
- name: Read the node with runtime_info and keep the whole result
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Read the node as k3s's release will
      k3s_gpu.nvidia.runtime_info:
        distribution: k3s
        release: "{{ release }}"
      register: reading
    - name: Keep it
      ansible.builtin.copy:
        content: "{{ reading | to_nice_json }}"
        dest: "{{ dest }}"
        mode: "0644"
YAML

    step "runtime_info, no toolkit"
    ansible-playbook -i "$inventory" "$reader" -e "release=$RELEASE" -e "dest=$OUT/runtime_info-no-toolkit.json" | tail -4

    step "NVIDIA Container Toolkit from the Go module proxy into $TOOLKIT_BIN_DIR; nvidia-ctk cdi generate"
    tar -C "$TOOLKIT_BIN_DIR" -xJf "$KIT/toolkit.tar.xz" --no-same-owner || return 1
    nvidia-ctk --version
    mkdir -p /var/run/cdi /var/lib/rancher/k3s/agent/etc/containerd
    nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml 2>&1 | tail -20
    if [ "${PIPESTATUS[0]}" != 0 ]; then
        # a driver mounted under /usr/local/nvidia (as in some GPU VMs) may be missing from the linker's cache
        step "again, with the driver's libraries of /usr/local/nvidia on LD_LIBRARY_PATH"
        LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib nvidia-ctk cdi generate \
            --output=/var/run/cdi/nvidia.yaml 2>&1 | tail -20
        echo "rc=${PIPESTATUS[0]}"
    fi
    cp /var/run/cdi/nvidia.yaml "$OUT/nvidia-cdi.yaml" 2>/dev/null
    nvidia-ctk cdi list 2>&1

    step "runtime_info, toolkit and CDI spec"
    ansible-playbook -i "$inventory" "$reader" -e "release=$RELEASE" -e "dest=$OUT/runtime_info-toolkit.json" | tail -4

    step "doctor (check mode, node layers only)"
    doctor "$inventory" doctor.json

    step "the doctor's fix for /dev/char links, then the doctor again"
    nvidia-ctk system create-dev-char-symlinks --create-all 2>&1 | tail -3
    find /dev/char -lname '*nvidia*' -printf '%p -> %l\n' | grep -v nvidia-caps
    doctor "$inventory" doctor-after-fix.json

    step "the gpu_node role on this node, twice (installs off; a k3s data dir but no k3s service to restart)"
    rm -f /var/run/cdi/nvidia.yaml  # the role generates its own spec
    local role=/tmp/k3sgpu-role.yml
    cat >"$role" <<'YAML'
- name: Configure the GPU node with the role
  hosts: gpu
  gather_facts: false
  roles:
    - role: k3s_gpu.nvidia.gpu_node
  post_tasks:
    - name: Keep what the role did
      ansible.builtin.copy:
        content: "{{ gpu_node_result | to_nice_json }}"
        dest: "{{ dest }}"
        mode: "0644"
YAML
    for run in 1 2; do
        ansible-playbook -i "$inventory" "$role" -e gpu_node_distribution=k3s -e "gpu_node_release=$RELEASE" \
            -e gpu_node_toolkit_install=false -e "dest=$OUT/role-run$run.json" 2>&1 \
            | grep -E '^(TASK|RUNNING HANDLER|changed|ok|fatal|skipping)|restart|PLAY RECAP|^gpu ' | grep -v '^ok: \[gpu\] =>'
    done
    find /var/lib/rancher/k3s/agent/etc/containerd /etc/rancher/k3s /var/run/cdi -type f -printf '%M %p\n' 2>/dev/null

    container_check

    step "summary"
    python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name in ("runtime_info-no-toolkit", "runtime_info-toolkit"):
    try:
        with open("%s/%s.json" % (out, name)) as f:
            result = json.load(f)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        print(name, "unreadable:", exc)
        continue
    if result.get("failed"):
        print(name, "FAILED:", result.get("msg"))
        continue
    driver, cdi, toolkit = result.get("driver", {}), result.get("cdi", {}), result.get("toolkit", {})
    print(name)
    print("  driver:", {k: driver.get(k) for k in ("loaded", "version", "open_kernel_module", "gpu_count",
                                                    "devices", "pci_gpus", "char_links", "nvswitches")})
    print("  toolkit:", {k: toolkit.get(k) for k in ("version", "version_source", "nvidia_ctk")})
    print("  runtimes:", [(r.get("name"), r.get("binary"), r.get("owner")) for r in result.get("runtimes", [])])
    print("  cdi:", [(s.get("path"), s.get("kind"), s.get("devices"), s.get("current")) for s in cdi.get("specs", [])])
    print("  gpu_operator:", result.get("gpu_operator"))
    print("  default_runtime:", result.get("default_runtime"), " release_runtimes:", result.get("release_runtimes"))
PY
}

case ${1:-} in
    prepare) prepare ;;
    prepare-container) prepare_container ;;
    run) run_checks 2>&1 | tee "$OUT.log"; cp "$OUT.log" "$OUT/log.txt" 2>/dev/null ;;
    *) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
