#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_verify
short_description: Internal - the decisions of the k3s_gpu.nvidia.verify playbook
version_added: 0.2.0
description:
  - B(Internal to the playbook k3s_gpu.nvidia.verify; its options and results may change without notice.) Use the playbook.
  - V(choose) picks the NVIDIA RuntimeClasses and the nodes that advertise C(nvidia.com/gpu) from the API's objects, and
    fails, saying what to run, when there is nothing to test.
  - V(report) makes one line per node and RuntimeClass (the pod's phase, the node's allocatable C(nvidia.com/gpu), the
    C(nvidia-smi -L) line) and fails when a pod did not succeed.
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - k3s_gpu.nvidia.action_attributes
options:
  phase:
    description: V(choose) or V(report).
    type: str
    default: choose
    choices: [choose, report]
  classes:
    description: V(choose) - the RuntimeClass objects of the cluster.
    type: list
    elements: dict
  nodes:
    description: V(choose) - the Node objects of the cluster.
    type: list
    elements: dict
  wanted:
    description: V(choose) - the RuntimeClasses to test (empty - every one whose handler starts with C(nvidia)).
    type: list
    elements: str
  namespace:
    description: V(choose) - the namespace of the smoke pods.
    type: str
    default: k3s-gpu-verify
  image:
    description: V(choose) - the smoke pods' image (needs only C(sh) and C(ls); the toolkit mounts C(nvidia-smi) and the libraries).
    type: str
    default: docker.io/library/ubuntu:24.04
  pods:
    description: V(report) - the smoke pods.
    type: list
    elements: dict
  logs:
    description: V(report) - the results of reading each pod's log (C(kubernetes.core.k8s_log) loop results).
    type: list
    elements: dict
  expected:
    description: V(report) - how many pods were started.
    type: int
  allocatable:
    description: V(report) - node name to its allocatable C(nvidia.com/gpu).
    type: dict
"""

EXAMPLES = r"""
# Internal: the k3s_gpu.nvidia.verify playbook calls it.
- name: Choose the RuntimeClasses and the GPU nodes
  k3s_gpu.nvidia.gpu_verify:
    classes: "{{ classes.resources }}"
    nodes: "{{ nodes.resources }}"
  register: chosen
"""

RETURN = r"""
runtimeclasses:
  description: V(choose) - the RuntimeClasses tested.
  returned: success
  type: list
  elements: str
gpu_nodes:
  description: V(choose) - the nodes that advertise C(nvidia.com/gpu).
  returned: success
  type: list
  elements: str
allocatable:
  description: V(choose) - node name to its allocatable C(nvidia.com/gpu) (time-slicing and MPS replicas included).
  returned: success
  type: dict
pods:
  description:
    - V(choose) - the smoke pods, one per GPU node and RuntimeClass, pinned to the node, with O(image) and the
      RuntimeClass, asking for one C(nvidia.com/gpu), running C(ls /dev/nvidia*), a look for C(libnvidia-ml.so) and
      C(nvidia-smi -L).
  returned: success
  type: list
  elements: dict
lines:
  description: V(report) - one line per pod.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec=dict(
        phase=dict(type="str", default="choose", choices=["choose", "report"]), classes=dict(type="list", elements="dict"),
        nodes=dict(type="list", elements="dict"), wanted=dict(type="list", elements="str"),
        namespace=dict(type="str", default="k3s-gpu-verify"), image=dict(type="str", default="docker.io/library/ubuntu:24.04"),
        pods=dict(type="list", elements="dict"), logs=dict(type="list", elements="dict"), expected=dict(type="int"),
        allocatable=dict(type="dict")), supports_check_mode=True)
    module.fail_json(msg="k3s_gpu.nvidia.gpu_verify runs through its action plugin, inside k3s_gpu.nvidia.verify")


if __name__ == "__main__":
    main()
