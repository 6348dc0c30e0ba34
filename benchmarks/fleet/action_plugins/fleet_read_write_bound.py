# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark helper (not part of the collection): the least a converge that reads and then writes can cost.

One task per host runs ansible.builtin.stat, and on a host that would change (a GPU host of the sandbox fleet) a
second ansible.builtin.stat in the same task, as the role's host step runs runtime_info and then node_files. No
decision is made and nothing is written: the difference to the converge is everything the collection adds beyond
two module executions (see benchmarks/fleet/README.md)."""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):

    _VALID_ARGS = frozenset(("path", "second"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        module_args = {"path": self._task.args["path"]}
        try:
            result.update(self._execute_module(module_name="ansible.builtin.stat", module_args=module_args,
                                               task_vars=task_vars))
            if boolean(self._task.args.get("second", False)):
                self._execute_module(module_name="ansible.builtin.stat", module_args=module_args, task_vars=task_vars)
        finally:
            # one temporary directory for both executions, as an action plugin that runs two modules keeps it
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
