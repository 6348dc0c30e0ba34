# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The DRA driver HelmChart (issue 45) rendered by NVIDIA's own chart with Helm's own engine.

Each case takes the HelmChart that _dra_driver builds and renders its `valuesContent`, exactly, with the
dra-driver-nvidia-gpu 0.4.1 chart (../shared/charts, checked by sha256), under the HelmChart's name and target
namespace, told the release's Kubernetes version, with helm-render (tests/helm_render on helm.sh/helm/v4, built from
the Go module proxy by tests/testbins.py). The chart's render-time refusals pass (gpuResourcesEnabledOverride, the
namespace, the resource API). Checked on the rendered objects: the kubelet plugin's DaemonSet runs on a node labelled
for DRA and on no device-plugin node (nor an NFD-only one), the kubelet dirs reach its env, mounts and hostPaths, the
driver root its hostPath, /var/run/cdi is its CDI dir, the gpu.nvidia.com DeviceClass selects NVIDIA's devices and names
nvidia.com/gpu, no ComputeDomain controller unless asked, and every object against the Kubernetes schema of the
release's line (kubernetes-validate). Missing material FAILS with the hint; it never skips."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as dp
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra
from ansible_collections.k3s_gpu.nvidia.tests import testbins
from ansible_collections.k3s_gpu.nvidia.tests.conformance.test_device_plugin_chart import schedulable, shared_file
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - the failure says how to install it
    kubernetes_validate = None

CHART_ARCHIVE = ("charts/dra-driver-nvidia-gpu-0.4.1.tgz", "8fb5490333c596aac17eac21dad68111eb9b8433cc648a256fcb6043d2f53155")
# (release, the Kubernetes minor of its schema check): the oldest line NVIDIA's driver supports and the newest lab line
RELEASES = [("v1.34.6+k3s1", "1.34"), ("v1.36.3+rke2r1", "1.36")]
DRA_NODE_LABELS = {"k3s-gpu.nvidia/gpu-allocation": "dra", "nvidia.com/gpu.present": "true"}
DEVICE_PLUGIN_NODE_LABELS = {"nvidia.com/gpu.present": "true"}
NFD_ONLY_NODE_LABELS = {"feature.node.kubernetes.io/pci-10de.present": "true"}


@pytest.fixture(scope="module")
def chart():
    return shared_file(*CHART_ARCHIVE)


@pytest.fixture(scope="module")
def helm_render():
    return testbins.require("helm-render", "helm-render")


@pytest.fixture(scope="module")
def validator():
    if kubernetes_validate is None:
        pytest.fail("kubernetes-validate is missing: pip install -r tests/unit/requirements.txt", pytrace=False)
    return kubernetes_validate


def plan_of(release, settings=None, nodes=({"host": "gpu1"},)):
    distribution = "rke2" if "rke2" in release else "k3s"
    return dra.plan_cluster(NodeFacts.from_reading(server_reading(distribution, release)), settings or {}, list(nodes))


def render(helm_render, chart, plan, release, tmp_path):
    spec = plan["objects"][0]["spec"]
    values = tmp_path / "values.yaml"
    values.write_text(spec["valuesContent"], encoding="utf-8")
    proc = subprocess.run([helm_render, plan["objects"][0]["metadata"]["name"], chart, "-n", spec["targetNamespace"],
                           "-f", str(values), "--kube-version", release.split("+", maxsplit=1)[0]],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(proc.stdout) if doc}


def kubelet_plugin(objects):
    return objects[("DaemonSet", "dra-driver-nvidia-gpu-kubelet-plugin")]["spec"]["template"]["spec"]


def host_paths(pod):
    return {volume["name"]: volume["hostPath"]["path"] for volume in pod["volumes"] if "hostPath" in volume}


