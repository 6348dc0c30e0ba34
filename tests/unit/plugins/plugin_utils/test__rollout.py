# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rollout's pure rules (issue 43): batches per cluster with a canary, the annotation on a node the collection
cordons, when a node is back, the pods a drain evicts and the processes it waits for, and the pod that proves a node."""

from __future__ import annotations

import json

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _rollout as rollout

SINCE = "2025-01-01T00:00:00Z"


# ---- batch_size ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, gpu_nodes, size", [
    ("1", 10, 1), (2, 10, 2), ("3", 1, 3), (" 2 ", 10, 2),
    ("25%", 10, 2), ("10%", 3, 1), ("1%", 10, 1), ("100%", 7, 7), ("50%", 4, 2), (" 50 % ", 4, 2),
    ("50%", 0, 1),
])
def test_batch_size_is_a_count_or_a_percentage_rounded_down_and_at_least_one(value, gpu_nodes, size):
    assert rollout.batch_size(value, gpu_nodes) == size


@pytest.mark.parametrize("value", ["0", 0, "0%", "abc", "150%", "101%", "-1", "", "1.5", "2 nodes", None])
def test_a_batch_size_that_is_no_count_or_percentage_is_refused_by_its_variable(value):
    with pytest.raises(K3sGpuError) as raised:
        rollout.batch_size(value, 10, "c1")
    assert "gpu_node_max_unavailable" in raised.value.cause and raised.value.cause.startswith("c1: ")
    assert "percentage" in raised.value.fix


# ---- waves -----------------------------------------------------------------------------------------------------------

def host(name, cluster, max_unavailable=1, **flags):
    return dict({"host": name, "cluster": cluster, "max_unavailable": max_unavailable}, **flags)


FLEET = [host("a1", "c1", 2), host("b1", "c2", "50%"), host("a2", "c1", 2), host("d1", "c3"), host("a3", "c1", 2),
         host("b2", "c2", "50%"), host("a4", "c1", 2), host("b3", "c2", "50%"), host("a5", "c1", 2)]


def test_the_first_wave_is_one_canary_per_cluster_and_later_waves_interleave_the_clusters():
    found = rollout.waves(FLEET, {"c2": 4})
    assert found["waves"] == [["a1", "b1", "d1"], ["a2", "a3", "b2", "b3"], ["a4", "a5"]]
    assert found["serial"] == [3, 4, 2]
    assert found["clusters"] == {"c1": {"batch": 2, "canary": "a1"}, "c2": {"batch": 2, "canary": "b1"},
                                 "c3": {"batch": 1, "canary": "d1"}}


def test_the_hosts_are_the_waves_flattened_each_host_once():
    found = rollout.waves(FLEET, {"c2": 4})
    assert found["hosts"] == [name for wave in found["waves"] for name in wave]
    assert sorted(found["hosts"]) == sorted(entry["host"] for entry in FLEET)
    assert len(found["hosts"]) == len(set(found["hosts"]))
    assert sum(found["serial"]) == len(FLEET)


def test_no_disruptive_host_is_no_wave():
    assert rollout.waves([], {}) == {"waves": [], "hosts": [], "serial": [], "clusters": {}}


def test_a_stopped_run_is_finished_first_all_together_without_a_separate_canary():
    hosts = [host("n1", "c", 2), host("r1", "c", 2, resume=True), host("n2", "c", 2), host("r2", "c", 2, resume=True),
             host("n3", "c", 2)]
    found = rollout.waves(hosts, {})
    assert found["waves"] == [["r1", "r2"], ["n1", "n2"], ["n3"]]
    assert found["clusters"]["c"]["batch"] == 2


def test_nodes_cordoned_by_others_go_after_the_canary_outside_the_count():
    hosts = [host("n1", "c", 2), host("o1", "c", 2, cordoned_by_others=True), host("n2", "c", 2),
             host("o2", "c", 2, cordoned_by_others=True), host("n3", "c", 2), host("n4", "c", 2)]
    found = rollout.waves(hosts, {})
    assert found["waves"] == [["n1"], ["o1", "o2"], ["n2", "n3"], ["n4"]]
    assert found["clusters"]["c"] == {"batch": 2, "canary": "n1"}


def test_only_nodes_cordoned_by_others_go_in_one_batch():
    found = rollout.waves([host("o1", "c", cordoned_by_others=True), host("o2", "c", cordoned_by_others=True)], {})
    assert found["waves"] == [["o1", "o2"]]


@pytest.mark.parametrize("gpu_nodes, waves", [
    ({"c": 10}, [["n1"], ["n2", "n3"], ["n4", "n5"]]),  # 20% of 10 GPU nodes: 2
    ({}, [["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]),       # 20% of its 5 entries: 1
    ({"c": 0}, [["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]),  # no count: its entries
    ({"other": 10}, [["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]),
], ids=["gpu-nodes", "entries", "zero", "other-cluster"])
def test_a_percentage_is_of_the_clusters_gpu_nodes_else_of_its_entries(gpu_nodes, waves):
    hosts = [host("n%d" % index, "c", "20%") for index in range(1, 6)]
    assert rollout.waves(hosts, gpu_nodes)["waves"] == waves


def test_a_bad_batch_size_names_the_cluster():
    with pytest.raises(K3sGpuError, match="^c9: gpu_node_max_unavailable"):
        rollout.waves([host("n1", "c9", "0")], {})


# ---- the annotation --------------------------------------------------------------------------------------------------

def node(name="gpu1", unschedulable=False, record=None, ready=True, gpus="1", annotations=None):
    annotations = dict(annotations or {})
    if record is not None:
        annotations[rollout.ANNOTATION] = record
    found = {"metadata": {"name": name, "annotations": annotations},
             "spec": {"unschedulable": True} if unschedulable else {},
             "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                        "allocatable": {"cpu": "8", rollout.GPU_RESOURCE: gpus} if gpus is not None else {"cpu": "8"}}}
    return found


def test_the_annotation_reads_back_what_was_written():
    text = rollout.annotation("failed", "driver upgrade from 580.95.05", True, SINCE, cause="nvidia-smi failed",
                              layer="driver")
    assert rollout.annotation_of(node(record=text)) == {
        "by": "k3s_gpu.nvidia", "state": "failed", "reason": "driver upgrade from 580.95.05", "was_cordoned": True,
        "since": SINCE, "cause": "nvidia-smi failed", "layer": "driver"}
    plain = rollout.annotation_of(node(record=rollout.annotation("draining", "r", 0, SINCE)))
    assert plain["was_cordoned"] is False and "cause" not in plain and "layer" not in plain


def test_an_unknown_state_is_refused():
    with pytest.raises(ValueError):
        rollout.annotation("done", "r", False, SINCE)


@pytest.mark.parametrize("value", ['{"by": "someone-else", "state": "draining"}', '{"state": "draining"}',
                                   "not json", "[1, 2]", '"k3s_gpu.nvidia"', "", "null"])
def test_an_annotation_that_is_not_ours_is_no_record(value):
    assert rollout.annotation_of(node(record=value)) is None


@pytest.mark.parametrize("found", [{}, None, {"metadata": {}}, {"metadata": {"annotations": None}}])
def test_a_node_without_annotations_has_no_record(found):
    assert rollout.annotation_of(found) is None


def test_cordon_patch_cordons_and_records_whether_the_node_was_cordoned_before():
    patch = rollout.cordon_patch(node(unschedulable=False), "draining", "r", SINCE)
    assert patch["spec"] == {"unschedulable": True}
    assert json.loads(patch["metadata"]["annotations"][rollout.ANNOTATION])["was_cordoned"] is False
    patch = rollout.cordon_patch(node(unschedulable=True), "draining", "r", SINCE)
    assert json.loads(patch["metadata"]["annotations"][rollout.ANNOTATION])["was_cordoned"] is True


@pytest.mark.parametrize("was_cordoned", [True, False])
def test_cordon_patch_keeps_was_cordoned_from_an_earlier_record(was_cordoned):
    # the collection cordoned the node itself since: it is unschedulable now, whatever it was before
    earlier = node(unschedulable=True, record=rollout.annotation("draining", "r", was_cordoned, SINCE))
    patch = rollout.cordon_patch(earlier, "failed", "r", SINCE, cause="c", layer="driver")
    record = json.loads(patch["metadata"]["annotations"][rollout.ANNOTATION])
    assert record["was_cordoned"] is was_cordoned
    assert (record["state"], record["cause"], record["layer"]) == ("failed", "c", "driver")


def test_uncordon_patch_takes_the_record_away_and_uncordons():
    ours = node(unschedulable=True, record=rollout.annotation("proving", "r", False, SINCE))
    assert rollout.uncordon_patch(ours) == {"metadata": {"annotations": {rollout.ANNOTATION: None}},
                                            "spec": {"unschedulable": None}}


def test_uncordon_patch_leaves_a_node_someone_else_cordoned_cordoned():
    theirs = node(unschedulable=True, record=rollout.annotation("proving", "r", True, SINCE))
    assert rollout.uncordon_patch(theirs) == {"metadata": {"annotations": {rollout.ANNOTATION: None}}}


def test_cordoned_by_others_is_a_cordon_without_our_record():
    assert rollout.cordoned_by_others(node(unschedulable=True)) is True
    assert rollout.cordoned_by_others(node(unschedulable=True, record=rollout.annotation("changing", "r", True, SINCE))) is False
    assert rollout.cordoned_by_others(node(unschedulable=False)) is False


# ---- back ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("found, expect_gpu, result", [
    (node(ready=False), True, (False, "the node is not Ready")),
    (node(ready=False), False, (False, "the node is not Ready")),
    (node(gpus=None), True, (False, "the node advertises no allocatable nvidia.com/gpu")),
    (node(gpus="0"), True, (False, "the node advertises no allocatable nvidia.com/gpu")),
    (node(gpus=None), False, (True, "")),
    (node(gpus="2"), True, (True, "")),
    (None, True, (False, "the Node object is not there")),
], ids=["not-ready", "not-ready-no-gpu-expected", "no-allocatable", "zero-allocatable", "no-gpu-expected", "back",
        "no-node"])
def test_a_node_is_back_when_ready_and_with_a_gpu_where_one_is_expected(found, expect_gpu, result):
    assert rollout.back(found, expect_gpu) == result


# ---- pods ------------------------------------------------------------------------------------------------------------

def pod(name, namespace="default", uid=None, limits=None, requests=None, init=None, owner=None, annotations=None,
        labels=None, phase="Running", **spec):
    container = {"name": "c", "resources": {}}
    if limits:
        container["resources"]["limits"] = limits
    if requests:
        container["resources"]["requests"] = requests
    found = {"metadata": {"name": name, "namespace": namespace, "uid": uid or "uid-" + name,
                          "annotations": annotations or {}, "labels": labels or {}},
             "spec": dict({"nodeName": "gpu1", "containers": [container]}, **spec), "status": {"phase": phase}}
    if init:
        found["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    if owner:
        found["metadata"]["ownerReferences"] = [{"kind": owner, "name": "x"}]
    return found


@pytest.mark.parametrize("found, uses", [
    (pod("p", limits={"nvidia.com/gpu": 1}), True),
    (pod("p", requests={"nvidia.com/mig-1g.5gb": 1}), True),
    (pod("p", requests={"nvidia.com/gpu.shared": 1}), True),
    (pod("p", init={"nvidia.com/gpu": 1}), True),
    (pod("p", resourceClaims=[{"name": "gpu", "resourceClaimName": "a-gpu"}]), True),
    (pod("p", runtimeClassName="nvidia-cdi"), True),
    (pod("p", runtimeClassName="nvidia"), True),
    (pod("p", limits={"cpu": "1", "memory": "1Gi"}), False),
    (pod("p", runtimeClassName="gvisor"), False),
    (pod("p"), False),
], ids=["gpu-limit", "mig-request", "shared", "init-container", "resource-claims", "nvidia-cdi", "nvidia",
        "cpu-only", "other-runtimeclass", "plain"])
def test_a_pod_uses_a_gpu_by_its_resources_claims_or_runtimeclass(found, uses):
    assert rollout.uses_gpu(found) is uses


@pytest.mark.parametrize("found, why", [
    (pod("p", owner="DaemonSet"), "a DaemonSet's pod"),
    (pod("p", annotations={rollout.MIRROR_ANNOTATION: "abc"}), "a static pod"),
    (pod("p", labels={"app.kubernetes.io/managed-by": "k3s_gpu.nvidia"}), "the collection's own pod"),
    (pod("p", phase="Succeeded"), "it has ended"),
    (pod("p", phase="Failed"), "it has ended"),
    (pod("p", owner="ReplicaSet"), ""),
    (pod("p", labels={"app.kubernetes.io/managed-by": "Helm"}), ""),
    (pod("p"), ""),
], ids=["daemonset", "mirror", "ours", "succeeded", "failed", "replicaset", "helm", "plain"])
def test_a_drain_keeps_daemonset_static_own_and_ended_pods(found, why):
    assert rollout.kept(found) == why


PODS = [
    pod("train", "ml", limits={"nvidia.com/gpu": 1}),
    pod("web", "apps"),
    pod("infer", "ai", runtimeClassName="nvidia"),
    pod("device-plugin", "kube-system", owner="DaemonSet", limits={"nvidia.com/gpu": 0}, runtimeClassName="nvidia"),
    pod("done", "ml", limits={"nvidia.com/gpu": 1}, phase="Succeeded"),
    pod("etcd", "kube-system", annotations={rollout.MIRROR_ANNOTATION: "x"}),
    pod("batch", "ai", requests={"nvidia.com/mig-1g.5gb": 1}),
]


@pytest.mark.parametrize("scope, keys", [
    (rollout.SCOPE_GPU_PODS, ["ai/batch", "ai/infer", "ml/train"]),
    (rollout.SCOPE_ALL, ["ai/batch", "ai/infer", "apps/web", "ml/train"]),
])
def test_to_evict_is_the_scopes_pods_a_drain_may_move_sorted(scope, keys):
    assert [rollout.pod_key(found) for found in rollout.to_evict(PODS, scope)] == keys


def holder(pid, command, pod_uid=None, devices=("/dev/nvidia0",)):
    return {"pid": pid, "command": command, "pod_uid": pod_uid, "devices": list(devices), "container_id": None}


def test_waited_holders_leave_out_kept_pods_and_the_drivers_daemons_but_not_unknown_processes():
    holders = [holder(10, "nvidia-device-p", "uid-device-plugin"), holder(11, "nvidia-persistenced"),
               holder(12, "nvidia-persiste"), holder(13, "nv-fabricmanager"), holder(20, "python3", "uid-train"),
               holder(21, "ollama"), holder(22, "python3", "uid-of-a-pod-not-listed")]
    assert [h["pid"] for h in rollout.waited_holders(holders, PODS)] == [20, 21, 22]


def test_holder_lines_name_the_pod_by_its_uid():
    holders = [holder(20, "python3", "uid-train", ("/dev/nvidia0", "/dev/nvidiactl")), holder(21, "ollama", devices=()),
               holder(22, "python3", "0f1e")]
    assert rollout.holder_lines(holders, PODS) == [
        "ml/train (pid 20, python3) holds /dev/nvidia0, /dev/nvidiactl",
        "a host process (pid 21, ollama) holds an NVIDIA device",
        "pod 0f1e (pid 22, python3) holds /dev/nvidia0"]


def test_an_eviction_names_the_pod():
    assert rollout.eviction(PODS[0]) == {"apiVersion": "policy/v1", "kind": "Eviction",
                                         "metadata": {"name": "train", "namespace": "ml"}}


# A static pod's processes run in the cgroup of the static pod's own UID, the hash that its mirror pod carries in the
# kubernetes.io/config.mirror annotation; the mirror pod the API lists has another, API-assigned metadata.uid
# (kubelet's config/common.go; the gpu_device_holders module reads the hash from the cgroup: module_utils/_holders).
STATIC = pod("gpu-exporter", "kube-system", uid="7b3e1c9a-0000-4000-8000-00000000abcd",
             annotations={rollout.MIRROR_ANNOTATION: "6576683a93d91d8e2119df2c2755f2f1",
                          "kubernetes.io/config.hash": "6576683a93d91d8e2119df2c2755f2f1"},
             limits={"nvidia.com/gpu": 1})


def test_a_static_pods_processes_are_not_waited_for_as_the_drain_keeps_the_pod():
    # BUG (found by this test): waited_holders matches kept pods by metadata.uid only, so a static pod's GPU process
    # (cgroup pod<config hash>) is waited for until the drain times out, although the drain never evicts that pod
    held = [holder(30, "dcgm-exporter", "6576683a93d91d8e2119df2c2755f2f1")]
    assert rollout.kept(STATIC) == "a static pod"
    assert rollout.waited_holders(held, [STATIC]) == []


def test_holder_lines_name_a_static_pod_by_its_config_hash():
    # BUG (found by this test): the same uid mismatch names the static pod "pod <hash>" instead of its namespace/name
    held = [holder(30, "dcgm-exporter", "6576683a93d91d8e2119df2c2755f2f1")]
    assert rollout.holder_lines(held, [STATIC]) == ["kube-system/gpu-exporter (pid 30, dcgm-exporter) holds /dev/nvidia0"]
