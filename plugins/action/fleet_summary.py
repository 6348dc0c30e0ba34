# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The summary of k3s_gpu.nvidia.site, built in Python from each host's gpu_node_result (plugin_utils/_summary)."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.FLEET_SUMMARY_SPEC

    def run_validated(self, result, args, task_vars):
        hostvars = task_vars["hostvars"]
        results = [(host, role_vars.registered(hostvars, host).get("gpu_node_result")) for host in args["hosts"]]
        # the rollout: each host's classification and rescued failure, and the batches planned on localhost
        planned = (role_vars.registered(hostvars, "localhost").get("k3s_gpu__rollout") or {}).get("rollout_hosts") or {}
        rollouts = {}
        for host in args["hosts"]:
            found = role_vars.registered(hostvars, host)
            rollouts[host] = summary.rollout_entry(found.get("gpu_node__disruption"), planned.get(host),
                                                   found.get("k3s_gpu__rollout_failure"))
        # each cluster's result is registered on the host that wrote it (its leader in the cluster play); an unchanged
        # cluster had no writer, and its plan entry holds the decision
        clusters = []
        for cluster in args["clusters"]:
            if isinstance(cluster.get("result"), dict):
                clusters.append(cluster["result"])
                continue
            leader = cluster.get("leader")
            found = role_vars.registered(hostvars, leader).get("k3s_gpu__cluster_result") if leader else None
            clusters.append(found if isinstance(found, dict) and "skipped" not in found else dict(
                failed=True, item=cluster, msg="not written: no host of cluster %s was left in the play" % cluster.get("name")))
        result.update(summary.summarize(results, check_mode=bool(self._task.check_mode), clusters=clusters, rollouts=rollouts),
                      changed=False)
        result["msg"] = result["lines"]
        return result
