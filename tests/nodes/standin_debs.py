# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""STAND-IN NVIDIA container toolkit packages: real names, files and dependency layout, shell stubs.

Dependencies as NVIDIA's packaging declares them: the toolkit pins -base and libnvidia-container-tools
to its own version (`=`), but the tools take libnvidia-container1 `>=` theirs, so
`apt-get install nvidia-container-toolkit=1.17.8-1` alone pulls the NEWEST libnvidia-container1.
Only pinning all four packages keeps one version.
"""

from __future__ import annotations

RUNTIME = """#!/bin/sh
# STAND-IN {binary} {upstream} (k3s_gpu.nvidia tests): a runc wrapper, no GPU code.
case "$1" in
    --version | -v) printf 'NVIDIA Container Runtime version {upstream}\\ncommit: standin\\n'; exit 0 ;;
esac
exec runc "$@"
"""

NOOP = """#!/bin/sh
# STAND-IN {binary} {upstream} (k3s_gpu.nvidia tests): does nothing.
case "$1" in
    --version | -v) echo '{binary} version {upstream} (standin)' ;;
esac
exit 0
"""

CLI = """#!/bin/sh
# STAND-IN nvidia-container-cli {upstream} (k3s_gpu.nvidia tests): no driver, like a node without a GPU.
case "$1" in
    --version | -V) printf 'cli-version: {upstream}\\nlib-version: {upstream}\\nbuild date: standin\\n'; exit 0 ;;
esac
echo 'nvidia-container-cli: initialization error: nvml error: driver not loaded' >&2
exit 1
"""

CTK = """#!/bin/sh
# STAND-IN nvidia-ctk {upstream} (k3s_gpu.nvidia tests): --version, cdi generate [--output=F], cdi list.
spec() {{
    cat <<'EOF'
---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      deviceNodes:
        - path: /dev/null
containerEdits:
  env:
    - NVIDIA_VISIBLE_DEVICES=void
EOF
}}
case "$1 $2" in
    "--version "* | "-v "* | "version "*)
        printf 'NVIDIA Container Toolkit CLI version {upstream}\\ncommit: standin\\n'
        exit 0 ;;
    "cdi generate")
        shift 2
        out=
        while [ $# -gt 0 ]; do
            case "$1" in
                --output=*) out=${{1#--output=}} ;;
                --output | -o) shift; out=$1 ;;
            esac
            shift
        done
        if [ -z "$out" ]; then spec; exit 0; fi
        mkdir -p "$(dirname "$out")" && spec >"$out" || exit 1
        echo "level=info msg=\\"Generated CDI spec with version 0.5.0\\"" >&2
        exit 0 ;;
    "cdi list")
        echo 'level=info msg="Found 1 CDI devices"' >&2
        echo 'nvidia.com/gpu=all'
        exit 0 ;;
esac
echo "nvidia-ctk (stand-in {upstream}): unsupported command: $*" >&2
exit 2
"""

RUNTIME_CONFIG = """# STAND-IN of /etc/nvidia-container-runtime/config.toml (k3s_gpu.nvidia tests)
#accept-nvidia-visible-devices-as-volume-mounts = false
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
"""

LIB_DIR = "usr/lib/x86_64-linux-gnu"

# From 1.18 the toolkit ships nvidia-cdi-refresh.path/.service (NVIDIA's .deb puts them in /lib/systemd/system, the
# same directory as /usr/lib/systemd/system on merged-/usr Debian 12; the .rpm in %{_unitdir}). The stand-ins watch
# nvidia-ctk and print a spec: what the role checks is that the path unit is there and gets enabled.
UNIT_DIR = "usr/lib/systemd/system"
REFRESH_PATH_UNIT = """# STAND-IN of nvidia-cdi-refresh.path {upstream} (k3s_gpu.nvidia tests)
[Unit]
Description=STAND-IN: refresh the CDI spec when the toolkit changes

[Path]
PathChanged=/usr/bin/nvidia-ctk

[Install]
WantedBy=multi-user.target
"""
REFRESH_SERVICE_UNIT = """# STAND-IN of nvidia-cdi-refresh.service {upstream} (k3s_gpu.nvidia tests): prints the spec, writes nothing
[Unit]
Description=STAND-IN: generate the CDI spec
ConditionPathExists=/usr/bin/nvidia-ctk

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-ctk cdi generate
"""


def packages(version):
    """[{name, depends, files: {path: (text, mode)}, conffiles}] for one Debian version (e.g. 1.17.8-1)."""
    upstream = version.split("-")[0]
    major = int(upstream.split(".", 1)[0])

    def stub(template, binary):
        return template.format(binary=binary, upstream=upstream), 0o755

    base_files = {"usr/bin/nvidia-container-runtime": stub(RUNTIME, "nvidia-container-runtime"),
                  "usr/bin/nvidia-ctk": stub(CTK, "nvidia-ctk"),
                  "usr/bin/nvidia-cdi-hook": stub(NOOP, "nvidia-cdi-hook"),
                  "etc/nvidia-container-runtime/config.toml": (RUNTIME_CONFIG, 0o644)}
    if tuple(int(part) for part in upstream.split(".")[:2]) >= (1, 18):
        base_files[UNIT_DIR + "/nvidia-cdi-refresh.path"] = (REFRESH_PATH_UNIT.format(upstream=upstream), 0o644)
        base_files[UNIT_DIR + "/nvidia-cdi-refresh.service"] = (REFRESH_SERVICE_UNIT.format(upstream=upstream), 0o644)
    return [
        {"name": "libnvidia-container1", "depends": "libc6 (>= 2.7)",
         "files": {"%s/libnvidia-container.so.%s" % (LIB_DIR, upstream): ("STAND-IN, not an ELF\n", 0o644)},
         "links": {"%s/libnvidia-container.so.1" % LIB_DIR: "libnvidia-container.so.%s" % upstream}},
        {"name": "libnvidia-container-tools",
         "depends": "libnvidia-container1 (>= %s), libc6 (>= 2.7)" % version,
         "files": {"usr/bin/nvidia-container-cli": stub(CLI, "nvidia-container-cli")}},
        {"name": "nvidia-container-toolkit-base", "depends": "",
         "files": base_files,
         "conffiles": ["/etc/nvidia-container-runtime/config.toml"]},
        {"name": "nvidia-container-toolkit",
         "depends": "nvidia-container-toolkit-base (= %s), libnvidia-container-tools (= %s), "
                    "libnvidia-container-tools (<< %d.0.0)" % (version, version, major + 1),
         "files": {"usr/bin/nvidia-container-runtime-hook": stub(NOOP, "nvidia-container-runtime-hook")}},
        {"name": "nvidia-container-toolkit-operator-extensions",
         "depends": "nvidia-container-toolkit-base (= %s)" % version,
         "files": {"usr/bin/nvidia-container-runtime.cdi": stub(RUNTIME, "nvidia-container-runtime.cdi"),
                   "usr/bin/nvidia-container-runtime.legacy": stub(RUNTIME, "nvidia-container-runtime.legacy")}},
    ]
