# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Operator mode, one node: every coexistence rule, from facts that real detection reads off a sandbox tree."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _gpu_operator as op

RELEASE = "v1.33.10+k3s1"


def facts_of(sandbox, layouts=("nothing",)):
    sandbox.k3s("k3s", layouts[0])
    for layout in layouts[1:]:
        sandbox.k3s("k3s", layout)
    return detect.gather(sandbox.root, "k3s", RELEASE)


# --- what detection reports per layout ----------------------------------------------------------

def test_detection_names_the_owner_of_each_runtime(sandbox):
    facts = facts_of(sandbox, ("operator",))
    assert [(r["name"], r["owner"]) for r in facts["runtimes"]] == [
        ("nvidia", "gpu-operator"), ("nvidia-cdi", "gpu-operator"), ("nvidia-legacy", "gpu-operator")]
    assert facts["gpu_operator"]["runtimes"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert facts["host_toolkit"] == {"present": False, "runtime_binaries": []}


def test_detection_finds_a_host_toolkit_masked_by_the_operator(sandbox):
    facts = facts_of(sandbox, ("operator", "package"))
    # k3s picks the operator's binaries first; the host's are still reported
    assert {r["owner"] for r in facts["runtimes"]} == {"gpu-operator"}
    assert facts["host_toolkit"] == {"present": True, "runtime_binaries": [
        "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
        "/usr/bin/nvidia-container-runtime.legacy"]}


def test_detection_host_only(sandbox):
    facts = facts_of(sandbox, ("package",))
    assert {r["owner"] for r in facts["runtimes"]} == {"host"}
    assert facts["gpu_operator"]["present"] is False and facts["gpu_operator"]["runtimes"] == []
    assert facts["host_toolkit"]["present"] is True


# --- host mode ------------------------------------------------------------------------------------

def test_host_mode_installs_the_toolkit_on_a_plain_node(sandbox):
    plan = op.plan_node(facts_of(sandbox), "host")
    assert plan["install_toolkit"] is True and plan["remove_host_toolkit"] is False
    assert plan["generate_cdi"] is True and plan["pending"] == []


def test_host_mode_refuses_a_second_toolkit_next_to_the_operators(sandbox):
    with pytest.raises(op.GpuOperatorPlanError, match=r"gpu1 has the GPU Operator's toolkit in /usr/local/nvidia/toolkit "
                       r"\(nvidia-container-runtime, .*gpu_node_toolkit_install=false"):
        op.plan_node(facts_of(sandbox, ("operator",)), "host", toolkit_install=True, host="gpu1")


def test_host_mode_keeps_the_operators_toolkit_when_not_installing(sandbox):
    plan = op.plan_node(facts_of(sandbox, ("operator",)), "host", toolkit_install=False)
    assert plan["install_toolkit"] is False
    assert plan["operator_handlers"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]


def test_host_mode_refuses_two_toolkits_even_without_installing(sandbox):
    with pytest.raises(op.GpuOperatorPlanError, match=r"two NVIDIA toolkits: the GPU Operator's in .* and the host's "
                       r"\(/usr/bin/nvidia-container-runtime, .*Keep one"):
        op.plan_node(facts_of(sandbox, ("operator", "package")), "host", toolkit_install=False)


# --- operator mode ----------------------------------------------------------------------------------

def test_operator_mode_before_the_operator_arrives(sandbox):
    plan = op.plan_node(facts_of(sandbox), "operator", default_runtime="nvidia", host="gpu1")
    assert plan["install_toolkit"] is False and plan["remove_host_toolkit"] is False
    assert plan["generate_cdi"] is False  # the operator's toolkit writes the CDI specs
    assert plan["default_runtime"] == ""
    assert plan["pending"] == ["gpu1: default runtime nvidia waits for the GPU Operator's toolkit (not on the node yet); "
                               "run the role again once /usr/local/nvidia/toolkit holds it"]


def test_operator_mode_with_the_operators_toolkit_in_place(sandbox):
    plan = op.plan_node(facts_of(sandbox, ("operator",)), "operator", default_runtime="nvidia-cdi")
    assert plan["default_runtime"] == "nvidia-cdi" and plan["pending"] == []
    assert plan["owners"] == {"nvidia": "gpu-operator", "nvidia-cdi": "gpu-operator", "nvidia-legacy": "gpu-operator"}


def test_operator_mode_removes_the_host_toolkit_on_a_real_root(sandbox):
    plan = op.plan_node(facts_of(sandbox, ("package",)), "operator", toolkit_install=True, live=True,
                        default_runtime="nvidia")
    assert plan["remove_host_toolkit"] is True and plan["install_toolkit"] is False
    # the host's nvidia goes away with its packages: the default waits for the operator's
    assert plan["default_runtime"] == "" and len(plan["pending"]) == 1


@pytest.mark.parametrize("toolkit_install, live", [(False, True), (True, False)])
def test_operator_mode_refuses_a_host_toolkit_it_may_not_remove(sandbox, toolkit_install, live):
    with pytest.raises(op.GpuOperatorPlanError, match=r"operator mode, where the GPU Operator installs the toolkit, but a "
                       r"host toolkit is there \(/usr/bin/nvidia-container-runtime, .*gpu_node_operator_toolkit=false"):
        op.plan_node(facts_of(sandbox, ("package",)), "operator", toolkit_install=toolkit_install, live=live)


def test_operator_mode_with_the_host_toolkit_kept(sandbox):
    plan = op.plan_node(facts_of(sandbox, ("package",)), "operator", operator_toolkit=False, default_runtime="nvidia")
    assert plan["install_toolkit"] is True and plan["remove_host_toolkit"] is False
    assert plan["generate_cdi"] is True and plan["default_runtime"] == "nvidia" and plan["pending"] == []


def test_operator_mode_refuses_stale_operator_files_when_its_toolkit_is_off(sandbox):
    with pytest.raises(op.GpuOperatorPlanError, match=r"toolkit is off \(gpu_node_operator_toolkit=false\), yet "
                       r"/usr/local/nvidia/toolkit .*search that directory first"):
        op.plan_node(facts_of(sandbox, ("operator",)), "operator", operator_toolkit=False)


def test_operator_mode_refuses_two_driver_owners(sandbox):
    with pytest.raises(op.GpuOperatorPlanError, match=r"gpu_node_driver_install=true and the GPU Operator's driver is on"):
        op.plan_node(facts_of(sandbox), "operator", operator_driver=True, driver_install=True)


def test_operator_mode_keeps_the_role_driver_when_the_operators_is_off(sandbox):
    plan = op.plan_node(facts_of(sandbox), "operator", operator_driver=False, driver_install=True)
    assert plan["install_driver"] is True


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "both"}, r"gpu_node_mode is 'both'; use host .* or operator"),
    ({"mode": "operator", "operator_toolkit": "yes"}, r"operator_toolkit must be true or false, got 'yes'"),
    ({"mode": "host", "live": 1}, r"live must be true or false, got 1"),
])
def test_bad_input(sandbox, kwargs, message):
    facts = facts_of(sandbox)
    with pytest.raises(op.GpuOperatorPlanError, match=message):
        op.plan_node(facts, **kwargs)
