# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The playbooks' step once per cluster: `phase: plan` (run once, on the controller) checks the cluster settings and
lists the clusters of the run with the server that writes for each; `phase: apply` (delegated to that server) reads
it, decides the cluster's GPU Operator HelmChart and RuntimeClasses from what its GPU nodes reported, and writes or
removes the manifests in one module execution. The phases are in plugin_utils/cluster/_cluster_phases.py, the
decisions in plugin_utils/cluster/_cluster_step.py."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import NOTHING_CHANGED
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_phases as cluster_phases
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_view as role_view
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_CLUSTER_SPEC
    REQUIRED_IF = specs.GPU_CLUSTER_REQUIRED_IF
    FAILURE_ENDING = NOTHING_CHANGED

    def run_validated(self, result, args, task_vars):
        role = role_view.RoleView(task_vars["hostvars"], self._templar.template)

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)

        task = cluster_phases.ClusterTask(task_vars=task_vars, execute_module=execute_module, role=role)
        try:
            return cluster_phases.run(task, result, args)
        finally:
            if args["phase"] != "plan":  # the plan runs no module
                self._remove_tmp_path(self._connection._shell.tmpdir)
