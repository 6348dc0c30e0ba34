# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA's DRA driver as a k3s/rke2 HelmChart (issue 45): the values that fit k3s/rke2, the release rule, the nodes'
agreement on one kubelet root dir and one driver owner, the settings' refusals, the OCI and air-gapped chart sources,
and the HelmChart against the release's helm-controller CRD. NVIDIA's chart renders these values in
tests/conformance/test_dra_driver_chart.py."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils.helmchart_checks import valid_helmchart

RELEASE = "v1.36.3+k3s1"
NODES = ({"host": "gpu1"}, {"host": "gpu2"})
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "k3s-gpu.nvidia/gpu-allocation", "operator": "In", "values": ["dra"]}]}]}}}


def plan(settings=None, nodes=NODES, release=RELEASE, distribution="k3s"):
    return dra.plan_cluster(NodeFacts.from_reading(server_reading(distribution, release)), settings or {}, list(nodes))


def test_the_known_versions_have_their_facts():
    assert release_rules.DRA_DRIVER_CHART["default_version"] in release_rules.DRA_DRIVER_VERSIONS
    for version, row in release_rules.DRA_DRIVER_VERSIONS.items():
        assert row["image"] == "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v" + version
        assert len(row["commit"]) == 40


def test_default_values_keep_the_driver_to_the_dra_nodes():
    result = plan()
    assert result["values"] == {
        "nvidiaDriverRoot": "/",
        "gpuResourcesEnabledOverride": True,
        "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
        "resourceApiVersion": "resource.k8s.io/v1",
        "kubeletPlugin": {"kubeletRegistrarDirectoryPath": "/var/lib/kubelet/plugins_registry",
                          "kubeletPluginsDirectoryPath": "/var/lib/kubelet/plugins", "affinity": AFFINITY},
    }
    spec = result["objects"][0]["spec"]
    # the registry's chart through OCI: spec.chart carries the reference, no repo
    assert (spec["chart"], spec["version"], spec["targetNamespace"], spec["createNamespace"]) == (
        "oci://registry.k8s.io/dra-driver-nvidia/charts/dra-driver-nvidia-gpu", "0.4.1", "nvidia-dra-driver-gpu", True)
    assert "repo" not in spec and yaml.safe_load(spec["valuesContent"]) == result["values"]
    assert result["objects"][0]["metadata"] == {"name": "nvidia-dra-driver-gpu", "namespace": "kube-system",
                                                "labels": {"app.kubernetes.io/managed-by": "k3s_gpu.nvidia"}}
    assert result["nodes"] == ["gpu1", "gpu2"] and result["chart_archive_path"] is None


def test_no_dra_node_wants_no_manifest():
    result = plan(nodes=())
    assert result["wanted"] is False and result["objects"] == []
    with pytest.raises(K3sGpuError, match=r"no DRA driver objects \(the cluster has no node with gpu_node_allocation=dra\) to render"):
        dra.render_manifest(result)


def test_kubelet_root_dir_and_operator_driver_follow_the_nodes():
    nodes = [{"host": "gpu1", "kubelet_root_dir": "/data/kubelet/", "operator_driver": True},
             {"host": "gpu2", "kubelet_root_dir": "/data/kubelet", "operator_driver": True}]
    values = plan(nodes=nodes)["values"]
    assert values["nvidiaDriverRoot"] == "/run/nvidia/driver"
    assert values["kubeletPlugin"]["kubeletRegistrarDirectoryPath"] == "/data/kubelet/plugins_registry"
    assert values["kubeletPlugin"]["kubeletPluginsDirectoryPath"] == "/data/kubelet/plugins"


@pytest.mark.parametrize("key, other, message", [
    ("kubelet_root_dir", "/data/kubelet", r"disagree on kubelet's root dir \(/data/kubelet on gpu2; /var/lib/kubelet on gpu1\)"),
    ("operator_driver", True, r"disagree on who owns the NVIDIA driver \(False on gpu1; True on gpu2\)"),
])
def test_nodes_that_disagree_on_a_cluster_wide_value_are_refused(key, other, message):
    with pytest.raises(K3sGpuError, match=message):
        plan(nodes=[{"host": "gpu1"}, {"host": "gpu2", key: other}])


@pytest.mark.parametrize("release", ["v1.33.10+k3s1", "v1.34.1+k3s1", "v1.32.13+rke2r1"])
def test_releases_before_1_34_2_are_refused_with_the_fix(release):
    distribution = "rke2" if "rke2" in release else "k3s"
    with pytest.raises(K3sGpuError, match=r"runs %s %s, which NVIDIA's DRA driver does not support: it needs Kubernetes "
                       r"1\.34\.2 or newer.*upgrade the cluster to v1\.34\.2 or newer, or keep "
                       r"gpu_node_allocation=device_plugin" % (distribution, release.replace("+", r"\+"))):
        plan(release=release, distribution=distribution)


