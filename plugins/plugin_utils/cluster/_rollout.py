# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A safe rollout of disruptive changes (pure, controller side): the batches per cluster, the pods a drain evicts, the
processes it waits for, the annotation that marks a node the collection cordoned, and when a node is back.

Batches: each cluster's first disruptive node goes alone, as a canary; then up to gpu_node_max_unavailable of its
GPU nodes at a time (a count, or a percentage of its GPU nodes, rounded down, at least 1). Wave k of the run is the
k-th batch of every cluster at once (clusters do not wait on each other). A node a stopped run left cordoned with the
annotation is finished first, with the others of its batch; a node someone else cordoned is out of service already, so
it goes in the wave after the canary, outside the count.

PRIVATE to the collection."""

from __future__ import annotations

import json
import re

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

ANNOTATION = "k3s-gpu.nvidia/rollout"
# what the role registers of its classification (role tasks/drain.yml): the cluster step and the plan read it
DISRUPTION_FACT = "gpu_node__disruption"
MANAGER = "k3s_gpu.nvidia"
MANAGED_BY = {"app.kubernetes.io/managed-by": MANAGER}
SCOPE_GPU_PODS = "gpu_pods"
SCOPE_ALL = "all"
# NVIDIA's resources in a pod's requests or limits (nvidia.com/gpu, MIG profiles, shared replicas)
GPU_RESOURCE_PREFIX = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# host daemons of the driver itself: they hold the devices for as long as the driver is loaded, and its change stops them
DRIVER_DAEMONS = ("nvidia-persiste", "nvidia-persistenced", "nvidia-powerd", "nv-fabricmanager", "nv-hostengine")
STATES = ("draining", "changing", "proving", "failed")
_PERCENT = re.compile(r"^\s*(\d{1,3})\s*%\s*$")


# ---- batches ---------------------------------------------------------------------------------------------------------

def batch_size(max_unavailable: Any, gpu_nodes: int, where: str = "") -> int:
    """gpu_node_max_unavailable resolved for a cluster of gpu_nodes GPU nodes: a count, or N% of them rounded down,
    never less than 1."""
    text = str(max_unavailable).strip()
    found = _PERCENT.match(text)
    if found and 0 < int(found.group(1)) <= 100:
        return max(1, int(found.group(1)) * max(gpu_nodes, 1) // 100)
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise K3sGpuError("%sgpu_node_max_unavailable is %r" % ("%s: " % where if where else "", max_unavailable),
                      fix="set it to a count of nodes (1 or more) or a percentage of the cluster's GPU nodes (1% to 100%)")


def waves(hosts: Sequence[Mapping[str, Any]], gpu_nodes: Mapping[str, int]) -> Dict[str, Any]:
    """The rollout's batches. hosts: [{host, cluster, max_unavailable, resume, cordoned_by_others}] of the nodes with a
    disruptive change, in inventory order; gpu_nodes: {cluster: its GPU nodes} (the API's count, else the
    inventory's). Returns {"waves": [[host]], "hosts": [host in wave order], "serial": [wave size], "clusters":
    {cluster: {"batch": N, "canary": host}}}."""
    by_cluster: Dict[str, List[Mapping[str, Any]]] = {}
    for entry in hosts:
        by_cluster.setdefault(entry["cluster"], []).append(entry)
    planned: Dict[str, List[List[str]]] = {}
    clusters = {}
    for cluster, entries in by_cluster.items():
        size = batch_size(entries[0].get("max_unavailable", 1), gpu_nodes.get(cluster) or len(entries), cluster)
        resumed = [e["host"] for e in entries if e.get("resume")]
        others_cordoned = [e["host"] for e in entries if e.get("cordoned_by_others") and not e.get("resume")]
        rest = [e["host"] for e in entries if not e.get("resume") and not e.get("cordoned_by_others")]
        batches: List[List[str]] = []
        if resumed:
            # a stopped run left at most one batch cordoned: finish it before anything else is touched
            batches.append(resumed)
        elif rest:
            batches.append([rest.pop(0)])
        if others_cordoned:
            batches.append(others_cordoned)
        batches += [rest[index:index + size] for index in range(0, len(rest), size)]
        planned[cluster] = batches
        # a resumed batch is no canary: it finishes what a stopped run began
        clusters[cluster] = {"batch": size, "canary": batches[0][0] if batches and not resumed else None}
    merged: List[List[str]] = []
    for index in range(max([len(b) for b in planned.values()] or [0])):
        merged.append([host for cluster in by_cluster for host in (planned[cluster][index:index + 1] or [[]])[0]])
    order = [host for wave in merged for host in wave]
    return {"waves": merged, "hosts": order, "serial": [len(wave) for wave in merged], "clusters": clusters}


# ---- the node and its annotation -------------------------------------------------------------------------------------

def annotation_of(node: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The collection's rollout record on a Node, or None (also for a value that is not ours)."""
    text = (((node or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("by") == MANAGER else None


def annotation(state: str, reason: str, was_cordoned: bool, since: str, cause: str = "", layer: str = "") -> str:
    """The record the collection puts on a node it cordons: who, why, how far, and whether it was cordoned before."""
    if state not in STATES:
        raise ValueError(state)
    record = {"by": MANAGER, "state": state, "reason": reason, "was_cordoned": bool(was_cordoned), "since": since}
    if cause:
        record.update(cause=cause, layer=layer)
    return json.dumps(record, sort_keys=True)


def unschedulable(node: Mapping[str, Any]) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def cordoned_by_others(node: Mapping[str, Any]) -> bool:
    """Cordoned, and not by the collection."""
    return unschedulable(node) and annotation_of(node) is None


def cordon_patch(node: Mapping[str, Any], state: str, reason: str, since: str, cause: str = "",
                 layer: str = "") -> Dict[str, Any]:
    """The merge patch that cordons the node and records the step; was_cordoned is kept from an earlier record."""
    earlier = annotation_of(node)
    was_cordoned = bool(earlier.get("was_cordoned")) if earlier else unschedulable(node)
    return {"spec": {"unschedulable": True},
            "metadata": {"annotations": {ANNOTATION: annotation(state, reason, was_cordoned, since, cause, layer)}}}


def uncordon_patch(node: Mapping[str, Any]) -> Dict[str, Any]:
    """The merge patch that takes the record away and uncordons the node, unless someone else had cordoned it."""
    record = annotation_of(node)
    patch: Dict[str, Any] = {"metadata": {"annotations": {ANNOTATION: None}}}
    if not (record and record.get("was_cordoned")):
        patch["spec"] = {"unschedulable": None}
    return patch


def node_ready(node: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in ((node or {}).get("status") or {}).get("conditions") or [])


def allocatable_gpus(node: Mapping[str, Any]) -> int:
    value = str((((node or {}).get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0"))
    return int(value) if value.isdigit() else 0


def back(node: Mapping[str, Any], expect_gpu: bool) -> Tuple[bool, str]:
    """(whether the node is back after its change, what it still waits for)."""
    if not node:
        return False, "the Node object is not there"
    if not node_ready(node):
        return False, "the node is not Ready"
    if expect_gpu and allocatable_gpus(node) < 1:
        return False, "the node advertises no allocatable %s" % GPU_RESOURCE
    return True, ""


# ---- the pods a drain evicts -----------------------------------------------------------------------------------------

def _resources(pod: Mapping[str, Any]) -> Iterable[str]:
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            yield from resources.get(part) or {}


def uses_gpu(pod: Mapping[str, Any]) -> bool:
    """A pod that asks for an NVIDIA resource, a DRA claim, or runs under an NVIDIA RuntimeClass (whose runtime may give
    it every GPU through NVIDIA_VISIBLE_DEVICES=all)."""
    spec = pod.get("spec") or {}
    return (any(name.startswith(GPU_RESOURCE_PREFIX) for name in _resources(pod)) or bool(spec.get("resourceClaims"))
            or str(spec.get("runtimeClassName") or "").startswith("nvidia"))


def kept(pod: Mapping[str, Any]) -> str:
    """Why a drain leaves the pod where it is ("" when it does not): a DaemonSet's pod (its controller would put it
    back at once; NVIDIA's device plugin is one), a static (mirror) pod, the collection's own, a pod that has ended."""
    metadata = pod.get("metadata") or {}
    if any(owner.get("kind") == "DaemonSet" for owner in metadata.get("ownerReferences") or []):
        return "a DaemonSet's pod"
    if MIRROR_ANNOTATION in (metadata.get("annotations") or {}):
        return "a static pod"
    if (metadata.get("labels") or {}).get("app.kubernetes.io/managed-by") == MANAGER:
        return "the collection's own pod"
    if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
        return "it has ended"
    return ""


def pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return "%s/%s" % (metadata.get("namespace"), metadata.get("name"))


def to_evict(pods: Sequence[Mapping[str, Any]], scope: str) -> List[Mapping[str, Any]]:
    """The pods of the node that the drain evicts: every pod a drain may move (scope all), or those of them that use a
    GPU (gpu_pods), by namespace and name."""
    chosen = [pod for pod in pods if not kept(pod) and (scope == SCOPE_ALL or uses_gpu(pod))]
    return sorted(chosen, key=pod_key)


def cgroup_uids(pod: Mapping[str, Any]) -> List[str]:
    """The uids a pod's processes carry in their cgroup: its own, and for a static pod the config hash its mirror pod
    records (kubelet names the static pod's cgroup after that hash, not after the mirror's uid)."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return [uid for uid in (metadata.get("uid"), annotations.get(MIRROR_ANNOTATION),
                            annotations.get("kubernetes.io/config.hash")) if uid]


def waited_holders(holders: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The processes holding an NVIDIA device that the drain waits for: all but those of pods a drain keeps (NVIDIA's
    device plugin, a monitoring DaemonSet: the driver change restarts them) and the driver's own host daemons."""
    kept_uids = set(uid for pod in pods if kept(pod) for uid in cgroup_uids(pod))
    return [holder for holder in holders
            if holder.get("pod_uid") not in kept_uids and str(holder.get("command") or "") not in DRIVER_DAEMONS]


def holder_lines(holders: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> List[str]:
    """'namespace/name (pid N, command) holds /dev/nvidia0' per process, its pod named where the cgroup says."""
    by_uid = dict((uid, pod_key(pod)) for pod in pods for uid in cgroup_uids(pod))
    lines = []
    for holder in holders:
        owner = by_uid.get(holder.get("pod_uid")) or ("pod %s" % holder["pod_uid"] if holder.get("pod_uid") else "a host process")
        held = ", ".join(holder.get("devices") or []) or "an NVIDIA device"
        lines.append("%s (pid %s, %s) holds %s" % (owner, holder.get("pid"), holder.get("command"), held))
    return lines


def eviction(pod: Mapping[str, Any]) -> Dict[str, Any]:
    """The Eviction the API checks against the pod's PodDisruptionBudgets."""
    metadata = pod.get("metadata") or {}
    return {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace")}}
