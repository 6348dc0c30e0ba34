#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""End-to-end check of the test nodes, as root: two nodes at once, the signed stand-in apt repo
(good key installs a pinned version, wrong key fails), the stand-in k3s agent with a good and a
duplicate-table template (crash loop), and a teardown that leaves nothing. Prints what it sees.

    python3 tests/nodes/selfcheck.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# pylint: disable=wrong-import-position
import apt_repo  # noqa: E402
import nodes  # noqa: E402
import nspawn  # noqa: E402

V = "1.17.8-1"
PACKAGES = ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
            "libnvidia-container1", "nvidia-container-toolkit-operator-extensions"]
CONTAINERD_DIR = "/var/lib/rancher/k3s/agent/etc/containerd"
V2_RUNTIMES = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
GOOD_TEMPLATE = """{{ template "base" . }}

[%s."nvidia-legacy"]
  runtime_type = "io.containerd.runc.v2"

[%s."nvidia-legacy".options]
  BinaryName = "/usr/bin/nvidia-container-runtime.legacy"
""" % (V2_RUNTIMES, V2_RUNTIMES)
BAD_TEMPLATE = """{{ template "base" . }}

[%s."nvidia"]
  runtime_type = "io.containerd.runc.v2"
""" % V2_RUNTIMES


def sh(name, script, expect=0):
    result = nodes.run_in(name, ["sh", "-c", script], timeout=120)
    if expect is not None and result.returncode != expect:
        raise SystemExit("FAIL in %s (rc %d, wanted %d): %s\n%s%s" % (
            name, result.returncode, expect, script, result.stdout, result.stderr))
    return result.stdout + result.stderr


def apt_checks(name, repos):
    good, wrong = repos["good"], repos["wrongkey"]
    bad_line = "deb [signed-by=%s] %s /" % (good["keyring"], wrong["url"])
    out = sh(name, "echo '%s' > /tmp/wrong.list; apt-get update -o Dir::Etc::SourceParts=/dev/null "
                   "-o Dir::Etc::SourceList=/tmp/wrong.list" % bad_line, expect=100)
    assert "NO_PUBKEY" in out and "is not signed" in out, out
    print("apt, wrong key: rc=100, %s" % next(line.strip() for line in out.splitlines() if "NO_PUBKEY" in line))
    sh(name, "echo '%s' > /etc/apt/sources.list.d/nvidia-container-toolkit.list && apt-get update -qq" % good["source_line"])
    out = sh(name, "apt-get install -y -q nvidia-container-toolkit=%s" % V, expect=100)
    print("apt, toolkit=%s alone: rc=100 (%s)" % (V, "is to be installed" in out and "deps pinned '=' need explicit versions"))
    sh(name, "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq %s >/dev/null" % " ".join(p + "=" + V for p in PACKAGES))
    out = sh(name, "dpkg-query -W %s; nvidia-ctk --version | head -1" % " ".join(PACKAGES))
    assert out.count(V) == len(PACKAGES), out
    print("apt, all pinned: " + " ".join(out.split()))


def unit_state(name):
    out = sh(name, "systemctl show -p ActiveState,SubState,NRestarts k3s-agent")
    return dict(line.split("=", 1) for line in out.split())


def k3s_checks(name):
    sh(name, "cat > %s/config.toml.tmpl <<'EOF'\n%sEOF\nsystemctl restart k3s-agent" % (CONTAINERD_DIR, GOOD_TEMPLATE))
    time.sleep(3)
    state = unit_state(name)
    tables = sh(name, "grep -o '^\\[.*runtimes[^]]*\\]' %s/config.toml" % CONTAINERD_DIR).split()
    assert state["ActiveState"] == "active" and state["NRestarts"] == "0", state
    assert any("nvidia-legacy" in t for t in tables) and any(t.endswith("runtimes.nvidia]") for t in tables), tables
    print("k3s, good template: %s; tables: %s" % (state, " ".join(t.rsplit(".runtimes.", 1)[-1] for t in tables)))
    sh(name, "cat > %s/config.toml.tmpl <<'EOF'\n%sEOF\nsystemctl restart k3s-agent" % (CONTAINERD_DIR, BAD_TEMPLATE))
    seen = []
    for second in range(11):
        state = unit_state(name)
        seen.append("t=%ds %s/%s n=%s" % (second, state["ActiveState"], state["SubState"], state["NRestarts"]))
        time.sleep(1)
    print("k3s, duplicate table: " + "; ".join(seen))
    assert int(state["NRestarts"]) >= 3, seen
    print("  containerd said: " + sh(name, "journalctl -u k3s-agent --no-pager | grep -m1 -E 'twice|duplicated'").strip())


def main():
    repos = apt_repo.build_all()
    names = ("selfcheck-a", "selfcheck-b")
    try:
        plain = nodes.up(names[0])
        agent = nodes.up(names[1], k3s_release=nodes.DEFAULT_K3S_RELEASE)
        print("booted %s in %ss, %s (k3s) in %ss" % (plain["name"], plain["boot_s"], agent["name"], agent["boot_s"]))
        apt_checks(agent["name"], repos)
        k3s_checks(agent["name"])
    finally:
        for name in names:
            info = nodes.node_info(name) or {}
            started = time.monotonic()
            nodes.down(name)
            left = nspawn.leftovers(name, nodes.node_dir(name), info.get("mntns"), info.get("port"))
            print("down %s in %.1fs, leftovers: %s" % (name, time.monotonic() - started, left or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
