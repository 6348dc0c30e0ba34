# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Make a node rootfs look like a k3s agent or server: /usr/local/bin/k3s, k3s-agent.service (or
k3s.service running `k3s server`), the stand-in. The server stand-in does only what the agent does
(the containerd part); it also creates <data-dir>/server/manifests, which k3s servers deploy from.

Written before boot, as plain files. The stand-in (standin_k3s.py) imports the collection's own
_detect/_distro (under an ansible_collections/ layout, no __init__ needed on Python 3) and the
conformance suite's base template renderer, copied next to it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIB = "usr/local/lib/standin-k3s"
ETC = "etc/standin-k3s"
MODULE_UTILS = "ansible_collections/k3s_gpu/nvidia/plugins/module_utils"

K3S_WRAPPER = """#!/bin/sh
# Stand-in for the k3s binary (k3s_gpu.nvidia tests/nodes): version from /etc/standin-k3s/release;
# `k3s agent|server` runs the stand-in, which writes containerd's config.toml and execs containerd.
case "$1" in
    --version | -v | version)
        printf 'k3s version %s (standin)\\ngo version go1.22.8\\n' "$(cat /etc/standin-k3s/release)" ;;
    *) exec /usr/bin/python3 /usr/local/lib/standin-k3s/standin_k3s.py "$@" ;;
esac
"""

# As k3s's install.sh writes it for an agent (Type=exec), but RestartSec=2 for faster tests; with 2 s,
# systemd's default start limit (5 starts in 10 s) could end the loop that k3s's 5 s never ends: off.
UNIT = """[Unit]
Description=Lightweight Kubernetes (stand-in: k3s_gpu.nvidia tests/nodes)
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=0

[Install]
WantedBy=multi-user.target

[Service]
Type=exec
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-/etc/systemd/system/{unit}.service.env
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=2
ExecStart=/usr/local/bin/k3s {command}
"""


def _write(path, text, mode=0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def install(rootfs, release, stream_port, server=False):
    """Install the stand-in k3s agent (or server) into rootfs (enabled, starts at boot)."""
    unit, command = ("k3s", "server") if server else ("k3s-agent", "agent")
    rootfs = Path(rootfs)
    lib = rootfs / LIB
    (lib / MODULE_UTILS).mkdir(parents=True, exist_ok=True)
    shutil.copy2(HERE / "standin_k3s.py", lib / "standin_k3s.py")
    shutil.copy2(REPO / "plugins/module_utils/_k3s_base.py", lib / "base_fixtures.py")
    # detection with what it imports: the node-side module_utils, all of them (they import only each other)
    for source in sorted((REPO / "plugins/module_utils").glob("_*.py")):
        shutil.copy2(source, lib / MODULE_UTILS / source.name)
    _write(rootfs / ETC / "release", release + "\n")
    # k3s's base pins the CRI stream server to 127.0.0.1:10010; nodes share the host network
    _write(rootfs / ETC / "stream-port", "%d\n" % stream_port)
    _write(rootfs / "usr/local/bin/k3s", K3S_WRAPPER, 0o755)
    units = rootfs / "etc/systemd/system"
    _write(units / (unit + ".service"), UNIT.format(unit=unit, command=command))
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / (unit + ".service")).unlink(missing_ok=True)
    (wants / (unit + ".service")).symlink_to("/etc/systemd/system/%s.service" % unit)
    if server:
        manifests = rootfs / "var/lib/rancher/k3s/server/manifests"
        manifests.mkdir(parents=True, exist_ok=True)
        manifests.chmod(0o700)
    # a k3s node runs k3s's containerd, not Debian's containerd.service
    (wants / "containerd.service").unlink(missing_ok=True)
