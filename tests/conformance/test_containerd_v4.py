# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd config `version = 4` against real upstream containerd 2.2.7 and 2.3.4.

The binaries are built at test time from the Go module proxy (`github.com/containerd/containerd/v2`
v2.2.7 and v2.3.4) by tests/testbins.py into its cache outside the clone (Debian has no 2.2 or 2.3); a
binary that cannot be built fails these tests with the module, the version and the builder's error.
Each case runs the engine on a plain containerd node tree (runtime_info's reading, the plan, the TOML
edit) and loads what it wrote with `containerd --config F config dump`:

- a v4 config (2.3.4's own `config default`) edited by the engine stays v4 and loads in 2.3.4 as v4
  (no migration), with the runtime tables at the v3 CRI paths;
- a v4 root that imports conf.d gets a v4 drop-in, a v3 root a v3 drop-in: both load in 2.3.4;
- 2.2.7 refuses version 4 with the message the engine quotes when it refuses such a file there;
- 2.3.4 refuses a drop-in whose version is above the root's, the rule that makes a drop-in follow
  the root config's version.
"""

from __future__ import annotations

import os
import subprocess
import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes

from ansible_collections.k3s_gpu.nvidia.tests import testbins
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

from . import lab

VERSIONS = tuple(testbins.UPSTREAM_CONTAINERD)  # ("2.2.7", "2.3.4")
NVIDIA = "/usr/bin/nvidia-container-runtime"
LEGACY = "/usr/bin/nvidia-container-runtime.legacy"
V3_RUNTIMES = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes"
REFUSED_V4 = "expected containerd config version equal to or less than `3`, got `4`"


def containerd(version):
    return testbins.require(testbins.UPSTREAM_CONTAINERD[version], "containerd")


def config_dump(version, config_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERD_")}
    proc = subprocess.run([containerd(version), "--config", config_path, "config", "dump"], capture_output=True,
                          text=True, timeout=60, env=env, check=False)
    data = tomllib.loads(proc.stdout) if proc.returncode == 0 else None
    return proc.returncode, data, proc.stderr


@pytest.fixture(scope="module")
def default_v4():
    """What containerd 2.3.4 writes as its default config (`version = 4`, imports /etc/containerd/conf.d)."""
    proc = subprocess.run([containerd("2.3.4"), "config", "default"], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.startswith("version = 4\n")
    return proc.stdout


class Node(lab.NodeTree):
    """A plain containerd node tree; the config imports its own conf.d by host path (as containerd reads it)."""

    def __init__(self, root):
        super().__init__(root, (NVIDIA, LEGACY, "/usr/bin/containerd"))

    @property
    def imports(self):
        return "imports = ['%s/*.toml']" % self.host("/etc/containerd/conf.d")

    def converge(self, version, **params):
        """The engine on this node: plan and file changes, applied to the tree. Returns the plan."""
        facts = detect.gather(self.root, "containerd", version)
        plan, file_changes = changes.compute(NodeFacts.from_reading(facts), params)
        for change in file_changes:
            if change.after is None:
                os.unlink(change.path)
            else:
                self.write(change.node_path, change.after)
        return plan, file_changes


def runtimes_of(data):
    return data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]


def test_v4_config_edited_by_the_engine_loads_as_v4(tmp_path, default_v4):
    node = Node(tmp_path)
    original = default_v4.replace("imports = ['/etc/containerd/conf.d/*.toml']", "imports = []")
    node.write("/etc/containerd/config.toml", original)
    plan, file_changes = node.converge("2.3.4")
    assert (plan["target"]["mode"], plan["target"]["schema"]) == ("config", 4)
    assert [c.node_path for c in file_changes] == ["/etc/containerd/config.toml"]
    edited = node.read("/etc/containerd/config.toml")
    assert edited.startswith(original) and edited.splitlines()[0] == "version = 4"
    rc, data, stderr = config_dump("2.3.4", node.host("/etc/containerd/config.toml"))
    assert rc == 0, stderr
    assert data["version"] == 4
    assert "Configuration migrated from version" not in stderr  # read as v4 itself, not migrated
    assert "Ignoring unknown key" not in stderr
    runtimes = runtimes_of(data)
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == NVIDIA
    assert runtimes["nvidia-legacy"]["options"]["BinaryName"] == LEGACY
    assert "runc" in runtimes
    # a second run changes nothing; state=absent takes our tables out again and the file stays v4
    assert node.converge("2.3.4")[1] == []
    node.converge("2.3.4", state="absent")
    assert node.read("/etc/containerd/config.toml").rstrip("\n") == original.rstrip("\n")  # blank lines left at the end


@pytest.mark.parametrize("root_version", [4, 3])
def test_dropin_follows_the_root_and_loads(tmp_path, default_v4, root_version):
    node = Node(tmp_path)
    if root_version == 4:
        root = default_v4.replace("imports = ['/etc/containerd/conf.d/*.toml']", node.imports)
    else:
        root = "version = 3\n%s\n" % node.imports
    node.write("/etc/containerd/config.toml", root)
    plan, file_changes = node.converge("2.3.4", default_runtime="nvidia")
    assert (plan["target"]["mode"], plan["target"]["schema"]) == ("dropin", root_version)
    assert [c.node_path for c in file_changes] == ["/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml"]
    dropin = node.read("/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml")
    assert tomllib.loads(dropin)["version"] == root_version
    assert node.read("/etc/containerd/config.toml") == root  # the root is not touched
    for version in ("2.3.4",) + (("2.2.7",) if root_version == 3 else ()):
        rc, data, stderr = config_dump(version, node.host("/etc/containerd/config.toml"))
        assert rc == 0, "%s: %s" % (version, stderr)
        runtimes = runtimes_of(data)
        assert runtimes["nvidia"]["options"]["BinaryName"] == NVIDIA, version
        assert data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["default_runtime_name"] == "nvidia"
        assert "runc" in runtimes


def test_2_2_refuses_version_4_and_the_engine_refuses_it_there(tmp_path, default_v4):
    node = Node(tmp_path)
    original = default_v4.replace("imports = ['/etc/containerd/conf.d/*.toml']", "imports = []")
    node.write("/etc/containerd/config.toml", original)
    node.converge("2.3.4")  # the engine's own v4 output
    rc, _data, stderr = config_dump("2.2.7", node.host("/etc/containerd/config.toml"))
    assert rc != 0 and REFUSED_V4 in stderr, stderr
    # on a 2.2 node the engine refuses the same file, quoting what containerd says, and writes nothing
    node.write("/etc/containerd/config.toml", original)
    facts = detect.gather(node.root, "containerd", "2.2.7")
    with pytest.raises(K3sGpuError) as info:
        changes.compute(NodeFacts.from_reading(facts), {})
    assert REFUSED_V4 in str(info.value) and info.value.fix.endswith("nothing was changed")
    assert node.read("/etc/containerd/config.toml") == original


def test_2_3_refuses_a_dropin_above_the_root(tmp_path, default_v4):
    """The rule behind the drop-in's version: containerd 2.3 does not start with a drop-in above the root (#12891)."""
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", default_v4.replace("imports = ['/etc/containerd/conf.d/*.toml']", node.imports))
    node.converge("2.3.4")
    v4_dropin = node.read("/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml")
    assert tomllib.loads(v4_dropin)["version"] == 4
    # the same drop-in under a v3 root: what a tool that copies `config dump`'s version does (aicr #1688)
    root_v3 = "version = 3\n%s\n" % node.imports
    node.write("/etc/containerd/config.toml", root_v3)
    rc, _data, stderr = config_dump("2.3.4", node.host("/etc/containerd/config.toml"))
    assert rc != 0 and "drop-in config version 4 higher than root config version 3" in stderr, stderr
    # 2.2 has no such check, but cannot read a v4 drop-in at all
    rc, _data, stderr = config_dump("2.2.7", node.host("/etc/containerd/config.toml"))
    assert rc != 0 and REFUSED_V4 in stderr, stderr
    # the engine rewrites its drop-in at the root's version, and 2.3.4 (and 2.2.7) load it
    plan, _file_changes = node.converge("2.3.4")
    assert plan["target"]["schema"] == 3
    assert tomllib.loads(node.read("/etc/containerd/conf.d/50-k3s-gpu-nvidia.toml"))["version"] == 3
    for version in VERSIONS:
        rc, data, stderr = config_dump(version, node.host("/etc/containerd/config.toml"))
        assert rc == 0, "%s: %s" % (version, stderr)
        assert runtimes_of(data)["nvidia"]["options"]["BinaryName"] == NVIDIA
