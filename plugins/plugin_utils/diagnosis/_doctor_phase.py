# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The host step's doctor phase (the doctor playbook runs it in check mode): the node as the role reads it, what the
role would change there, the services' states, and the first broken layer between the GPU and containerd
(_doctor decides that layer).

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import base64

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _doctor as doctor
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_phases as phases
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step


def diagnose(task, result, settings, task_vars):
    """Read-only (the doctor playbook runs it in check mode): the node as the role reads it, what the role would
    change there, the services' states, and the first broken layer between the GPU and containerd."""
    host = task.host
    result["changed"] = False
    if not task.check_mode:
        return host_step.failed(result, "%s: phase doctor only reads: run it with check_mode: true (the "
                                        "k3s_gpu.nvidia.doctor playbook does)" % host)
    settings = phases.release_settings(task, settings, task_vars)
    reading = phases.read_node(task.execute_module, settings, settings["distribution"], settings["release"] or None)
    if reading.get("failed"):
        result["doctor"] = doctor.unread(host, host_step.role_message(reading))
        return result
    reading.pop("warnings", None)
    facts = NodeFacts.from_reading(reading)
    _doctor_generated_config(settings, facts, task.execute_module)
    node = {"mode": settings["mode"], "allocation": settings.get("allocation") or k8s_labels.ALLOCATION_DEVICE_PLUGIN,
            "operator_namespace": settings["operator_namespace"],
            "toolkit_version": settings["toolkit_version"], "toolkit_install": settings["toolkit_install"],
            "enable_cdi": settings["enable_cdi"], "device_list_strategy": settings["device_plugin_device_list_strategy"],
            "cdi_spec_path": settings["cdi_spec_path"], "cdi_refresh": settings["cdi_refresh"],
            "unit": (facts.units or [None])[0], "handlers": [h for h in facts.handlers if h.startswith("nvidia")]}
    try:
        node["labels"] = host_step.device_plugin_labels(settings, host)
    except K3sGpuError:
        node["labels"] = []  # the plan refuses the same settings, and says so
    _doctor_plan(task, node, settings, facts)
    node["services"] = _doctor_services(task, settings, facts, node["unit"])
    node["existing_binaries"] = _doctor_binaries(task, settings, facts)
    result["doctor"] = doctor.check_node(host, facts, node)
    return result


def _doctor_plan(task, node, settings, facts):
    """What the role would do here: its refusal, the handlers it writes or relies on, the files it would change."""
    plan_settings = dict((k, settings[k]) for k in (
        "force", "root", "mode", "operator_toolkit", "operator_driver", "toolkit_install", "driver_install",
        "driver_reboot", "default_runtime", "remove_operator_leftovers", "state", "absent_remove_toolkit",
        "absent_remove_driver"))
    # the doctor installs nothing: what the role would write into containerd's config is planned for the node as it
    # is (a template that breaks with the toolkit installed is the configure step's refusal then, not the install's)
    plan_settings.update(local_connection=False, toolkit_install=False, driver_install=False)
    try:
        plan = host_step.plan_host(facts, plan_settings, task.host)
        if not plan.selected:
            return
        params = phases.configure_params(task, settings, facts, plan)
    except K3sGpuError as exc:
        node["refusal"] = exc.parts(host_step.ROLE_NAMES)
        return
    validated = ArgumentSpecValidator(configure.SPEC).validate(params)
    checked = configure.run({}, validated.validated_parameters, task.execute_module, False, own_files=True)
    if checked.get("failed"):
        node["refusal"] = K3sGpuError.from_result(checked).parts(host_step.ROLE_NAMES)
        return
    node["handlers"] = host_state.handlers_of(checked)
    node["changes"] = [f for f in checked.get("files") or [] if f.get("action") in ("created", "updated", "removed")]


def _doctor_generated_config(settings, facts, execute_module):
    """The text of the config.toml k3s/rke2 wrote at its last start (the reading has only its facts)."""
    generated = facts.files.get("generated_config") or {}
    if generated.get("state") != "file" or "content" in generated:
        return
    read = execute_module("ansible.builtin.slurp", {"src": settings["root"].rstrip("/") + generated["path"]})
    if not read.get("failed") and "content" in read:
        generated["content"] = base64.b64decode(read["content"]).decode("utf-8", "replace")


def _doctor_services(task, settings, facts, unit):
    """{unit: ActiveState, or not-found} of k3s/rke2, the fabric manager and persistenced, on a live root with
    systemd; {} in a sandbox tree (nothing to ask)."""
    if settings["root"] not in ("/", "") or not facts.reading.get("systemd"):
        return {}
    states = {}
    for name in [u for u in (unit, doctor.FABRIC_MANAGER_UNIT, doctor.PERSISTENCED_UNIT) if u]:
        found = task.execute_module("ansible.builtin.systemd_service", {"name": name})
        status = found.get("status") or {}
        states[name] = "not-found" if status.get("LoadState") == "not-found" else status.get("ActiveState", "unknown")
    return states


def _doctor_binaries(task, settings, facts):
    """The BinaryNames of what containerd loads that exist and are executable on the node (those detection found,
    and the others looked at one by one)."""
    found = set(r["binary"] for r in facts.runtimes + facts.release_runtimes)
    for binary, _path in node_reading.loaded_runtimes(facts).values():
        if binary and binary not in found and binary.startswith("/"):
            looked = task.execute_module("ansible.builtin.stat", {"path": settings["root"].rstrip("/") + binary})
            stat = looked.get("stat") or {}
            if stat.get("exists") and stat.get("executable") and not stat.get("isdir"):
                found.add(binary)
    return sorted(found)
