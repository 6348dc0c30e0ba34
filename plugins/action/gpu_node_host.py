# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's step on one host, in one task: read the node, decide, and configure its containerd
when nothing has to be installed first. The role registers the result as gpu_node_result.

The role's variables are read here, converted by the role's argument spec, so `-e gpu_node_force=false`
means false; a refusal is one message that names the user's variables, never a filter's wrapping."""

from __future__ import annotations

import re

from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _changes as changes_engine
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _role_vars as role_vars

display = Display()

READ_VARS = ("gpu_node_root", "gpu_node_distribution", "gpu_node_release", "gpu_node_newer_release", "gpu_node_data_dir",
             "gpu_node_toolkit_dirs")
PLAN_VARS = ("gpu_node_force", "gpu_node_mode", "gpu_node_operator_toolkit", "gpu_node_operator_driver",
             "gpu_node_toolkit_install", "gpu_node_driver_install", "gpu_node_driver_reboot", "gpu_node_default_runtime",
             "gpu_node_remove_operator_leftovers", "gpu_node_cdi_generate", "gpu_node_cdi_spec_path")
CONFIGURE_VARS = ("gpu_node_runtimes", "gpu_node_enable_cdi", "gpu_node_handler_labels", "gpu_node_backup",
                  "gpu_node_target_release")

# module options named in messages of the modules, and the role variables a user sets instead
_OPTION_NAMES = (
    (re.compile(r"\bpass release="), "set gpu_node_release"),
    (re.compile(r"\bset distribution and release\b"), "set gpu_node_distribution and gpu_node_release"),
    (re.compile(r"\bset distribution: (\S+) and release: "), r"set gpu_node_distribution: \1 and gpu_node_release: "),
    (re.compile(r"\bset distribution\b"), "set gpu_node_distribution"),
    (re.compile(r"\bbut distribution is\b"), "but gpu_node_distribution is"),
    (re.compile(r"\bnewer_release\b"), "gpu_node_newer_release"),
)

# The release other inventories ask for (k3s-ansible, rke2-ansible, lablabs.rke2), read when gpu_node_release is
# empty: the role then plans for it, also before k3s/rke2 is installed (reference facts-2026-12: inventories)
INVENTORY_RELEASES = (("k3s_version", distro.K3S), ("rke2_install_version", distro.RKE2), ("rke2_version", distro.RKE2))

CONFIGURE_SPEC = dict(CONTAINERD_RUNTIMES_SPEC)
CONFIGURE_SPEC.update((k, v) for k, v in FILE_COMMON_ARGUMENTS.items() if k in changes_engine.FILE_ARGS)


def in_role_terms(message):
    for pattern, replacement in _OPTION_NAMES:
        message = pattern.sub(replacement, message or "")
    return message


def inventory_release(task_vars, template):
    """(variable, release, distribution) of the first of INVENTORY_RELEASES the inventory sets, else None."""
    for name, distribution in INVENTORY_RELEASES:
        value = template(task_vars[name]) if name in task_vars else None
        if isinstance(value, str) and value.strip():
            return name, value.strip(), distribution
    return None


def cdi_due(info, plan, settings):
    """nvidia-ctk runs only when the spec is missing or does not fit the loaded driver and its GPUs."""
    if not (plan["selected"] and settings["cdi_generate"] and plan["mode"].get("generate_cdi") and plan["live"]):
        return False
    if (info.get("toolkit") or {}).get("nvidia_ctk") is None or not (info["driver"]["loaded"] or settings["force"]):
        return False
    return not any(spec.get("path") == settings["cdi_spec_path"] and spec.get("current")
                   for spec in info["cdi"]["specs"])


def node_result(plan, info, runtimes):
    """gpu_node_result, in one place: the plan's skeleton and what the containerd step did."""
    result = dict(plan["result"])
    if runtimes is None:
        return result
    written = [r["name"] for r in runtimes.get("runtimes_written") or []]
    skipped = runtimes.get("runtimes_skipped") or []
    result.update(
        runtimes_detected=[r["name"] for r in info["release_runtimes"]], written=written,
        rendered_by_release=[r["name"] for r in skipped], runtimes_skipped=skipped,
        handlers=sorted(set(written) | set(r["name"] for r in skipped)),
        gpu_operator=info["gpu_operator"]["present"], operator_runtimes=list(info["gpu_operator"]["runtimes"]),
        template_findings=runtimes.get("template_findings") or [], upgrade_findings=runtimes.get("upgrade_findings") or [],
        runtime_in_use=runtimes.get("runtime_in_use"), cgroup_driver_mismatch=runtimes.get("cgroup_driver_mismatch"),
        default_runtime=runtimes.get("default_runtime"), node_labels=runtimes.get("node_labels"),
        files=runtimes.get("files") or [])
    return result


