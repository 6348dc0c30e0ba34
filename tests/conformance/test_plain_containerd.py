# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Plain containerd nodes, loaded by the real containerd of every line (Debian's 1.6, 1.7 and 2.1; upstream
2.2.7 and 2.3.4) with `containerd --config F config dump`, and compared with NVIDIA's own configurator
(nvidia-ctk 1.20.0, built at test time from the Go module proxy by tests/testbins.py) on the same files.

The configs are the ones nodes really have: each line's `containerd config default` (as written, with
`SystemdCgroup = true`, and hardened: `privileged_without_host_devices = true` and a runc `Root`), that
file importing a conf.d (the engine then writes a drop-in), a default runtime that is no runc shim (kata)
and one that is (crun through runc's shim), Debian's packaged config, an empty file, a comment-only file,
Docker's containerd.io file (the CRI plugin disabled: refused untouched), and k3s/rke2 nodes pointed at
the host's containerd each way they can be.
For each, after the engine's write:
- containerd loads the file and every NVIDIA runtime is in the loaded config;
- each NVIDIA runtime's effective privileged_without_host_devices, SystemdCgroup and Root equal the
  default runtime's (runc's);
- nvidia-ctk, given the same file, gives `nvidia` the same effective table, apart from what the
  collection documents as its own choices (runtime_root and runtime_engine are not copied; a default
  runtime that is not a runc shim gives way to runc, where nvidia-ctk copies a kata table into `nvidia`);
- a second run changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write

from ansible_collections.k3s_gpu.nvidia.tests import testbins
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

from . import lab

LINES = ("1.6", "1.7", "2.x") + tuple(testbins.UPSTREAM_CONTAINERD)  # + 2.2.7, 2.3.4 built from the proxy
NVIDIA = {"nvidia": "/usr/bin/nvidia-container-runtime", "nvidia-cdi": "/usr/bin/nvidia-container-runtime.cdi",
          "nvidia-legacy": "/usr/bin/nvidia-container-runtime.legacy"}
INHERITED = ("privileged_without_host_devices", "SystemdCgroup", "Root")
# what the collection does not copy from the default runtime, unlike nvidia-ctk (docs: plain containerd)
NOT_COPIED = ("runtime_root", "runtime_engine")


