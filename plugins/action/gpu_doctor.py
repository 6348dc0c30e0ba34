# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The doctor playbook's report, on the controller: the node layers each host found (gpu_node_host phase doctor),
the cluster's layers for the nodes whose node layers passed, one line per node, the layers that passed, a JSON report,
and a failed task when a node is BROKEN (unless fail is false). The rules are in plugin_utils/diagnosis/_doctor.py."""

from __future__ import annotations

import json
import os
import time

from ansible.errors import AnsibleActionFail

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _doctor as doctor
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_DOCTOR_SPEC

    def run_validated(self, result, args, task_vars):
        reports = self._reports(args)
        names = args["node_names"] or {}
        if args["phase"] == "choose":
            cluster = args["cluster"] or {}
            chosen = {"pairs": doctor.pod_pairs(reports, names, cluster, args["runtimeclasses"]),
                      "claim_pairs": doctor.claim_pairs(reports, names, cluster, args["runtimeclasses"])}
            result.update(changed=False, pairs=chosen["pairs"] + chosen["claim_pairs"],
                          pods=verify.smoke_pods(chosen, args["namespace"], args["image"]),
                          claim_templates=verify.claim_templates(chosen, args["namespace"]))
            return result
        if args["pods"] is not None:
            logs = dict(((entry.get("item") or {}).get("metadata", {}).get("name"), entry.get("log_lines") or [])
                        for entry in args["logs"])
            for report in reports:
                doctor.check_pods(report, names.get(report["host"]) or report["host"], args["pods"], args["events"], logs,
                                  args["claims"])
        for report in reports:
            report["status"] = "BROKEN" if report.get("broken") else "OK" if report.get("gpu_node") else "no GPU"
            report["broken_layer"] = (report.get("broken") or {}).get("layer")
        lines = [doctor.line(r) for r in reports]
        passed = ["%s: passed %s" % (r["host"], "; ".join("%s (%s)" % (p["layer"], p["detail"]) for p in r["passed"]))
                  for r in reports if r.get("gpu_node") and r["passed"]]
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = args.get("report_path") or os.path.abspath("k3s-gpu-doctor-%s.json" % stamp)
        document = {"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "layers": list(doctor.LAYERS),
                    "nodes": reports, "broken": sorted(r["host"] for r in reports if r.get("broken"))}
        try:
            tmp_path = path + ".tmp"
            with open(tmp_path, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=2, sort_keys=True)
            os.chmod(tmp_path, 0o600)
            os.replace(tmp_path, path)
        except OSError as exc:
            raise AnsibleActionFail("doctor_report_path %s: cannot write the report: %s" % (path, exc))
        result.update(changed=False, lines=lines, passed=passed, report_path=path, nodes=reports, broken=document["broken"],
                      msg=lines + passed + ["report: %s" % path])
        if document["broken"] and args["fail"]:
            result.update(failed=True)
        return result

    @staticmethod
    def _reports(args):
        """Each host's node layers as its doctor phase found them, then the cluster's layers where a cluster was read."""
        reports = []
        for host, registered in sorted((args["results"] or {}).items()):
            if not isinstance(registered, dict) or not registered:
                continue  # not among the doctor's hosts
            report = registered.get("doctor")
            if not isinstance(report, dict):
                why = "unreachable" if registered.get("unreachable") else str(registered.get("msg") or "no result")
                report = doctor.unread(host, why)
            if args.get("cluster") is not None:
                doctor.check_cluster(report, (args["node_names"] or {}).get(host) or host, args["cluster"])
            else:
                report["cluster_why"] = args["cluster_why"].strip()
            reports.append(report)
        return reports
