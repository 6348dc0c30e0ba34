# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A node changed again converges (issue 41): the role's host step run twice on one sandbox node with a setting
changed between the runs, as a user changes a group_vars file. Each case failed on 0baaf98."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _decide as decide_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import host_step

TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
YAML = "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"
V3 = 'plugins."io.containerd.cri.v1.runtime".containerd'


def converge(sandbox, **role_vars):
    """The role's tasks on the sandbox: the host step, then (after install.yml, which a sandbox skips) its configure
    phase where it is due."""
    result = host_step(sandbox, **role_vars)
    assert not result.get("failed"), result.get("msg")
    phases = (["reread", "configure"] if result.get("install_due") else
              ["configure"] if result.get("configure_due") else [])
    for phase in phases:
        result = host_step(sandbox, {"phase": phase, "node": result["node"]}, **role_vars)
        assert not result.get("failed"), result.get("msg")
    return result


@pytest.mark.parametrize("first, then", [
    ("nvidia-legacy", "nvidia-cdi"),  # from the template's TOML to k3s's default-runtime
    ("nvidia-legacy", "nvidia"),
    ("nvidia-cdi", "nvidia-legacy"),  # and back
    ("nvidia", "nvidia-legacy"),
])
def test_switching_the_default_runtime_converges_both_ways(sandbox, first, then):
    sandbox.k3s("k3s", "package")
    converge(sandbox, gpu_node_default_runtime=first)
    converge(sandbox, gpu_node_default_runtime=then)
    template = sandbox.read(TEMPLATE).decode() if sandbox.exists(TEMPLATE) else ""
    yaml = sandbox.read(YAML).decode()
    if then == "nvidia-legacy":  # k3s does not detect it: containerd's TOML names it
        assert 'default_runtime_name = "nvidia-legacy"' in template and "default-runtime" not in yaml
    else:  # k3s detects it: default-runtime in config.yaml, and the TOML default of the first run is gone
        assert "default_runtime_name" not in template and 'default-runtime: "%s"' % then in yaml
    snapshot = sandbox.snapshot()
    assert host_step(sandbox, gpu_node_default_runtime=then)["changed"] is False and sandbox.snapshot() == snapshot


def test_a_users_own_default_runtime_table_is_still_refused(sandbox):
    # the rule that lets our table go is narrow: a table of the user's that the base emits is refused as before
    sandbox.k3s("k3s", "package")
    sandbox.write(TEMPLATE, '{{ template "base" . }}\n[%s]\n  default_runtime_name = "runc"\n' % V3)
    result = host_step(sandbox, gpu_node_default_runtime="nvidia")
    assert result.get("failed") and "duplicate_table" in result["msg"] and "line 2" in result["msg"]


def test_a_second_converge_with_the_toolkit_off_path_changes_nothing(sandbox):
    sandbox.k3s("k3s", "custom_off_path")
    converge(sandbox, gpu_node_toolkit_dirs=["/opt/nvidia/bin"], gpu_node_toolkit_install=True)
    assert "/opt/nvidia/bin/nvidia-container-runtime" in sandbox.read(TEMPLATE).decode()
    snapshot = sandbox.snapshot()
    second = converge(sandbox, gpu_node_toolkit_dirs=["/opt/nvidia/bin"], gpu_node_toolkit_install=True)
    assert not second.get("changed") and sandbox.snapshot() == snapshot


def test_the_pre_install_check_does_not_count_the_collections_own_tables(sandbox):
    # on a live node the toolkit install puts nvidia on k3s's PATH: the tables the collection wrote into a template it
    # created for /opt/nvidia/bin are taken out by its next edit, so they do not stop the install
    sandbox.k3s("k3s", "custom_off_path")
    converge(sandbox, gpu_node_toolkit_dirs=["/opt/nvidia/bin"])
    assert "/opt/nvidia/bin/nvidia-container-runtime" in sandbox.read(TEMPLATE).decode()
    facts = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", toolkit_dirs=["/opt/nvidia/bin"]))
    assert decide_step.refusal_before_install(facts) is None
    # the same tables in a template of the user's still stop it
    sandbox.write(TEMPLATE, sandbox.read(TEMPLATE).decode().split("\n", 1)[1])
    facts = NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1", toolkit_dirs=["/opt/nvidia/bin"]))
    refusal = decide_step.refusal_before_install(facts)
    assert refusal is not None and "after_install_duplicate" in refusal.cause


def test_after_the_install_our_own_blocks_give_way_to_the_releases(sandbox):
    # the toolkit now on PATH (/usr/bin): k3s renders nvidia and nvidia-cdi itself, and the blocks the collection wrote
    # for /opt/nvidia/bin in its own template go, although their BinaryName differs from the release's
    sandbox.k3s("k3s", "custom_off_path")
    converge(sandbox, gpu_node_toolkit_dirs=["/opt/nvidia/bin"])
    for name in ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy"):
        sandbox.binary("/usr/bin/" + name)
    converge(sandbox)
    template = sandbox.read(TEMPLATE).decode()
    assert "runtimes.nvidia]" not in template and "runtimes.nvidia-cdi]" not in template
    assert '"/usr/bin/nvidia-container-runtime.legacy"' in template


def test_a_users_template_switches_its_default_runtime_and_is_given_back(sandbox):
    # the collection added the default runtime to the user's template (its text before the first edit is kept): the
    # switch to a runtime k3s detects takes that table out again, and absent gives the user's bytes back
    sandbox.k3s("k3s", "package")
    mine = '# the site template\n{{ template "base" . }}\n\n[%s.runtimes.runsc]\n  runtime_type = "io.containerd.runsc.v1"\n' % V3
    sandbox.write(TEMPLATE, mine, 0o640)
    converge(sandbox, gpu_node_default_runtime="nvidia-legacy")
    assert 'default_runtime_name = "nvidia-legacy"' in sandbox.read(TEMPLATE).decode()
    converge(sandbox, gpu_node_default_runtime="nvidia-cdi")
    assert "default_runtime_name" not in sandbox.read(TEMPLATE).decode()
    converge(sandbox, gpu_node_state="absent")
    assert sandbox.read(TEMPLATE).decode() == mine
