# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's step on one host, in one task: read the node, decide, and configure its containerd
when nothing has to be installed first. The role registers the result as gpu_node_result.

The role's variables are read here, converted by the role's argument spec, so `-e gpu_node_force=false`
means false; a refusal is one message that names the user's variables, never a filter's wrapping."""

from __future__ import annotations

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _role_vars as role_vars

display = Display()

READ_VARS = ("gpu_node_root", "gpu_node_distribution", "gpu_node_release", "gpu_node_newer_release", "gpu_node_data_dir",
             "gpu_node_toolkit_dirs")
PLAN_VARS = ("gpu_node_force", "gpu_node_mode", "gpu_node_operator_toolkit", "gpu_node_operator_driver",
             "gpu_node_toolkit_install", "gpu_node_driver_install", "gpu_node_driver_reboot", "gpu_node_default_runtime",
             "gpu_node_remove_operator_leftovers", "gpu_node_cdi_generate", "gpu_node_cdi_spec_path", "gpu_node_state",
             "gpu_node_absent_remove_toolkit")
CONFIGURE_VARS = ("gpu_node_runtimes", "gpu_node_enable_cdi", "gpu_node_handler_labels", "gpu_node_backup",
                  "gpu_node_target_release")
# the device plugin's node labels are written with the containerd step (config.yaml.d)
DEVICE_PLUGIN_VARS = ("gpu_node_device_plugin_state", "gpu_node_device_plugin_config", "gpu_node_gpu_sharing",
                      "gpu_node_device_plugin_configs", "gpu_node_device_plugin_chart_version",
                      "gpu_node_device_plugin_mig_strategy")


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("phase", "node_facts", "plan"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        phase = args.get("phase", "plan")
        self._host = task_vars.get("inventory_hostname", "")
        try:
            # every variable of the role in the plan phase: the site playbook imports the role without Ansible's own
            # validation task (rolespec_validate: false), one task per host less
            settings = role_vars.read(task_vars, self._templar.template,
                                      None if phase == "plan" else READ_VARS + PLAN_VARS + CONFIGURE_VARS + DEVICE_PLUGIN_VARS)
        except role_vars.RoleVarsError as exc:
            return host_step.failed(result, "%s: %s. Nothing was changed." % (task_vars.get("inventory_hostname"), exc))
        warnings = result.setdefault("warnings", [])
        if phase == "plan":
            warnings.extend(role_vars.unknown_variables(task_vars))

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)

        try:
            if phase == "plan":
                return self._plan(result, settings, task_vars, execute_module)
            if phase == "reread":
                return self._reread(result, settings, args["node_facts"], args["plan"], execute_module)
            result["reboot_required"] = bool(self._templar.template(task_vars.get("gpu_node_reboot_required", False)))
            return self._configure(result, settings, args["node_facts"], args["plan"], execute_module)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def _plan(self, result, settings, task_vars, execute_module):
        host = self._host
        if not settings["release"]:
            found = host_step.inventory_release(task_vars, self._templar.template)
            if found and settings["distribution"] in ("auto", found[2]):
                settings = dict(settings, release=found[1], distribution=found[2])
                result["release_from"] = found[0]
        read = dict(root=settings["root"], distribution=settings["distribution"], release=settings["release"] or None,
                    newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
                    toolkit_dirs=settings["toolkit_dirs"])
        info = configure.read_node(execute_module, read)
        if info.get("failed"):
            message = host_step.in_role_terms(info.get("msg")).rstrip(".")
            return host_step.failed(result, "%s: %s. Nothing was changed." % (host, message))
        result["warnings"].extend(info.pop("warnings", None) or [])
        plan_settings = dict((k, settings[k]) for k in (
            "force", "root", "mode", "operator_toolkit", "operator_driver", "toolkit_install", "driver_install",
            "driver_reboot", "default_runtime", "remove_operator_leftovers", "state", "absent_remove_toolkit"))
        plan_settings["local_connection"] = task_vars.get("ansible_connection", "ssh") == "local"
        try:
            plan = host_step.plan_host(info, plan_settings, host)
            if plan.get("selected"):
                host_step.device_plugin_labels(settings, host)  # the sharing settings refused before any install
        except gpu_operator.GpuOperatorPlanError as exc:
            return host_step.failed(result, str(exc))
        for message in plan["messages"]:
            display.display(message)
        mode = plan["mode"]
        cdi = host_step.cdi_due(info, plan, settings)
        due = plan["selected"] and bool(mode.get("install_driver") or mode.get("install_toolkit")
                                        or mode.get("remove_host_toolkit") or mode.get("remove_operator_leftovers") or cdi)
        result.update(_info=info, _plan=plan, install_due=due, cdi_due=cdi, _cdi_marker=host_step.cdi_marker(settings))
        if not plan["selected"] or due:
            result.update(host_step.node_result(plan, info, None))
            return result
        return self._configure(result, settings, info, plan, execute_module)

    def _reread(self, result, settings, info, plan, execute_module):
        """After the installs: the node as it is now (runtimes, nvidia-ctk, driver), and whether the CDI spec is due."""
        read = dict(root=settings["root"], distribution=info["distribution"], release=info["release"],
                    newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
                    toolkit_dirs=settings["toolkit_dirs"])
        fresh = configure.read_node(execute_module, read)
        if fresh.get("failed"):
            message = host_step.in_role_terms(fresh.get("msg")).rstrip(".")
            return host_step.failed(result, "%s: reading the node after the installs failed: %s" % (self._host, message))
        fresh.pop("warnings", None)  # said by the first reading
        result.update(host_step.node_result(plan, fresh, None), _info=fresh, _plan=plan, install_due=False,
                      cdi_due=host_step.cdi_due(fresh, plan, settings), _cdi_marker=host_step.cdi_marker(settings))
        return result

    def _configure(self, result, settings, info, plan, execute_module):
        absent = settings["state"] == "absent"
        params = dict(
            state=settings["state"], root=settings["root"], distribution=info["distribution"], release=info["release"],
            newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
            toolkit_dirs=settings["toolkit_dirs"], runtimes=settings["runtimes"] or None,
            default_runtime=plan["mode"].get("default_runtime") or None, enable_cdi=settings["enable_cdi"],
            # k3s/rke2 add node-label entries to the node at every start (labels are added, never removed)
            handler_labels=settings["handler_labels"] if info["distribution"] in (distro.K3S, distro.RKE2) else None,
            backup=settings["backup"], node_facts=info,
            # the release the inventory asks for: its template check is reported before the upgrade reaches the node
            target_release=settings["target_release"] if settings["target_release"] not in ("", info["release"]) and not absent
            else None)
        if params["handler_labels"] is not None:
            try:
                params["node_labels"] = host_step.device_plugin_labels(settings, self._host)
            except gpu_operator.GpuOperatorPlanError as exc:
                return host_step.failed(result, "%s. Nothing was changed." % str(exc).rstrip("."))
        validated = ArgumentSpecValidator(configure.SPEC).validate(params)
        if validated.error_messages:
            return host_step.failed(result, "; ".join(validated.error_messages))
        # state absent: the CDI spec the role generated goes in the same node_files execution
        extra, extra_warnings = host_step.cdi_spec_changes(info, settings) if absent else ([], [])
        result["warnings"].extend(extra_warnings)
        runtimes = configure.run({}, validated.validated_parameters, execute_module, self._task.diff, own_files=True,
                                 extra_changes=extra)
        result["warnings"].extend(runtimes.pop("warnings", None) or [])
        for key in ("changed", "failed", "msg", "diff"):
            if key in runtimes:
                result[key] = runtimes[key]
        reboot = result.get("reboot_required", False)
        result.update(host_step.node_result(plan, info, runtimes), _info=info, _plan=plan, _runtimes=runtimes)
        # for the cluster step's device plugin: this node's CDI readiness and its named plugin config
        result.update(cdi=host_step.cdi_readiness(info, plan, settings), device_plugin_config=settings["device_plugin_config"])
        result.update(reboot_required=reboot, install_due=False, cdi_due=False)
        if runtimes.get("failed"):
            changed = result.get("changed", False)
            host_step.failed(result, "%s: %s" % (self._host, host_step.in_role_terms(runtimes.get("msg"))))
            result["changed"] = changed  # files written before a failed write stay written
        return result
