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
version_added: 1.0.0
description:
  - B(Internal to the playbook k3s_gpu.nvidia.verify; its options and results may change without notice.) Use the playbook.
  - V(choose) picks the NVIDIA RuntimeClasses and the nodes that advertise C(nvidia.com/gpu) from the API's objects, says
    what is broken before a pod runs (a RuntimeClass that does not exist, a GPU-labelled node without C(nvidia.com/gpu)),
    and fails, saying what to run, when there is nothing to test. With O(kubeconfig) it reads the RuntimeClasses and
    Nodes itself with C(kubernetes.core.k8s_info) (O(classes) and O(nodes) are not used).
  - With O(kubeconfig) (V(choose), V(wait)), before the first read, the kubeconfig is checked on the controller (the file
    is a kubeconfig whose current context names a cluster; its API server is reachable and presents a certificate the
    kubeconfig trusts, valid now and for its address) and C(kubernetes.core) is looked for. Any of them, or a read that
    fails, fails the task with one line that names the kubeconfig, what is wrong and the fix, quoting nothing of the
    file.
  - V(wait) polls the smoke pods and their events with C(kubernetes.core.k8s_info) until each pod has ended, or is stuck
    where kubelet only retries (its sandbox, its container, its image, the scheduler), or O(timeout) has passed.
  - V(report) makes one line per node and RuntimeClass, C(OK) with the node's allocatable C(nvidia.com/gpu) and the
    C(nvidia-smi -L) lines, or C(BROKEN at <layer>) with the cause and the fix, and fails when anything did not pass.
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
options:
  phase:
    description:
      - V(connect) only checks O(kubeconfig) (a kubeconfig whose API server answers with a certificate it trusts) and
        that kubernetes.core is installed, and fails with one line saying what is wrong and the fix (the doctor's check
        before it reads the cluster); V(choose), V(wait) or V(report) as above.
    type: str
    default: choose
    choices: [connect, choose, wait, report]
  classes:
    description: V(choose) - the RuntimeClass objects of the cluster.
    type: list
    elements: dict
    default: []
  nodes:
    description: V(choose) - the Node objects of the cluster.
    type: list
    elements: dict
    default: []
  wanted:
    description:
      - V(choose) - the RuntimeClasses to test; one that does not exist is broken.
      - Empty - C(nvidia) and every class whose handler starts with C(nvidia), each on the nodes whose handler labels
        (C(k3s-gpu.nvidia/handler.<handler>)) name its handler, or on every GPU node when a node has no such label.
    type: list
    elements: str
    default: []
  namespace:
    description: The namespace of the smoke pods.
    type: str
    default: k3s-gpu-verify
  kubeconfig:
    description:
      - The kubeconfig C(kubernetes.core.k8s_info) reads the cluster with - V(choose) the RuntimeClasses and Nodes,
        V(wait) the pods and events; checked before the first read.
      - C(K8S_AUTH_CONTEXT) in the environment chooses its context; with C(K8S_AUTH_PROXY), or a C(proxy-url) in the
        cluster, its server is not connected to by the check.
    type: str
  timeout:
    description: V(wait) - seconds to wait for the pods at most.
    type: int
    default: 300
  events:
    description: V(report) - the events of the smoke pods' namespace (the result of V(wait)).
    type: list
    elements: dict
    default: []
  problems:
    description: V(report) - what V(choose) found broken before the pods ran.
    type: list
    elements: dict
    default: []
  notes:
    description: V(report) - what V(choose) left untested, and why (they do not fail the report).
    type: list
    elements: str
    default: []
  image:
    description: V(choose) - the smoke pods' image (needs only C(sh) and C(ls); the toolkit mounts C(nvidia-smi) and the libraries).
    type: str
    default: docker.io/library/ubuntu:24.04
  pods:
    description: V(report) - the smoke pods (the result of V(wait)).
    type: list
    elements: dict
    default: []
  logs:
    description: V(report) - the results of reading each pod's log (C(kubernetes.core.k8s_log) loop results).
    type: list
    elements: dict
    default: []
  expected:
    description: V(wait), V(report) - how many pods were started.
    type: int
    default: 0
  allocatable:
    description: V(report) - node name to its allocatable C(nvidia.com/gpu).
    type: dict
    default: {}
  dra:
    description:
      - V(choose) without O(kubeconfig) - what the cluster has of DRA for the nodes labelled
        C(k3s-gpu.nvidia/gpu-allocation=dra) - C(dra_api) (C(resource.k8s.io/v1) served), C(resourceslices) and
        C(deviceclasses); with O(kubeconfig) they are read where such a node exists.
    type: dict
    default: {}
  claims:
    description: V(report) - the ResourceClaims of the smoke pods' namespace (the result of V(wait)), for the claim pods'
      allocations.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
# Internal: the k3s_gpu.nvidia.verify playbook calls it.
- name: Check the kubeconfig, read the RuntimeClasses and nodes through it, choose the classes and GPU nodes
  k3s_gpu.nvidia.gpu_verify:
    kubeconfig: /home/admin/.kube/k3s.yaml
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
claim_templates:
  description: V(choose) - the ResourceClaimTemplate (one device of DeviceClass C(gpu.nvidia.com)) the claim pods ask
    for, where a node labelled for DRA passed its DRA layers; empty otherwise.
  returned: success
  type: list
  elements: dict
claims:
  description: V(wait) - the ResourceClaims of the namespace when the wait ended (where any pod has a claim).
  returned: success
  type: list
  elements: dict
pods:
  description:
    - V(choose) - the smoke pods, one per GPU node and RuntimeClass, placed on the node by node affinity, with
      O(image) and the RuntimeClass, asking for one C(nvidia.com/gpu), looking for C(/dev/nvidia<N>),
      C(libnvidia-ml.so) and C(nvidia-smi), then running C(nvidia-smi -L). On a node labelled for DRA, one claim pod
      per RuntimeClass the node serves and one without a RuntimeClass, each with a claim of O(namespace)'s
      ResourceClaimTemplate instead of the C(nvidia.com/gpu) limit; on Kubernetes 1.36 also the C(nvidia) pod with
      one C(nvidia.com/gpu), which DRA serves there.
    - V(wait) - the smoke pods as the API has them when the wait ended.
  returned: success
  type: list
  elements: dict
problems:
  description: V(choose) - what is broken before a pod runs, each with scope, layer, cause and fix.
  returned: success
  type: list
  elements: dict
events:
  description: V(wait) - the events of the smoke pods' namespace.
  returned: success
  type: list
  elements: dict
lines:
  description:
    - V(choose) - the problems and notes, one line each.
    - "V(report) - the problems and notes, then one line per pod, C(<node> / <class>) followed by C(OK | ...) or
      C(BROKEN at <layer>: <cause>. Fix: <fix>)."
  returned: success
  type: list
  elements: str
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_VERIFY_SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.gpu_verify runs through its action plugin, inside k3s_gpu.nvidia.verify", GPU_VERIFY_SPEC)


if __name__ == "__main__":
    main()
