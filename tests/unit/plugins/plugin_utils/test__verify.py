# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions: what is tested, the report per node, the manifests read without a cluster."""

from __future__ import annotations

import subprocess

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as cluster_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify

CLASSES = [{"metadata": {"name": "nvidia"}, "handler": "nvidia"}, {"metadata": {"name": "nvidia-cdi"}, "handler": "nvidia-cdi"},
           {"metadata": {"name": "crun"}, "handler": "crun"}]
NODES = [{"metadata": {"name": "gpu1"}, "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"}}},
         {"metadata": {"name": "cpu1"}, "status": {"allocatable": {"cpu": "8"}}}]


def pod(node, cls, phase, state=None, conditions=None, reason=None, message=None):
    status = {"phase": phase, "containerStatuses": [{"name": "smoke", "state": state or {}}]}
    if conditions:
        status["conditions"] = conditions
    if reason:
        status.update(reason=reason, message=message)
    return {"metadata": {"name": "gpu-%s-%s" % (cls, node)},
            "spec": {"nodeName": node, "runtimeClassName": cls}, "status": status}


def event(pod_name, reason, message):
    return {"involvedObject": {"kind": "Pod", "name": pod_name}, "reason": reason, "message": message}


def test_every_nvidia_class_on_every_node_that_advertises_gpus():
    chosen = verify.choose(CLASSES, NODES)
    assert chosen["runtimeclasses"] == ["nvidia", "nvidia-cdi"] and chosen["gpu_nodes"] == ["gpu1"]
    assert chosen["pairs"] == [["gpu1", "nvidia"], ["gpu1", "nvidia-cdi"]]
    assert chosen["allocatable"] == {"gpu1": "4", "cpu1": "0"} and chosen["nodes_without_gpu"] == ["cpu1"]
    assert chosen["problems"] == [] and chosen["notes"] == []
    assert verify.refusal(chosen) is None
    assert verify.choose(CLASSES, NODES, ["nvidia-cdi"])["pairs"] == [["gpu1", "nvidia-cdi"]]


def test_a_class_whose_handler_the_node_lacks_is_not_tested_unless_named():
    """k3s ships nvidia-experimental on every cluster; the role's handler labels say which node has the handler."""
    classes = CLASSES + [{"metadata": {"name": "nvidia-experimental"}, "handler": "nvidia-experimental"}]
    labelled = [dict(NODES[0], metadata={"name": "gpu1", "labels": {"k3s-gpu.nvidia/handler.nvidia": "true",
                                                                    "k3s-gpu.nvidia/handler.nvidia-cdi": "true"}})]
    chosen = verify.choose(classes, labelled)
    assert chosen["pairs"] == [["gpu1", "nvidia"], ["gpu1", "nvidia-cdi"]]
    assert chosen["notes"] == ["gpu1 / nvidia-experimental: not tested: the node's labels say it has no nvidia-experimental handler"]
    assert verify.choose(classes, labelled, ["nvidia-experimental"])["pairs"] == [["gpu1", "nvidia-experimental"]]
    # without handler labels (gpu_node_handler_labels: false) every class is tested
    assert len(verify.choose(classes, NODES)["pairs"]) == 3


def test_a_missing_runtimeclass_is_broken_at_runtimeclass():
    chosen = verify.choose(CLASSES[1:], NODES)
    assert [(p["scope"], p["layer"]) for p in chosen["problems"]] == [("cluster", "runtimeclass")]
    line = verify.broken_line(chosen["problems"][0])
    assert line.startswith("cluster: BROKEN at runtimeclass: RuntimeClass nvidia does not exist. Fix: run "
                           "k3s_gpu.nvidia.runtimeclasses"), line
    assert chosen["pairs"] == [["gpu1", "nvidia-cdi"]]
    assert [p["scope"] for p in verify.choose(CLASSES, NODES, ["nvidia", "nvidia-gone"])["problems"]] == ["cluster"]


