# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_device_holders: who holds an NVIDIA device open, read from the real /proc (a child holding a sandbox's
"device") and from fake proc trees (fd links to real files), and the /proc/devices and cgroup parsers."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _holders
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.modules import gpu_device_holders

POD = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
CID = "3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b8559"
DEVICES = """Character devices:
  1 mem
195 nvidia
195 nvidia-modeset
234 nvidia-nvswitch
237 nvidia-caps
508 nvidia-uvm
510 nvidia-frontend
 10 misc

Block devices:
  7 loop
 42 nvidia-block-not-a-char
"""


@pytest.fixture
def node(sandbox):
    """A sandbox node with two NVIDIA "devices" (plain files), the caps directory and a file that is none."""
    sandbox.write("/dev/nvidia0")
    sandbox.write("/dev/nvidiactl")
    sandbox.write("/dev/nvidia-caps/nvidia-cap1")
    sandbox.write("/dev/null-ish")
    return sandbox


def hold(path):
    """A child process that holds path open until killed; returns once it has opened it."""
    child = subprocess.Popen([sys.executable, "-c", "import time,sys; f=open(sys.argv[1]); print(1, flush=True); time.sleep(60)",
                              path], stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"1"
    return child


def fake_proc(tmp_path, processes, devices=DEVICES):
    """A proc tree: {pid: {"fds": {n: target}, "comm": text, "cgroup": text}}; a pid without "fds" has no fd directory
    (it ended between the listing and the read)."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "devices").write_text(devices)
    (proc / "self").mkdir()  # not a pid: skipped
    for pid, info in processes.items():
        (proc / str(pid)).mkdir()
        if "fds" in info:
            (proc / str(pid) / "fd").mkdir()
            for n, target in info["fds"].items():
                os.symlink(target, str(proc / str(pid) / "fd" / str(n)))
        for name in ("comm", "cgroup"):
            if name in info:
                (proc / str(pid) / name).write_text(info[name])
    return str(proc)


def test_parse_majors_reads_only_nvidia_character_devices():
    assert _holders.parse_majors(DEVICES) == [195, 234, 237, 508, 510]
    assert _holders.parse_majors("") == [195]  # no /proc/devices: the fixed major still counts


@pytest.mark.parametrize("text,expected", [
    # cgroup v1, cgroupfs driver: every hierarchy names the pod and the container
    ("12:devices:/kubepods/besteffort/pod%s/%s\n11:memory:/kubepods/besteffort/pod%s/%s\n1:name=systemd:/\n"
     % (POD, CID, POD, CID), (POD, CID)),
    # systemd driver: the uid's dashes are underscores in the slice name
    ("5:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/cri-containerd-%s.scope\n"
     % (POD.replace("-", "_"), CID), (POD, CID)),
    # cgroup v2, systemd driver (guaranteed pods have no QoS slice)
    ("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope\n" % (POD.replace("-", "_"), CID), (POD, CID)),
    # cgroup v2, cgroupfs driver (k3s without systemd)
    ("0::/kubepods/burstable/pod%s/%s\n" % (POD, CID), (POD, CID)),
    # a static pod: its uid is a hash without dashes; the pod's own cgroup (the sandbox's pause is in a child)
    ("0::/kubepods/burstable/pod6a1f0e23b2c4d5e6f7a8b9c0d1e2f3a4\n", ("6a1f0e23b2c4d5e6f7a8b9c0d1e2f3a4", None)),
    # a container outside Kubernetes, and a host service: no pod
    ("0::/system.slice/docker-%s.scope\n" % CID, (None, CID)),
    ("0::/system.slice/k3s-agent.service\n", (None, None)),
    ("", (None, None)),
])
def test_parse_cgroup(text, expected):
    assert _holders.parse_cgroup(text) == expected


def test_finds_the_process_that_holds_a_sandbox_device(node):
    holding = hold(node.path("/dev/nvidia0"))
    other = hold(node.path("/dev/null-ish"))
    try:
        with open(node.path("/dev/nvidiactl")):  # the module's own process is never listed
            result = _holders.holders(root=node.root, proc="/proc")
        pids = [h["pid"] for h in result["holders"]]
        assert holding.pid in pids and other.pid not in pids and os.getpid() not in pids
        found = result["holders"][pids.index(holding.pid)]
        with open("/proc/%d/comm" % holding.pid) as comm:
            assert found["command"] == comm.read().strip()
        assert found["devices"] == [node.path("/dev/nvidia0")]  # as the kernel shows the fd
        assert result["devices"] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia0", "/dev/nvidiactl"]
        assert 195 in result["majors"] and result["unreadable"] == []
    finally:
        for child in (holding, other):
            child.kill()
            child.wait()


def test_fake_proc_pods_majors_and_vanished_processes(node, tmp_path):
    proc = fake_proc(tmp_path, {
        100: {"fds": {0: node.path("/dev/null-ish"), 3: node.path("/dev/nvidiactl"), 4: node.path("/dev/nvidia0"),
                      5: node.path("/dev/nvidia0"), 6: node.path("/dev/gone")},  # a dangling fd: skipped
              "comm": "python3\n", "cgroup": "0::/kubepods/besteffort/pod%s/%s\n" % (POD, CID)},
        200: {"fds": {1: node.path("/dev/null-ish")}, "comm": "bash\n"},
        300: {},  # ended after the listing: no fd directory
        # /dev/null's major counted as NVIDIA's (a real node's nvidia-uvm): rule (a), without a device file; no
        # comm or cgroup (ended meanwhile)
        400: {"fds": {7: "/dev/null"}},
    }, devices="Character devices:\n  1 nvidia-uvm\n\nBlock devices:\n")
    result = _holders.holders(root=node.root, proc=proc)
    assert result["majors"] == [1, 195] and result["unreadable"] == []
    assert result["holders"] == [
        {"pid": 100, "command": "python3", "devices": sorted([node.path("/dev/nvidia0"), node.path("/dev/nvidiactl")]),
         "pod_uid": POD, "container_id": CID},
        {"pid": 400, "command": "", "devices": ["/dev/null"], "pod_uid": None, "container_id": None}]


@pytest.mark.parametrize("error,unreadable", [
    (ProcessLookupError(errno.ESRCH, "No such process"), []),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), []),
    (PermissionError(errno.EACCES, "Permission denied"), [100]),  # may hold a device: the caller must know
])
def test_a_process_that_cannot_be_read_never_fails(node, tmp_path, monkeypatch, error, unreadable):
    proc = fake_proc(tmp_path, {100: {"fds": {3: node.path("/dev/nvidia0")}}})
    listdir = os.listdir

    def refusing(path):
        if str(path).endswith("/100/fd"):
            raise error
        return listdir(path)
    monkeypatch.setattr(os, "listdir", refusing)
    result = _holders.holders(root=node.root, proc=proc)
    assert result["holders"] == [] and result["unreadable"] == unreadable


def test_proc_or_root_that_cannot_be_read_is_refused(node, tmp_path):
    with pytest.raises(K3sGpuError, match="proc: cannot list"):
        _holders.holders(root=node.root, proc=str(tmp_path / "nope"))
    with pytest.raises(K3sGpuError, match="is not a directory"):
        _holders.holders(root=str(tmp_path / "nope"), proc="/proc")


def run_module(capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            gpu_device_holders.main()
    return json.loads(capsys.readouterr().out)


def test_module_in_check_mode(node, tmp_path, capsys):
    proc = fake_proc(tmp_path, {100: {"fds": {3: node.path("/dev/nvidia0")}, "comm": "nvidia-smi\n"}})
    before = node.snapshot()
    result = run_module(capsys, {"root": node.root, "proc": proc, "_ansible_check_mode": True})
    assert result["changed"] is False and not result.get("failed")
    assert [(h["pid"], h["command"]) for h in result["holders"]] == [(100, "nvidia-smi")]
    assert result["devices"] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia0", "/dev/nvidiactl"]
    assert node.snapshot() == before  # read-only


def test_module_refuses_a_proc_it_cannot_list(node, tmp_path, capsys):
    result = run_module(capsys, {"root": node.root, "proc": str(tmp_path / "nope")})
    assert result["failed"] and result["error"]["variables"] == ["proc"]
