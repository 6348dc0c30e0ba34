# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rollout's steps on one node (issue 43): drain (cordon with the annotation, evict through the Eviction API,
wait for the devices; on timeout uncordon as it was) and prove (a GPU pod, then uncordon; on failure stay cordoned
with the cause on the annotation). Against a FakeCluster and a fake clock: no API server, no waiting."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _rollout as rollout
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster._kube_api import Refused
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _rollout_step as rollout_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis._rollout_step import RolloutStep, RolloutTask

NODE = "gpu1"
REASON = "driver upgrade from 580.95.05"
GPU_LOG = ["/dev/nvidia0", "GPU 0: NVIDIA Lab (UUID: x)"]


def merge(target, patch):
    """RFC 7386 JSON merge patch: a None value deletes the key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeCluster:
    """A TEST DOUBLE that stands in for the API server behind _kube_api.Cluster: it keeps a dict of Nodes and one of
    pods, applies JSON merge patches to Nodes (None deletes a key), answers an eviction of a budget-protected pod with
    429 (as a PodDisruptionBudget does) and otherwise deletes the pod, and records every call in `calls`."""

    kubeconfig = "/fake/kubeconfig"

    def __init__(self, nodes, pods=(), protected=(), lingering=(), forbidden=(), prove_phase="Succeeded", prove_exit=0,
                 prove_log=None):
        self.nodes = dict((found["metadata"]["name"], copy.deepcopy(found)) for found in nodes)
        self.pods = dict((rollout.pod_key(found), copy.deepcopy(found)) for found in pods)
        # protected: a budget refuses their eviction (429); lingering: evicted, but they do not end;
        # forbidden: the kubeconfig's user may not evict them (403)
        self.protected, self.lingering, self.forbidden = set(protected), set(lingering), set(forbidden)
        self.prove_phase, self.prove_exit, self.prove_log = prove_phase, prove_exit, list(GPU_LOG if prove_log is None else prove_log)
        self.calls = []

    def called(self, name):
        return [args for call, args in self.calls if call == name]

    # nodes
    def node(self, name):
        self.calls.append(("node", name))
        found = self.nodes.get(name)
        return copy.deepcopy(found) if found is not None else None

    def patch_node(self, name, patch):
        self.calls.append(("patch_node", (name, copy.deepcopy(patch))))
        return copy.deepcopy(merge(self.nodes[name], patch))

    # pods
    def pods_on(self, name):
        self.calls.append(("pods_on", name))
        return [copy.deepcopy(found) for found in self.pods.values() if found["spec"].get("nodeName") == name]

    def evict(self, eviction):
        key = "%s/%s" % (eviction["metadata"]["namespace"], eviction["metadata"]["name"])
        self.calls.append(("evict", key))
        if key in self.protected:
            raise Refused("evict pod %s: the API server answered 429 Too Many Requests: Cannot evict pod as it would "
                          "violate the pod's disruption budget" % key, status=429)
        if key in self.forbidden:
            raise Refused("evict pod %s: the API server answered 403 Forbidden" % key, status=403)
        if key not in self.lingering:
            self.pods.pop(key, None)

    def pod(self, namespace, name):
        found = self.pods.get("%s/%s" % (namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create_pod(self, found):
        self.calls.append(("create_pod", copy.deepcopy(found)))
        stored = copy.deepcopy(found)
        stored["spec"]["nodeName"] = NODE
        stored["status"] = {"phase": self.prove_phase}
        if self.prove_phase == "Failed":
            stored["status"]["containerStatuses"] = [{"name": "prove", "state": {
                "terminated": {"exitCode": self.prove_exit, "reason": "Error"}}}]
        self.pods[rollout.pod_key(stored)] = stored
        return copy.deepcopy(stored)

    def delete_pod(self, namespace, name):
        self.calls.append(("delete_pod", "%s/%s" % (namespace, name)))
        self.pods.pop("%s/%s" % (namespace, name), None)

    def pod_log(self, namespace, name):
        return list(self.prove_log)

    def events_of(self, namespace, name):
        return []

    def ensure_namespace(self, name):
        self.calls.append(("ensure_namespace", name))


class Clock:
    """A fake monotonic clock; sleep() moves it on."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


class Display:
    def __init__(self):
        self.lines = []

    def display(self, text):
        self.lines.append(text)


