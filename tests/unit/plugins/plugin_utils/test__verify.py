# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions: what is tested, the report per node, the manifests read without a cluster."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _verify as verify

CLASSES = [{"metadata": {"name": "nvidia"}, "handler": "nvidia"}, {"metadata": {"name": "nvidia-cdi"}, "handler": "nvidia-cdi"},
           {"metadata": {"name": "crun"}, "handler": "crun"}]
NODES = [{"metadata": {"name": "gpu1"}, "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"}}},
         {"metadata": {"name": "cpu1"}, "status": {"allocatable": {"cpu": "8"}}}]


def pod(node, cls, phase):
    return {"metadata": {"name": "gpu-%s-%s" % (cls, node)}, "spec": {"nodeName": node, "runtimeClassName": cls},
            "status": {"phase": phase}}


def test_every_nvidia_class_on_every_node_that_advertises_gpus():
    chosen = verify.choose(CLASSES, NODES)
    assert chosen == {"runtimeclasses": ["nvidia", "nvidia-cdi"], "gpu_nodes": ["gpu1"],
                      "allocatable": {"gpu1": "4", "cpu1": "0"}, "nodes_without_gpu": ["cpu1"]}
    assert verify.refusal(chosen) is None
    assert verify.choose(CLASSES, NODES, ["nvidia-cdi"])["runtimeclasses"] == ["nvidia-cdi"]


def test_no_gpu_advertised_says_what_to_run():
    message = verify.refusal(verify.choose(CLASSES, NODES[1:]))
    assert message.startswith("Nothing to test: 2 NVIDIA RuntimeClasses (nvidia, nvidia-cdi) and 0 nodes")
    assert "device plugin" in message


def test_the_report_has_phase_allocatable_and_the_nvidia_smi_line():
    pods = [pod("gpu1", "nvidia", "Succeeded"), pod("gpu1", "nvidia-cdi", "Failed")]
    logs = [{"name": "gpu-nvidia-gpu1", "lines": ["/dev/nvidia0", "GPU 0: NVIDIA H200 (UUID: GPU-1)"]},
            {"name": "gpu-nvidia-cdi-gpu1", "lines": ["ls: cannot access '/dev/nvidia*'"]}]
    reported = verify.report(pods, logs, 2, {"gpu1": "4"})
    assert reported["lines"] == [
        "gpu1 / nvidia: Succeeded | allocatable nvidia.com/gpu 4 | GPU 0: NVIDIA H200 (UUID: GPU-1)",
        "gpu1 / nvidia-cdi: Failed | allocatable nvidia.com/gpu 4 | ls: cannot access '/dev/nvidia*'"]
    assert reported["failed"] == ["gpu-nvidia-cdi-gpu1"]
    assert verify.report(pods[:1], logs, 2, {})["failed"] == ["1 of 2 pods found"]


def test_manifests_read_without_a_cluster():
    rc = runtimeclasses.render_manifest_yaml([runtimeclasses.runtimeclass_manifest("nvidia-cdi")])
    chart = ('---\napiVersion: helm.cattle.io/v1\nkind: HelmChart\nmetadata: {name: nvidia-device-plugin}\n'
             'spec: {chart: nvidia-device-plugin, version: 0.20.0, valuesContent: "runtimeClassName: nvidia\\n"}\n')
    found = verify.inspect_manifests({"a.yaml": None, "rc.yaml": rc, "dp.yaml": chart})
    assert found["a.yaml"] is None
    assert found["rc.yaml"] == {"kinds": ["RuntimeClass"], "names": ["nvidia-cdi"]}
    assert found["dp.yaml"]["runtimeClassName"] == "nvidia" and found["dp.yaml"]["version"] == "0.20.0"


def test_one_smoke_pod_per_gpu_node_and_class_with_a_dns_label_name():
    long_node = "gpu-node-in-rack-17-of-the-west-datacenter.example.com"
    chosen = {"gpu_nodes": ["gpu1", long_node], "runtimeclasses": ["nvidia", "nvidia-experimental"]}
    pods = verify.smoke_pods(chosen, "smoke", "registry.local/ubuntu:24.04")
    assert [(p["spec"]["nodeName"], p["spec"]["runtimeClassName"]) for p in pods] == [
        ("gpu1", "nvidia"), ("gpu1", "nvidia-experimental"), (long_node, "nvidia"), (long_node, "nvidia-experimental")]
    for made in pods:
        name = made["metadata"]["name"]
        assert len(name) <= 63 and all(c.isalnum() or c == "-" for c in name), name
        assert made["metadata"]["namespace"] == "smoke" and made["metadata"]["labels"]["k3s-gpu.nvidia/verify"] == "true"
        container = made["spec"]["containers"][0]
        assert container["image"] == "registry.local/ubuntu:24.04" and container["resources"]["limits"] == {"nvidia.com/gpu": 1}
        assert container["command"][-1].endswith("nvidia-smi -L") and made["spec"]["restartPolicy"] == "Never"
    assert len(set(p["metadata"]["name"] for p in pods)) == 4
    # two long names that agree in their first 30 characters stay apart
    twin = long_node.replace("example", "example2")
    assert verify.pod_name(long_node, "nvidia") != verify.pod_name(twin, "nvidia")
