# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_node_mode_plan
short_description: Decide what the gpu_node role does on one node in host or operator mode
version_added: 0.1.0
description:
  - From a node's M(k3s_gpu.nvidia.runtime_info) result, decides whether the role installs the host toolkit, removes it
    (operator mode), installs the driver, generates CDI specs, and whether the default runtime can be set yet.
  - Refuses, with the fix, every state where two owners would manage one thing - two toolkits on one node (the GPU
    Operator's in C(/usr/local/nvidia/toolkit) and the host's), the operator's driver and the role's, and stale operator
    files when the operator's toolkit is off. C(remove_operator_leftovers) lets host mode take back a node whose GPU
    Operator was uninstalled (its toolkit container leaves C(/usr/local/nvidia/toolkit) behind).
positional: _input, mode
options:
  _input:
    description: The node's M(k3s_gpu.nvidia.runtime_info) result.
    type: dict
    required: true
  mode:
    description: V(host) (the role installs the toolkit) or V(operator) (NVIDIA's GPU Operator does).
    type: str
    required: true
  operator_toolkit:
    description: Whether the cluster's GPU Operator installs its toolkit.
    type: bool
    default: true
  operator_driver:
    description: Whether the cluster's GPU Operator installs its driver.
    type: bool
    default: false
  toolkit_install:
    description: The role's C(gpu_node_toolkit_install).
    type: bool
    default: true
  driver_install:
    description: The role's C(gpu_node_driver_install).
    type: bool
    default: false
  default_runtime:
    description: The role's C(gpu_node_default_runtime).
    type: str
    default: ""
  live:
    description: Whether the role works on the real root (packages and files of the machine may be touched).
    type: bool
    default: true
  remove_operator_leftovers:
    description: In host mode, remove the files an uninstalled GPU Operator left in C(/usr/local/nvidia/toolkit).
    type: bool
    default: false
  host:
    description: The inventory hostname, for the messages.
    type: str
    default: ""
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
"""

EXAMPLES = r"""
- name: Decide the node's plan
  ansible.builtin.set_fact:
    mode_plan: "{{ info | k3s_gpu.nvidia.gpu_node_mode_plan('operator', host=inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: >-
    C(mode), C(install_toolkit), C(remove_host_toolkit), C(remove_operator_leftovers), C(install_driver), C(generate_cdi),
    C(default_runtime) (empty while it must wait for the operator), C(pending) (messages), C(owners) (runtime -> owner),
    C(operator_handlers) (the node's runtimes that run the operator's binaries; each is the handler of the RuntimeClass
    of the same name).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _gpu_operator as gpu_operator


def gpu_node_mode_plan(info, mode, **kwargs):
    try:
        return gpu_operator.plan_node(info, mode, **kwargs)
    except (ValueError, KeyError, TypeError) as exc:
        raise AnsibleFilterError("gpu_node_mode_plan: %s" % exc) from exc


class FilterModule:
    def filters(self):
        return {"gpu_node_mode_plan": gpu_node_mode_plan}