class Holders:
    """The gpu_device_holders module on the node: the holders it reports, call after call (the last one repeats)."""

    def __init__(self, *answers):
        self.answers = list(answers) or [[]]
        self.calls = []

    def __call__(self, name, args):
        self.calls.append((name, args))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return {"changed": False, "holders": answer}


def node(unschedulable=False, record=None, ready=True, gpus="1"):
    found = {"metadata": {"name": NODE, "annotations": {"other": "kept"}}, "spec": {"podCIDR": "10.42.1.0/24"},
             "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                        "allocatable": {"cpu": "8", rollout.GPU_RESOURCE: gpus}}}
    if unschedulable:
        found["spec"]["unschedulable"] = True
    if record is not None:
        found["metadata"]["annotations"][rollout.ANNOTATION] = record
    return found


def pod(name, namespace="default", gpu=True, owner=None):
    found = {"metadata": {"name": name, "namespace": namespace, "uid": "uid-" + name},
             "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {
                 "limits": {rollout.GPU_RESOURCE: 1}} if gpu else {}}]},
             "status": {"phase": "Running"}}
    if owner:
        found["metadata"]["ownerReferences"] = [{"kind": owner, "name": "x"}]
    return found


PODS = [pod("train", "ml"), pod("web", "apps", gpu=False), pod("device-plugin", "kube-system", owner="DaemonSet"),
        pod("infer", "ai")]


def step(cluster, check_mode=False, holders=None):
    clock = Clock()
    display = Display()
    task = RolloutTask(host=NODE, check_mode=check_mode, display=display, run_module=holders or Holders(),
                       sleep=clock.sleep, clock=clock)
    return RolloutStep(task, cluster, NODE), clock, display


def record_on(cluster):
    return rollout.annotation_of(cluster.nodes[NODE])


# ---- drain -----------------------------------------------------------------------------------------------------------

def test_a_drain_cordons_with_the_annotation_and_evicts_only_the_gpu_pods():
    cluster = FakeCluster([node()], PODS)
    holders = Holders()
    found = step(cluster, holders=holders)[0].drain(REASON, rollout.SCOPE_GPU_PODS, 300, "/")
    assert found["evicted"] == ["ai/infer", "ml/train"]
    assert found["kept"] == ["kube-system/device-plugin (a DaemonSet's pod)"]
    assert found["cordoned"] is True and found["was_cordoned"] is False and found["resumed"] is False
    assert cluster.called("evict") == ["ai/infer", "ml/train"]
    assert sorted(cluster.pods) == ["apps/web", "kube-system/device-plugin"]
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True
    record = record_on(cluster)
    assert (record["state"], record["reason"], record["was_cordoned"]) == ("changing", REASON, False)
    # the first patch cordons, as draining, before anything is evicted
    order = [call for call, _args in cluster.calls if call in ("patch_node", "evict")]
    assert order == ["patch_node", "evict", "evict", "patch_node"]
    first = cluster.called("patch_node")[0][1]
    assert first["spec"] == {"unschedulable": True}
    assert rollout.annotation_of({"metadata": first["metadata"]})["state"] == "draining"
    assert holders.calls == [(rollout_step.HOLDERS_MODULE, {"root": "/"})]
    assert cluster.nodes[NODE]["metadata"]["annotations"]["other"] == "kept"


def test_a_drain_with_scope_all_evicts_every_pod_it_may_move():
    cluster = FakeCluster([node()], PODS)
    found = step(cluster)[0].drain(REASON, rollout.SCOPE_ALL, 300, "/")
    assert found["evicted"] == ["ai/infer", "apps/web", "ml/train"]
    assert sorted(cluster.pods) == ["kube-system/device-plugin"]


def test_a_pod_its_budget_protects_is_asked_again_until_the_timeout_then_the_node_is_uncordoned():
    cluster = FakeCluster([node()], PODS, protected={"ml/train"})
    rolling, clock, _display = step(cluster)
    with pytest.raises(K3sGpuError) as raised:
        rolling.drain(REASON, rollout.SCOPE_GPU_PODS, 30, "/")
    assert "node gpu1 was not drained" in raised.value.cause and "ml/train" in raised.value.cause
    assert "disruption budget" in raised.value.cause and "ai/infer" not in raised.value.cause
    assert "uncordoned as it was" in raised.value.fix
    # asked at 0 s and after each pause, the last time at the deadline
    assert cluster.called("evict").count("ml/train") == 30 // rollout_step.BUDGET_RETRY_SECONDS + 1
    assert clock.now >= 30 and set(clock.sleeps) == {rollout_step.BUDGET_RETRY_SECONDS}
    assert "unschedulable" not in cluster.nodes[NODE]["spec"]
    assert rollout.ANNOTATION not in cluster.nodes[NODE]["metadata"]["annotations"]
    assert cluster.nodes[NODE]["metadata"]["annotations"]["other"] == "kept"


