# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rollout's settings of a host: which kubeconfig and which Node name it uses."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _rollout_plan as rollout_plan


def same(value):
    return value


@pytest.mark.parametrize("host_vars, environment, kubeconfig", [
    ({"gpu_node_kubeconfig": "/role.yaml", "k3s_gpu_kubeconfig": "/verify.yaml"}, "/env.yaml", "/role.yaml"),
    ({"k3s_gpu_kubeconfig": "/verify.yaml"}, "/env.yaml", "/verify.yaml"),
    ({}, "/env.yaml", "/env.yaml"),
    ({}, "", ""),
])
def test_the_kubeconfig_is_the_roles_then_verifys_then_the_environments(host_vars, environment, kubeconfig):
    assert rollout_plan.settings_of(host_vars, same, "gpu-01", environment)["kubeconfig"] == kubeconfig


@pytest.mark.parametrize("host_vars, node", [
    ({"gpu_node_kubernetes_node": "ip-10-0-0-7", "k3s_gpu_node_name": "doctor-name"}, "ip-10-0-0-7"),
    ({"k3s_gpu_node_name": "doctor-name"}, "doctor-name"),
    ({}, "gpu-01"),
])
def test_the_node_name_is_the_roles_then_the_doctors_then_the_inventory_name(host_vars, node):
    assert rollout_plan.settings_of(host_vars, same, "gpu-01")["node"] == node


def test_a_bad_rollout_setting_is_refused_by_name_for_its_host():
    with pytest.raises(K3sGpuError, match="gpu-01: .*gpu_node_drain"):
        rollout_plan.settings_of({"gpu_node_drain": "sometimes"}, same, "gpu-01")


def test_no_kubeconfig_is_refused_with_the_fix_when_the_cluster_is_needed():
    settings = rollout_plan.settings_of({}, same, "gpu-01")
    with pytest.raises(K3sGpuError, match="gpu-01: no kubeconfig .*gpu_node_kubeconfig"):
        rollout_plan.cluster_of(settings, "gpu-01")


@pytest.mark.parametrize("declared, defer, deferred", [("kernel upgrade", True, True), ("kernel upgrade", False, False),
                                                       ("", True, False)])
def test_only_a_disruptive_change_is_deferred_and_only_when_site_asks(declared, defer, deferred):
    host_vars = {"gpu_node_disruptive_change": declared, "gpu_node_kubeconfig": "/k.yaml"}
    settings = rollout_plan.settings_of(host_vars, same, "gpu-01")
    args = {"probe": {}, "removal_probe": {}, "resume": False, "defer": defer}
    found = rollout_plan.classify(host_vars, same, settings, args, "gpu-01", check_mode=False)
    assert found["deferred"] is deferred and found["disruptive"] is bool(declared) and found["drain"] is bool(declared)


@pytest.mark.parametrize("host_vars, named", [({"gpu_node_max_unavailable": "0%"}, "gpu_node_max_unavailable is '0%'"),
                                              ({"gpu_node_max_unavailable": "two"}, "gpu_node_max_unavailable is 'two'"),
                                              ({"gpu_node_drain_timeout_seconds": 0}, "gpu_node_drain_timeout_seconds: 0"),
                                              ({"gpu_node_prove_timeout_seconds": -5}, "gpu_node_prove_timeout_seconds: -5")])
def test_a_bad_batch_size_or_timeout_is_refused_when_the_variables_are_read_before_any_change(host_vars, named):
    """The host step reads every gpu_node_* variable at its first task: a bad batch size is refused there, not once
    the first pass has changed the fleet."""
    with pytest.raises(K3sGpuError, match="gpu-01: %s" % named):
        rollout_plan.settings_of(host_vars, same, "gpu-01")
