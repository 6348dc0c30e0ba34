#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_rollout
short_description: Internal - the safe rollout of the gpu_node role's disruptive changes
version_added: 1.0.0
description:
  - B(Internal to the role k3s_gpu.nvidia.gpu_node and the playbook k3s_gpu.nvidia.site; its options and results may
    change without notice.) Use the role (its C(drain) and C(prove) entry points for a change of yours).
  - V(classify) says which of the node's changes disrupt its GPU pods - a driver install, upgrade or removal (the
    package manager's answer in check mode, O(probe)), a reboot, a change the user declares - and which do not (the
    container toolkit, the CDI spec, a k3s/rke2 restart for a containerd config change, which the containers survive).
    A disruptive change on a node that runs k3s/rke2 without a kubeconfig is refused unless C(gpu_node_drain=never).
  - V(drain) cordons the node with the annotation C(k3s-gpu.nvidia/rollout) (who, why, how far, whether it was
    cordoned before), evicts its GPU pods (C(gpu_node_drain_scope)) through the Eviction API, asking again while a
    PodDisruptionBudget refuses, and waits until they are gone and no process holds an NVIDIA device
    (M(k3s_gpu.nvidia.gpu_device_holders)). On timeout it uncordons the node as it was and fails, changing nothing.
  - V(prove) waits until the node is Ready with C(nvidia.com/gpu) allocatable, runs the verify playbook's GPU pod pinned
    to it (tolerating the cordon) and uncordons it; a node someone else had cordoned stays cordoned. A node whose pod
    fails stays cordoned with the layer and the cause on its annotation, and the task fails.
  - V(plan) puts the run's disruptive nodes into batches per cluster (C(gpu_node_max_unavailable), each cluster's
    first node alone, as a canary), finding the nodes a stopped run left cordoned by their annotation.
  - The cluster is reached on the controller with the Python kubernetes client and C(gpu_node_kubeconfig).
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
options:
  phase:
    description: V(classify), V(drain), V(prove) (one host) or V(plan) (once, for the run).
    type: str
    required: true
    choices: [classify, drain, prove, plan]
  probe:
    description: V(classify) - the result of the driver's package step run in check mode (empty when it did not run).
    type: dict
    default: {}
  removal_probe:
    description: V(classify) - the result of the driver's removal run in check mode (empty when it did not run).
    type: dict
    default: {}
  resume:
    description: V(classify) - the node carries the annotation of a stopped run (the plan found it).
    type: bool
    default: false
  defer:
    description:
      - V(classify) - leave a disruptive change to the rollout play of k3s_gpu.nvidia.site (its first pass sets it);
        the result says RV(deferred).
    type: bool
    default: false
  reason:
    description: V(drain) - what the change is, for the annotation and the messages.
    type: str
    default: ""
  clusters:
    description: V(plan) - C(k3s_gpu__clusters.clusters), the clusters of the run and their hosts.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
# Internal: the role's tasks/drain.yml and handlers call it. A change of yours under the same rollout:
- name: Cordon and drain the node before a kernel upgrade
  ansible.builtin.include_role:
    name: k3s_gpu.nvidia.gpu_node
    tasks_from: drain
  vars:
    gpu_node_disruptive_change: kernel upgrade to 6.8
    gpu_node_kubeconfig: ~/.kube/config
"""

RETURN = r"""
disruptive:
  description: V(classify) - whether a change of the node disrupts its GPU pods.
  returned: phase is classify
  type: bool
changes:
  description: V(classify) - each change, whether it disrupts and why.
  returned: phase is classify
  type: list
  elements: dict
deferred:
  description: V(classify) - the node's change is left to the rollout play of k3s_gpu.nvidia.site.
  returned: phase is classify
  type: bool
drain:
  description: V(classify) - whether the role cordons and drains the node before its change.
  returned: phase is classify
  type: bool
evicted:
  description: V(drain) - the pods evicted (or that would be, in check mode), C(namespace/name).
  returned: phase is drain
  type: list
  elements: str
line:
  description: "V(prove) - C(<node> / <class>: OK | <nvidia-smi -L>), or what there was to prove."
  returned: phase is prove
  type: str
waves:
  description: V(plan) - the batches, each a list of hosts.
  returned: phase is plan
  type: list
  elements: list
hosts:
  description: V(plan) - the disruptive hosts in wave order.
  returned: phase is plan
  type: list
  elements: str
serial:
  description: V(plan) - the size of each wave (the rollout play's C(serial)).
  returned: phase is plan
  type: list
  elements: int
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_ROLLOUT_SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.gpu_rollout runs through its action plugin, inside the role k3s_gpu.nvidia.gpu_node",
                          GPU_ROLLOUT_SPEC)


if __name__ == "__main__":
    main()
