# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's host step, phase by phase (the action k3s_gpu.nvidia.gpu_node_host only dispatches): decide
(read the node, the role's first decision, and configure containerd where nothing is to be installed first), reread
after the installs, configure containerd, and the upgrade check. Each phase takes the HostTask of its Ansible task and
fills the task's result; a refusal is raised as a K3sGpuError, which the action's failure boundary
(_spec_action.SpecAction) reports.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import NOTHING_CHANGED, ended
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_plan as host_plan
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _restart as restart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars


@dataclass(frozen=True)
class HostTask:
    """What a phase needs of its Ansible task: the host, its check and diff flags, the templar, the display, and a
    runner of modules on the host (execute_module(name, args) -> result)."""
    host: str
    check_mode: bool
    diff: bool
    template: Callable[[Any], Any]
    display: Any
    execute_module: Callable[[str, Dict[str, Any]], Dict[str, Any]]


def read_node(execute_module, settings, distribution, release):
    """runtime_info's reading of the node with the role's node settings."""
    return node_reading.read_node(execute_module, dict(
        root=settings["root"], distribution=distribution, release=release or None, newer_release=settings["newer_release"],
        data_dir=settings["data_dir"] or None, toolkit_dirs=settings["toolkit_dirs"]))


def _reading_failed(result, host, reading, ending):
    """A failed reading as the role reports it: the module's message in the role's variable names, and its ending once."""
    return host_step.failed(result, ended("%s: %s" % (host, host_step.role_message(reading)), ending))


# the in-memory group of the hosts on which the role has work to do (phase probe): k3s_gpu.nvidia.site runs the rest of
# the role on it
DUE_GROUP = "k3s_gpu_nvidia_due"


def probe(task, result, settings, task_vars):
    """decide without writing or printing. A host with work due (an install, a removal, files to write) joins DUE_GROUP
    the way ansible.builtin.group_by's result adds it: by the result's add_group, which the strategy applies in the
    controller's main process, so that a host with nothing to do costs no other task (no worker, no task banner)."""
    result = decide(task, result, settings, task_vars, write=False)
    if not result.get("failed") and (result.get("install_due") or result.get("configure_due")):
        # work_due: the role went no further on this host (k3s_gpu.nvidia.site's batches stopped before it) while its
        # result is this one; the next task of the role registers over it
        result.update(add_group=DUE_GROUP, work_due=True)
    return result


def decide(task, result, settings, task_vars, write=True):
    """Read the node and decide; configure it here where no restart can follow (write=False: never, configure_due then
    says that files are to be written)."""
    host = task.host
    settings = release_settings(task, settings, task_vars)
    if settings.get("release_from"):
        result["release_from"] = settings["release_from"]
    reading = read_node(task.execute_module, settings, settings["distribution"], settings["release"] or None)
    if reading.get("failed"):
        return _reading_failed(result, host, reading, NOTHING_CHANGED)
    result["warnings"].extend(reading.pop("warnings", None) or [])
    facts = NodeFacts.from_reading(reading)
    plan_settings = dict((k, settings[k]) for k in (
        "force", "root", "mode", "operator_toolkit", "operator_driver", "toolkit_install", "driver_install",
        "driver_reboot", "default_runtime", "remove_operator_leftovers", "state", "absent_remove_toolkit",
        "absent_remove_driver", "allocation", "enable_cdi"))
    plan_settings["local_connection"] = task_vars.get("ansible_connection", "ssh") == "local"
    plan = host_step.plan_host(facts, plan_settings, host)
    if plan.selected:
        host_step.device_plugin_labels(settings, host)  # the sharing settings refused before any install
    # on the host's own result (AWX/AAP attaches it to the host; -v prints it), not printed on every run
    if plan.messages:
        result["msg"] = " ".join(plan.messages)
    cdi = host_step.cdi_due(facts, plan, settings)
    devices = device_steps(facts, plan, settings)
    result["warnings"].extend(host_step.device_nodes_kept(facts, plan, settings))
    due = plan.selected and bool(plan.mode.installs_or_removes or cdi or devices["dev_char_due"]
                                 or devices["cdi_refresh_due"] or devices["device_nodes_due"])
    result.update(install_due=due, cdi_due=cdi, **devices)
    if not plan.selected or due:
        result.update(host_step.node_result(plan, facts, None), configure_due=False,
                      node=host_state.HostState(facts, plan, host_step.cdi_marker(settings)).to_result())
        return result
    # where k3s/rke2 can restart, a change is written by the role's next task, which notifies the restart handler;
    # elsewhere (check mode, a sandbox tree, gpu_node_restart false) it is written here and no handler runs
    restarts = restart.notified(task.check_mode, settings["restart"], plan.live)
    result = configure_node(task, result, settings, facts, plan, write=write and not restarts)
    if result.get("changed") and not result.get("failed") and not restarts:
        reason = restart.why_not(bool(task.check_mode), settings["restart"], plan.live, facts.units)
        line = restart.not_restarted(task.host, facts.units[0] if facts.units else facts.distribution, reason)
        task.display.display(line)  # printed too: only where something changed, and it asks for an action
        result["msg"] = " ".join(filter(None, [result.get("msg"), line]))
    return result


def release_settings(task, settings, task_vars):
    """settings with the distribution and release the node is read for (the inventory's, when gpu_node_release is
    empty) and release_from, the inventory variable it came from, or None."""
    distribution, release, source = role_vars.release_to_read(settings["distribution"], settings["release"], task_vars,
                                                              task.template)
    return dict(settings, distribution=distribution, release=release, release_from=source)


def reread(task, result, settings, state):
    """After the installs: the node as it is now (runtimes, nvidia-ctk, driver), and whether the CDI spec is due."""
    reading = read_node(task.execute_module, settings, state.facts.distribution, state.facts.release)
    if reading.get("failed"):
        message = host_step.role_message(reading)
        return host_step.failed(result, "%s: reading the node after the installs failed: %s" % (task.host, message))
    reading.pop("warnings", None)  # said by the first reading
    fresh, plan = NodeFacts.from_reading(reading), state.plan
    result.update(host_step.node_result(plan, fresh, None), install_due=False, configure_due=False,
                  cdi_due=host_step.cdi_due(fresh, plan, settings),
                  node=host_state.HostState(fresh, plan, host_step.cdi_marker(settings)).to_result(),
                  **device_steps(fresh, plan, settings))
    return result


def device_steps(facts, plan, settings):
    """The node's device steps the role's tasks take: the /dev/char links and their udev rule, nvidia-cdi-refresh, the
    device nodes before k3s/rke2 starts (DRA nodes)."""
    return {"dev_char_due": host_step.dev_char_due(facts, plan, settings) or False,
            "cdi_refresh_due": host_step.cdi_refresh_due(facts, plan, settings),
            "device_nodes_due": host_step.device_nodes_due(facts, plan, settings) or False}


def configure_params(task, settings, facts, plan):
    """containerd_runtimes' options for the role's settings and plan (the node labels may refuse: raises)."""
    absent = settings["state"] == "absent"
    params = dict(
        state=settings["state"], root=settings["root"], distribution=facts.distribution, release=facts.release,
        newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
        toolkit_dirs=settings["toolkit_dirs"], runtimes=settings["runtimes"] or None,
        default_runtime=plan.mode.default_runtime or None, enable_cdi=host_plan.enable_cdi(facts, settings),
        allocation=settings["allocation"] if not absent else k8s_labels.ALLOCATION_DEVICE_PLUGIN,
        # k3s/rke2 add node-label entries to the node at every start (labels are added, never removed)
        handler_labels=settings["handler_labels"] if facts.distribution in (distro.K3S, distro.RKE2) else None,
        backup=settings["backup"], node_facts=facts.reading,
        # the release the inventory asks for (k3s/rke2 nodes): its template check is reported before the upgrade
        # reaches the node; a plain containerd node of the same inventory has no release to upgrade to
        target_release=settings["target_release"] if settings["target_release"] not in ("", facts.release) and not absent
        and facts.distribution in (distro.K3S, distro.RKE2) else None)
    if params["handler_labels"] is not None:
        params["node_labels"] = host_step.device_plugin_labels(settings, task.host)
    return params


def configure_node(task, result, settings, facts, plan, write=True):
    """Configure containerd (write=False: only decide; configure_due then says that files are to be written). The node
    labels' refusal is raised (K3sGpuError)."""
    absent = settings["state"] == "absent"
    params = configure_params(task, settings, facts, plan)
    validated = ArgumentSpecValidator(configure.SPEC).validate(params)
    if validated.error_messages:
        # the role's variables were checked by the role's spec (gpu_node_runtimes by the module's own): not the user's
        return host_step.failed(result, "%s: the host step built options that containerd_runtimes refuses (%s): a "
                                        "defect of k3s_gpu.nvidia, please report it. Nothing was changed." % (
                                            task.host, "; ".join(validated.error_messages)))
    # state absent: the CDI spec the role generated goes in the same node_files execution
    extra, extra_warnings = host_step.cdi_spec_changes(facts, settings) if absent else ([], [])
    result["warnings"].extend(extra_warnings)
    runtimes = configure.run({}, validated.validated_parameters, task.execute_module, task.diff, own_files=True,
                             extra_changes=extra, write=write)
    if runtimes.get("write_due") and not runtimes.get("failed"):
        # nothing written: the configure phase decides again from this reading, writes and reports the files
        result.update(host_step.node_result(plan, facts, None), install_due=False, configure_due=True, changed=False,
                      node=host_state.HostState(facts, plan, host_step.cdi_marker(settings)).to_result())
        return result
    result["warnings"].extend(runtimes.pop("warnings", None) or [])
    for key in ("changed", "failed", "diff"):
        if key in runtimes:
            result[key] = runtimes[key]
    if runtimes.get("msg"):  # after the plan's own messages, unless it is the failure
        said = [runtimes["msg"]] if runtimes.get("failed") else [result.get("msg"), runtimes["msg"]]
        result["msg"] = " ".join(filter(None, said))
    reboot = result.get("reboot_required", False)
    state = host_state.HostState(facts, plan, host_step.cdi_marker(settings), host_state.Changes.of_step(runtimes))
    result.update(host_step.node_result(plan, facts, runtimes), node=state.to_result())
    # for the cluster step's device plugin: this node's CDI readiness and its named plugin config
    result.update(cdi=host_step.cdi_readiness(facts, plan, settings), device_plugin_config=settings["device_plugin_config"],
                  dra=host_step.dra_readiness(facts, settings))
    result.update(reboot_required=reboot, install_due=False, configure_due=False, cdi_due=False, dev_char_due=False,
                  cdi_refresh_due=False, device_nodes_due=False)
    if runtimes.get("failed"):
        changed = result.get("changed", False)
        host_step.failed(result, "%s: %s" % (task.host, host_step.role_message(runtimes)))
        result["changed"] = changed  # files written before a failed write stay written
    return result


def check_upgrade(task, result, settings, fail):
    """Read-only: render the node's template for gpu_node_target_release (check mode, nothing is written), as the
    node is and once the toolkit is installed; report it, and fail a node that breaks there or is refused now."""
    host, target = task.host, settings["target_release"]
    if not target:
        return host_step.failed(result, "Set gpu_node_target_release to the k3s or rke2 release the nodes are about to "
                                        "get (for example v1.35.3+k3s1 or v1.35.3+rke2r1). Nothing was checked.")
    reading = read_node(task.execute_module, settings, settings["distribution"], settings["release"] or None)
    if reading.get("failed"):
        return _reading_failed(result, host, reading, "Nothing was checked.")
    result["warnings"].extend(reading.pop("warnings", None) or [])
    facts = NodeFacts.from_reading(reading)
    if facts.distribution not in (distro.K3S, distro.RKE2):
        result.update(skipped=True, msg="%s: %s has no k3s/rke2 template to check" % (host, facts.distribution))
        return result
    params = dict(root=settings["root"], distribution=facts.distribution, release=facts.release,
                  newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
                  toolkit_dirs=settings["toolkit_dirs"], runtimes=settings["runtimes"] or None, target_release=target,
                  node_facts=facts.reading)
    checked = configure.run({}, ArgumentSpecValidator(configure.SPEC).validate(params).validated_parameters,
                            task.execute_module, False)
    result["warnings"].extend(checked.pop("warnings", None) or [])
    refused = host_step.role_message(checked) if checked.get("failed") else ""
    report = dict(node=host, release="%s -> %s" % (facts.release, target), refused_now=refused,
                  breaks_on_target=checked.get("upgrade_findings") or [],
                  warnings_now=[f for f in checked.get("template_findings") or [] if f.get("when") != "upgrade"])
    result.update(changed=False, report=report)
    problems = list(checked.get("upgrade_messages") or []) + ([refused] if refused else [])
    fine = ("the template renders and loads on the target release" if checked.get("template_outcome") is not None
            else "no containerd template on the node, nothing to render for the target release")
    task.display.display("%s: %s: %s" % (host, report["release"], "; ".join(problems) if problems else fine))
    if fail and problems:
        host_step.failed(result, ended("%s: %s" % (host, "; ".join(problems))))
    return result
