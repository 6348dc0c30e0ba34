#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# the documentation header every module opens with, alike in the doc-only modules (docs/architecture-duplicates.md)
DOCUMENTATION = r"""
module: fleet_summary
short_description: Internal - the summary of the k3s_gpu.nvidia.site playbook
version_added: 0.2.0
description:
  - B(Internal to the playbook k3s_gpu.nvidia.site; its options and results may change without notice.)
  - One row and one line per host from its C(gpu_node_result) - what changed, or would change in check mode, whether a
    restart happened or is still needed, the default runtime and node labels written, and what is pending.
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
attributes:
  diff_mode:
    support: none
options:
  hosts:
    description: The hosts to summarize, in order.
    type: list
    elements: str
    required: true
  clusters:
    description: The results of the cluster step (one per cluster), for one row per cluster.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
# Internal: k3s_gpu.nvidia.site calls it.
- name: One row per host
  k3s_gpu.nvidia.fleet_summary:
    hosts: "{{ ansible_play_hosts_all }}"
"""

RETURN = r"""
hosts:
  description: One row per host (status, reason, release, handlers, what was written, changed or would_change, restarted,
    restart_needed, default_runtime, node_labels, files, mode, pending, reboot_required, runtime_in_use, cgroup_driver_mismatch).
  returned: always
  type: list
  elements: dict
clusters:
  description: One row per cluster (cluster, writer, status, complete, gpu_operator, runtimeclasses, files, changed or would_change).
  returned: always
  type: list
  elements: dict
lines:
  description: The same as one line per host, then one per cluster.
  returned: always
  type: list
  elements: str
counts:
  description: Hosts per status, and how many changed, would change, need a restart or a reboot, or have a cgroup driver mismatch.
  returned: always
  type: dict
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import FLEET_SUMMARY_SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.fleet_summary runs through its action plugin, inside k3s_gpu.nvidia.site", FLEET_SUMMARY_SPEC)


if __name__ == "__main__":
    main()