def failed(result, msg):
    """A refusal as the role reports it: one message, cause and fix first (a warning that says the same is dropped)."""
    result.update(failed=True, changed=False, msg=msg)
    warnings = [w for w in result.get("warnings") or [] if str(w).rstrip(".") not in msg]
    if warnings:
        result["warnings"] = warnings
    else:
        result.pop("warnings", None)
    return result


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
            settings, _w = role_vars.read(task_vars, self._templar.template, READ_VARS + PLAN_VARS + CONFIGURE_VARS)
        except role_vars.RoleVarsError as exc:
            return failed(result, "%s: %s. Nothing was changed." % (task_vars.get("inventory_hostname"), exc))
        warnings = result.setdefault("warnings", [])
        if phase == "plan":
            warnings.extend(role_vars.unknown_variables(task_vars))

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)

        try:
            if phase == "plan":
                return self._plan(result, settings, task_vars, execute_module)
            result["reboot_required"] = bool(self._templar.template(task_vars.get("gpu_node_reboot_required", False)))
            return self._configure(result, settings, args["node_facts"], args["plan"], execute_module)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def _plan(self, result, settings, task_vars, execute_module):
        host = self._host
        if not settings["release"]:
            found = inventory_release(task_vars, self._templar.template)
            if found and settings["distribution"] in ("auto", found[2]):
                settings = dict(settings, release=found[1], distribution=found[2])
                result["release_from"] = found[0]
        read = dict(root=settings["root"], distribution=settings["distribution"], release=settings["release"] or None,
                    newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
                    toolkit_dirs=settings["toolkit_dirs"])
        info = configure.read_node(execute_module, read)
        if info.get("failed"):
            return failed(result, "%s: %s. Nothing was changed." % (host, in_role_terms(info.get("msg")).rstrip(".")))
        result["warnings"].extend(info.pop("warnings", None) or [])
        plan_settings = dict((k, settings[k]) for k in (
            "force", "root", "mode", "operator_toolkit", "operator_driver", "toolkit_install", "driver_install",
            "driver_reboot", "default_runtime", "remove_operator_leftovers"))
        plan_settings["local_connection"] = task_vars.get("ansible_connection", "ssh") == "local"
        try:
            plan = gpu_operator.plan_host(info, plan_settings, host=host)
            if plan.get("selected") and plan["mode"].get("install_toolkit"):
                # the install makes k3s detect nvidia/nvidia-cdi at its next start: a template that breaks then
                # is refused now, before a package is installed
                refusal = changes_engine.refusal_before_install(info)
                if refusal:
                    raise gpu_operator.GpuOperatorPlanError(
                        "%s: the NVIDIA toolkit is not installed, because %s" % (host or "this host", refusal))
        except gpu_operator.GpuOperatorPlanError as exc:
            return failed(result, str(exc))
        for message in plan["messages"]:
            display.display(message)
        mode = plan["mode"]
        due = plan["selected"] and bool(
            mode.get("install_driver") or mode.get("install_toolkit") or mode.get("remove_host_toolkit")
            or mode.get("remove_operator_leftovers") or cdi_due(info, plan, settings))
        result.update(_info=info, _plan=plan, install_due=due, cdi_due=cdi_due(info, plan, settings))
        if not plan["selected"] or due:
            result.update(node_result(plan, info, None))
            return result
        return self._configure(result, settings, info, plan, execute_module)

    def _configure(self, result, settings, info, plan, execute_module):
        params = dict(
            root=settings["root"], distribution=info["distribution"], release=info["release"],
            newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
            toolkit_dirs=settings["toolkit_dirs"], runtimes=settings["runtimes"] or None,
            default_runtime=plan["mode"].get("default_runtime") or None, enable_cdi=settings["enable_cdi"],
            # k3s/rke2 add node-label entries to the node at every start (labels are added, never removed)
            handler_labels=settings["handler_labels"] if info["distribution"] in (distro.K3S, distro.RKE2) else None,
            backup=settings["backup"], node_facts=info,
            # the release the inventory asks for: its template check is reported before the upgrade reaches the node
            target_release=settings["target_release"] if settings["target_release"] not in ("", info["release"]) else None)
        validated = ArgumentSpecValidator(CONFIGURE_SPEC).validate(params)
        if validated.error_messages:
            return failed(result, "; ".join(validated.error_messages))
        runtimes = configure.run({}, validated.validated_parameters, execute_module, self._task.diff)
        result["warnings"].extend(runtimes.pop("warnings", None) or [])
        for key in ("changed", "failed", "msg", "diff"):
            if key in runtimes:
                result[key] = runtimes[key]
        reboot = result.get("reboot_required", False)
        result.update(node_result(plan, info, runtimes), _info=info, _plan=plan, _runtimes=runtimes)
        result.update(reboot_required=reboot, install_due=False, cdi_due=False)
        if runtimes.get("failed"):
            changed = result.get("changed", False)
            failed(result, "%s: %s" % (self._host, in_role_terms(runtimes.get("msg"))))
            result["changed"] = changed  # files written before a failed write stay written
        return result