@pytest.mark.parametrize("capacity,why", [(None, "no device plugin has registered"), ("0", "registered once and is gone"),
                                          ("2", "capacity 2, allocatable 0")])
def test_a_gpu_labelled_node_without_gpus_is_broken_at_device_plugin(capacity, why):
    status = {"allocatable": {"nvidia.com/gpu": "0"} if capacity else {}, "capacity": {"nvidia.com/gpu": capacity} if capacity else {}}
    labelled = {"metadata": {"name": "gpu2", "labels": {"nvidia.com/gpu.present": "true"}}, "status": status}
    chosen = verify.choose(CLASSES, NODES + [labelled])
    assert [(p["scope"], p["layer"]) for p in chosen["problems"]] == [("gpu2", "device-plugin")]
    assert why in chosen["problems"][0]["cause"] and chosen["pairs"][0][0] == "gpu1"
    alone = verify.choose(CLASSES, [labelled])
    assert verify.refusal(alone).startswith("Nothing to test") and len(alone["problems"]) == 1


def test_no_gpu_advertised_anywhere_is_broken_at_device_plugin():
    chosen = verify.choose(CLASSES, NODES[1:])
    assert [(p["scope"], p["layer"]) for p in chosen["problems"]] == [("cluster", "device-plugin")]
    assert "gpu_node_device_plugin_state" in chosen["problems"][0]["fix"]
    assert verify.refusal(chosen).startswith("Nothing to test: 2 NVIDIA RuntimeClasses (nvidia, nvidia-cdi) and 0 nodes")


SANDBOX_MISSING = ('Failed to create pod sandbox: rpc error: code = Unknown desc = unable to get OCI runtime for sandbox '
                   '"5749a9": no runtime for "nvidia" is configured')
CDI_MISSING = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: could not apply "
               "required modification to OCI specification: error modifying OCI spec: failed to inject CDI devices: "
               "unresolvable CDI devices nvidia.com/gpu=0")


@pytest.mark.parametrize("made,events,done,layer", [
    (pod("gpu1", "nvidia", "Succeeded"), [], True, None),
    (pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "ContainerCreating"}}),
     [event("gpu-nvidia-gpu1", "FailedCreatePodSandBox", SANDBOX_MISSING)], False, "containerd-config"),
    (pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "ContainerCreating"}}),
     [event("gpu-nvidia-other", "FailedCreatePodSandBox", SANDBOX_MISSING)], False, None),  # another pod's event
    (pod("gpu1", "nvidia", "Failed", {"terminated": {"exitCode": 128, "reason": "StartError", "message": CDI_MISSING}}),
     [], True, "cdi"),
    (pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "CreateContainerError", "message": CDI_MISSING}}),
     [], False, "cdi"),
    (pod("gpu1", "nvidia", "Failed", {"terminated": {"exitCode": 128, "message": "error running hook #0: exit status 1"}}),
     [], True, "toolkit"),
    (pod("gpu1", "nvidia", "Failed", reason="UnexpectedAdmissionError",
         message="Allocate failed due to requested number of devices unavailable for nvidia.com/gpu"), [], True, "device-plugin"),
    (pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "ErrImageNeverPull", "message": "never pull"}}), [], False, "pod"),
    (pod("gpu1", "nvidia", "Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                                   "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]),
     [], False, "allocatable"),
    (pod("gpu1", "nvidia", "Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                                   "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node "
                                                              "affinity/selector."}]), [], False, "runtimeclass"),
    (pod("gpu1", "nvidia", "Running", {"running": {}}), [], False, None),
    # the sandbox failed once and came up on kubelet's retry: its event stays behind
    (pod("gpu1", "nvidia", "Running", {"running": {}}),
     [event("gpu-nvidia-gpu1", "FailedCreatePodSandBox", SANDBOX_MISSING)], False, None),
    (pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "ContainerCreating"}},
         conditions=[{"type": "PodReadyToStartContainers", "status": "True"}]),
     [event("gpu-nvidia-gpu1", "FailedCreatePodSandBox", SANDBOX_MISSING)], False, None),
    (pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "ContainerCreating"}},
         conditions=[{"type": "PodReadyToStartContainers", "status": "False"}]),
     [event("gpu-nvidia-gpu1", "FailedCreatePodSandBox", SANDBOX_MISSING)], False, "containerd-config"),
])
def test_a_pod_names_the_layer_that_stops_it(made, events, done, layer):
    found = verify.diagnose(made, events)
    assert found["done"] == done and (found["broken"] or {}).get("layer") == layer, found
    if layer:
        assert found["broken"]["scope"] == "gpu1 / nvidia" and found["broken"]["fix"]