def test_an_evicted_pod_that_does_not_end_times_out_and_the_node_is_uncordoned():
    cluster = FakeCluster([node()], PODS, lingering={"ml/train"})
    with pytest.raises(K3sGpuError, match="evicted but still there: ml/train;"):
        step(cluster)[0].drain(REASON, rollout.SCOPE_GPU_PODS, 20, "/")
    assert "unschedulable" not in cluster.nodes[NODE]["spec"] and record_on(cluster) is None


def test_an_eviction_the_api_forbids_fails_at_once_and_the_node_is_uncordoned():
    cluster = FakeCluster([node()], PODS, forbidden={"ai/infer"})
    rolling, clock, _display = step(cluster)
    with pytest.raises(Refused, match="403"):
        rolling.drain(REASON, rollout.SCOPE_GPU_PODS, 300, "/")
    assert clock.now == 0 and cluster.called("evict") == ["ai/infer"]
    assert "unschedulable" not in cluster.nodes[NODE]["spec"] and record_on(cluster) is None


def test_a_node_someone_else_cordoned_stays_cordoned_after_a_drain_timeout():
    cluster = FakeCluster([node(unschedulable=True)], PODS, protected={"ml/train"})
    rolling = step(cluster)[0]
    with pytest.raises(K3sGpuError, match="ml/train"):
        rolling.drain(REASON, rollout.SCOPE_GPU_PODS, 10, "/")
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True
    assert rollout.ANNOTATION not in cluster.nodes[NODE]["metadata"]["annotations"]


def test_a_drain_waits_for_the_holders_to_go():
    gone_later = [{"pid": 42, "command": "python3", "pod_uid": None, "devices": ["/dev/nvidia0"]}]
    holders = Holders(gone_later, gone_later, [])
    cluster = FakeCluster([node()], PODS)
    rolling, clock, _display = step(cluster, holders=holders)
    found = rolling.drain(REASON, rollout.SCOPE_GPU_PODS, 300, "/")
    assert len(holders.calls) == 3 and clock.now == 2 * rollout_step.POLL_SECONDS
    assert found["waited_seconds"] == 4.0 and record_on(cluster)["state"] == "changing"


def test_holders_that_never_go_time_out_naming_the_holder_and_the_node_is_uncordoned():
    stuck = [{"pid": 42, "command": "ollama", "pod_uid": None, "devices": ["/dev/nvidia0"]},
             {"pid": 7, "command": "nvidia-persistenced", "pod_uid": None, "devices": ["/dev/nvidiactl"]},
             {"pid": 9, "command": "nvidia-device-p", "pod_uid": "uid-device-plugin", "devices": ["/dev/nvidia0"]}]
    cluster = FakeCluster([node()], PODS)
    with pytest.raises(K3sGpuError) as raised:
        step(cluster, holders=Holders(stuck))[0].drain(REASON, rollout.SCOPE_GPU_PODS, 20, "/")
    assert "processes still hold its GPUs: a host process (pid 42, ollama) holds /dev/nvidia0" in raised.value.cause
    assert "persistenced" not in raised.value.cause and "device-plugin" not in raised.value.cause
    assert "unschedulable" not in cluster.nodes[NODE]["spec"]
    assert record_on(cluster) is None


def test_a_failing_holders_module_fails_the_drain_and_uncordons():
    cluster = FakeCluster([node()], [])

    def failing(name, args):
        return {"failed": True, "msg": "cannot list /proc"}
    with pytest.raises(K3sGpuError, match="cannot list /proc"):
        step(cluster, holders=failing)[0].drain(REASON, rollout.SCOPE_GPU_PODS, 20, "/")
    assert "unschedulable" not in cluster.nodes[NODE]["spec"] and record_on(cluster) is None


