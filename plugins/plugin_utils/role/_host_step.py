# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's decisions about one host (pure, controller side), for its host step action.

PRIVATE to the collection."""

from __future__ import annotations

import re

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, clause
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _claims_cdi as claims_cdi
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _decide as decide_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import FileChange
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra_driver
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_plan as host_plan
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars

# the module options the role's variables feed (runtime_info, containerd_runtimes): an error that names an option
# names the variable the role's user sets instead
ROLE_NAMES = dict((option, "gpu_node_" + option) for option in (
    "root", "distribution", "release", "newer_release", "data_dir", "toolkit_dirs", "runtimes", "default_runtime",
    "enable_cdi", "handler_labels", "backup", "target_release"))


def role_message(outcome):
    """A module's failed result as the role's user reads it: its error in the role's variable names."""
    return K3sGpuError.from_result(outcome).text(ROLE_NAMES)


# the role variables the role's task files read, resolved by the host step: gpu_node_result.settings (the role's
# gpu_node__settings), keyed without the gpu_node_ prefix; the tasks never read a gpu_node_* variable themselves, so
# that a variable the user did not set has its default from meta/argument_specs.yml alone
# gpu_node_result.settings: what the role's tasks read, and a node's settings the cluster step reads (mode, driver_install);
# never gpu_node_proxy_env (no_log: its password would be in every result, which AWX keeps): the package step reads it
TASK_SETTINGS = ("root", "cdi_spec_path", "driver_reboot_timeout_seconds", "mode", "driver_install", "allocation")


def task_settings(settings, task_vars, template, where=None):
    """gpu_node_result.settings: TASK_SETTINGS from the step's settings (those its phase did not read are read here,
    converted by the role's argument spec; raises K3sGpuError, its cause prefixed with `where` where given)."""
    missing = [role_vars.PREFIX + name for name in TASK_SETTINGS if name not in settings]
    found = dict(settings, **role_vars.read(task_vars, template, missing, where=where)) if missing else settings
    return dict((name, found[name]) for name in TASK_SETTINGS)


def cdi_due(facts, plan, settings):
    """nvidia-ctk runs only when the spec is missing or does not fit the loaded driver and its GPUs."""
    if not (plan.selected and settings["cdi_generate"] and plan.mode.generate_cdi and plan.live):
        return False
    if facts.nvidia_ctk is None or not (facts.driver["loaded"] or settings["force"]):
        return False
    return not any(spec.get("path") == settings["cdi_spec_path"] and spec.get("current") for spec in facts.cdi["specs"])


def dev_char_rule_text(nvidia_ctk):
    """The udev rule that makes the /dev/char links again whenever the NVIDIA driver binds to a GPU (boot, driver
    reload), with the node's nvidia-ctk."""
    return "%s\nACTION==\"add\", DEVPATH==\"/bus/pci/drivers/nvidia\", RUN+=\"%s system create-dev-char-symlinks --create-all\"\n" % (
        release_rules.DEV_CHAR_RULE_MARKER, nvidia_ctk)


def nvidia_device_nodes(driver):
    """/dev/nvidiactl and /dev/nvidia<N> among the node's device nodes: the ones a container gets."""
    return [d for d in driver.get("devices") or [] if re.match(r"^/dev/nvidia(\d+|ctl)$", d)]


def dev_char_due(facts, plan, settings):
    """What the role does for the /dev/char links (gpu_node_dev_char_symlinks), on a real root in host mode:
    {"rule": "write" | "remove" | None, "links": bool, "path", "text"}, or None when nothing is due.

    The rule is written once nvidia-ctk is there, the driver loaded or not (it fires when the driver binds after the
    reboot into a new driver), where udev is installed (its rules directory exists); the links are made now only when
    the driver is loaded and one is missing. State absent removes a rule that starts with the role's marker line."""
    if not (plan.selected and plan.live):
        return None
    rule = facts.driver.get("dev_char_rule") or {}
    ours = rule.get("state") == "file" and (rule.get("content") or "").startswith(release_rules.DEV_CHAR_RULE_MARKER)
    if settings.get("state") == "absent":
        return {"rule": "remove", "links": False, "path": distro.DEV_CHAR_RULE, "text": None} if ours else None
    ctk = facts.nvidia_ctk
    if not (settings.get("dev_char_symlinks") and plan.mode.mode == "host" and ctk):
        return None
    text = dev_char_rule_text(ctk)
    write = (rule.get("state") == "absent" and rule.get("parent_exists")) or (ours and rule.get("content") != text)
    driver = facts.driver
    linked = set(driver.get("char_links") or [])
    links = bool(driver.get("loaded")) and any(d not in linked for d in nvidia_device_nodes(driver))
    if not (write or links):
        return None
    return {"rule": "write" if write else None, "links": links, "path": distro.DEV_CHAR_RULE, "text": text,
            "nvidia_ctk": ctk}