@pytest.mark.parametrize("release", ["v1.34.2+k3s1", "v1.35.7+k3s1", "v1.37.1+rke2r1"])
def test_releases_from_1_34_2_serve_dra(release):
    assert plan(release=release, distribution="rke2" if "rke2" in release else "k3s")["wanted"]


def test_the_feature_table_says_where_pods_asking_nvidia_com_gpu_are_served_through_dra():
    served = [line for line in distro.KNOWN_LINES
              if distro.has_feature(distro.Release("k3s", "v%s.9+k3s1" % line), "dra_extended_resource")]
    assert served == ["1.36", "1.37"]


def test_air_gapped_chart_and_mirrors():
    result = plan({"chart_archive": "dra-driver-nvidia-gpu-0.4.1.tgz", "image_registry": "registry.local:5000",
                   "compute_domains": True, "namespace": "gpu-dra"})
    spec = result["objects"][0]["spec"]
    assert spec["chart"] == "https://%{KUBERNETES_API}%/static/charts/dra-driver-nvidia-gpu-0.4.1.tgz"
    assert "version" not in spec and spec["targetNamespace"] == "gpu-dra"
    assert result["chart_archive_path"] == "/var/lib/rancher/k3s/server/static/charts/dra-driver-nvidia-gpu-0.4.1.tgz"
    assert result["values"]["image"] == {"repository": "registry.local:5000/dra-driver-nvidia/dra-driver-nvidia-gpu"}
    assert result["values"]["resources"]["computeDomains"] == {"enabled": True}
    https = plan({"chart_repo": "https://charts.example.com/nvidia"})["objects"][0]["spec"]
    assert (https["chart"], https["repo"]) == ("dra-driver-nvidia-gpu", "https://charts.example.com/nvidia")


@pytest.mark.parametrize("settings, message", [
    ({"chart_version": "0.3.0"}, r"gpu_node_dra_driver_chart_version is '0\.3\.0', which this collection does not know"),
    ({"namespace": "default"}, r"gpu_node_dra_driver_namespace is 'default': the chart needs a namespace of its own"),
    ({"namespace": "Bad_NS"}, r"gpu_node_dra_driver_namespace is 'Bad_NS'"),
    ({"compute_domains": "yes"}, r"gpu_node_dra_driver_compute_domains must be a boolean, got str 'yes'"),
    ({"chart_repo": "registry.k8s.io/charts"}, r"gpu_node_dra_driver_chart_repo is 'registry\.k8s\.io/charts', not a chart"),
    ({"image_registry": "https://mirror"}, r"gpu_node_dra_driver_image_registry is 'https://mirror'"),
    ({"chart_archive": "chart.tar"}, r"gpu_node_dra_driver_chart_archive is 'chart\.tar'"),
])
def test_settings_are_refused_by_their_variable(settings, message):
    with pytest.raises(K3sGpuError, match=message):
        plan(settings)


@pytest.mark.parametrize("distribution, release, controller", [
    ("k3s", "v1.34.2+k3s1", "v0.16.16"), ("rke2", "v1.35.7+rke2r1", "v0.17.7"), ("k3s", "v1.36.3+k3s1", "v0.17.7")])
def test_helmchart_is_valid_for_the_release_line(distribution, release, controller):
    result = plan(release=release, distribution=distribution)
    assert release_rules.helm_controller_version(distro.profile(distribution, release)) == controller
    text = dra.render_manifest(result)
    chart = valid_helmchart(text, controller, "nvidia-dra-driver-gpu")
    assert yaml.safe_load(chart["spec"]["valuesContent"]) == result["values"]
    assert text.startswith("# Managed by k3s_gpu.nvidia; edits are overwritten. NVIDIA DRA driver 0.4.1 for k3s/rke2")
    assert dra.render_manifest(plan(nodes=list(reversed(NODES)), release=release, distribution=distribution)) == text


def test_role_settings_convert_the_role_variables():
    converted = dra.settings_of_role({"dra_driver_chart_archive": "/srv/charts/dra-driver-nvidia-gpu-0.4.1.tgz",
                                      "dra_driver_namespace": "gpu-dra", "dra_driver_compute_domains": False})
    assert converted == {"chart_archive": "dra-driver-nvidia-gpu-0.4.1.tgz", "namespace": "gpu-dra",
                         "compute_domains": False}
    assert dra.ROLE_VARS[0] == "gpu_node_dra_driver_state" and "gpu_node_dra_driver_image_registry" in dra.ROLE_VARS
