# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action plugin for k3s_gpu.nvidia.containerd_runtimes: facts from the node in one round trip (none when the
play hands over a fitting runtime_info result), TOML decisions on the controller, and every file that changes
written in one k3s_gpu.nvidia.node_files execution, each only if it is still the text the decision was made from."""

from __future__ import annotations

import os

from ansible import constants as C
from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS
from ansible.plugins.action import ActionBase

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _changes as changes_engine
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _check_cache as check_cache
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _toml as toml


class ActionModule(ActionBase):

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        spec = dict(CONTAINERD_RUNTIMES_SPEC)
        spec.update((k, v) for k, v in FILE_COMMON_ARGUMENTS.items() if k in changes_engine.FILE_ARGS)
        _validation, params = self.validate_argument_spec(argument_spec=spec)
        try:
            return self._run(result, params, task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def _run(self, result, params, task_vars):
        binaries = sorted(set(r["binary"] for r in params["runtimes"] or [] if r.get("binary")))
        facts = changes_engine.given_facts(params, binaries)
        if facts is not None and (facts.get("read_options") or {}).get("newer_release", "refuse") != params["newer_release"]:
            facts = None  # read with another newer_release policy: the profile may be refused or assumed differently
        result["facts_source"] = "node_facts" if facts is not None else "read"
        if facts is None:
            facts = self._execute_module(
                module_name="k3s_gpu.nvidia.runtime_info",
                module_args=dict(root=params["root"], distribution=params["distribution"], release=params["release"],
                                 data_dir=params["data_dir"], toolkit_dirs=params["toolkit_dirs"], path=params["path"],
                                 newer_release=params["newer_release"],
                                 binaries=[b for b in binaries if b.startswith("/")], include_content=True),
                task_vars=task_vars)
            if facts.get("failed"):
                result.update(failed=True, msg=facts.get("msg"))
                return result
            # the reading's warnings become this task's (ansible-core 2.19+ hands them over as WarningSummary
            # objects, which Display.warning does not take; the task result's `warnings` takes both)
            result.setdefault("warnings", []).extend(facts.get("warnings") or [])
        elif facts["profile"].get("assumed_warning"):
            result.setdefault("warnings", []).append(facts["profile"]["assumed_warning"])  # this task writes on it too
        for binary in binaries:
            facts["binaries"].setdefault(binary, {"path": binary, "state": "relative"})
        # hosts of one run share the template checks' verdicts (the run's local temporary directory)
        params["_check_cache"] = check_cache.CheckCache(os.path.join(C.DEFAULT_LOCAL_TMP, "k3s-gpu-template-checks"))
        try:
            plan, changes = changes_engine.compute(facts, params)
        except (planner.PlanError, toml.TomlEditError) as exc:
            result.update(failed=True, msg=str(exc), changed=False)
            return result
        result.update(changes_engine.result_fields(facts, plan))
        if plan.get("warnings"):
            result.setdefault("warnings", []).extend(plan["warnings"])  # after the reading's (newer_release) ones
        result["changed"] = bool(changes)
        result["files"] = [{"path": c["path"], "node_path": c["node_path"], "backup_file": None,
                            "action": "removed" if c["after"] is None else "updated" if c["exists"] else "created"}
                           for c in changes]
        if self._task.diff and changes:
            result["diff"] = [dict(before=c["before"] or "", after=c["after"] or "", before_header=c["path"],
                                   after_header=c["path"]) for c in changes]
        params["validate"] = changes_engine.node_validate(facts, params)
        entries = [changes_engine.write_entry(change, params) for change in changes]
        entries += changes_engine.attribute_entries(facts, plan, changes, params)
        if not entries:
            return result
        written = self._execute_module(module_name="k3s_gpu.nvidia.node_files", module_args=dict(files=entries),
                                       task_vars=task_vars)
        outcomes = written.get("files") or []
        for entry, outcome in zip(result["files"], outcomes):
            entry["backup_file"] = outcome.get("backup_file")
        if any(o.get("action") == "attributes" for o in outcomes[len(changes):]):
            result["changed"] = True
        if written.get("failed"):
            # files applied before the failure stay applied; report exactly those
            result.update(failed=True, changed=bool(outcomes), files=result["files"][:len(outcomes)],
                          msg="writing the containerd files failed: %s" % written.get("msg"))
        return result
