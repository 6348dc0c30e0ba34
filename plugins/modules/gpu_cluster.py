#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_cluster
short_description: Internal - the cluster objects of k3s_gpu.nvidia's playbooks, once per cluster
version_added: 1.0.0
description:
  - B(Internal to the playbooks k3s_gpu.nvidia.site, k3s_gpu.nvidia.runtimeclasses and k3s_gpu.nvidia.gpu_operator; its
    options and results may change without notice.) Use the playbooks.
  - V(plan) (run once) checks the cluster settings (C(runtimeclasses_*), C(k3s_gpu_servers)) before any host is touched
    and lists the clusters of the run, each with the server that writes for it.
  - V(apply) (delegated to that server) reads the server, decides the GPU Operator HelmChart and the RuntimeClasses of
    the cluster from what its GPU nodes reported in this run, and writes or removes both manifests in one module
    execution, none where the server's reading shows every manifest as it would be written. A run that does not see
    every GPU node of the cluster (C(--limit), a failed node) only adds.
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
options:
  phase:
    description: V(plan) lists the clusters; V(read) reads this GPU node (its NVIDIA handlers) as the role would; V(apply)
      writes the objects of one cluster; V(inspect) reads what the manifests on the cluster's server say (the verify
      playbook without a cluster).
    type: str
    default: apply
    choices: [plan, read, apply, inspect]
  hosts:
    description: V(plan) - the GPU hosts of this run (the play's hosts, within C(--limit)).
    type: list
    elements: str
    default: []
  pattern_hosts:
    description: V(plan) - every host of C(k3s_gpu_nodes) in the inventory, C(--limit) aside.
    type: list
    elements: str
    default: []
  servers:
    description: V(plan) - every host of C(k3s_gpu_servers) in the inventory, in inventory order.
    type: list
    elements: str
    default: []
  servers_pattern:
    description: V(plan) - the C(k3s_gpu_servers) pattern, for messages.
    type: str
    default: server
  cluster:
    description: V(apply), V(inspect) - one entry of the V(plan) phase's RV(clusters) (required there).
    type: dict
  objects:
    description: V(apply) - what this run writes; V(plan) - what the run's V(apply) writes (returned as RV(objects), and
      compared with O(skip_unchanged)).
    type: list
    elements: str
    choices: [gpu_operator, runtimeclasses, device_plugin]
    default: [gpu_operator, runtimeclasses, device_plugin]
  skip_unchanged:
    description:
      - V(plan) - leave out of the writers each cluster whose manifests on its writing server are already what V(apply)
        would write, judged by that server's reading in this run (runtime_info's RV(k3s_gpu.nvidia.runtime_info#module:manifests)),
        the gpu_node role's, or else the one V(read) registered as C(runtimeclasses__info) (the runtimeclasses playbook).
        Its decision is returned in the cluster's C(result) and no module runs for it.
      - A cluster whose writer was not read in this run, a partial run that keeps earlier RuntimeClasses, an air-gapped chart
        archive, the API method and a refusal are left to V(apply).
    type: bool
    default: false
seealso:
  - module: k3s_gpu.nvidia.runtime_info
  - module: k3s_gpu.nvidia.node_files
"""

EXAMPLES = r"""
# Internal: the playbooks k3s_gpu.nvidia.site, runtimeclasses and gpu_operator call it.
- name: Find the clusters of this run
  k3s_gpu.nvidia.gpu_cluster:
    phase: plan
    hosts: "{{ ansible_play_hosts_all }}"
    servers: "{{ query('ansible.builtin.inventory_hostnames', 'server') }}"
  run_once: true
  register: clusters
"""

RETURN = r"""
clusters:
  description: V(plan) - the clusters of the run.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The cluster (C(k3s_gpu_cluster) of its hosts).
      type: str
    writer:
      description: The server that writes the cluster's manifests.
      type: str
    hosts:
      description: The GPU hosts of the cluster in this run.
      type: list
      elements: str
    complete:
      description: Whether the run sees every host of the cluster (else nothing is removed).
      type: bool
    leader:
      description: The host whose task writes for the cluster (delegated to the writer), or null when none does (all its hosts
        failed, or O(skip_unchanged) found it unchanged).
      type: str
    result:
      description: With O(skip_unchanged), for a cluster whose manifests are unchanged - what V(apply) would have
        returned (RV(gpu_operator), RV(runtimeclasses), RV(device_plugin), C(msg); C(changed) false, no C(files)).
      type: dict
      returned: when the cluster is unchanged
objects:
  description: V(plan) - the objects of O(objects), for the V(apply) tasks.
  returned: success
  type: list
  elements: str
gpu_operator:
  description: V(apply) - the cluster's GPU Operator HelmChart (C(wanted), C(chart_version), C(operator_mode), C(operator_nodes), C(manifest)).
  returned: success
  type: dict
runtimeclasses:
  description: V(apply) - the cluster's RuntimeClasses (C(written), C(shipped), C(skipped), C(owners), C(manifests) for the API method).
  returned: success
  type: dict
device_plugin:
  description:
    - V(apply) - the cluster's NVIDIA device plugin HelmChart in host mode (C(wanted), C(chart_version), C(runtime_class),
      C(device_list_strategy), C(sharing), C(manifest)).
  returned: success
  type: dict
chart_archives:
  description: V(apply) - C({src, dest, directory}) of each chart archive to copy to the server (air-gapped).
  returned: success
  type: list
  elements: dict
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_CLUSTER_REQUIRED_IF as REQUIRED_IF
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_CLUSTER_SPEC as SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.gpu_cluster runs through its action plugin, inside the collection's playbooks", SPEC, REQUIRED_IF)


if __name__ == "__main__":
    main()
