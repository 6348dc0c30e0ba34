# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which of the gpu_node role's changes disrupt the GPU workloads of a node (pure, controller side).

Disruptive: a driver install, upgrade or removal (the kernel module is replaced: a process that holds the old one keeps
it until it ends, a new one cannot load while it is held, and the policy may reboot), a reboot, a change the user
declares (gpu_node_disruptive_change: a kernel or k3s upgrade wrapped by the role's drain/prove entry points).
Not disruptive: the container toolkit (running containers keep the hook they started with), the CDI spec, and a
restart of k3s/rke2 for a containerd config change: containerd's shims keep every container running while it
restarts (shown on the cluster lab: tests/cluster/test_rollout_lab.py, the container IDs stay).

PRIVATE to the collection."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

DRAIN_AUTO = "auto"
DRAIN_NEVER = "never"
RESTART_CHANGE = "containerd config and a k3s/rke2 restart"
FIX_KUBECONFIG = ("set gpu_node_kubeconfig (or k3s_gpu_kubeconfig, or K8S_AUTH_KUBECONFIG on the controller) to a "
                  "kubeconfig of the node's cluster, so that the role cordons the node and evicts its GPU pods first, "
                  "or set gpu_node_drain: never if you drain the node yourself")


def _change(what: str, disruptive: bool, why: str) -> Dict[str, Any]:
    return {"change": what, "disruptive": disruptive, "why": why}


def _probed(probe: Mapping[str, Any], *signs: str) -> bool:
    """Whether gpu_node_packages, run in check mode, would change packages (a skipped or missing run: no)."""
    return bool(probe) and not probe.get("skipped") and any(probe.get(sign) for sign in signs)


def _driver_change(mode: Mapping[str, Any], driver: Mapping[str, Any], probe: Mapping[str, Any],
                   reboot_policy: str, removal_probe: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The driver change the package manager announced in check mode (probe: the install's result; removal_probe:
    the removal's), or None: a second absent run, whose packages are gone, changes nothing and drains nothing."""
    if mode.get("remove_driver") and _probed(removal_probe, "packages_changed"):
        return _change("driver removal", True, "the driver's libraries leave the node under the GPU pods that use them")
    if not _probed(probe, "packages_changed", "unseen", "driver_changed"):
        return None
    loaded = driver.get("version") if driver.get("loaded") else None
    what = "driver upgrade from %s" % loaded if loaded else "driver install"
    why = ("the kernel module is replaced: a GPU process keeps the old one until it ends and the new one cannot load "
           "while a process holds /dev/nvidia*")
    if reboot_policy == "always":
        why += "; gpu_node_driver_reboot: always reboots the node"
    elif reboot_policy == "if_needed" and loaded:
        why += "; gpu_node_driver_reboot: if_needed reboots the node when the loaded module is another version"
    return _change(what, True, why)


def classify(mode: Mapping[str, Any], driver: Mapping[str, Any], probe: Mapping[str, Any], reboot_policy: str,
             declared: str = "", toolkit_due: bool = False, configure_due: bool = False, cdi_due: bool = False,
             resume: bool = False, removal_probe: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """{"disruptive", "reason", "changes": [{change, disruptive, why}]} for one node.

    mode: the host step's plan (install_driver, remove_driver, ...); driver: the driver the node has ({loaded,
    version}); probe, removal_probe: the driver's package step (install, removal) run in check mode ({} when it did not
    run); declared: a change the
    user names as disruptive; resume: a killed run left the node cordoned with the collection's annotation."""
    changes: List[Dict[str, Any]] = []
    driver_change = _driver_change(mode, driver or {}, probe or {}, reboot_policy, removal_probe or {})
    if driver_change:
        changes.append(driver_change)
    if declared:
        changes.append(_change(declared, True, "declared disruptive (gpu_node_disruptive_change)"))
    if resume:
        changes.append(_change("finish the rollout a stopped run left", True,
                               "the node is cordoned with the collection's annotation"))
    if toolkit_due:
        changes.append(_change("container toolkit", False, "running containers keep the runtime hook they started with"))
    if cdi_due:
        changes.append(_change("CDI spec", False, "containers read it when they are created"))
    if configure_due:
        changes.append(_change(RESTART_CHANGE, False,
                               "containerd's shims keep the running containers through the restart"))
    disruptive = [entry["change"] for entry in changes if entry["disruptive"]]
    return {"disruptive": bool(disruptive), "reason": "; ".join(disruptive), "changes": changes}


def drain_decision(host: str, classified: Mapping[str, Any], drain: str, kubeconfig: str, runs_kubernetes: bool,
                   check_mode: bool = False) -> Dict[str, Any]:
    """{"drain": bool, "note": str}: whether the role cordons and drains the node before its disruptive change.

    Raises K3sGpuError (nothing changed) for a disruptive change on a node that runs k3s/rke2 without a kubeconfig,
    unless gpu_node_drain is never (the user drains it)."""
    if not classified["disruptive"]:
        return {"drain": False, "note": ""}
    if drain == DRAIN_NEVER:
        return {"drain": False, "note": "%s: %s disrupts its GPU pods; gpu_node_drain: never, so the role does not "
                                        "cordon or drain it" % (host, classified["reason"])}
    if not kubeconfig:
        if not runs_kubernetes:
            return {"drain": False, "note": "%s: %s; the node runs no k3s/rke2 yet, so there is nothing to drain"
                                            % (host, classified["reason"])}
        raise K3sGpuError("%s: %s would disrupt the GPU pods of this k3s/rke2 node, and no kubeconfig is set to cordon "
                          "and drain it first" % (host, classified["reason"]), fix=FIX_KUBECONFIG)
    return {"drain": True, "note": "%s: %s: %s cordon the node, evict its GPU pods, change, prove it with a GPU pod, "
                                   "uncordon" % (host, classified["reason"], "would" if check_mode else "will")}