def device_nodes_text(nvidia_ctk):
    """The k3s/rke2 unit drop-in that makes the NVIDIA device nodes before the service starts a pod (a DRA node).

    NVIDIA's DRA driver builds a claim's CDI spec from the device nodes that exist when its kubelet plugin starts, and
    nothing makes them at boot on a headless node (dra-driver-nvidia-gpu #1380). Before the service, at every start
    (boot, a restart after a driver change): nvidia-smi makes /dev/nvidiactl and a /dev/nvidia<N> per GPU (through the
    driver's nvidia-modprobe); nvidia-ctk the control nodes nvidia-smi does not make (nvidia-uvm, nvidia-uvm-tools,
    nvidia-modeset), loading the modules first. Each bounded and never fatal: k3s/rke2 units start with no timeout, and
    a node with a broken driver must still join (the doctor's driver layer names it)."""
    return ("%s\n[Service]\nExecStartPre=-/usr/bin/timeout 60 nvidia-smi -L\n"
            "ExecStartPre=-/usr/bin/timeout 60 %s system create-device-nodes --control-devices --load-kernel-modules\n"
            % (release_rules.DEVICE_NODES_MARKER, nvidia_ctk))


def device_nodes_due(facts, plan, settings):
    """What the role does for the device nodes of a DRA node (gpu_node_allocation=dra), on a real root in host mode:
    {"files": [{"path", "text" (None: remove)}], "now": bool}, or None when nothing is due. The drop-in goes on each
    k3s/rke2 unit once nvidia-ctk is there; "now" makes the missing device nodes at once where the driver is loaded.
    A drop-in of the role's is removed on a device-plugin node and on state absent; a file of the user's at that name
    is left alone."""
    if not (plan.selected and plan.live):
        return None
    ctk = facts.nvidia_ctk
    wanted = _device_nodes_wanted(facts, plan, settings)
    files = []
    for dropin in facts.driver.get("device_nodes_dropins") or []:
        ours = _ours(dropin)
        if wanted and (dropin.get("state") == "absent" or ours) and dropin.get("content") != device_nodes_text(ctk):
            files.append({"path": dropin["path"], "text": device_nodes_text(ctk)})
        elif not wanted and ours:
            files.append({"path": dropin["path"], "text": None})
    driver = facts.driver
    expected = ["/dev/nvidia%d" % index for index in range(driver.get("gpu_count") or 0)] + [
        "/dev/nvidiactl", "/dev/nvidia-uvm"]
    now = wanted and bool(driver.get("loaded")) and any(d not in (driver.get("devices") or []) for d in expected)
    if not (files or now):
        return None
    return {"files": files, "now": now, "nvidia_ctk": ctk}


def device_nodes_kept(facts, plan, settings):
    """Warnings for the device-nodes drop-ins a DRA node needs where a file of the user's holds that name: it is left
    as it is, so the role cannot vouch that the device nodes exist before k3s/rke2 start a claim pod."""
    if not (plan.selected and plan.live and _device_nodes_wanted(facts, plan, settings)):
        return []
    return ["%s is not the role's (its first line is not the role's marker) and is left as it is: the role's pre-start "
            "commands that make the NVIDIA device nodes before %s starts a claim pod are not written there. Move that "
            "file to another name (or remove it) and run again" % (dropin["path"], facts.distribution)
            for dropin in facts.driver.get("device_nodes_dropins") or []
            if dropin.get("state") == "file" and not _ours(dropin)]


def _device_nodes_wanted(facts, plan, settings):
    return (settings.get("state") != "absent" and settings.get("allocation") == k8s_labels.ALLOCATION_DRA
            and plan.mode.mode == "host" and bool(facts.nvidia_ctk))


def _ours(dropin):
    return dropin.get("state") == "file" and (dropin.get("content") or "").startswith(release_rules.DEVICE_NODES_MARKER)


