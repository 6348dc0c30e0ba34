# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_operator_plan
short_description: Decide the NVIDIA GPU Operator HelmChart of one k3s or rke2 cluster
version_added: 1.0.0
description:
  - Returns the C(helm.cattle.io/v1) HelmChart that installs NVIDIA's GPU Operator on a k3s or rke2 cluster when at least
    one of its GPU nodes is in operator mode, with chart values that fit k3s/rke2 - the toolkit signals containerd at
    C(/run/k3s/containerd/containerd.sock), and nothing points the operator at the containerd config k3s/rke2 regenerate
    or at their templates (k3s/rke2 detect the operator's runtimes in C(/usr/local/nvidia/toolkit) themselves).
  - C(driver.enabled) is off where the gpu_node role installs the host driver, C(toolkit.enabled) off where the host
    toolkit is kept; CDI on or off as chosen (the chart line's default otherwise).
  - Refuses, with the fix, settings that would make two owners fight - mixed modes in one cluster, the operator's driver
    and the role's, CDI mode on containerd 1.7, NRI mode before containerd 2.1, user values that re-point the toolkit at
    k3s's config, move its install directory or set a default runtime k3s would lose, and HelmChart fields the release's
    helm-controller does not know (the API server would drop them silently).
  - Turn the result into manifest text with P(k3s_gpu.nvidia.gpu_operator_manifest#filter).
positional: _input, settings, nodes
options:
  _input:
    description: The M(k3s_gpu.nvidia.runtime_info) result of the server that writes the manifest (C(distribution), C(release), C(paths)).
    type: dict
    required: true
  settings:
    description:
      - C(chart_version) (default V(v26.3.3)), C(chart_repo), C(chart_archive) (a C(.tgz) file name served from the server's
        C(static/charts)), C(namespace) (default V(gpu-operator)), C(cdi) (V(true), V(false) or V(null) for the chart's
        default), C(driver) (V(auto), V(true), V(false)), C(toolkit) (bool), C(values) (extra chart values),
        C(helmchart_spec) (extra HelmChart spec fields).
    type: dict
    required: true
  nodes:
    description: One C({host, mode, driver_install}) per GPU node of the cluster (C(mode) V(host) or V(operator)).
    type: list
    elements: dict
    required: true
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
"""

EXAMPLES = r"""
- name: Plan the GPU Operator of a cluster
  ansible.builtin.set_fact:
    operator_plan: "{{ server_info | k3s_gpu.nvidia.gpu_operator_plan({'cdi': true}, [{'host': 'gpu1', 'mode': 'operator'}]) }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    wanted:
      description: Whether a node of the cluster is in operator mode (else write nothing, and remove an earlier manifest).
      type: bool
    objects:
      description: The HelmChart object (empty when not wanted).
      type: list
      elements: dict
    values:
      description: The chart values, as they go into C(valuesContent).
      type: dict
    operator_mode:
      description: V(cdi), V(legacy) (CDI off) or V(nri) (CDI with the NRI plugin).
      type: str
    runtimeclasses:
      description: Every RuntimeClass the operator manages in that mode (creates or deletes); the RuntimeClasses playbook leaves them to it.
      type: list
      elements: str
    runtimeclasses_created:
      description: The RuntimeClasses it creates.
      type: list
      elements: str
    runtimeclasses_deleted:
      description: The RuntimeClasses it deletes on every reconcile, whoever made them.
      type: list
      elements: str
    operator_nodes:
      description: The hosts in operator mode.
      type: list
      elements: str
    chart_archive_path:
      description: Where the chart archive goes on the server (air-gapped sites), or null.
      type: str
    chart_version:
      description: The chart version.
      type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._filter import one_filter
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

# what the refusal of an input that is not a reading says to do
SERVER_READING = "cluster must be the runtime_info result of a k3s or rke2 server (distribution, release, paths)"


def gpu_operator_plan(cluster, settings, nodes):
    try:
        server = NodeFacts.from_reading(cluster, "cluster", SERVER_READING)
        return gpu_operator.plan_cluster(server, settings, nodes)
    except ValueError as exc:
        raise AnsibleFilterError("gpu_operator_plan: %s" % exc) from exc


FilterModule = one_filter(gpu_operator_plan)
