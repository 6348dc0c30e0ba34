# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the rollout reads of the role and the cluster before a node is touched: a node's rollout settings (its
kubeconfig, its Node's name), which of its changes disrupt (role/_disruption over the host step's reading and the
driver's check-mode probe), and, for k3s_gpu.nvidia.site, the batches of the run's disruptive nodes per cluster
(cluster/_rollout.waves), with the nodes a stopped run left cordoned found by the collection's annotation.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import os

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _rollout as rollout
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster._kube_api import Cluster
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _disruption as disruption
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars

SETTINGS = ("gpu_node_kubeconfig", "gpu_node_kubernetes_node", "gpu_node_drain", "gpu_node_drain_scope",
            "gpu_node_drain_timeout_seconds", "gpu_node_prove_timeout_seconds", "gpu_node_prove_image",
            "gpu_node_prove_runtimeclass", "gpu_node_max_unavailable", "gpu_node_disruptive_change", "gpu_node_root",
            "gpu_node_driver_reboot", "gpu_node_state")
# the kubeconfig the verify playbook uses, when the role's own is not set
SHARED_KUBECONFIG = "k3s_gpu_kubeconfig"
SHARED_NODE_NAME = "k3s_gpu_node_name"


def settings_of(task_vars: Mapping[str, Any], template: Callable[[Any], Any], host: str,
                environment_kubeconfig: str = "") -> Dict[str, Any]:
    """The rollout's settings of one host, converted by the role's argument spec; kubeconfig: gpu_node_kubeconfig,
    else k3s_gpu_kubeconfig, else K8S_AUTH_KUBECONFIG; node: gpu_node_kubernetes_node, else k3s_gpu_node_name (the
    doctor's), else the inventory name."""
    settings = role_vars.read(task_vars, template, SETTINGS, where=host)
    kubeconfig = settings["kubeconfig"] or (template(task_vars[SHARED_KUBECONFIG]) if SHARED_KUBECONFIG in task_vars
                                            else "") or environment_kubeconfig
    settings["kubeconfig"] = os.path.expanduser(str(kubeconfig)) if kubeconfig else ""
    # the doctor's name for the host's node (k3s_gpu_node_name) when the role's own is not set
    shared_name = template(task_vars[SHARED_NODE_NAME]) if SHARED_NODE_NAME in task_vars else ""
    settings["node"] = settings["kubernetes_node"] or (str(shared_name) if shared_name else "") or host
    return settings


def cluster_of(settings: Mapping[str, Any], host: str) -> Cluster:
    if not settings["kubeconfig"]:
        raise K3sGpuError("%s: no kubeconfig is set to reach the node's cluster" % host, fix=disruption.FIX_KUBECONFIG)
    return Cluster(settings["kubeconfig"])


def _host_state(task_vars: Mapping[str, Any], template: Callable[[Any], Any]) -> Dict[str, Any]:
    registered = template(task_vars.get("gpu_node_result") or {})
    return host_state.decoded((registered or {}).get("node")) or {}


def classify(task_vars: Mapping[str, Any], template: Callable[[Any], Any], settings: Mapping[str, Any],
             args: Mapping[str, Any], host: str, check_mode: bool) -> Dict[str, Any]:
    """role/_disruption over what the host step read (none when the drain entry point runs alone) and the probe."""
    state = _host_state(task_vars, template)
    facts, plan = state.get("facts") or {}, state.get("plan") or {}
    mode = plan.get("mode") or {}
    registered = template(task_vars.get("gpu_node_result") or {}) or {}
    classified = disruption.classify(mode, facts.get("driver") or {}, args.get("probe") or {}, settings["driver_reboot"],
                                     declared=settings["disruptive_change"],
                                     toolkit_due=bool(mode.get("install_toolkit")),
                                     # a sandbox's host step wrote its containerd files already (changed)
                                     configure_due=bool(registered.get("configure_due") or registered.get("changed")),
                                     cdi_due=bool(registered.get("cdi_due")), resume=args["resume"],
                                     removal_probe=args["removal_probe"])
    decided = disruption.drain_decision(host, classified, settings["drain"], settings["kubeconfig"],
                                        runs_kubernetes=runs_kubernetes(task_vars, template), check_mode=check_mode)
    # k3s_gpu.nvidia.site's first pass leaves a disruptive node to its rollout play
    return dict(classified, **decided, node=settings["node"], deferred=bool(classified["disruptive"] and args["defer"]))