def cdi_refresh_due(facts, plan, settings):
    """Whether the role enables the toolkit's nvidia-cdi-refresh.path (gpu_node_cdi_refresh): on a real root in host
    mode, where the toolkit ships the unit, it is not enabled yet, and the role's spec is the one the unit writes."""
    refresh = facts.toolkit.get("cdi_refresh") or {}
    return bool(plan.selected and plan.live and settings.get("state") != "absent" and settings.get("cdi_refresh")
                and settings.get("cdi_generate") and plan.mode.mode == "host" and refresh.get("unit")
                and not refresh.get("enabled") and settings.get("cdi_spec_path") == release_rules.CDI_REFRESH_OUTPUT)


def device_plugin_labels(settings, host):
    """The node labels this GPU node needs in host mode: for NVIDIA's DRA driver (gpu_node_allocation=dra: the
    allocation label its kubelet plugin selects, which keeps the device plugin off), else for the device plugin (when
    present); [] otherwise. A device-plugin node gets no allocation label: one written to every node would change every
    node's config.yaml.d, and restart k3s there, on the first run after an upgrade of the collection."""
    if settings.get("mode") != "host" or settings.get("state") == "absent":
        return []
    if settings.get("allocation") == k8s_labels.ALLOCATION_DRA:
        return ["%s=%s" % (k8s_labels.ALLOCATION_LABEL, k8s_labels.ALLOCATION_DRA),
                "%s=%s" % (device_plugin.GPU_PRESENT_LABEL, device_plugin.GPU_PRESENT_VALUE)]
    if settings.get("device_plugin_state") != "present":
        return []
    try:
        return device_plugin.labels_of_node(device_plugin.settings_of_role(settings), host, settings.get("device_plugin_config") or "")
    except K3sGpuError as exc:
        raise exc.within(host or "this host") from exc


def cdi_readiness(facts, plan, settings):
    """What the device plugin's CDI choice needs to know of this node: CDI on in containerd (as configured, or the
    release's default) and a current NVIDIA spec (or one this run generated: the spec was due before the configure
    step, and the role generates it in between)."""
    enabled = settings.get("enable_cdi")
    if enabled is None:
        enabled = bool(facts.profile.get("cdi_default_on"))
    spec = any(s.get("kind") == "nvidia.com/gpu" and s.get("current") for s in facts.cdi.get("specs") or [])
    return {"enabled": bool(enabled), "spec": spec or cdi_due(facts, plan, settings)}


def node_result(plan, facts, runtimes):
    """gpu_node_result, in one place: the plan's skeleton and what the containerd step did."""
    result = dict(plan.result)
    if runtimes is None:
        return result
    written = [r["name"] for r in runtimes.get("runtimes_written") or []]
    skipped = runtimes.get("runtimes_skipped") or []
    result.update(
        runtimes_detected=facts.handlers, written=written,
        rendered_by_release=[r["name"] for r in skipped], runtimes_skipped=skipped,
        handlers=host_state.handlers_of(runtimes),
        gpu_operator=facts.gpu_operator["present"], operator_runtimes=list(facts.gpu_operator["runtimes"]),
        template_findings=runtimes.get("template_findings") or [], upgrade_findings=runtimes.get("upgrade_findings") or [],
        runtime_in_use=runtimes.get("runtime_in_use"), cgroup_driver_mismatch=runtimes.get("cgroup_driver_mismatch"),
        default_runtime=runtimes.get("default_runtime"), node_labels=runtimes.get("node_labels"),
        files=runtimes.get("files") or [], restored=runtimes.get("restored") or [],
        changed_since_written=runtimes.get("changed_since_written") or [])
    return result


def cdi_marker(settings):
    """The marker line cdi.yml puts above a spec it generates ("" for a JSON spec, which has no comments)."""
    return "" if settings["cdi_spec_path"].endswith(".json") else distro.CDI_SPEC_MARKER


def cdi_spec_changes(facts, settings):
    """State absent: the CDI spec at gpu_node_cdi_spec_path goes when the role generated it (its marker line first).

    Returns (changes for _configure.run's extra_changes, warnings)."""
    path = settings["cdi_spec_path"]
    for spec in facts.cdi.get("specs") or []:
        if spec.get("path") != path:
            continue
        if spec.get("generated_by_collection"):
            devices = spec.get("devices") or []
            return [FileChange(key="cdi_spec", node_path=path, path=facts.host_path(path),
                               before="%s\n# (the CDI spec of %s, %d devices: %s)\n" % (
                                   distro.CDI_SPEC_MARKER, spec.get("kind"), len(devices), ", ".join(devices)),
                               after=None, exists=True, parent_exists=True, sha1=spec.get("sha1"))], []
        if spec.get("kind") == "nvidia.com/gpu":
            return [], ["%s is an NVIDIA CDI spec without the collection's marker line (generated by someone else, or "
                        "before the collection marked its specs): it stays; remove it yourself if nothing else uses it" % path]
    return [], []


