# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action plugin for k3s_gpu.nvidia.containerd_runtimes: the arguments checked by the module's spec, the rest in
plugin_utils/containerd/_configure.py (one reading of the node, the decision here, one write)."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction


class ActionModule(SpecAction):

    ARGUMENT_SPEC = configure.SPEC

    def run_validated(self, result, args, task_vars):

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)

        try:
            return configure.run(result, args, execute_module, self._task.diff)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
