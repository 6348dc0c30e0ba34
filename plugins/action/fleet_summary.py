# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The summary of k3s_gpu.nvidia.site, built in Python from each host's gpu_node_result (plugin_utils/_summary)."""

from __future__ import annotations

import json
import os
import tempfile

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as cluster_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary


def write_report(report_path, report):
    """The JSON report, whole or not at all (a temporary file renamed over it), readable by its owner only."""
    directory = os.path.dirname(os.path.abspath(report_path))
    try:
        handle, tmp = tempfile.mkstemp(prefix=".k3s-gpu-summary.", dir=directory)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2, sort_keys=True)
            out.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, report_path)
    except OSError as exc:
        raise K3sGpuError("cannot write the summary to %s: %s" % (report_path, exc.strerror or exc),
                          fix="set k3s_gpu_summary_path to a file in a directory the controller's user can write",
                          variable="k3s_gpu_summary_path") from exc


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.FLEET_SUMMARY_SPEC

    def run_validated(self, result, args, task_vars):
        hostvars = task_vars["hostvars"]
        local = role_vars.registered(hostvars, "localhost")
        results, rollouts, failures, left_out, cluster_of = [], {}, {}, {}, {}
        # the rollout's batches, and where the first pass stopped its batches (site's host play)
        planned = (local.get("k3s_gpu__rollout") or {}).get("rollout_hosts") or {}
        halted = local.get("k3s_gpu__batches_halted")
        for cluster in args["clusters"]:
            for host in cluster.get("hosts") or []:
                cluster_of[host] = str(cluster.get("name") or "")
        for host in args["hosts"]:
            found = role_vars.registered(hostvars, host)
            results.append((host, found.get("gpu_node_result")))
            rollouts[host] = summary.rollout_entry(found.get("gpu_node__disruption"), planned.get(host),
                                                   found.get("k3s_gpu__rollout_failure"))
            if found.get("k3s_gpu__host_failure"):
                failures[host] = found["k3s_gpu__host_failure"]
            if isinstance(halted, dict):
                left_out[host] = halted.get("reason") or "the run stopped its batches"
            if host not in cluster_of:
                cluster_of[host] = str(hostvars[host].get("k3s_gpu_cluster") or cluster_step.DEFAULT_CLUSTER) \
                    if host in hostvars else cluster_step.DEFAULT_CLUSTER
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
        check_mode = bool(self._task.check_mode)
        report = summary.summarize(results, check_mode=check_mode, clusters=clusters, rollouts=rollouts,
                                   failures=failures, left_out=left_out, cluster_of=cluster_of)
        if args["report_path"]:
            write_report(args["report_path"], {"hosts": report["hosts"], "clusters": report["clusters"],
                                               "counts": report["counts"], "totals": report["totals"],
                                               "check_mode": check_mode})
        # no rows in the result: its job event (AWX drops one over 700,000 bytes) carries the lines and the totals only
        result.update(changed=False, lines=summary.printed_lines(report), totals_line=report["totals_line"],
                      totals=report["totals"], counts=report["counts"], report_path=args["report_path"],
                      failed_hosts=[entry["host"] for entry in report["hosts"] if entry["status"] in summary.FAILING],
                      failed_clusters=[entry["cluster"] for entry in report["clusters"] if entry["status"] == "failed"])
        return result