def plan_absent(facts, settings, host):
    """gpu_node_state=absent: the plan that takes back what the collection wrote on the host, on every host (a GPU
    is not needed to take files back). The packages go only with gpu_node_absent_remove_toolkit /
    gpu_node_absent_remove_driver, on a real root."""
    who = host or "this host"
    live = role_vars.live(settings["root"])
    remove_toolkit = bool(settings["absent_remove_toolkit"]) and live
    # the GPU Operator's driver container has no host packages to remove
    remove_driver = bool(settings.get("absent_remove_driver")) and live and not facts.gpu_operator.get("driver_container")
    messages = []
    for wanted, what in ((settings["absent_remove_toolkit"], "NVIDIA container toolkit"),
                         (settings.get("absent_remove_driver"), "NVIDIA driver")):
        if wanted and not live:
            messages.append("%s: the %s packages are not removed (gpu_node_root is a sandbox tree)." % (who, what))
    if settings.get("absent_remove_driver") and live and not remove_driver:
        messages.append("%s: the NVIDIA driver is not removed: the GPU Operator's driver container owns it." % who)
    mode = host_state.Mode(mode=settings["mode"], state="absent", remove_host_toolkit=remove_toolkit,
                           remove_toolkit_source=remove_toolkit, remove_driver=remove_driver,
                           owners=dict((r["name"], r["owner"]) for r in facts.runtimes))
    result = {
        "status": "absent", "reason": "", "state": "absent", "distribution": facts.distribution,
        "release": facts.release, "runtimes_detected": facts.handlers,
        "gpu_operator": facts.gpu_operator["present"], "mode": settings["mode"],
        "operator_runtimes": list(facts.gpu_operator["runtimes"]), "pending": [], "handlers": [], "written": [],
        "rendered_by_release": [], "runtimes_skipped": [], "restarted": False, "verified": None, "reboot_required": False,
    }
    return host_state.RolePlan(selected=True, live=live, mode=mode, messages=messages, result=result)


def failed(result, msg):
    """A refusal as the role reports it: one message, cause and fix first (a warning that says the same is dropped),
    and none of the step's internal state (the host state it hands to the next phase)."""
    result.pop("node", None)
    result.update(failed=True, changed=False, msg=msg)
    warnings = [w for w in result.get("warnings") or [] if clause(w) not in msg]
    if warnings:
        result["warnings"] = warnings
    else:
        result.pop("warnings", None)
    return result


def plan_host(facts, settings, host):
    """The role's first decision about a host (_host_plan.first_decision, or plan_absent for gpu_node_state=absent),
    and the refusal of a toolkit install that would break the node's template. Raises K3sGpuError with the
    message for the user."""
    if settings.get("state") == "absent":
        return plan_absent(facts, settings, host)
    plan = host_state.RolePlan.from_dict(host_plan.first_decision(facts, settings, host=host))
    plan.result["state"] = "present"
    if plan.selected and plan.mode.install_toolkit and plan.live:  # a sandbox tree gets no package
        # the install makes k3s detect nvidia/nvidia-cdi at its next start: a template that breaks then
        # is refused now, before a package is installed
        refusal = decide_step.refusal_before_install(facts)
        if refusal is None and settings.get("allocation") == k8s_labels.ALLOCATION_DRA:
            refusal = claims_cdi.refusal_now(facts)  # a file of the user's turns CDI off: no claim pod could start
        if refusal:
            raise K3sGpuError("%s: the NVIDIA toolkit is not installed, because %s" % (host or "this host", refusal.cause),
                              refusal.fix, refusal.variable)
    return plan


def dra_readiness(facts, settings):
    """What the cluster step's DRA driver needs of a node with gpu_node_allocation=dra (None on other nodes): kubelet's
    root dir (config.yaml's kubelet-arg root-dir, rootless k3s, or kubelet's default) and whether the GPU Operator's
    driver container owns the driver."""
    if settings.get("allocation") != k8s_labels.ALLOCATION_DRA:
        return None
    return {"kubelet_root_dir": facts.reading.get("kubelet_root_dir") or dra_driver.KUBELET_ROOT_DIR,
            "operator_driver": bool(facts.gpu_operator.get("driver_container"))}
