# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's safe rollout: `classify` says which of a node's changes disrupt its GPU pods (and refuses a
disruptive one that cannot be drained), `drain` cordons and drains the node, `prove` proves it with a GPU pod and
uncordons it, `plan` (k3s_gpu.nvidia.site, once) puts the disruptive nodes into batches per cluster. The steps are
plugin_utils/diagnosis/_rollout_step.py; the rules cluster/_rollout.py and role/_disruption.py."""

from __future__ import annotations

import os

from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _rollout_plan as rollout_plan
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _rollout_step as rollout_step

display = Display()


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_ROLLOUT_SPEC

    def run_validated(self, result, args, task_vars):
        result["changed"] = False
        template = self._templar.template
        host = task_vars.get("inventory_hostname", "")
        phase = args["phase"]
        if phase == "plan":
            result.update(rollout_plan.plan(args["clusters"], task_vars.get("hostvars") or {}, template,
                                            os.environ.get("K8S_AUTH_KUBECONFIG", "")))
            return result
        settings = rollout_plan.settings_of(task_vars, template, host, os.environ.get("K8S_AUTH_KUBECONFIG", ""))
        if phase == "classify":
            result.update(rollout_plan.classify(task_vars, template, settings, args, host, bool(self._task.check_mode)))
            if result.get("note"):
                display.display(result["note"])
            return result
        step = rollout_step.RolloutStep(
            rollout_step.RolloutTask(host=host, check_mode=bool(self._task.check_mode), display=display,
                                     run_module=lambda name, module_args: self._execute_module(
                                         module_name=name, module_args=module_args, task_vars=task_vars)),
            rollout_plan.cluster_of(settings, host), settings["node"])
        if phase == "drain":
            result.update(step.drain(args["reason"], settings["drain_scope"], settings["drain_timeout_seconds"],
                                     settings["root"], rollout_plan.runs_kubernetes(task_vars, template)))
            result["changed"] = result["drained"]  # cordoned (or would be): the prove handler runs
            return result
        result.update(step.prove(settings["prove_timeout_seconds"], settings["prove_image"],
                                 settings["prove_runtimeclass"], rollout_plan.expects_gpu(task_vars, template, settings)))
        result["changed"] = bool(result.get("uncordoned") or result.get("proved"))
        display.display(result["line"])
        return result
