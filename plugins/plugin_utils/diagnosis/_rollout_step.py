# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rollout's steps on one node, around a disruptive change (the action k3s_gpu.nvidia.gpu_rollout runs them):

drain: cordon the node with the collection's annotation (who, why, how far), evict the pods the scope names through
the Eviction API (a PodDisruptionBudget answers 429 and is asked again until the timeout), wait until they are gone
and no process on the node holds an NVIDIA device. On timeout the node is uncordoned as it was, nothing is changed,
and the node fails with the pods and processes that still hold it.

prove: wait until the node is Ready and advertises nvidia.com/gpu again, run verify's smoke pod pinned to it
(tolerating the cordon), and only when it passes take the annotation away and uncordon (a node someone else had
cordoned stays cordoned). When it fails the node stays cordoned, its annotation carries the layer and the cause, and
the node fails with them: the rollout stops before the next batch.

The rules are in cluster/_rollout (batches, pods, annotation) and diagnosis/_verify (the smoke pod's verdict).

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import re
import time

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Mapping

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _rollout as rollout
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster._kube_api import Cluster, Refused
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify

POLL_SECONDS = 2
STUCK_SECONDS = 20  # a pod in one broken state this long is broken (kubelet's retries: verify's own threshold)
BUDGET_RETRY_SECONDS = 5  # kubectl drain's pause between evictions a budget refused
HOLDERS_MODULE = "k3s_gpu.nvidia.gpu_device_holders"
PROVE_NAMESPACE = "k3s-gpu-rollout"
FIX_DRAIN = ("let the pods go (their PodDisruptionBudgets, or their processes outside Kubernetes), raise "
             "gpu_node_drain_timeout_seconds, or drain the node yourself and set gpu_node_drain: never")


def prove_pod(node: str, namespace: str, image: str, runtimeclass: str) -> Dict[str, Any]:
    """The GPU pod that proves the node before it is uncordoned: verify's smoke pod for the node and class, named for
    the rollout, marked as the collection's own (a drain keeps it), tolerating the cordon it is there to lift. Its GPU
    limit is the API's quantity text: the Python client checks the type, kubernetes.core (verify's path) does not."""
    pod = verify.smoke_pods({"pairs": [[node, runtimeclass]]}, namespace, image)[0]
    pod["metadata"].update(name=re.sub("[^a-z0-9-]", "-", ("prove-%s" % node).lower())[:63].rstrip("-"),
                           labels=dict(rollout.MANAGED_BY, **{"k3s-gpu.nvidia/prove": "true"}))
    pod["spec"]["tolerations"].append({"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                       "effect": "NoSchedule"})
    for container in pod["spec"]["containers"]:
        container["resources"]["limits"] = dict((key, str(value)) for key, value in container["resources"]["limits"].items())
    return pod


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class RolloutTask:
    """What the step needs of its Ansible task: the host, check mode, a display, and a runner of a read-only module on
    the node (run_module(name, args) -> result)."""
    host: str
    check_mode: bool
    display: Any
    run_module: Callable[[str, Dict[str, Any]], Dict[str, Any]]
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic


class RolloutStep:

    def __init__(self, task: RolloutTask, cluster: Cluster, node_name: str):
        self.task = task
        self.cluster = cluster
        self.node_name = node_name
        self._resumed = False

    # ---- the node ---------------------------------------------------------------------------------------------------
    def node(self) -> Dict[str, Any]:
        found = self.cluster.node(self.node_name)
        if found is None:
            raise K3sGpuError("%s: the cluster of %s has no Node named %s"
                              % (self.task.host, self.cluster.kubeconfig, self.node_name),
                              fix="set gpu_node_kubernetes_node to the node's name in the cluster (kubectl get nodes)")
        return found

    def _record(self, node: Mapping[str, Any], state: str, reason: str, cause: str = "", layer: str = "") -> None:
        self.cluster.patch_node(self.node_name, rollout.cordon_patch(node, state, reason, now_text(), cause, layer))

    def _release(self, node: Mapping[str, Any]) -> None:
        self.cluster.patch_node(self.node_name, rollout.uncordon_patch(node))

    # ---- drain ------------------------------------------------------------------------------------------------------
    def drain(self, reason: str, scope: str, timeout: int, root: str, runs_kubernetes: bool = True) -> Dict[str, Any]:
        """Cordon, evict, wait for the devices; {cordoned, evicted, kept, waited_seconds, resumed, drained}. A node that
        is not in the cluster and runs no k3s/rke2 (a new node getting its first driver) has nothing to drain."""
        if not runs_kubernetes and self.cluster.node(self.node_name) is None:
            self.task.display.display("%s: the cluster has no Node named %s and the host runs no k3s/rke2: nothing to "
                                      "drain" % (self.task.host, self.node_name))
            return {"node": self.node_name, "drained": False, "evicted": []}
        node = self.node()
        record = rollout.annotation_of(node)
        self._resumed = bool(record)
        if record and record.get("reason"):
            reason = record["reason"]  # finishing a stopped run: its change, not "finish the rollout"
        pods = self.cluster.pods_on(self.node_name)
        chosen = rollout.to_evict(pods, scope)
        outcome = {"node": self.node_name, "drained": True, "resumed": bool(record),
                   "cordoned": not rollout.unschedulable(node),
                   "was_cordoned": rollout.cordoned_by_others(node) or bool(record and record.get("was_cordoned")),
                   "evicted": [rollout.pod_key(pod) for pod in chosen],
                   "kept": ["%s (%s)" % (rollout.pod_key(pod), rollout.kept(pod)) for pod in pods if rollout.kept(pod)
                            and rollout.uses_gpu(pod)]}
        if self.task.check_mode:
            self.task.display.display("%s: would cordon node %s (%s) and evict %s" % (
                self.task.host, self.node_name, reason, ", ".join(outcome["evicted"]) or "no pod"))
            return outcome
        self._record(node, "draining", reason)
        started = self.task.clock()
        deadline = started + timeout
        try:
            self._evict_all(chosen, deadline)
            self._wait_free(root, deadline)
        except K3sGpuError:
            if record:  # a stopped run's node stays as that run left it: cordoned, with its record
                self.cluster.patch_node(self.node_name, {"metadata": {"annotations": {
                    rollout.ANNOTATION: node["metadata"]["annotations"][rollout.ANNOTATION]}}})
            else:
                self._release(self.cluster.node(self.node_name) or node)
            raise
        self._record(self.cluster.node(self.node_name) or node, "changing", reason)
        outcome["waited_seconds"] = round(self.task.clock() - started, 1)
        return outcome

    def _drain_fix(self) -> str:
        if self._resumed:
            return FIX_DRAIN + ". The node stays cordoned, as the stopped run left it; nothing was changed"
        return FIX_DRAIN + ". The node is uncordoned as it was; nothing was changed"

    def _evict_all(self, chosen: List[Mapping[str, Any]], deadline: float) -> None:
        """Evict each pod until the API accepts (a budget answers 429: asked again), then wait until they are gone."""
        waiting = {rollout.pod_key(pod): pod for pod in chosen}
        refused: Dict[str, str] = {}
        while waiting:
            for key, pod in sorted(waiting.items()):
                try:
                    self.cluster.evict(rollout.eviction(pod))
                    del waiting[key]
                except Refused as exc:
                    if exc.status != 429:
                        raise
                    refused[key] = str(exc.cause)
            if waiting:
                if self.task.clock() >= deadline:
                    raise K3sGpuError("%s: node %s was not drained: %s" % (
                        self.task.host, self.node_name,
                        "; ".join("%s: %s" % (key, refused.get(key, "not evicted")) for key in sorted(waiting))),
                        fix=self._drain_fix())
                self.task.sleep(BUDGET_RETRY_SECONDS)
        gone = set(chosen and [rollout.pod_key(pod) for pod in chosen])
        while True:
            left = [pod for pod in self.cluster.pods_on(self.node_name) if rollout.pod_key(pod) in gone
                    and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            if not left:
                return
            if self.task.clock() >= deadline:
                raise K3sGpuError("%s: node %s was not drained: evicted but still there: %s" % (
                    self.task.host, self.node_name, ", ".join(rollout.pod_key(pod) for pod in left)),
                    fix=self._drain_fix())
            self.task.sleep(POLL_SECONDS)

    def holders(self, root: str) -> List[Dict[str, Any]]:
        found = self.task.run_module(HOLDERS_MODULE, {"root": root})
        if found.get("failed"):
            raise K3sGpuError("%s: %s failed: %s" % (self.task.host, HOLDERS_MODULE, found.get("msg") or "no message"))
        return found.get("holders") or []

    def _wait_free(self, root: str, deadline: float) -> None:
        while True:
            pods = self.cluster.pods_on(self.node_name)
            left = rollout.waited_holders(self.holders(root), pods)
            if not left:
                return
            if self.task.clock() >= deadline:
                raise K3sGpuError("%s: node %s was not drained: processes still hold its GPUs: %s" % (
                    self.task.host, self.node_name, "; ".join(rollout.holder_lines(left, pods))),
                    fix=self._drain_fix())
            self.task.sleep(POLL_SECONDS)

    # ---- prove ------------------------------------------------------------------------------------------------------
    def prove(self, timeout: int, image: str, runtimeclass: str, expect_gpu: bool) -> Dict[str, Any]:
        """Wait until the node is back, run the GPU pod, uncordon; {proved, line, uncordoned, left_cordoned}."""
        node = self.node()
        record = rollout.annotation_of(node)
        if self.task.check_mode:  # the drain cordoned nothing in check mode
            return {"node": self.node_name, "proved": False, "uncordoned": False,
                    "line": "%s: would prove the node with a GPU pod and uncordon it" % self.task.host}
        if record is None:
            return {"node": self.node_name, "proved": False, "uncordoned": False,
                    "line": "%s: not cordoned by the collection: nothing to prove" % self.node_name}
        reason = record.get("reason") or ""
        deadline = self.task.clock() + timeout
        while True:
            ready, waiting_for = rollout.back(node, expect_gpu)
            if ready:
                break
            if self.task.clock() >= deadline:
                self._fail(node, reason, "node", "%s after its change (%d s)" % (waiting_for, timeout),
                           verify.FIX_DEVICE_PLUGIN if "allocatable" in waiting_for else verify.FIX_DRIVER)
            self.task.sleep(POLL_SECONDS)
            node = self.node()
        self._record(node, "proving", reason)
        line = "%s: Ready" % self.node_name
        if expect_gpu:
            line = self._gpu_pod(node, reason, deadline, image, runtimeclass)
        node = self.node()
        self._release(node)
        left = bool(record.get("was_cordoned"))
        return {"node": self.node_name, "proved": True, "uncordoned": not left, "left_cordoned": left, "line": line}

    def _gpu_pod(self, node: Mapping[str, Any], reason: str, deadline: float, image: str, runtimeclass: str) -> str:
        pod = prove_pod(self.node_name, PROVE_NAMESPACE, image, runtimeclass)
        name = pod["metadata"]["name"]
        self.cluster.ensure_namespace(PROVE_NAMESPACE)
        self.cluster.delete_pod(PROVE_NAMESPACE, name)
        self._gone(name, deadline)
        self.cluster.create_pod(pod)
        try:
            state, found = {"done": False, "broken": None}, pod
            broken_since = None
            while True:
                found = self.cluster.pod(PROVE_NAMESPACE, name) or found
                events = self.cluster.events_of(PROVE_NAMESPACE, name)
                lines = self.cluster.pod_log(PROVE_NAMESPACE, name) if (found.get("status") or {}).get("phase") in (
                    "Succeeded", "Failed") else []
                state = verify.diagnose(found, events, lines)
                if state["done"]:
                    break
                if state["broken"] is not None:
                    broken_since = broken_since or self.task.clock()
                    if self.task.clock() - broken_since >= STUCK_SECONDS:
                        break
                else:
                    broken_since = None
                if self.task.clock() >= deadline:
                    state = {"done": True, "broken": verify.broken(
                        "%s / %s" % (self.node_name, runtimeclass), "pod", "the GPU pod did not end in time (phase %s)"
                        % (found.get("status") or {}).get("phase", "Pending"),
                        "look at the pod's events: kubectl -n %s describe pod %s" % (PROVE_NAMESPACE, name))}
                    break
                self.task.sleep(POLL_SECONDS)
        finally:
            self.cluster.delete_pod(PROVE_NAMESPACE, name)
        if state["broken"] is not None:
            entry = state["broken"]
            self._fail(self.node(), reason, entry["layer"], entry["cause"], entry["fix"])
        return "%s / %s: OK | %s" % (self.node_name, runtimeclass, verify.gpu_line(lines))

    def _gone(self, name: str, deadline: float) -> None:
        while self.cluster.pod(PROVE_NAMESPACE, name) is not None and self.task.clock() < deadline:
            self.task.sleep(POLL_SECONDS / 2)

    def _fail(self, node: Mapping[str, Any], reason: str, layer: str, cause: str, fix: str) -> None:
        """Leave the node cordoned with the cause on its annotation, and fail it."""
        self._record(node, "failed", reason, cause, layer)
        raise K3sGpuError("%s: node %s stays cordoned: BROKEN at %s: %s" % (self.task.host, self.node_name, layer, cause),
                          fix="%s; then run the playbook again: it proves the node and uncordons it" % fix.rstrip("."))