def test_check_mode_patches_nothing_and_evicts_nothing_but_says_what_it_would_evict():
    cluster = FakeCluster([node()], PODS)
    holders = Holders()
    rolling, _clock, display = step(cluster, check_mode=True, holders=holders)
    found = rolling.drain(REASON, rollout.SCOPE_GPU_PODS, 300, "/")
    assert found["evicted"] == ["ai/infer", "ml/train"]
    assert cluster.called("patch_node") == [] and cluster.called("evict") == [] and holders.calls == []
    assert len(cluster.pods) == len(PODS) and "unschedulable" not in cluster.nodes[NODE]["spec"]
    assert display.lines == ["gpu1: would cordon node gpu1 (%s) and evict ai/infer, ml/train" % REASON]


def test_a_missing_node_is_refused_before_anything_is_touched():
    cluster = FakeCluster([], PODS)
    with pytest.raises(K3sGpuError, match="no Node named gpu1") as raised:
        step(cluster)[0].drain(REASON, rollout.SCOPE_GPU_PODS, 300, "/")
    assert "gpu_node_kubernetes_node" in raised.value.fix
    assert cluster.called("evict") == [] and cluster.called("patch_node") == []


def test_a_drain_of_a_node_a_stopped_run_left_cordoned_resumes_and_keeps_was_cordoned():
    earlier = rollout.annotation("changing", REASON, True, "2025-01-01T00:00:00Z")
    cluster = FakeCluster([node(unschedulable=True, record=earlier)], PODS)
    found = step(cluster)[0].drain(REASON, rollout.SCOPE_GPU_PODS, 300, "/")
    assert found["resumed"] is True and found["was_cordoned"] is True and found["cordoned"] is False
    assert record_on(cluster)["was_cordoned"] is True


def test_a_drain_timeout_on_a_node_a_stopped_run_left_cordoned_leaves_it_cordoned_with_its_record():
    # BUG (found by this test): the role drains a resumed node again (classify: resume is disruptive), and on a timeout
    # _release() uncordons it and takes its record away, although a stopped run left it cordoned mid-change or failed
    # (the driver may be half replaced, or its GPU pod failed): "uncordoned as it was" must leave it cordoned and marked
    earlier = rollout.annotation("failed", REASON, False, "2025-01-01T00:00:00Z", cause="nvidia-smi -L failed in the pod",
                                 layer="driver")
    stuck = [{"pid": 42, "command": "ollama", "pod_uid": None, "devices": ["/dev/nvidia0"]}]
    cluster = FakeCluster([node(unschedulable=True, record=earlier)], PODS)
    with pytest.raises(K3sGpuError, match="ollama"):
        step(cluster, holders=Holders(stuck))[0].drain(REASON, rollout.SCOPE_GPU_PODS, 20, "/")
    assert cluster.nodes[NODE]["spec"].get("unschedulable") is True
    assert record_on(cluster) is not None


# ---- prove -----------------------------------------------------------------------------------------------------------

def changing(was_cordoned=False, **extra):
    return node(unschedulable=True, record=rollout.annotation("changing", REASON, was_cordoned, "2025-01-01T00:00:00Z"),
                **extra)


def test_a_node_that_passes_its_gpu_pod_is_uncordoned_and_its_annotation_goes():
    cluster = FakeCluster([changing()])
    found = step(cluster)[0].prove(300, "busybox", "nvidia", expect_gpu=True)
    assert found["proved"] is True and found["uncordoned"] is True and found["left_cordoned"] is False
    assert found["line"] == "gpu1 / nvidia: OK | GPU 0: NVIDIA Lab (UUID: x)"
    assert "unschedulable" not in cluster.nodes[NODE]["spec"] and record_on(cluster) is None
    assert cluster.nodes[NODE]["metadata"]["annotations"] == {"other": "kept"}
    [created] = cluster.called("create_pod")
    assert created["metadata"]["namespace"] == rollout_step.PROVE_NAMESPACE and created["spec"]["runtimeClassName"] == "nvidia"
    assert cluster.pods == {}  # the prove pod is deleted after
    assert cluster.called("ensure_namespace") == [rollout_step.PROVE_NAMESPACE]


def test_a_gpu_pod_that_fails_leaves_the_node_cordoned_with_the_layer_on_its_annotation():
    cluster = FakeCluster([changing()], prove_phase="Failed", prove_exit=14,
                          prove_log=["/dev/nvidia0", "Failed to initialize NVML: Driver/library version mismatch"])
    with pytest.raises(K3sGpuError) as raised:
        step(cluster)[0].prove(300, "busybox", "nvidia", expect_gpu=True)
    assert "gpu1: node gpu1 stays cordoned: BROKEN at driver" in raised.value.cause
    assert "version mismatch" in raised.value.cause
    assert "run the playbook again" in raised.value.fix
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True
    record = record_on(cluster)
    assert (record["state"], record["layer"], record["reason"]) == ("failed", "driver", REASON)
    assert "nvidia-smi -L failed" in record["cause"]
    assert cluster.pods == {}


