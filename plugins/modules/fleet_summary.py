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
version_added: 1.0.0
description:
  - B(Internal to the playbook k3s_gpu.nvidia.site; its options and results may change without notice.)
  - One row and one line per host from its C(gpu_node_result) - what changed, or would change in check mode, whether a
    restart happened or is still needed, the default runtime and node labels written, and what is pending. Failed,
    unreachable and left-out hosts are rows too. Rows are sorted by cluster, then host; a totals line follows.
  - The rows (the JSON report) are written to O(report_path) on the controller, in check mode too (a report of the run,
    not state of the fleet); the result carries only the lines and the totals, so that its job event stays small.
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
  report_path:
    description: Write the JSON report (hosts, clusters, counts, totals) to this path on the controller (mode 0600). Empty
      writes none.
    type: str
    default: ""
"""

EXAMPLES = r"""
# Internal: k3s_gpu.nvidia.site calls it.
- name: One row per host
  k3s_gpu.nvidia.fleet_summary:
    hosts: "{{ ansible_play_hosts_all }}"
"""

RETURN = r"""
lines:
  description: What to print - one line per host (sorted by cluster, then host), then one per cluster. Past 400,000 bytes
    the hosts with nothing to say are folded into one line per cluster that names them.
  returned: always
  type: list
  elements: str
totals_line:
  description: The totals in one line (hosts ok, changed, failed, unreachable, without a GPU, left out; clusters done and failed).
  returned: always
  type: str
totals:
  description: The same as numbers, with C(per_cluster) counts (what C(set_stats) hands to AWX workflows).
  returned: always
  type: dict
counts:
  description: Hosts per status, and how many changed, would change, need a restart or a reboot, or have a cgroup driver mismatch.
  returned: always
  type: dict
failed_hosts:
  description: The hosts that failed, were unreachable or were left out, for the play that fails them after the report.
  returned: always
  type: list
  elements: str
failed_clusters:
  description: The clusters whose objects were not written (their row says why).
  returned: always
  type: list
  elements: str
report_path:
  description: Where the JSON report was written, or empty.
  returned: always
  type: str
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import FLEET_SUMMARY_SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.fleet_summary runs through its action plugin, inside k3s_gpu.nvidia.site", FLEET_SUMMARY_SPEC)


if __name__ == "__main__":
    main()
