# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action plugin for k3s_gpu.nvidia.containerd_runtimes: facts from the node in one round trip,
TOML decisions on the controller, writes through ansible.builtin.copy only when something changes."""

from __future__ import annotations

import posixpath
import time

from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS
from ansible.plugins.action import ActionBase

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _changes as changes_engine
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _toml as toml

NEW_FILE_MODE = "0600"
NEW_DIR_MODE = "0700"
_NOT_FILE_ARGS = ("src", "follow", "force", "content", "backup", "remote_src", "regexp", "delimiter", "directory_mode")
_FILE_ARGS = tuple(k for k in FILE_COMMON_ARGUMENTS if k not in _NOT_FILE_ARGS)


class ActionModule(ActionBase):

    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        spec = dict(CONTAINERD_RUNTIMES_SPEC)
        spec.update((k, v) for k, v in FILE_COMMON_ARGUMENTS.items() if k in _FILE_ARGS)
        _validation, params = self.validate_argument_spec(argument_spec=spec)
        try:
            return self._run(result, params, task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def _run(self, result, params, task_vars):
        binaries = sorted(set(r["binary"] for r in params["runtimes"] or [] if r.get("binary")))
        facts = self._execute_module(
            module_name="k3s_gpu.nvidia.runtime_info",
            module_args=dict(root=params["root"], distribution=params["distribution"], release=params["release"],
                             data_dir=params["data_dir"], toolkit_dirs=params["toolkit_dirs"], path=params["path"],
                             binaries=[b for b in binaries if b.startswith("/")], include_content=True),
            task_vars=task_vars)
        if facts.get("failed"):
            result.update(failed=True, msg=facts.get("msg"))
            return result
        for warning in facts.get("warnings") or []:
            self._display.warning(warning)
        for binary in binaries:
            facts["binaries"].setdefault(binary, {"path": binary, "state": "relative"})
        try:
            plan, changes = changes_engine.compute(facts, params)
        except (planner.PlanError, toml.TomlEditError) as exc:
            result.update(failed=True, msg=str(exc), changed=False)
            return result
        result.update(changes_engine.result_fields(facts, plan))
        result["changed"] = bool(changes)
        result["files"] = []
        if self._task.diff and changes:
            result["diff"] = [dict(before=c["before"] or "", after=c["after"] or "", before_header=c["path"],
                                   after_header=c["path"]) for c in changes]
        for change in changes:
            entry = {"path": change["path"], "node_path": change["node_path"], "backup_file": None,
                     "action": "removed" if change["after"] is None else "updated" if change["exists"] else "created"}
            result["files"].append(entry)
            if self._task.check_mode:
                continue
            outcome = self._apply(change, params, task_vars)
            if outcome.get("failed"):
                # files written before this one stay written; report exactly that
                written = list(result["files"][:-1])
                result.update(failed=True, changed=bool(written), files=written,
                              msg="writing %s failed: %s" % (change["path"], outcome.get("msg")))
                return result
            entry["backup_file"] = outcome.get("backup_file")
        if any(params.get(k) is not None for k in _FILE_ARGS if k != "unsafe_writes"):
            self._apply_attributes(result, facts, plan, changes, params, task_vars)
        return result

    def _apply_attributes(self, result, facts, plan, changes, params, task_vars):
        """owner/group/mode/SELinux on the target even when its text is already right."""
        target_path = changes_engine.host_path(facts["root"], plan["target"]["path"])
        touched = [c for c in changes if c["path"] == target_path]
        if touched and touched[0]["after"] is None:
            return
        if not touched and (facts["files"].get(plan["target"]["key"]) or {}).get("state") != "file":
            return
        args = dict((k, params[k]) for k in _FILE_ARGS if params.get(k) is not None)
        args.update(path=target_path, state="file")
        outcome = self._execute_module(module_name="ansible.legacy.file", module_args=args, task_vars=task_vars)
        if outcome.get("failed"):
            result.update(failed=True, msg="setting attributes of %s failed: %s" % (target_path, outcome.get("msg")))
        elif outcome.get("changed"):
            result["changed"] = True

    def _apply(self, change, params, task_vars):
        if change["after"] is None:
            if params["backup"]:
                backup = "%s.%s~" % (change["path"], time.strftime("%Y-%m-%d@%H:%M:%S"))
                copied = self._execute_module(module_name="ansible.legacy.copy", task_vars=task_vars, module_args=dict(
                    src=change["path"], dest=backup, remote_src=True, mode="preserve"))
                if copied.get("failed"):
                    return copied
            removed = self._execute_module(module_name="ansible.legacy.file", task_vars=task_vars,
                                           module_args=dict(path=change["path"], state="absent"))
            if params["backup"] and not removed.get("failed"):
                removed["backup_file"] = backup
            return removed
        if not change["exists"] and not change["parent_exists"]:
            parent = self._execute_module(module_name="ansible.legacy.file", task_vars=task_vars, module_args=dict(
                path=posixpath.dirname(change["path"]), state="directory", mode=NEW_DIR_MODE))
            if parent.get("failed"):
                return parent
        args = dict(content=change["after"], dest=change["path"], force=True, follow=False,
                    backup=params["backup"], validate=params["validate"])
        for key in _FILE_ARGS:
            if params.get(key) is not None:
                args[key] = params[key]
        if not change["exists"] and params.get("mode") is None:
            args["mode"] = NEW_FILE_MODE
        copy_task = self._task.copy()
        copy_task.args = args
        copy_task.diff = False
        copy_action = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.copy", task=copy_task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return copy_action.run(task_vars=task_vars)