def test_a_pod_waiting_for_a_gpu_while_another_smoke_pod_runs_there_waits_its_turn():
    insufficient = [{"type": "PodScheduled", "status": "False", "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]
    waiting = pod("gpu1", "nvidia-cdi", "Pending", conditions=insufficient)
    running = pod("gpu1", "nvidia", "Running", {"running": {}})
    assert [state["broken"] for _pod, state in verify.settle([waiting, running])] == [None, None]
    assert verify.diagnose(waiting)["broken"]["layer"] == "allocatable"  # alone, it is broken
    finished = pod("gpu1", "nvidia", "Succeeded")
    layers = [(state["broken"] or {}).get("layer") for _pod, state in verify.settle([waiting, finished])]
    assert layers == [None, "allocatable"], layers  # sorted by node and class: nvidia, then nvidia-cdi


def test_the_report_has_ok_lines_with_nvidia_smi_and_broken_lines_with_layer_and_fix():
    pods = [pod("gpu1", "nvidia", "Succeeded"),
            pod("gpu1", "nvidia-cdi", "Failed", {"terminated": {"exitCode": 128, "message": CDI_MISSING}})]
    logs = [{"name": "gpu-nvidia-gpu1", "lines": ["/dev/nvidia0", "GPU 0: NVIDIA H200 (UUID: GPU-1)"]}]
    problems = verify.choose(CLASSES[1:], NODES)["problems"]
    reported = verify.report(pods, logs, 2, {"gpu1": "4"}, [], problems, ["gpu1 / x: not tested: why"])
    assert reported["lines"][0].startswith("cluster: BROKEN at runtimeclass: RuntimeClass nvidia does not exist. Fix: ")
    assert reported["lines"][1:3] == ["gpu1 / x: not tested: why",
                                      "gpu1 / nvidia: OK | allocatable nvidia.com/gpu 4 | GPU 0: NVIDIA H200 (UUID: GPU-1)"]
    assert reported["lines"][3].startswith("gpu1 / nvidia-cdi: BROKEN at cdi: the container did not start: failed to create")
    assert "Fix: regenerate the CDI spec" in reported["lines"][3]
    assert reported["failed"] == ["cluster (runtimeclass)", "gpu1 / nvidia-cdi (cdi)"]
    assert verify.report(pods[:1], logs, 2, {})["failed"] == ["1 of 2 pods found"]
    still = verify.report([pod("gpu1", "nvidia", "Pending", {"waiting": {"reason": "ContainerCreating"}})], [], 1, {})
    assert still["lines"] == ["gpu1 / nvidia: BROKEN at pod: still Pending (ContainerCreating) when the wait ended. Fix: raise "
                              "k3s_gpu_verify_timeout_seconds, or look at the pod's events (kubectl describe pod)"]


def test_manifests_read_without_a_cluster():
    rc = runtimeclasses.render_manifest_yaml([runtimeclasses.runtimeclass_manifest("nvidia-cdi")])
    chart = ('---\napiVersion: helm.cattle.io/v1\nkind: HelmChart\nmetadata: {name: nvidia-device-plugin}\n'
             'spec: {chart: nvidia-device-plugin, version: 0.20.0, valuesContent: "runtimeClassName: nvidia\\n"}\n')
    found = cluster_step.inspect_manifests({"a.yaml": None, "rc.yaml": rc, "dp.yaml": chart})
    assert found["a.yaml"] is None
    assert found["rc.yaml"] == {"kinds": ["RuntimeClass"], "names": ["nvidia-cdi"]}
    assert found["dp.yaml"]["runtimeClassName"] == "nvidia" and found["dp.yaml"]["version"] == "0.20.0"


def test_one_smoke_pod_per_gpu_node_and_class_with_a_dns_label_name():
    long_node = "gpu-node-in-rack-17-of-the-west-datacenter.example.com"
    chosen = {"pairs": [[node, cls] for node in ("gpu1", long_node) for cls in ("nvidia", "nvidia-experimental")]}
    pods = verify.smoke_pods(chosen, "smoke", "registry.local/ubuntu:24.04")
    assert [(verify.node_of(p), p["spec"]["runtimeClassName"]) for p in pods] == [
        ("gpu1", "nvidia"), ("gpu1", "nvidia-experimental"), (long_node, "nvidia"), (long_node, "nvidia-experimental")]
    for made in pods:
        name = made["metadata"]["name"]
        assert len(name) <= 63 and all(c.isalnum() or c == "-" for c in name), name
        assert made["metadata"]["namespace"] == "smoke" and made["metadata"]["labels"]["k3s-gpu.nvidia/verify"] == "true"
        # placed by the scheduler, so that pods of one node wait for a free GPU; never nodeName
        assert "nodeName" not in made["spec"] and made["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
        container = made["spec"]["containers"][0]
        assert container["image"] == "registry.local/ubuntu:24.04" and container["resources"]["limits"] == {"nvidia.com/gpu": 1}
        assert "nvidia-smi -L" in container["command"][-1] and made["spec"]["restartPolicy"] == "Never"
        # the device plugin sets NVIDIA_VISIBLE_DEVICES; a pod's own `all` would override the allocation
        assert "NVIDIA_VISIBLE_DEVICES" not in [env["name"] for env in container["env"]]
    assert len(set(p["metadata"]["name"] for p in pods)) == 4
    # two long names that agree in their first 30 characters stay apart
    twin = long_node.replace("example", "example2")
    assert verify.pod_name(long_node, "nvidia") != verify.pod_name(twin, "nvidia")


@pytest.mark.parametrize("exit_code,layer", [(11, "toolkit"), (12, "toolkit"), (13, "toolkit"), (14, "driver"), (0, None)])
def test_the_smoke_script_fails_with_the_code_of_the_missing_piece(tmp_path, exit_code, layer):
    """The script itself, run by sh against a fake root: each missing piece has its own exit code and layer."""
    for piece in ("dev", "lib/x86_64-linux-gnu", "bin"):
        (tmp_path / piece).mkdir(parents=True)
    script = verify.SMOKE_SCRIPT.replace("/dev/", str(tmp_path / "dev") + "/").replace("/usr/lib*", str(tmp_path / "lib"))
    script = script.replace("PATH=$PATH:/usr/bin:/bin", "PATH=%s:/usr/bin:/bin" % (tmp_path / "bin"))
    if exit_code != 11:
        (tmp_path / "dev" / "nvidia0").write_text("")
    if exit_code not in (11, 12):
        (tmp_path / "lib" / "x86_64-linux-gnu" / "libnvidia-ml.so.1").write_text("")
    if exit_code not in (11, 12, 13):
        smi = tmp_path / "bin" / "nvidia-smi"
        smi.write_text("#!/bin/sh\n%s\n" % ("echo 'Failed to initialize NVML: Driver/library version mismatch'; exit 18"
                                            if exit_code == 14 else "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1)'"))
        smi.chmod(0o755)
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
    assert proc.returncode == exit_code, (proc.stdout, proc.stderr)
    made = pod("gpu1", "nvidia", "Succeeded" if exit_code == 0 else "Failed", {"terminated": {"exitCode": exit_code}})
    found = verify.diagnose(made, [], proc.stdout.splitlines())
    assert (found["broken"] or {}).get("layer") == layer, found
    if exit_code == 14:
        assert "Driver/library version mismatch" in found["broken"]["cause"]


# ---------------------------------------------------------------------------------------- DRA nodes (issue 45)
DRA_NODE = {"metadata": {"name": "dra1", "labels": {"k3s-gpu.nvidia/gpu-allocation": "dra",
                                                    "nvidia.com/gpu.present": "true"}},
            "status": {"allocatable": {"cpu": "8"}, "nodeInfo": {"kubeletVersion": "v1.34.2+k3s1"}}}
DRA = {"dra_api": True, "deviceclasses": [{"metadata": {"name": "gpu.nvidia.com"},
                                           "spec": {"extendedResourceName": "nvidia.com/gpu"}}],
       "resourceslices": [{"spec": {"driver": "gpu.nvidia.com", "nodeName": "dra1", "devices": [{"name": "gpu-0"}]}}]}


def test_a_dra_node_gets_claim_pods_per_class_and_without_one_and_no_device_plugin_finding():
    """Its GPUs come through DRA: no nvidia.com/gpu, so no device-plugin finding; one claim pod per RuntimeClass and one
    without; on 1.34 the seed's nvidia.com/gpu pod is a note that says why it is not tested."""
    chosen = verify.choose(CLASSES, NODES + [DRA_NODE], dra=DRA)
    assert chosen["problems"] == [] and chosen["dra_nodes"] == ["dra1"] and chosen["nodes_without_gpu"] == ["cpu1"]
    assert chosen["pairs"] == [["gpu1", "nvidia"], ["gpu1", "nvidia-cdi"]]
    assert chosen["claim_pairs"] == [["dra1", ""], ["dra1", "nvidia"], ["dra1", "nvidia-cdi"]]
    assert chosen["notes"] == ["dra1 / nvidia with nvidia.com/gpu: 1: not tested: the node's GPUs are allocated through "
                               "DRA, and its kubelet is v1.34.2+k3s1: Kubernetes serves nvidia.com/gpu through DRA from 1.36 "
                               "(DRAExtendedResource; before, only with that feature gate on every component), so such a "
                               "pod stays Pending there; ask for a ResourceClaim of DeviceClass gpu.nvidia.com instead"]
    pods = verify.smoke_pods(chosen, "smoke", "busybox")
    claims = [p for p in pods if p["spec"].get("resourceClaims")]
    assert [(verify.node_of(p), p["spec"].get("runtimeClassName")) for p in claims] == [
        ("dra1", None), ("dra1", "nvidia"), ("dra1", "nvidia-cdi")]
    for made in claims:
        container = made["spec"]["containers"][0]
        assert made["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "k3s-gpu-nvidia-gpu"}]
        assert container["resources"] == {"claims": [{"name": "gpu"}]}, container
    assert len(set(p["metadata"]["name"] for p in pods)) == len(pods)
    template = verify.claim_templates(chosen, "smoke")
    assert template == [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                         "metadata": {"name": "k3s-gpu-nvidia-gpu", "namespace": "smoke",
                                      "labels": {"app.kubernetes.io/managed-by": "k3s_gpu.nvidia"}},
                         "spec": {"spec": {"devices": {"requests": [
                             {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}]
    # on 1.36 the seed's pod runs too, as any smoke pod (DRA serves its nvidia.com/gpu)
    newer = dict(DRA_NODE, status=dict(DRA_NODE["status"], nodeInfo={"kubeletVersion": "v1.36.3+k3s1"}))
    chosen = verify.choose(CLASSES, [newer], dra=DRA)
    assert chosen["pairs"] == [["dra1", "nvidia"]] and chosen["notes"] == [] and verify.refusal(chosen) is None


def test_a_dra_node_a_device_plugin_also_serves_is_a_conflict_and_gets_no_device_plugin_pods():
    served = dict(DRA_NODE, status=dict(DRA_NODE["status"], allocatable={"nvidia.com/gpu": "2"}, capacity={"nvidia.com/gpu": "2"}))
    chosen = verify.choose(CLASSES, [served], dra=DRA)
    assert [(p["scope"], p["layer"]) for p in chosen["problems"]] == [("dra1", "dra-conflict")]
    assert chosen["pairs"] == [] and chosen["claim_pairs"] == [] and chosen["allocatable"] == {"dra1": "2"}


@pytest.mark.parametrize("dra,layer", [
    (dict(DRA, dra_api=False), "dra-api"), (dict(DRA, resourceslices=[]), "dra-driver"),
    (dict(DRA, deviceclasses=[]), "deviceclass"), (None, "dra-api")])
def test_a_dra_node_whose_dra_layer_is_broken_is_named_before_any_pod(dra, layer):
    chosen = verify.choose(CLASSES, [DRA_NODE], dra=dra)
    assert [(p["scope"], p["layer"]) for p in chosen["problems"]] == [("dra1", layer)], chosen["problems"]
    assert chosen["claim_pairs"] == [] and verify.refusal(chosen).startswith("Nothing to test")


def claim_pod_state(phase, **status):
    made = verify.claim_pod("dra1", "nvidia", "smoke", "busybox")
    made["spec"]["nodeName"] = "dra1"
    made["status"] = dict({"phase": phase, "containerStatuses": [{"name": "smoke", "state": {}}]}, **status)
    return made


def test_a_claim_pod_names_the_claim_layer_and_the_dirs_of_the_drivers_cdi_specs():
    unschedulable = [{"type": "PodScheduled", "status": "False",
                      "message": "0/1 nodes are available: 1 cannot allocate all claims."}]
    waiting = claim_pod_state("Pending", conditions=unschedulable)
    entry = verify.diagnose(waiting)["broken"]
    assert entry["layer"] == "claim" and entry["scope"] == "dra1 / nvidia (claim)", entry
    # another claim pod of the node still runs: it waits its turn
    other = verify.claim_pod("dra1", "", "smoke", "busybox")
    other["spec"]["nodeName"] = "dra1"
    other["status"] = {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]}
    assert [s["broken"] for _p, s in verify.settle([waiting, other])] == [None, None]
    prepare = verify.diagnose(claim_pod_state("Pending"), [event(waiting["metadata"]["name"], "FailedPrepareDynamicResources",
                                                                 "prepare dynamic resources: NodePrepareResources failed")])
    assert prepare["broken"]["layer"] == "claim" and "kubelet cannot prepare the pod's claim" in prepare["broken"]["cause"]
    unresolvable = claim_pod_state("Pending", containerStatuses=[{"state": {"waiting": {
        "reason": "CreateContainerError", "message": "CDI device injection failed: unresolvable CDI devices "
                                                     "k8s.gpu.nvidia.com/claim=1234-gpu-0"}}}])
    entry = verify.diagnose(unresolvable)["broken"]
    assert entry["layer"] == "cdi" and "containerd must scan /var/run/cdi" in entry["fix"], entry


def test_the_report_of_a_claim_pod_has_its_allocation_and_wants_exactly_its_device():
    ran = claim_pod_state("Succeeded", resourceClaimStatuses=[{"name": "gpu", "resourceClaimName": "c1"}])
    claims = [{"metadata": {"name": "c1"}, "status": {"allocation": {"devices": {"results": [
        {"driver": "gpu.nvidia.com", "pool": "dra1", "device": "gpu-0"}]}}}}]
    name = ran["metadata"]["name"]
    good = verify.report([ran], [{"name": name, "lines": ["/dev/nvidia0", "GPU 0: x"]}], 1, {}, claims=claims)
    assert good == {"lines": ["dra1 / nvidia (claim): OK | claim gpu.nvidia.com dra1/gpu-0 | /dev/nvidia0 | GPU 0: x"],
                    "failed": []}
    both = verify.report([ran], [{"name": name, "lines": ["/dev/nvidia0", "/dev/nvidia1"]}], 1, {}, claims=claims)
    assert both["failed"] == ["dra1 / nvidia (claim) (claim)"] and "sees 2 GPU device(s)" in both["lines"][0]
