# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The engine's layers of a plain containerd node (plugin_utils/containerd/_layers) against the real containerd of every
line (Debian's 1.6, 1.7 and 2.1; upstream 2.2.7 and 2.3.4): `containerd config dump` of the root config with its
imported drop-ins is the oracle of

- the merge: each line's `containerd config default` (hardened: runc's SystemdCgroup on, its own Root) importing
  conf.d, a drop-in that sets a key of the CRI plugin and a later one that sets runc's Root; the engine's merged
  config must give every one of those keys the value containerd loads (1.6 and 1.7 replace the plugin's whole table,
  2.1 and newer merge key by key);
- the refusal `runtimes_replaced`: after a first run wrote the NVIDIA runtimes, a drop-in of the user's with a CRI
  plugin table; the engine's second run must refuse exactly where containerd no longer loads `nvidia`."""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _layers as layers

from .test_plain_containerd import LINES, NVIDIA, Node, config_case, default_config, dump, loaded_runtimes, release_of

CONFIG = "/etc/containerd/config.toml"
LOG_LINE = "max_container_log_line_size"


def _plugin(line):
    return "io.containerd.grpc.v1.cri" if line in ("1.6", "1.7") else "io.containerd.cri.v1.runtime"


def _facts(node, line):
    return NodeFacts.from_reading(detect.gather(node.root, "containerd", release_of(line), binaries=list(NVIDIA.values())))


def _runc_option(plugin_table, key):
    runc = ((plugin_table.get("containerd") or {}).get("runtimes") or {}).get("runc") or {}
    return (runc.get("options") or {}).get(key)


@pytest.mark.parametrize("line", LINES)
def test_the_engines_merge_gives_each_key_the_value_containerd_loads(tmp_path, line):
    plugin = _plugin(line)
    defaults = tomllib.loads(default_config(line))["plugins"][plugin]
    assert LOG_LINE in defaults, "containerd %s has no %s in %s" % (line, LOG_LINE, plugin)
    node = Node(tmp_path)
    node.write(CONFIG, config_case(line, "default-hardened-dropin", node))  # runc: SystemdCgroup on, Root set
    node.write("/etc/containerd/conf.d/30-early.toml", "[plugins.'%s']\n  %s = 4096\n" % (plugin, LOG_LINE))
    node.write("/etc/containerd/conf.d/40-site.toml",
               "[plugins.'%s'.containerd.runtimes.runc.options]\n  Root = '/run/site'\n" % plugin)
    facts = _facts(node, line)
    target = planner.select_target(facts.reading)
    current = (facts.files.get(target["key"]) or {}).get("content")
    found = layers.compose(facts, layers.Where.now(facts, target), current)
    assert [path.rsplit("/", 1)[-1] for path, _t, _d in found] == ["config.toml", "30-early.toml", "40-site.toml"]
    deep = layers.deep_merge_of(facts)
    assert deep == distro.profile("containerd", release_of(line))["dropin_deep_merge"]
    engine = layers.merged(found, deep)["plugins"][plugin]
    loaded = dump(line, node.host(CONFIG))["plugins"][plugin]
    expected = {LOG_LINE: engine.get(LOG_LINE, defaults[LOG_LINE]),
                "SystemdCgroup": _runc_option(engine, "SystemdCgroup") or False,
                "Root": _runc_option(engine, "Root")}
    got = {LOG_LINE: loaded.get(LOG_LINE), "SystemdCgroup": _runc_option(loaded, "SystemdCgroup") or False,
           "Root": _runc_option(loaded, "Root")}
    print("containerd %s (deep merge %s): loads %s; engine %s" % (line, deep, got, expected))
    assert got == expected
    # and the two rules differ here: a case that cannot tell them apart would prove nothing
    assert (got[LOG_LINE] == 4096 and got["SystemdCgroup"] is True) == deep
    assert got["Root"] == "/run/site"


@pytest.mark.parametrize("line", LINES)
def test_the_engine_refuses_exactly_where_a_later_dropin_drops_the_runtimes(tmp_path, line):
    node = Node(tmp_path)
    node.write(CONFIG, config_case(line, "default-dropin", node))
    node.converge(line)
    assert "nvidia" in loaded_runtimes(dump(line, node.host(CONFIG)))  # the first run's files load
    node.write("/etc/containerd/conf.d/60-site.toml", "[plugins.'%s']\n  %s = 32768\n" % (_plugin(line), LOG_LINE))
    loaded = "nvidia" in loaded_runtimes(dump(line, node.host(CONFIG)))
    try:
        node.converge(line)
        refusal = None
    except K3sGpuError as exc:
        refusal = exc.text()
    print("containerd %s: nvidia loaded with the user's drop-in: %s; engine: %s" % (line, loaded, refusal or "written"))
    assert (refusal is None) == loaded, refusal
    if refusal is not None:
        assert "60-site.toml:1 has a table of the plugin %s [runtimes_replaced]" % _plugin(line) in refusal, refusal