def _binary(line):
    if line in lab.LINES:
        return lab.binary(line), lab._line_env(line)  # pylint: disable=protected-access
    path = testbins.require(testbins.UPSTREAM_CONTAINERD[line], "containerd")
    return path, {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERD_")}


def release_of(line):
    return lab.versions()[line]["version"].split("~")[0] if line in lab.LINES else line


def containerd(line, *args):
    exe, env = _binary(line)
    return subprocess.run([exe] + list(args), capture_output=True, text=True, timeout=60, env=env, check=False)


def dump(line, path):
    proc = containerd(line, "--config", path, "config", "dump")
    assert proc.returncode == 0, "containerd %s refuses %s: %s" % (line, path, proc.stderr[-2000:])
    return tomllib.loads(proc.stdout)


def default_config(line):
    proc = containerd(line, "config", "default")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def loaded_runtimes(data):
    for plugin in ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"):
        runtimes = (((data.get("plugins") or {}).get(plugin) or {}).get("containerd") or {}).get("runtimes")
        if runtimes:
            return runtimes
    return {}


ZERO = {"privileged_without_host_devices": False, "SystemdCgroup": False, "Root": ""}


def effective(table, key):
    """The value the runtime runs with: a key containerd does not print has its Go zero value."""
    value = (table.get("options") or {}).get(key) if key in ("SystemdCgroup", "Root") else table.get(key)
    return ZERO[key] if value is None else value


class Node(lab.NodeTree):
    """A plain containerd node tree whose config imports its own conf.d by host path (as containerd reads it)."""

    def __init__(self, root):
        super().__init__(root, list(NVIDIA.values()) + ["/usr/bin/containerd"])

    def converge(self, line, **params):
        facts = detect.gather(self.root, "containerd", release_of(line), binaries=list(NVIDIA.values()))
        plan, file_changes = changes.compute(NodeFacts.from_reading(facts), params)
        for change in file_changes:
            self.write(change.node_path, change.after)
        return plan, file_changes


_IMPORTS = re.compile(r"^imports = \[.*\]$", re.M)


def _in_runc(text, pattern, replacement):
    """Replace the first match of pattern after the runc runtime header (the default configs' only runtime)."""
    start = re.search(r"runtimes\.runc\]", text).end()
    new, count = re.subn(pattern, replacement, text[start:], count=1)
    assert count == 1, pattern
    return text[:start] + new


def config_case(line, case, node):
    text = default_config(line)
    if case.startswith("default"):
        imports = "imports = ['%s/*.toml']" % node.host("/etc/containerd/conf.d") if case.endswith("dropin") else "imports = []"
        text = _IMPORTS.sub(imports, text) if _IMPORTS.search(text) else imports + "\n" + text
        if "systemd" in case or "hardened" in case:
            text = _in_runc(text, r"SystemdCgroup = false", "SystemdCgroup = true")
        if "hardened" in case:
            text = _in_runc(text, r"privileged_without_host_devices = false", "privileged_without_host_devices = true")
            text = _in_runc(text, r"Root = (''|\"\")", "Root = '/run/runc-root'")
        return text
    if case == "kata-default":
        text = _IMPORTS.sub("imports = []", text)
        text = _in_runc(text, r"SystemdCgroup = false", "SystemdCgroup = true")
        text = re.sub(r"default_runtime_name = (['\"])runc\1", "default_runtime_name = 'kata'", text, count=1)
        header = re.search(r"^([ \t]*)\[(plugins\..*\.runtimes)\.runc\]$", text, re.M)
        return text + "\n[%s.kata]\n  runtime_type = 'io.containerd.kata.v2'\n  privileged_without_host_devices = true\n" % header.group(2)
    if case == "crun-default":
        # a default runtime that is another runc shim (crun through runc's shim): its own settings, not runc's
        text = _IMPORTS.sub("imports = []", text)
        text = _in_runc(text, r"SystemdCgroup = false", "SystemdCgroup = true")
        text = re.sub(r"default_runtime_name = (['\"])runc\1", "default_runtime_name = 'crun'", text, count=1)
        header = re.search(r"^([ \t]*)\[(plugins\..*\.runtimes)\.runc\]$", text, re.M)
        return text + ("\n[%s.crun]\n  runtime_type = 'io.containerd.runc.v2'\n  privileged_without_host_devices = true\n"
                       "[%s.crun.options]\n  BinaryName = '/usr/bin/crun'\n  SystemdCgroup = false\n  Root = '/run/crun'\n"
                       % (header.group(2), header.group(2)))
    if case == "debian-package":
        return debian_package_config(line)
    return {"empty": "", "comments": "# written by the image build\n# (nothing else)\n"}[case]


def debian_package_config(line):
    """The /etc/containerd/config.toml Debian's containerd package of that line ships (no runtime table at all;
    version 2 also in the 2.x package)."""
    bin_dir = lab.versions()[line]["bin_dir"]
    path = os.path.join(os.path.dirname(os.path.dirname(bin_dir)), "etc", "containerd", "config.toml")
    with open(path, encoding="utf-8") as handle:
        return handle.read()


CASES = ("default", "default-systemd", "default-hardened", "default-hardened-dropin", "kata-default", "crun-default",
         "empty", "comments")
# Debian's package only exists for the Debian lines (upstream 2.2.7 and 2.3.4 ship no config file)
PACKAGE_CASES = [(line, "debian-package") for line in lab.LINES]


@pytest.mark.parametrize("line,case", [(line, case) for line in LINES for case in CASES] + PACKAGE_CASES)
def test_every_runtime_loads_and_inherits_the_default_runtime(tmp_path, line, case):
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", config_case(line, case, node))
    plan, file_changes = node.converge(line)
    assert file_changes, "nothing written"
    if case.endswith("dropin"):
        # containerd merges a drop-in's tables into the root's deeply from 2.1 on; before, the root is edited
        merges = distro.profile("containerd", release_of(line))["dropin_deep_merge"]
        assert plan["target"]["mode"] == (planner.MODE_DROPIN if merges else planner.MODE_CONFIG)
    data = dump(line, node.host("/etc/containerd/config.toml"))
    runtimes = loaded_runtimes(data)
    source = "crun" if case == "crun-default" else "runc"  # kata is no runc shim: runc's table is the start
    for name, binary in NVIDIA.items():
        assert runtimes[name]["options"]["BinaryName"] == binary, (name, sorted(runtimes))
        assert runtimes[name]["runtime_type"] == "io.containerd.runc.v2"
        for key in INHERITED:
            assert effective(runtimes[name], key) == effective(runtimes[source], key), (name, key)
    if case == "crun-default":
        assert runtimes["nvidia"]["options"]["SystemdCgroup"] is False and runtimes["runc"]["options"]["SystemdCgroup"] is True
        assert runtimes["nvidia"]["privileged_without_host_devices"] is True
    if "hardened" in case:
        assert runtimes["nvidia"]["privileged_without_host_devices"] is True
        assert runtimes["nvidia"]["options"]["Root"] == "/run/runc-root"
    if case in ("default-systemd", "default-hardened", "kata-default"):
        assert runtimes["nvidia-cdi"]["options"]["SystemdCgroup"] is True
    assert node.converge(line)[1] == []


def _ctk():
    return testbins.require("nvidia-container-toolkit", "nvidia-ctk")


@pytest.mark.parametrize("case", ("default", "default-hardened", "kata-default", "crun-default", "empty"))
@pytest.mark.parametrize("line", LINES)
def test_nvidia_gets_what_nvidia_ctk_gives_it(tmp_path, line, case):
    ours = Node(tmp_path / "ours")
    ours.write("/etc/containerd/config.toml", config_case(line, case, ours))
    ours.converge(line, runtimes=[{"name": "nvidia", "binary": NVIDIA["nvidia"]}])
    our_nvidia = loaded_runtimes(dump(line, ours.host("/etc/containerd/config.toml")))["nvidia"]

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    config = str(theirs / "config.toml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(config_case(line, case, ours))
    proc = subprocess.run([_ctk(), "runtime", "configure", "--runtime=containerd", "--config=" + config,
                           "--drop-in-config=" + str(theirs / "conf.d" / "99-nvidia.toml"),
                           "--nvidia-runtime-path=" + NVIDIA["nvidia"]], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    their_nvidia = loaded_runtimes(dump(line, config))["nvidia"]

    def comparable(table):
        # effective values: an option containerd prints as its Go zero value is the same as one not printed
        options = {k: v for k, v in (table.get("options") or {}).items() if v not in (False, "", 0)}
        return json.dumps(dict({k: v for k, v in table.items() if k not in NOT_COPIED}, options=options), sort_keys=True)

    if case == "kata-default":
        # nvidia-ctk copies the default runtime whatever its shim: its `nvidia` becomes a kata runtime that
        # was given nvidia-container-runtime as BinaryName. The collection starts from runc's table there
        # (documented), so `nvidia` is runc's shim with the NVIDIA binary
        assert their_nvidia["runtime_type"] == "io.containerd.kata.v2"
        assert our_nvidia["runtime_type"] == "io.containerd.runc.v2"
        assert our_nvidia["options"]["SystemdCgroup"] is True and effective(our_nvidia, "privileged_without_host_devices") is False
        return
    assert comparable(our_nvidia) == comparable(their_nvidia)


DOCKER_CONTAINERD_IO = """#   Copyright 2018-2020 Docker Inc.

#   Licensed under the Apache License, Version 2.0 (the "License");
#   you may not use this file except in compliance with the License.

disabled_plugins = ["cri"]

#root = "/var/lib/containerd"
#state = "/run/containerd"
#subreaper = true
#oom_score = 0

#[grpc]
#  address = "/run/containerd/containerd.sock"
#  uid = 0
#  gid = 0
"""


@pytest.mark.parametrize("line", LINES)
def test_docker_containerd_io_file_is_refused_untouched(tmp_path, line):
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", DOCKER_CONTAINERD_IO)
    # what containerd does with it: the CRI service is off (1.x does not even load the runtimes' settings)
    data = dump(line, node.host("/etc/containerd/config.toml"))
    assert "io.containerd.grpc.v1.cri" in data.get("disabled_plugins", []) or not loaded_runtimes(data)
    with pytest.raises(K3sGpuError, match=r"kubelet cannot use this containerd.*\[cri_disabled\]"):
        node.converge(line)
    assert node.read("/etc/containerd/config.toml") == DOCKER_CONTAINERD_IO


# A k3s node whose pods run on the host's containerd, each way k3s can be told so (config.yaml,
# config.yaml.d, the unit's flag, a variable of the unit's env file in ExecStart, the host
# containerd's own [grpc] address): the engine configures /etc/containerd/config.toml, which the
# real containerd of each line then loads with every NVIDIA runtime; nothing lands in k3s's dir.
EXTERNAL_WAYS = {
    "config-yaml": {"/etc/rancher/k3s/config.yaml": "container-runtime-endpoint: unix:///run/containerd/containerd.sock\n"},
    "config-yaml-d": {"/etc/rancher/k3s/config.yaml.d/50-cri.yaml": "container-runtime-endpoint: /var/run/containerd/containerd.sock\n"},
    "unit-flag": {"/etc/systemd/system/k3s-agent.service":
                  "[Service]\nExecStart=/usr/local/bin/k3s agent --container-runtime-endpoint /run/containerd/containerd.sock\n"},
    "unit-variable": {"/etc/systemd/system/k3s.service":
                      "[Service]\nEnvironmentFile=-/etc/default/k3s\nExecStart=/usr/local/bin/k3s server ${K3S_ARGS}\n",
                      "/etc/default/k3s": "K3S_ARGS='--container-runtime-endpoint=unix:///run/containerd/containerd.sock'\n"},
    "grpc-address": {"/etc/rancher/k3s/config.yaml": "container-runtime-endpoint: /run/site/cri.sock\n"},
    "rke2-config-yaml": {"/etc/rancher/rke2/config.yaml": "container-runtime-endpoint: unix:///run/containerd/containerd.sock\n"},
}


@pytest.mark.parametrize("way", sorted(EXTERNAL_WAYS))
@pytest.mark.parametrize("line", LINES)
def test_k3s_on_the_host_containerd_is_configured_where_its_pods_run(tmp_path, line, way):
    node = Node(tmp_path)
    text = default_config(line)
    if way == "grpc-address":
        # [grpc] up to version 3, [plugins.'io.containerd.server.v1.grpc'] in version 4 (2.3)
        text = re.sub(r"(\[(?:grpc|plugins\.'io\.containerd\.server\.v1\.grpc')\]\s*\n\s*address = )(['\"]).*?\2",
                      r"\1'/run/site/cri.sock'", text, count=1)
        assert "/run/site/cri.sock" in text
    if _IMPORTS.search(text):  # upstream 2.2/2.3 import conf.d: read the node's, not this machine's
        text = _IMPORTS.sub("imports = ['%s/*.toml']" % node.host("/etc/containerd/conf.d"), text)
    node.write("/etc/containerd/config.toml", text)
    node.write("/var/lib/dpkg/status", "Package: containerd\nStatus: install ok installed\nVersion: %s-1\n" % release_of(line))
    distribution = "rke2" if way.startswith("rke2") else "k3s"
    os.makedirs(node.host("/var/lib/rancher/%s/agent/etc/containerd" % distribution))
    for path, content in EXTERNAL_WAYS[way].items():
        node.write(path, content)
    release = "v1.33.10+k3s1" if distribution == "k3s" else "v1.33.10+rke2r1"
    facts = detect.gather(node.root, distribution, release, binaries=list(NVIDIA.values()))
    assert (facts["distribution"], facts["release"]) == ("containerd", release_of(line))
    plan, file_changes = changes.compute(NodeFacts.from_reading(facts), {})
    assert [c.node_path for c in file_changes] == [plan["target"]["path"]]
    assert plan["target"]["path"] in ("/etc/containerd/config.toml", "/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml")
    assert any("host's containerd" in note for note in plan["notes"])
    node.write(plan["target"]["path"], file_changes[0].after)
    runtimes = loaded_runtimes(dump(line, node.host("/etc/containerd/config.toml")))
    assert {name: runtimes[name]["options"]["BinaryName"] for name in NVIDIA} == NVIDIA
    assert os.listdir(node.host("/var/lib/rancher/%s/agent/etc/containerd" % distribution)) == []


@pytest.mark.parametrize("case", ("default", "default-systemd"))
@pytest.mark.parametrize("line", LINES)
def test_cgroup_driver_warning_says_what_containerd_loads(tmp_path, line, case):
    # kubeadm's kubelet uses the systemd driver; the warning names exactly the runtimes whose loaded
    # SystemdCgroup (containerd's config dump) is not true
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", config_case(line, case, node))
    node.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\ncgroupDriver: systemd\n")
    plan, _file_changes = node.converge(line)
    runtimes = loaded_runtimes(dump(line, node.host("/etc/containerd/config.toml")))
    off = sorted(name for name in ["runc"] + list(NVIDIA) if effective(runtimes[name], "SystemdCgroup") is not True)
    mismatch = plan["cgroup_driver_mismatch"]
    assert sorted(mismatch["runtimes"] if mismatch else []) == off
    assert off == ([] if case == "default-systemd" else sorted(["runc"] + list(NVIDIA)))


@pytest.mark.parametrize("line", LINES)
def test_the_validate_command_refuses_what_containerd_refuses(tmp_path, line):
    # the command node_validate builds, with this line's containerd as the node's binary: the engine's
    # result passes, a file that containerd cannot read fails (a table declared twice; a version above
    # the line's is no test: 1.6 reads `version = 3` without a word)
    exe, env = _binary(line)
    reading = {"distribution": "containerd", "release": "", "root": "/", "containerd_binary": exe, "profile": {}, "paths": {},
               "runtimes": [], "release_runtimes": [], "driver": {}, "toolkit": {}, "cdi": {}, "gpu_operator": {}, "units": [],
               "files": {}}
    command = node_write.node_validate(NodeFacts.from_reading(reading), {})
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", default_config(line))
    _plan, file_changes = node.converge(line)
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(file_changes[0].after, encoding="utf-8")
    first_table = re.search(r"^\s*(\[[^\[].*\])\s*$", file_changes[0].after, re.M).group(1)
    bad.write_text(file_changes[0].after + "\n" + first_table + "\n", encoding="utf-8")
    for path, expected in ((good, 0), (bad, 1)):
        proc = subprocess.run((command % path).split(), capture_output=True, text=True, timeout=60, env=env, check=False)
        assert (proc.returncode != 0) == bool(expected), (path, proc.stderr[-500:])
