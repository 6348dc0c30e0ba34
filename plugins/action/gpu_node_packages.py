# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's package step on one host: NVIDIA's signed repository and the pinned, held packages of the
container toolkit or the driver, or taking them back, in one task. The step is plugin_utils/role/_package_step.py
(the decisions: _packages); this action runs its modules.

Every module runs with gpu_node_proxy_env over the task's own environment. The step reads it itself, instead of the
role passing it as the task's `environment:` from a registered result: a result holds no proxy password (issue 41),
and a URL in a message has its password masked."""

from __future__ import annotations

from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _package_step as package_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction

display = Display()


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_NODE_PACKAGES_SPEC
    _step = None
    _proxy_env = None
    _read_only = False

    def run_validated(self, result, args, task_vars):
        self._task_vars = task_vars
        task = package_step.PackageTask(host=task_vars.get("inventory_hostname", ""), check_mode=bool(self._task.check_mode),
                                        template=self._templar.template, display=display, run_module=self._run_module,
                                        write_file=self._write)
        self._step = package_step.PackageStep(task)
        try:
            settings = role_vars.read(task_vars, self._templar.template, package_step.SETTINGS)
            self._proxy_env = settings["proxy_env"]  # for every module of the step (_compute_environment_string)
            outcome = self._step.run(settings, args, task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(outcome, changed=self._step.changed)
        return result

    def failure_message(self, exc):
        return package_step.failure_message(exc)

    def failed_result(self, result, message):
        host_step.failed(result, message)
        # what was written before the failure stays written
        result["changed"] = self._step.changed if self._step is not None else False
        return result

    # ---- Ansible's hooks and runners for the step --------------------------------------------------------

    def _compute_environment_string(self, raw_environment_out=None):
        """The task's environment (play, block, task), then gpu_node_proxy_env over it, for every module the step runs
        (Ansible's own module runner and Mitogen's both ask here)."""
        environment = {}
        super(ActionModule, self)._compute_environment_string(environment)
        environment.update(self._proxy_env or {})
        if isinstance(raw_environment_out, dict):
            raw_environment_out.clear()
            raw_environment_out.update(environment)
        return self._connection._shell.env_prefix(**environment)

    def _update_module_args(self, module_name, module_args, task_vars, *args, **kwargs):
        super(ActionModule, self)._update_module_args(module_name, module_args, task_vars, *args, **kwargs)
        if self._read_only:
            module_args["_ansible_check_mode"] = False  # scratch files and reads run in check mode too

    def _run_module(self, name, module_args, read_only):
        self._read_only = read_only
        try:
            return self._execute_module(module_name=name, module_args=module_args, task_vars=self._task_vars)
        finally:
            self._read_only = False

    def _write(self, content, dest, mode):
        """A file with this content, through the copy action (check mode and diff as a copy task has them)."""
        task = self._task.copy()
        task.args.clear()
        task.args.update(content=content, dest=dest, mode=mode)
        copy = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.copy", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return copy.run(task_vars=self._task_vars)