def runs_kubernetes(task_vars: Mapping[str, Any], template: Callable[[Any], Any]) -> bool:
    """Whether the host runs k3s/rke2 by the host step's reading (its units); True when the step did not read it."""
    state = _host_state(task_vars, template)
    return bool((state.get("facts") or {}).get("units")) or not state


def expects_gpu(task_vars: Mapping[str, Any], template: Callable[[Any], Any], settings: Mapping[str, Any]) -> bool:
    """A node the role takes back (gpu_node_state absent, the driver removed) is proved Ready only, without a GPU pod."""
    mode = (_host_state(task_vars, template).get("plan") or {}).get("mode") or {}
    return settings["state"] != "absent" and not mode.get("remove_driver")


def _cluster_nodes(kubeconfig: str, lines: List[str]) -> Optional[Dict[str, Dict[str, Any]]]:
    """{name: Node} of a cluster, or None (said in lines) when it cannot be read."""
    try:
        return dict((node["metadata"]["name"], node) for node in Cluster(kubeconfig).nodes())
    except K3sGpuError as exc:
        lines.append("cannot read the Nodes with %s (%s): nodes a stopped run left cordoned are not found there"
                     % (kubeconfig, exc.cause))
        return None


def _gpu_node(node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return rollout.allocatable_gpus(node) > 0 or labels.get("nvidia.com/gpu.present") == "true"


def plan(clusters: Sequence[Mapping[str, Any]], hostvars: Mapping[str, Any], template: Callable[[Any], Any],
         environment_kubeconfig: str = "") -> Dict[str, Any]:
    """The batches of k3s_gpu.nvidia.site's rollout play. clusters: k3s_gpu__clusters.clusters ([{name, hosts}])."""
    lines: List[str] = []
    read: Dict[str, Optional[Dict[str, Dict[str, Any]]]] = {}
    entries, gpu_nodes = [], {}
    members = [(str(entry.get("name")), host) for entry in clusters for host in entry.get("hosts") or []]
    for cluster, host in members:
        if host not in hostvars:
            continue
        found = role_vars.registered(hostvars, host)
        classified = found.get(rollout.DISRUPTION_FACT) or {}
        settings = settings_of(hostvars[host], template, host, environment_kubeconfig)
        node = None
        if settings["kubeconfig"] and settings["drain"] != disruption.DRAIN_NEVER:
            if settings["kubeconfig"] not in read:
                read[settings["kubeconfig"]] = _cluster_nodes(settings["kubeconfig"], lines)
            nodes = read[settings["kubeconfig"]]
            if nodes is not None:
                node = nodes.get(settings["node"])
                gpu_nodes[cluster] = sum(1 for each in nodes.values() if _gpu_node(each))
        resume = rollout.annotation_of(node or {}) is not None
        if not (classified.get("disruptive") or resume):
            continue
        entries.append({"host": host, "cluster": cluster, "max_unavailable": settings["max_unavailable"],
                        "resume": resume, "cordoned_by_others": rollout.cordoned_by_others(node or {}),
                        "reason": classified.get("reason") or "finish the rollout a stopped run left"})
    batches = rollout.waves(entries, gpu_nodes)
    by_host = {}
    for index, wave in enumerate(batches["waves"]):
        for host in wave:
            entry = next(e for e in entries if e["host"] == host)
            by_host[host] = {"wave": index + 1, "canary": batches["clusters"][entry["cluster"]]["canary"] == host,
                             "resume": entry["resume"], "cordoned_by_others": entry["cordoned_by_others"],
                             "cluster": entry["cluster"], "reason": entry["reason"]}
            lines.append("wave %d: %s (%s%s%s): %s" % (
                index + 1, host, entry["cluster"], ", canary" if by_host[host]["canary"] else "",
                ", finishing a stopped run" if entry["resume"] else "", entry["reason"]))
    return dict(batches, rollout_hosts=by_host, lines=lines or ["no node needs a disruptive change"])
