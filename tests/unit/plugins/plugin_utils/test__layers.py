# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What containerd loads, layer by layer (_layers): the layers of a node and their merge as the node's containerd line
merges them, the runtimes a later drop-in would drop on lines before 2.1 refused by name with every file as it was,
and the default runtime a drop-in inherits read through the same layers. Real containerd is the oracle of the same
rules in tests/conformance/test_config_layers.py."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _layers as layers
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import host_step
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils.test__plain_containerd import CONFIG, NVIDIA, node, runtimes_of

V2_PLUGIN = "io.containerd.grpc.v1.cri"
V3_PLUGIN = "io.containerd.cri.v1.runtime"
ROOT_V2 = """version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri"]
  max_container_log_line_size = 4096
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""
ROOT_V3 = ROOT_V2.replace("version = 2", "version = 3").replace(V2_PLUGIN, V3_PLUGIN)
SITE = "/etc/containerd/conf.d/40-site.toml"


def layer(path, document):
    return (path, None, document)


def test_a_later_layer_merges_key_by_key_where_deep_and_replaces_the_plugins_table_before_2_1():
    root = layer("root", {"version": 2, "plugins": {V2_PLUGIN: {"enable_cdi": True, "containerd": {"snapshotter": "x"}},
                                                    "io.containerd.grpc.v1.other": {"a": 1}}})
    dropin = layer("dropin", {"plugins": {V2_PLUGIN: {"max_container_log_line_size": 1}}})
    deep = layers.merged([root, dropin], deep=True)
    assert deep["plugins"][V2_PLUGIN] == {"enable_cdi": True, "containerd": {"snapshotter": "x"},
                                          "max_container_log_line_size": 1}
    whole = layers.merged([root, dropin], deep=False)
    assert whole["plugins"][V2_PLUGIN] == {"max_container_log_line_size": 1}  # the root's keys are gone
    assert whole["plugins"]["io.containerd.grpc.v1.other"] == {"a": 1}  # a plugin the drop-in does not have stays
    assert whole["version"] == 2
    assert root[2]["plugins"][V2_PLUGIN]["enable_cdi"] is True  # the layers themselves are left as they were


def test_origins_name_the_layer_each_key_comes_from_as_merged_says():
    plugin = ("plugins", V2_PLUGIN)
    root = ("root", "r", {"plugins": {V2_PLUGIN: {"enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi"]}}})
    other = ("other", "o", {"plugins": {"io.containerd.grpc.v1.other": {"enable_cdi": False}}})
    dropin = ("dropin", "d", {"plugins": {V2_PLUGIN: {"enable_cdi": False}}})
    keys = ("enable_cdi", "cdi_spec_dirs")
    for deep in (True, False):
        found, last = layers.origins([root, other, dropin], plugin, keys, deep)
        table = layers.table(layers.merged([root, other, dropin], deep), plugin)
        assert dict((key, value[2]) for key, value in found.items()) == dict(
            (key, table[key]) for key in keys if key in table)
        assert found["enable_cdi"][:2] == ("dropin", "d") and last == "dropin"
        assert ("cdi_spec_dirs" in found) is deep  # before 2.1 the drop-in's table replaced the root's
    assert layers.origins([root, other], plugin, keys, False)[1] == "root"
    assert layers.origins([], plugin, keys, True) == ({}, "")


def test_touches_counts_an_empty_plugin_table():
    assert layers.touches({"plugins": {V2_PLUGIN: {}}}, ("plugins", V2_PLUGIN))
    assert not layers.touches({"plugins": {"io.containerd.grpc.v1.other": {"a": 1}}}, ("plugins", V2_PLUGIN))
    assert layers.table({"plugins": {V2_PLUGIN: {"x": 1}}}, ("plugins", V2_PLUGIN, "missing")) == {}


@pytest.mark.parametrize("release", ["1.6.20", "1.7.24"])
def test_a_later_dropin_with_the_cri_plugin_is_refused_by_name_before_2_1(sandbox, release):
    sandbox.write(SITE, '[plugins."io.containerd.grpc.v1.cri"]\n  max_concurrent_downloads = 8\n')
    facts = NodeFacts.from_reading(node(sandbox, ROOT_V2, release))
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError) as raised:
        changes.compute(facts, {})
    text = raised.value.text()
    assert "%s:1 has a table of the plugin %s [runtimes_replaced]" % (SITE, V2_PLUGIN) in text
    assert "runtimes written to %s (nvidia, nvidia-cdi" % CONFIG in text
    assert "move that file's settings of %s into %s" % (V2_PLUGIN, CONFIG) in text and "nothing was written" in text
    assert sandbox.snapshot() == before


@pytest.mark.parametrize("release", ["1.6.20", "1.7.24"])
def test_a_dropin_without_the_cri_plugin_or_not_imported_is_no_reason_to_refuse(sandbox, release):
    sandbox.write(SITE, '[plugins."io.containerd.grpc.v1.other"]\n  a = 1\n')
    plan, file_changes = changes.compute(NodeFacts.from_reading(node(sandbox, ROOT_V2, release)), {})
    assert plan["target"]["mode"] == planner.MODE_CONFIG and "nvidia" in runtimes_of(file_changes[0].after, 2)
    sandbox.write(SITE, '[plugins."io.containerd.grpc.v1.cri"]\n  max_concurrent_downloads = 8\n')
    not_imported = ROOT_V2.replace('imports = ["/etc/containerd/conf.d/*.toml"]\n', "")
    assert changes.compute(NodeFacts.from_reading(node(sandbox, not_imported, release)), {})[1]
    # a later drop-in that has the CRI plugin and defines the NVIDIA runtimes itself: containerd loads its tables,
    # which run the NVIDIA binaries only where they name them
    tables = "".join('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%s.options]\n  BinaryName = "%s"\n' % (
        name, "/usr/bin/" + binary) for name, binary in zip(("nvidia", "nvidia-cdi", "nvidia-legacy"), NVIDIA))
    sandbox.write(SITE, tables)
    assert changes.compute(NodeFacts.from_reading(node(sandbox, ROOT_V2, release)), {})[1]
    sandbox.write(SITE, tables.replace("/usr/bin/nvidia-container-runtime.cdi", "/usr/local/bin/site-runtime"))
    with pytest.raises(K3sGpuError, match=r"config.toml \(nvidia-cdi\) would not be loaded"):
        changes.compute(NodeFacts.from_reading(node(sandbox, ROOT_V2, release)), {})


def test_on_2_1_the_same_dropin_merges_and_the_runtimes_go_into_a_dropin_that_inherits_through_it(sandbox):
    # the user's drop-in turns runc's SystemdCgroup off after the root turned it on: containerd 2.1 merges keys, so the
    # default runtime the NVIDIA runtimes start from is the merged one
    sandbox.write(SITE, "[plugins.'%s'.containerd.runtimes.runc.options]\n  SystemdCgroup = false\n  Root = '/run/site'\n"
                  % V3_PLUGIN)
    plan, file_changes = changes.compute(NodeFacts.from_reading(node(sandbox, ROOT_V3, "2.1.4")), {})
    assert plan["target"]["mode"] == planner.MODE_DROPIN
    nvidia = runtimes_of(file_changes[0].after, 3)["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is False and nvidia["options"]["Root"] == "/run/site"


def test_the_layers_of_a_plain_node_follow_its_imports_in_file_name_order(sandbox):
    sandbox.write("/etc/containerd/conf.d/50-late.toml", "[plugins.'%s']\n  enable_cdi = false\n" % V3_PLUGIN)
    sandbox.write("/etc/containerd/conf.d/10-early.toml", "[plugins.'%s']\n  enable_cdi = true\n" % V3_PLUGIN)
    sandbox.write("/etc/containerd/conf.d/30-broken.toml", "[plugins\n")  # containerd refuses it; named elsewhere
    facts = NodeFacts.from_reading(node(sandbox, ROOT_V3, "2.1.4"))
    target = planner.select_target(facts.reading)
    found = layers.compose(facts, layers.Where.now(facts, target), None)
    assert [path for path, _text, _document in found] == [
        CONFIG, "/etc/containerd/conf.d/10-early.toml", "/etc/containerd/conf.d/50-late.toml"]
    assert layers.merged(found, layers.deep_merge_of(facts))["plugins"][V3_PLUGIN]["enable_cdi"] is False
    with_ours = layers.compose(facts, layers.Where.now(facts, target), "version = 3\n")
    assert [path for path, _t, _d in with_ours][-1] == "/etc/containerd/conf.d/50-late.toml"
    assert target["path"] in [path for path, _t, _d in with_ours]


def test_the_role_on_such_a_node_fails_by_name_with_every_file_as_it_was(sandbox):
    sandbox.write(SITE, '[plugins."io.containerd.grpc.v1.cri"]\n  max_concurrent_downloads = 8\n')
    node(sandbox, ROOT_V2, "1.7.24")
    before = sandbox.snapshot()
    result = host_step(sandbox, gpu_node_distribution="containerd", gpu_node_release="1.7.24")
    assert result.get("failed") and "[runtimes_replaced]" in result["msg"] and SITE in result["msg"], result
    assert sandbox.snapshot() == before
    sandbox.write(SITE, '[plugins."io.containerd.grpc.v1.other"]\n  a = 1\n')  # the user moves the setting out
    result = host_step(sandbox, gpu_node_distribution="containerd", gpu_node_release="1.7.24")
    assert not result.get("failed") and result["changed"], result.get("msg")
