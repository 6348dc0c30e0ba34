# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: runtimeclass_plan
short_description: Decide which NVIDIA RuntimeClass objects a k3s or rke2 cluster needs
version_added: 1.0.0
description:
  - Returns one C(node.k8s.io/v1) RuntimeClass (name and handler equal) for each NVIDIA runtime handler
    (C(nvidia), C(nvidia-cdi), C(nvidia-legacy), C(nvidia-experimental)) that at least one node has.
  - Leaves out the RuntimeClasses the cluster's release ships itself (k3s from v1.28.5 in its C(runtimes.yaml)
    manifest, rke2 from its C(rke2-runtimeclasses) chart on; both C(nvidia) and C(nvidia-experimental), never
    C(nvidia-cdi) or C(nvidia-legacy)) and those the NVIDIA GPU Operator creates, so that no object has two owners.
    Each one left out is listed in RV(_value.skipped) with the reason.
  - Handlers that are not NVIDIA runtimes (runc, crun, wasm shims) are reported in RV(_value.handlers) only.
  - Every object carries the label C(app.kubernetes.io/managed-by=k3s_gpu.nvidia).
  - Turn the result into manifest text with P(k3s_gpu.nvidia.runtimeclass_manifest#filter).
positional: _input, nodes
options:
  _input:
    description:
      - The cluster, as the server that applies manifests sees it - C(distribution) (V(k3s) or V(rke2)) and C(release)
        (such as V(v1.33.10+k3s1)); other keys are ignored, so a M(k3s_gpu.nvidia.runtime_info) result of a server fits.
      - >-
        Optional C(runtimeclasses_disabled=true) when the servers run with C(disable: [runtimes]) (k3s) or
        C(disable: [rke2-runtimeclasses]) (rke2); then nothing counts as shipped.
    type: dict
    required: true
  nodes:
    description:
      - One entry per node - C(host) (inventory hostname), C(handlers) (the runtime handler names the node has after
        configuration, V([]) for none), optional C(gpu_operator) (V(true) when the node has the GPU Operator layout; the
        operator then manages the RuntimeClasses V(nvidia), V(nvidia-cdi) and V(nvidia-legacy) - it creates some and deletes
        the others on every reconcile, by its CDI mode), optional C(operator_runtimeclasses) (the RuntimeClass names the
        GPU Operator manages in its mode, from P(k3s_gpu.nvidia.gpu_operator_plan#filter)).
    type: list
    elements: dict
    required: true
  node_selector:
    description:
      - >-
        C(scheduling.nodeSelector) on every RuntimeClass, label key to value (strings), such as
        V({"nvidia.com/gpu.present": "true"}). Keys and values are checked by the Kubernetes label rules.
      - Omitted when empty.
    type: dict
  overhead:
    description:
      - >-
        C(overhead.podFixed) on every RuntimeClass, resource to Kubernetes quantity, such as
        V({"cpu": "250m", "memory": "64Mi"}). Omitted when empty.
    type: dict
  select_by_handler_label:
    description:
      - >-
        Each RuntimeClass also selects the nodes labelled C(k3s-gpu.nvidia/handler.<handler>=true), the label the
        gpu_node role gives a node for each handler it serves, so pods land only on nodes that have the handler.
    type: bool
    default: false
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
"""

EXAMPLES = r"""
- name: RuntimeClasses a k3s cluster needs for two GPU nodes
  ansible.builtin.set_fact:
    plan: >-
      {{ {'distribution': 'k3s', 'release': 'v1.33.10+k3s1'}
         | k3s_gpu.nvidia.runtimeclass_plan([{'host': 'gpu1', 'handlers': ['nvidia', 'nvidia-cdi']},
                                             {'host': 'gpu2', 'handlers': ['nvidia', 'nvidia-legacy']}],
                                            node_selector={'nvidia.com/gpu.present': 'true'},
                                            overhead={'cpu': '250m', 'memory': '64Mi'}) }}
  # plan.manifests: nvidia-cdi and nvidia-legacy; plan.skipped: nvidia (k3s ships it)

- name: Write them into the server's auto-deploy directory
  ansible.builtin.copy:
    dest: /var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml
    content: "{{ plan | k3s_gpu.nvidia.runtimeclass_manifest }}"
    mode: "0600"
  when: plan.manifests | length > 0
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    manifests:
      description: RuntimeClass objects to create, sorted by name.
      type: list
      elements: dict
      sample:
        - apiVersion: node.k8s.io/v1
          kind: RuntimeClass
          metadata: {name: nvidia-cdi, labels: {app.kubernetes.io/managed-by: k3s_gpu.nvidia}}
          handler: nvidia-cdi
          overhead: {podFixed: {cpu: 250m, memory: 64Mi}}
          scheduling: {nodeSelector: {nvidia.com/gpu.present: "true"}}
    shipped:
      description: Every RuntimeClass name the release ships itself (NVIDIA or not), sorted; empty when it ships none.
      type: list
      elements: str
      sample: [crun, nvidia, nvidia-experimental]
    skipped:
      description: NVIDIA handlers some node has whose RuntimeClass is not created here, with the reason.
      type: list
      elements: dict
      sample:
        - name: nvidia
          reason: rke2 v1.33.10+rke2r1 ships the RuntimeClass nvidia in its rke2-runtimeclasses chart
    handlers:
      description: Every handler a node reported, with the hosts that have it (sorted).
      type: dict
      sample: {nvidia: [gpu1, gpu2], nvidia-cdi: [gpu1]}
    owners:
      description:
        - For each NVIDIA handler a node reported, who makes its RuntimeClass - the distribution (V(k3s), V(rke2)) when
          its release ships it, V(gpu-operator), or V(k3s_gpu.nvidia) (this plan).
      type: dict
      sample: {nvidia: k3s, nvidia-cdi: gpu-operator, nvidia-legacy: k3s_gpu.nvidia}
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._filter import one_filter


def runtimeclass_plan(cluster, nodes, node_selector=None, overhead=None, select_by_handler_label=False):
    try:
        # a cluster described by its distribution and release (a runtime_info result fits): not a NodeFacts
        return runtimeclasses.plan_runtimeclasses_described(cluster, nodes, node_selector=node_selector, overhead=overhead,
                                                            select_by_handler_label=select_by_handler_label)
    except ValueError as exc:
        raise AnsibleFilterError("runtimeclass_plan: %s" % exc) from exc


FilterModule = one_filter(runtimeclass_plan)
