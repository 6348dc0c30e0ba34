#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# the documentation header every module opens with, alike in the doc-only modules (docs/architecture-duplicates.md)
DOCUMENTATION = r"""
module: gpu_doctor
short_description: Internal - the report of the k3s_gpu.nvidia.doctor playbook
version_added: 1.0.0
description:
  - B(Internal to the playbook k3s_gpu.nvidia.doctor; its options and results may change without notice.) Use the playbook.
  - Takes each node's layers (C(k3s_gpu.nvidia.gpu_node_host) O(k3s_gpu.nvidia.gpu_node_host#module:phase=doctor)),
    checks the cluster's layers (RuntimeClass, device plugin, allocatable) for the nodes whose node layers passed, writes
    one line per node and a JSON report, and fails when a node is BROKEN.
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
options:
  phase:
    description:
      - V(choose) - the pod layer's smoke pods (RETURN C(pods), C(pairs)) for the nodes whose other layers passed; on a
        node labelled for DRA, the claim layer's claim pods.
      - V(report) - the lines, the JSON report and the failure; with O(pods), the pod layer from what the pods did.
    type: str
    choices: [choose, report]
    default: report
  results:
    description: Inventory host to its registered result of the doctor phase.
    type: dict
    required: true
  node_names:
    description: Inventory host to its node's name in Kubernetes (empty - the host's name).
    type: dict
    default: {}
  cluster:
    description:
      - The cluster's RuntimeClasses, Nodes and the pods that have not ended (C(classes), C(nodes), C(pods)); for DRA
        nodes also whether C(resource.k8s.io/v1) is served (C(dra_api)), its ResourceSlices and DeviceClasses
        (C(resourceslices), C(deviceclasses)).
    type: dict
  cluster_why:
    description: Why the cluster was not read, for the nodes' lines.
    type: str
    default: no cluster
  report_path:
    description: Where the JSON report goes on the controller (default C(k3s-gpu-doctor-<time>.json) in the current directory).
    type: path
  fail:
    description: Fail when a node is BROKEN.
    type: bool
    default: true
  namespace:
    description: The namespace of the pod layer's smoke pods.
    type: str
    default: k3s-gpu-doctor
  image:
    description: The smoke pods' image (it needs only C(sh) and C(ls); the toolkit mounts C(nvidia-smi)).
    type: str
    default: docker.io/library/ubuntu:24.04
  runtimeclasses:
    description: V(choose) - only these RuntimeClasses (empty - the class of each handler the node serves).
    type: list
    elements: str
    default: []
  pods:
    description: The smoke pods as they ended (C(k3s_gpu.nvidia.gpu_verify) O(k3s_gpu.nvidia.gpu_verify#module:phase=wait)); omitted - no pod layer.
    type: list
    elements: dict
  events:
    description: The events of the smoke pods' namespace.
    type: list
    elements: dict
    default: []
  logs:
    description: The registered results of C(kubernetes.core.k8s_log) for the smoke pods.
    type: list
    elements: dict
    default: []
  claims:
    description: The ResourceClaims of the claim pods, read while they ran (C(k3s_gpu.nvidia.gpu_verify)'s wait), for
      the claim layer of the DRA nodes.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
# Internal: the k3s_gpu.nvidia.doctor playbook calls it.
- name: Report
  k3s_gpu.nvidia.gpu_doctor:
    results: "{{ dict(groups['all'] | zip(groups['all'] | map('extract', hostvars) | map(attribute='doctor__node', default={}) | list)) }}"
"""

RETURN = r"""
lines:
  description: "One line per node: C(<host>: OK) or C(<host>: BROKEN at <layer>: <cause>. Fix: <fix>)."
  returned: success
  type: list
  elements: str
passed:
  description: Per node, the layers that passed and what each saw.
  returned: success
  type: list
  elements: str
broken:
  description: The hosts that are BROKEN.
  returned: success
  type: list
  elements: str
report_path:
  description: The JSON report written on the controller.
  returned: success
  type: str
nodes:
  description: The report of each node (the JSON report's C(nodes)).
  returned: success
  type: list
  elements: dict
pairs:
  description: V(choose) - C([node, RuntimeClass]) of each smoke pod.
  returned: success
  type: list
  elements: list
pods:
  description: V(choose) - the smoke pods' manifests (on a DRA node, claim pods, with a claim of C(claim_templates)).
  returned: success
  type: list
  elements: dict
claim_templates:
  description: V(choose) - the ResourceClaimTemplate of the claim pods, where there is any.
  returned: success
  type: list
  elements: dict
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_DOCTOR_SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.gpu_doctor runs through its action plugin, inside k3s_gpu.nvidia.doctor", GPU_DOCTOR_SPEC)


if __name__ == "__main__":
    main()
