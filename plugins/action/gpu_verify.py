# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions, on the controller: `phase: choose` picks the RuntimeClasses and GPU nodes from the
API's objects (and refuses a cluster with nothing to test), `phase: report` turns the pods and their logs into one line
per node and RuntimeClass and fails when a pod did not pass. The rules are in plugin_utils/_verify.py."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _verify as verify


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("phase", "classes", "nodes", "wanted", "namespace", "image", "pods", "logs", "expected",
                             "allocatable"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        result["changed"] = False
        if args.get("phase", "choose") == "choose":
            chosen = verify.choose(args.get("classes"), args.get("nodes"), args.get("wanted") or ())
            result.update(chosen)
            result["pods"] = verify.smoke_pods(chosen, args.get("namespace") or "k3s-gpu-verify",
                                               args.get("image") or "docker.io/library/ubuntu:24.04")
            message = verify.refusal(chosen)
            if message:
                result.update(failed=True, msg=message)
            return result
        logs = [{"name": (entry.get("item") or {}).get("metadata", {}).get("name"), "lines": entry.get("log_lines") or []}
                for entry in args.get("logs") or []]
        reported = verify.report(args.get("pods"), logs, int(args.get("expected") or 0), args.get("allocatable") or {})
        result.update(lines=reported["lines"], failed_pods=reported["failed"], msg=reported["lines"])
        if reported["failed"]:
            result.update(failed=True, msg=reported["lines"] + ["GPU smoke test failed for %s" % ", ".join(reported["failed"])])
        return result
