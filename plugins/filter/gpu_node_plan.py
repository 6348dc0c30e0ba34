# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_node_plan
short_description: The gpu_node role's first decision about a host, in one call
version_added: 0.1.0
description:
  - From a host's M(k3s_gpu.nvidia.runtime_info) result and the role's settings, decides whether the role configures the
    host (a GPU on the PCI bus or a loaded driver, or C(force)), whether it works on the real root, the mode plan (what
    host or operator mode installs, removes or leaves to the GPU Operator, and whether the default runtime can be set
    yet), the messages to show, and the skeleton of C(gpu_node_result).
  - C(remove_operator_leftovers) lets host mode take back a node whose GPU Operator was uninstalled (its toolkit container
    leaves C(/usr/local/nvidia/toolkit) behind).
  - One call instead of one template per decision - on a fleet every templated expression is paid per host.
  - Fails the host before anything is installed when the containerd template k3s/rke2 reads would break once the
    toolkit install makes k3s detect C(nvidia) and C(nvidia-cdi), or cannot be rendered at all (see the outcome table
    in docs/template-outcomes.md); the message names the file, the line, the cause and the fix.
  - Fails the host, with the fix, for a release known to break with NVIDIA runtimes, a driver install whose reboot policy
    could reboot the machine that runs Ansible (local connection), and two owners of one thing on one node - the GPU
    Operator's toolkit and the host's, the operator's driver and the role's, stale operator files while its toolkit is off.
positional: _input, settings
options:
  _input:
    description: The host's M(k3s_gpu.nvidia.runtime_info) result.
    type: dict
    required: true
  settings:
    description:
      - C(force), C(root), C(mode), C(operator_toolkit), C(operator_driver) (V(auto) or bool), C(toolkit_install),
        C(driver_install), C(driver_reboot), C(default_runtime), C(remove_operator_leftovers), C(local_connection) - the
        role's C(gpu_node_*) variables of the same meaning.
    type: dict
    required: true
  host:
    description: The inventory hostname, for the messages.
    type: str
    default: ""
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
"""

EXAMPLES = r"""
- name: Decide about this host
  ansible.builtin.set_fact:
    node_plan: "{{ info | k3s_gpu.nvidia.gpu_node_plan(settings, host=inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: >-
    C(selected), C(live), C(messages), C(result), and C(mode) (empty when not selected) - C(install_toolkit),
    C(remove_host_toolkit), C(remove_operator_leftovers), C(install_driver), C(generate_cdi), C(default_runtime) (empty
    while it must wait for the operator), C(pending), C(owners) (runtime -> owner), C(operator_handlers).
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _changes as changes


def gpu_node_plan(info, settings, host=""):
    try:
        plan = gpu_operator.plan_host(info, settings, host=host)
    except (ValueError, KeyError, TypeError) as exc:
        raise AnsibleFilterError("gpu_node_plan: %s" % exc) from exc
    if plan.get("selected") and (plan.get("mode") or {}).get("install_toolkit"):
        # the install makes k3s detect nvidia/nvidia-cdi at its next start: a template that breaks then
        # is refused now, before a package is installed
        refusal = changes.refusal_before_install(info)
        if refusal:
            raise AnsibleFilterError("%s: the NVIDIA toolkit is not installed, because %s" % (host or "this host", refusal))
    return plan


class FilterModule:
    def filters(self):
        return {"gpu_node_plan": gpu_node_plan}
