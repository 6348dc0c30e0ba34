# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's step on one host, in one task: read the node, decide, and configure its containerd
when nothing has to be installed first. The role registers the result as gpu_node_result.

The role's variables are read here, converted by the role's argument spec, so `-e gpu_node_force=false`
means false; a refusal is one message that names the user's variables, never a filter's wrapping."""

from __future__ import annotations

import contextlib

from ansible.errors import AnsibleConnectionFailure
from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import NOTHING_CHANGED
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _doctor_phase as doctor_phase
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _handler as handler
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_phases as phases
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction

display = Display()

READ_VARS = ("gpu_node_root", "gpu_node_distribution", "gpu_node_release", "gpu_node_newer_release", "gpu_node_data_dir",
             "gpu_node_toolkit_dirs")
PLAN_VARS = ("gpu_node_force", "gpu_node_mode", "gpu_node_operator_toolkit", "gpu_node_operator_driver",
             "gpu_node_toolkit_install", "gpu_node_driver_install", "gpu_node_driver_reboot", "gpu_node_default_runtime",
             "gpu_node_remove_operator_leftovers", "gpu_node_cdi_generate", "gpu_node_cdi_spec_path", "gpu_node_state",
             "gpu_node_absent_remove_toolkit", "gpu_node_absent_remove_driver", "gpu_node_dev_char_symlinks",
             "gpu_node_cdi_refresh", "gpu_node_allocation")
CONFIGURE_VARS = ("gpu_node_runtimes", "gpu_node_enable_cdi", "gpu_node_handler_labels", "gpu_node_backup",
                  "gpu_node_target_release")
# the upgrade_check playbook: the node as the role reads it, and the release it is about to get
UPGRADE_CHECK_VARS = READ_VARS + ("gpu_node_runtimes", "gpu_node_target_release")
# the handler: restart, verify, roll back
RESTART_VARS = READ_VARS + ("gpu_node_restart", "gpu_node_restart_timeout_seconds", "gpu_node_restart_settle_seconds")
# the device plugin's node labels are written with the containerd step (config.yaml.d)
DEVICE_PLUGIN_VARS = device_plugin.ROLE_VARS
# the doctor playbook: what the role plans on the node, and what the doctor checks it against
DOCTOR_VARS = READ_VARS + PLAN_VARS + CONFIGURE_VARS + DEVICE_PLUGIN_VARS + (
    "gpu_node_toolkit_version", "gpu_node_operator_namespace")
# the role's variables each phase reads (None: every one, in the plan phase)
PHASE_VARS = {"plan": None, "probe": None, "upgrade_check": UPGRADE_CHECK_VARS, "doctor": DOCTOR_VARS, "restart": RESTART_VARS,
              "reread": READ_VARS + PLAN_VARS + CONFIGURE_VARS + DEVICE_PLUGIN_VARS,
              "configure": READ_VARS + PLAN_VARS + CONFIGURE_VARS + DEVICE_PLUGIN_VARS}


# a phase whose refusals end otherwise than with "Nothing was changed.": the handler's refusal says itself that it
# restarts nothing
PHASE_ENDINGS = {"restart": None}


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_NODE_HOST_SPEC
    REQUIRED_IF = specs.GPU_NODE_HOST_REQUIRED_IF
    FAILURE_ENDING = NOTHING_CHANGED
    # a refusal as the role reports it: the host state the step hands on is dropped, a warning that says it too
    failed_result = staticmethod(host_step.failed)

    def run_validated(self, result, args, task_vars):
        phase = args["phase"]
        host = task_vars.get("inventory_hostname", "")
        # every variable of the role in the plan phase: the site playbook imports the role without Ansible's own
        # validation task (rolespec_validate: false), one task per host less; a refusal names the host
        settings = role_vars.read(task_vars, self._templar.template, PHASE_VARS.get(phase), where=host)
        # the role's tasks read these
        result["settings"] = host_step.task_settings(settings, task_vars, self._templar.template, where=host)
        if phase in ("plan", "probe"):
            result.setdefault("warnings", []).extend(role_vars.unknown_variables(task_vars))
        result.setdefault("warnings", [])

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)

        task = phases.HostTask(host=host, check_mode=bool(self._task.check_mode), diff=bool(self._task.diff),
                               template=self._templar.template, display=display, execute_module=execute_module)
        try:
            return self._run_phase(task, phase, result, settings, args, task_vars)
        except AnsibleConnectionFailure as exc:
            if not self._task.ignore_unreachable:
                raise
            # k3s_gpu.nvidia.site ignores unreachable nodes (Ansible ends the whole playbook, its report included, when
            # every host of a batch is unreachable): the node is a failure that the play rescues, saying so
            result.update(failed=True, changed=False, node_unreachable=True, msg="unreachable: %s" % (exc.message,))
            return result
        finally:
            with contextlib.suppress(AnsibleConnectionFailure):
                self._remove_tmp_path(self._connection._shell.tmpdir)

    def _run_phase(self, task, phase, result, settings, args, task_vars):
        state = None
        if phase in ("reread", "configure"):
            state = host_state.HostState.from_result(args["node"], "%s: the argument node" % task.host)
        self.failure_ending = PHASE_ENDINGS.get(phase, NOTHING_CHANGED)
        if phase == "plan":
            return phases.decide(task, result, settings, task_vars)
        if phase == "probe":
            return phases.probe(task, result, settings, task_vars)
        if phase == "restart":
            return handler.restart_verified(task, result, settings, task_vars)
        if phase == "upgrade_check":
            return phases.check_upgrade(task, result, settings, args["fail"])
        if phase == "doctor":
            return doctor_phase.diagnose(task, result, settings, task_vars)
        if phase == "reread":
            return phases.reread(task, result, settings, state)
        result["reboot_required"] = bool(self._templar.template(task_vars.get("gpu_node_reboot_required", False)))
        return phases.configure_node(task, result, settings, state.facts, state.plan)
