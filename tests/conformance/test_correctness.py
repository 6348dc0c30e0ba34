# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 27 against real containerd (Debian's 1.7 and 2.1, `config dump`):

- new runtimes inherit from the runtime default_runtime_name names (a crun runc-shim runtime), in the root config
  and where another drop-in names it; the mirror: runc is the default;
- a k3s template without the base include (what nvidia-ctk writes) is edited into a file that containerd loads
  with every runtime; the mirror with the base include composes and loads too;
- the user's own nvidia table that the module refuses really is refused by containerd (the refusal's cause is true).
"""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as check
from ansible_collections.k3s_gpu.nvidia.tests.containerd_tables import CRUN, NVIDIA_CTK_V2, RUNC_SYSTEMD, default_runtime
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

from . import lab

NVIDIA = {"nvidia": "/usr/bin/nvidia-container-runtime", "nvidia-cdi": "/usr/bin/nvidia-container-runtime.cdi",
          "nvidia-legacy": "/usr/bin/nvidia-container-runtime.legacy"}
CRI = {2: 'plugins."io.containerd.grpc.v1.cri".containerd', 3: "plugins.'io.containerd.cri.v1.runtime'.containerd"}
PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
LINE_SCHEMA = {"1.7": 2, "2.x": 3}


def crun_config(schema, default="crun", imports=None):
    text = "version = %d\n" % schema
    if imports:
        text += "imports = ['%s']\n" % imports
    return text + (default_runtime(default) + CRUN + RUNC_SYSTEMD) % {"t": CRI[schema]}


def release_of(line):
    return lab.versions()[line]["version"].split("~")[0]


def runtimes_in(data, schema):
    containerd = data["plugins"][PLUGIN[schema]]["containerd"]
    return containerd.get("default_runtime_name"), containerd["runtimes"]


def dumped(line, text):
    result = lab.config_dump(line, text)
    assert result.rc == 0 and result.data is not None, "containerd %s refuses the config: %s" % (line, result.stderr[-2000:])
    return result.data


class Node(lab.NodeTree):
    def __init__(self, root):
        super().__init__(root, list(NVIDIA.values()) + ["/usr/bin/containerd", "/usr/bin/crun"])

    def converge(self, distribution, release, **params):
        facts = detect.gather(self.root, distribution, release, binaries=list(NVIDIA.values()))
        plan, file_changes = changes.compute(NodeFacts.from_reading(facts), dict(params, state="present"))
        for change in file_changes:
            self.write(change.node_path, change.after)
        return facts, plan, file_changes


# --- 4. inheritance, in the config containerd loads -------------------------------------------------------

@pytest.mark.parametrize("line", ["2.x", "1.7"])
@pytest.mark.parametrize("default, systemd, privileged", [("crun", False, True), ("runc", True, False)])
def test_new_runtimes_inherit_the_default_runtime_in_real_containerd(lab_versions, tmp_path, line, default, systemd,
                                                                     privileged):
    schema = LINE_SCHEMA[line]
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", crun_config(schema, default))
    facts, plan, _changes = node.converge("containerd", release_of(line))
    assert plan["target"]["mode"] == planner.MODE_CONFIG
    loaded_default, runtimes = runtimes_in(dumped(line, node.read("/etc/containerd/config.toml")), schema)
    assert loaded_default == default
    for name, binary in NVIDIA.items():
        table = runtimes[name]
        assert table["options"]["BinaryName"] == binary, name  # never crun's
        assert bool(table["options"].get("SystemdCgroup", False)) is systemd, (name, table)
        assert bool(table.get("privileged_without_host_devices", False)) is privileged, (name, table)
    source = changes.result_fields(NodeFacts.from_reading(facts), plan)["inherited_from"]
    assert (source["runtime"], source["fallback"]) == (default, None)


def test_a_dropin_follows_the_default_another_dropin_names(lab_versions, tmp_path):
    node = Node(tmp_path)
    conf_d = node.host("/etc/containerd/conf.d")
    node.write("/etc/containerd/config.toml", crun_config(3, "runc", imports=conf_d + "/*.toml"))
    node.write("/etc/containerd/conf.d/10-default.toml", 'version = 3\n[%s]\n  default_runtime_name = "crun"\n' % CRI[3])
    _facts, plan, _changes = node.converge("containerd", release_of("2.x"))
    assert plan["target"]["mode"] == planner.MODE_DROPIN
    loaded_default, runtimes = runtimes_in(dumped("2.x", node.read("/etc/containerd/config.toml")), 3)
    assert loaded_default == "crun"
    for name in NVIDIA:
        assert runtimes[name]["options"].get("SystemdCgroup", False) is False, runtimes[name]
        assert runtimes[name]["privileged_without_host_devices"] is True


# --- 2. a template without the base include -----------------------------------------------------------------

K3S_RELEASE = "v1.30.6+k3s1"  # containerd 1.7, schema 2, no drop-ins
TEMPLATE_V2 = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"


def k3s_node(tmp_path, template):
    node = Node(tmp_path)
    node.write("/var/lib/rancher/k3s/agent/etc/containerd/.keep", "")
    node.write(TEMPLATE_V2, template)
    return node


def test_a_template_without_base_is_edited_into_a_config_containerd_loads(lab_versions, tmp_path):
    node = k3s_node(tmp_path, NVIDIA_CTK_V2)
    facts, plan, file_changes = node.converge("k3s", K3S_RELEASE)
    assert [c.node_path for c in file_changes] == [TEMPLATE_V2]
    after = node.read(TEMPLATE_V2)
    assert after.startswith(NVIDIA_CTK_V2)
    assert any("[no_base]" in w for w in plan["warnings"])
    # k3s renders this file alone: what containerd loads is the file
    rendered = check.render(after, NodeFacts.from_reading(facts), 2)
    _default, runtimes = runtimes_in(dumped("1.7", rendered), 2)
    for name, binary in NVIDIA.items():
        assert runtimes[name]["options"]["BinaryName"] == binary
    assert node.converge("k3s", K3S_RELEASE)[2] == []  # idempotent


def test_the_mirror_with_the_base_include_loads_composed_with_the_base(lab_versions, tmp_path):
    template = '{{ template "base" . }}\n\n# mine\n[%s.runtimes.mine]\n  runtime_type = "io.containerd.runc.v2"\n' % CRI[2]
    node = k3s_node(tmp_path, template)
    facts, plan, _changes = node.converge("k3s", K3S_RELEASE)
    assert not any("[no_base]" in w for w in plan.get("warnings") or [])
    rendered = check.render(node.read(TEMPLATE_V2), NodeFacts.from_reading(facts), 2)
    _default, runtimes = runtimes_in(dumped("1.7", rendered), 2)
    assert set(NVIDIA) | {"mine", "runc"} <= set(runtimes)


# --- 1. the user's own table of a runtime the release renders ------------------------------------------------

def test_the_refused_users_table_is_what_containerd_refuses(lab_versions, tmp_path):
    template = ('{{ template "base" . }}\n\n[%(t)s.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
                '[%(t)s.runtimes.nvidia.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
                '  SystemdCgroup = false\n' % {"t": CRI[2]})
    node = k3s_node(tmp_path, template)
    node.write("/run/systemd/system/.keep", "")
    facts = detect.gather(node.root, "k3s", K3S_RELEASE)
    with pytest.raises(K3sGpuError, match=r"SystemdCgroup false \u2192 true"):
        changes.compute(NodeFacts.from_reading(facts), {"state": "present"})
    assert node.read(TEMPLATE_V2) == template
    # as the file stands, k3s would render a config that containerd refuses: the refusal's cause is true
    params = check.base_params(NodeFacts.from_reading(facts), facts["profile"], facts["release_runtimes"], None)
    composed = k3s_base.compose(template.rstrip("\n"), k3s_base.render_base(facts["profile"], 2, params))
    result = lab.config_dump("1.7", composed)
    assert result.rc != 0 and "duplicated tables" in result.stderr, result.stderr[-500:]
    assert distro.runtime_table(2, "nvidia") in [tuple(t) for t in planner.reserved_tables(
        facts, planner.select_target(facts), False)]
