#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_node_host
short_description: Internal - the k3s_gpu.nvidia.gpu_node role's step on one host
version_added: 1.0.0
description:
  - B(Internal to the role k3s_gpu.nvidia.gpu_node; its options and results may change without notice.) Use the role.
  - Reads the node (M(k3s_gpu.nvidia.runtime_info)), decides what the role does on it, and when nothing has to be
    installed first configures its containerd as M(k3s_gpu.nvidia.containerd_runtimes) does, in one task. The role
    registers the result as C(gpu_node_result).
  - Reads the role's C(gpu_node_*) variables itself, converted by the role's argument spec (so text such as C(false)
    from C(-e) or an INI inventory is a boolean), and warns about a C(gpu_node_*) variable the role does not know.
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
options:
  phase:
    description:
      - V(plan) reads, decides and configures when nothing is due to be installed; V(reread) reads the node again after
        the role's installs and decides whether the CDI spec is due; V(configure) configures from O(node).
      - V(probe) (the k3s_gpu.nvidia.site playbook's first pass) reads and decides as V(plan) does but never writes,
        shows no diff and prints nothing; a host on which the role has work to do (RV(install_due) or
        RV(configure_due)) joins the in-memory group C(k3s_gpu_nvidia_due), as M(ansible.builtin.group_by) would
        add it, so that the rest of the role runs only on those hosts (a host with nothing to do gets no other task).
      - V(restart) (the role's handler) restarts the k3s/rke2/containerd unit, verifies it (active, stable past
        C(gpu_node_restart_settle_seconds), every expected runtime table in the loaded config) and rolls back and fails
        when it is not healthy; it returns C(gpu_node_result) with C(restarted) and C(verified).
      - V(upgrade_check) (the k3s_gpu.nvidia.upgrade_check playbook, in check mode) renders the node's template for
        C(gpu_node_target_release), reports it and fails the node when it breaks there or is refused now (O(fail)).
      - V(doctor) (the k3s_gpu.nvidia.doctor playbook, in check mode) reads the node, plans what the role would do there
        without writing, and returns RV(doctor), the node's layers from the GPU to containerd with the first broken one.
    type: str
    default: plan
    choices: [plan, probe, reread, configure, restart, upgrade_check, doctor]
  fail:
    description: O(phase=upgrade_check) - fail a node whose template breaks on the target release or is refused now.
    type: bool
    default: true
  node:
    description:
      - What the earlier phase read and decided (its RV(node), passed unchanged; its JSON text is decoded here),
        required with O(phase=reread) and O(phase=configure).
    type: dict
seealso:
  - module: k3s_gpu.nvidia.containerd_runtimes
  - module: k3s_gpu.nvidia.runtime_info
"""

EXAMPLES = r"""
# Internal: the role k3s_gpu.nvidia.gpu_node calls it.
- name: Read, decide and configure this host
  k3s_gpu.nvidia.gpu_node_host:
  register: gpu_node_result
"""

RETURN = r"""
status:
  description: V(configured) or V(skipped) (with O(k3s_gpu.nvidia.gpu_node_host#module:phase=plan) on a host without GPU).
  returned: always
  type: str
  sample: configured
node:
  description:
    - What this phase read and decided, for the next phase, the package step, the handler and the cluster step
      (C(facts), the node's reading as M(k3s_gpu.nvidia.runtime_info) returns it; C(plan); C(cdi_marker); C(changes),
      the files the containerd step wrote and the handlers it expects), serialized once as compact JSON text. Internal
      to the role; not part of a failed result.
  returned: success
  type: str
settings:
  description:
    - The role variables the role's task files and the playbooks' cluster step read, as the host step resolved them
      (the user's value, else the default of the role's argument spec), keyed without the C(gpu_node_) prefix - C(root),
      C(cdi_spec_path), C(driver_reboot_timeout_seconds), C(mode), C(driver_install). Never C(proxy_env) (no_log; the
      package step reads it itself).
  returned: success
  type: dict
install_due:
  description: Whether the role installs, removes or generates something before it configures containerd.
  returned: success
  type: bool
  sample: false
configure_due:
  description:
    - Whether containerd's files are still to be written by the role's configure task, which notifies the restart
      handler. True only where a restart can follow (C(gpu_node_root) is C(/), C(gpu_node_restart), not check mode)
      and something changes; elsewhere this task writes them itself and the handler never runs. False where
      C(install_due) is true, because the install tasks configure containerd after they install.
  returned: success
  type: bool
  sample: false
doctor:
  description:
    - O(phase=doctor) - C(host), C(gpu_node), C(passed) (each layer with what it saw), C(broken) (the first broken layer
      with C(cause) and C(fix), or null), C(handlers) and C(labels) the node should have in the cluster.
  returned: when O(phase=doctor)
  type: dict
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_NODE_HOST_REQUIRED_IF as REQUIRED_IF
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_NODE_HOST_SPEC as SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.gpu_node_host runs through its action plugin, inside the role k3s_gpu.nvidia.gpu_node", SPEC, REQUIRED_IF)


if __name__ == "__main__":
    main()