@pytest.mark.parametrize("release, kubernetes", RELEASES, ids=[r[0] for r in RELEASES])
def test_default(helm_render, chart, validator, tmp_path, release, kubernetes):
    plan = plan_of(release)
    objects = render(helm_render, chart, plan, release, tmp_path)
    pod = kubelet_plugin(objects)
    assert objects[("DaemonSet", "dra-driver-nvidia-gpu-kubelet-plugin")]["metadata"]["namespace"] == "nvidia-dra-driver-gpu"
    # on the DRA nodes only: never beside the device plugin, whose own affinity keeps off DRA_NODE_LABELS
    assert schedulable(pod, DRA_NODE_LABELS)
    assert not schedulable(pod, DEVICE_PLUGIN_NODE_LABELS) and not schedulable(pod, NFD_ONLY_NODE_LABELS)
    plugin_values = dp.chart_values(dict(dp._check_settings({}), sharing=None, configs={}), "nvidia", "envvar", [],
                                    dra_nodes=True)
    assert not schedulable({"affinity": plugin_values["affinity"]}, DRA_NODE_LABELS)
    assert schedulable({"affinity": plugin_values["affinity"]}, DEVICE_PLUGIN_NODE_LABELS)
    paths = host_paths(pod)
    assert paths["plugins-registry"] == "/var/lib/kubelet/plugins_registry" and paths["plugins"] == "/var/lib/kubelet/plugins"
    assert paths["cdi"] == "/var/run/cdi" and paths["driver-root"] == "/"
    images = {c["image"] for c in pod["containers"]}
    assert images == {release_rules.DRA_DRIVER_VERSIONS["0.4.1"]["image"]}
    gpu_class = objects[("DeviceClass", "gpu.nvidia.com")]
    assert gpu_class["apiVersion"] == "resource.k8s.io/v1" and gpu_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "device.driver == 'gpu.nvidia.com'" in gpu_class["spec"]["selectors"][0]["cel"]["expression"]
    # ComputeDomains off: no controller Deployment, no compute-domain DeviceClasses
    assert not any(kind == "Deployment" for kind, _name in objects)
    assert not any(kind == "DeviceClass" and name.startswith("compute-domain") for kind, name in objects)
    for obj in objects.values():
        assert validator.validate(obj, kubernetes, strict=True) == kubernetes, (obj["kind"], obj["metadata"]["name"])


def test_a_custom_kubelet_root_an_operator_driver_and_a_mirror(helm_render, chart, tmp_path):
    nodes = [{"host": "gpu1", "kubelet_root_dir": "/data/kubelet", "operator_driver": True}]
    plan = plan_of("v1.36.3+k3s1", {"image_registry": "registry.local:5000", "compute_domains": True}, nodes)
    objects = render(helm_render, chart, plan, "v1.36.3+k3s1", tmp_path)
    pod = kubelet_plugin(objects)
    paths = host_paths(pod)
    assert (paths["plugins-registry"], paths["plugins"], paths["driver-root"]) == (
        "/data/kubelet/plugins_registry", "/data/kubelet/plugins", "/run/nvidia/driver")
    env = {item["name"]: item.get("value") for c in pod["containers"] for item in c.get("env", [])}
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/data/kubelet/plugins_registry"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/data/kubelet/plugins"
    assert {c["image"] for c in pod["containers"]} == {"registry.local:5000/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1"}
    # asked for: the ComputeDomain controller and its DeviceClasses
    assert ("Deployment", "dra-driver-nvidia-gpu-controller") in objects
    assert ("DeviceClass", "compute-domain-default-channel.nvidia.com") in objects


def test_the_chart_refuses_what_the_collection_never_writes(helm_render, chart, tmp_path):
    """The chart's own guards, so that a change of ours that dropped a needed value fails here, by the chart's words."""
    plan = plan_of("v1.36.3+k3s1")
    values = dict(plan["values"], gpuResourcesEnabledOverride=False)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    proc = subprocess.run([helm_render, "x", chart, "-n", "nvidia-dra-driver-gpu", "-f", str(path), "--kube-version",
                           "v1.36.3"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "cannot be deployed alongside the standard GPU device plugin" in proc.stderr