def test_a_node_that_does_not_come_back_stays_cordoned():
    cluster = FakeCluster([changing(ready=False)])
    rolling, clock, _display = step(cluster)
    with pytest.raises(K3sGpuError, match="stays cordoned: BROKEN at node: the node is not Ready"):
        rolling.prove(30, "busybox", "nvidia", expect_gpu=True)
    assert clock.now >= 30 and cluster.called("create_pod") == []
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True and record_on(cluster)["state"] == "failed"


def test_a_gpu_pod_that_never_ends_fails_the_node_at_the_deadline_and_it_stays_cordoned():
    cluster = FakeCluster([changing()], prove_phase="Pending")
    rolling, clock, _display = step(cluster)
    with pytest.raises(K3sGpuError, match="stays cordoned: BROKEN at pod: the GPU pod did not end in time"):
        rolling.prove(60, "busybox", "nvidia", expect_gpu=True)
    assert clock.now >= 60 and cluster.pods == {}
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True and record_on(cluster)["layer"] == "pod"


def test_a_node_taken_back_is_proved_ready_without_a_gpu_pod():
    cluster = FakeCluster([changing(gpus="0")])
    found = step(cluster)[0].prove(30, "busybox", "nvidia", expect_gpu=False)
    assert found["proved"] is True and found["line"] == "gpu1: Ready"
    assert cluster.called("create_pod") == [] and record_on(cluster) is None


def test_prove_on_a_node_without_the_annotation_does_nothing():
    cluster = FakeCluster([node(unschedulable=True)])
    found = step(cluster)[0].prove(300, "busybox", "nvidia", expect_gpu=True)
    assert found["proved"] is False and found["uncordoned"] is False
    assert "nothing to prove" in found["line"]
    assert cluster.called("patch_node") == [] and cluster.called("create_pod") == []
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True


def test_prove_of_a_node_someone_else_cordoned_leaves_it_unschedulable():
    cluster = FakeCluster([changing(was_cordoned=True)])
    found = step(cluster)[0].prove(300, "busybox", "nvidia", expect_gpu=True)
    assert found["proved"] is True and found["uncordoned"] is False and found["left_cordoned"] is True
    assert cluster.nodes[NODE]["spec"]["unschedulable"] is True and record_on(cluster) is None


def test_prove_in_check_mode_changes_nothing():
    cluster = FakeCluster([changing()])
    found = step(cluster, check_mode=True)[0].prove(300, "busybox", "nvidia", expect_gpu=True)
    assert found["proved"] is False and found["line"].startswith("gpu1: would prove")
    assert cluster.called("patch_node") == [] and cluster.called("create_pod") == []


# ---- the pod that proves a node --------------------------------------------------------------------------------------

def test_the_prove_pod_tolerates_the_cordon_and_asks_for_one_gpu_under_the_runtimeclass():
    found = rollout_step.prove_pod("GPU_Node.1", "k3s-gpu-rollout", "busybox:1.36", "nvidia-cdi")
    spec = found["spec"]
    assert found["metadata"]["name"] == "prove-gpu-node-1" and found["metadata"]["namespace"] == "k3s-gpu-rollout"
    assert found["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "k3s_gpu.nvidia"
    assert rollout.kept(found) == "the collection's own pod"
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["runtimeClassName"] == "nvidia-cdi" and spec["restartPolicy"] == "Never"
    [container] = spec["containers"]
    # one GPU, as a count or the API's quantity text
    assert list(container["resources"]) == ["limits"]
    assert dict((k, str(v)) for k, v in container["resources"]["limits"].items()) == {"nvidia.com/gpu": "1"}
    assert container["image"] == "busybox:1.36" and container["command"] == verify.SMOKE_COMMAND
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["GPU_Node.1"]}]}]


def test_the_prove_pods_name_is_a_valid_pod_name_for_a_long_node_name():
    name = rollout_step.prove_pod("n" * 80 + "-x", "ns", "i", "nvidia")["metadata"]["name"]
    assert len(name) <= 63 and not name.endswith("-")
