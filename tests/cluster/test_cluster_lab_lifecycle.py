# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lab's own promises: it refuses what is taken, by name, and nothing is left after a killed run.

- a port the lab needs, held by something else: `up` exits 1 naming the port and its component, and
  makes nothing (no lab dir, no process, no address);
- `up` killed with SIGKILL while it starts the cluster: the next `up` cleans what the killed one left and
  starts; `down` then leaves nothing (processes, mounts, cgroups, log links, the lab dir).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

from . import clusterlab
from .test_cluster_lab import LINES, SCRIPT, host_snapshot


def _clean(before):
    after = host_snapshot()
    return {key: sorted(set(after[key]) - set(before[key])) if isinstance(after[key], list) else after[key]
            for key in after if (after[key] if not isinstance(after[key], list) else set(after[key]) - set(before[key]))}


def test_a_taken_port_is_refused_by_name_and_nothing_is_made():
    before = host_snapshot()
    port = clusterlab.PORTS["kube-apiserver"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        proc = subprocess.run([SCRIPT, "up", "--kubernetes", LINES[0]], capture_output=True, text=True, timeout=600,
                              check=False)
    assert proc.returncode == 1, proc
    assert "port 127.0.0.1:%d (kube-apiserver) already in use" % port in proc.stderr, proc.stderr
    assert not _clean(before) and not clusterlab.node_ip_present()


@pytest.mark.parametrize("tree, release, said", [
    ("/var/lib/rancher/k3s/agent/etc/containerd", "v1.36.3+rke2r1",
     "is a node of k3s (it has /var/lib/rancher/k3s) but the release is rke2's"),
    ("/var/lib/rancher/rke2/agent/etc/containerd", "v1.36.3+k3s1",
     "is a node of rke2 (it has /var/lib/rancher/rke2) but the release is k3s's"),
    ("/usr/bin", "v1.36.3+rke2r1", "has neither /var/lib/rancher/rke2 nor /etc/rancher/rke2/config.yaml.d"),
    ("/var/lib/rancher/k3s", "v1.36.3", "expected a k3s or rke2 release such as v1.36.3+k3s1 or v1.36.3+rke2r1"),
], ids=("k3s-tree-rke2-release", "rke2-tree-k3s-release", "no-distribution", "no-suffix"))
def test_a_node_root_of_the_other_distribution_is_refused_by_name_and_nothing_is_made(tmp_path, tree, release, said):
    """--node-root and --release must be one distribution's: the lab would compose a config nobody reads otherwise."""
    before = host_snapshot()
    (tmp_path / tree.lstrip("/")).mkdir(parents=True)
    proc = subprocess.run([SCRIPT, "up", "--release", release, "--node-root", str(tmp_path)], capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 1 and said in proc.stderr, (proc.stdout, proc.stderr)
    assert not _clean(before) and not clusterlab.node_ip_present()


def test_a_killed_up_is_cleaned_by_the_next_up_and_down_leaves_nothing():
    before = host_snapshot()
    starting = subprocess.Popen([SCRIPT, "up", "--kubernetes", LINES[0], "--gpus", "1"], stdout=subprocess.DEVNULL,  # pylint: disable=consider-using-with
                                stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    killed_at = None
    while time.monotonic() < deadline:  # kill it once kubelet is starting: daemons, mounts and cgroups exist
        state = clusterlab.read_state()
        if state and "kubelet" in state.get("processes", {}):
            os.killpg(starting.pid, signal.SIGKILL)
            killed_at = sorted(state["processes"])
            break
        if starting.poll() is not None:
            break
        time.sleep(0.2)
    starting.wait(timeout=30)
    assert killed_at, "up ended (%s) before kubelet started: nothing to kill" % starting.returncode
    assert clusterlab.marked_pids(), "the killed up left no daemon behind: the test would prove nothing"
    again = subprocess.run([SCRIPT, "up", "--kubernetes", LINES[0], "--gpus", "1"], capture_output=True, text=True,
                           timeout=900, check=False)
    try:
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        assert "cleaning what a stopped or killed run left" in again.stdout
        assert again.stdout.strip().splitlines()[-1].startswith("KUBECONFIG=")
        # what a failed test prints before `down`: each process, its last log lines, the last events
        shown = subprocess.run([SCRIPT, "status", "--logs", "3"], capture_output=True, text=True, timeout=120, check=False)
        assert shown.returncode == 0, shown
        processes = [line for line in shown.stdout.splitlines() if " running  pid " in line]
        assert len(processes) >= 6 and len(shown.stdout.splitlines()) > 2 * len(processes), shown.stdout
        events = shown.stdout.split("\nevents:\n", 1)[1].splitlines()
        assert events[0].split()[:2] == ["NAMESPACE", "LAST"] and len(events) == 1 + 3 + 1, shown.stdout  # + KUBECONFIG=
    finally:
        down = subprocess.run([SCRIPT, "down"], capture_output=True, text=True, timeout=300, check=False)
    assert down.returncode == 0, down
    left = _clean(before)
    assert not left and not clusterlab.node_ip_present(), json.dumps(left)


@pytest.fixture(autouse=True)
def _no_lab_around():
    assert clusterlab.read_state() is None, "a lab is running: scripts/cluster-lab.sh down"
    yield
    if clusterlab.read_state() is not None:
        subprocess.run([SCRIPT, "down"], capture_output=True, timeout=300, check=False)
