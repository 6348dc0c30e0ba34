# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Host mode's device-plugin HelmChart: the choices (RuntimeClass, device list strategy), GPU sharing
and its refusals, and the HelmChart against helm-controller's CRD schema per release line.

What NVIDIA's chart makes of these values is tested with the chart itself and Helm's renderer in
tests/conformance/test_device_plugin_chart.py."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as dp
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils.helmchart_checks import documents, helmchart_schema, valid_helmchart
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

RELEASE = "v1.33.10+k3s1"
CDI_NODE = {"host": "gpu1", "cdi_enabled": True, "cdi_spec": True, "handlers": ["nvidia", "nvidia-cdi", "runc"]}
PLAIN_NODE = {"host": "gpu2", "cdi_enabled": False, "cdi_spec": False, "handlers": ["nvidia", "runc"]}
SHIPPED = ("nvidia", "nvidia-experimental", "crun")  # what k3s itself ships (runtimes.yaml)


def cluster_of(distribution="k3s", release=RELEASE):
    """runtime_info's reading of the cluster's server."""
    return server_reading(distribution, release)


def plan(settings=None, nodes=(CDI_NODE, PLAIN_NODE), runtimeclasses=SHIPPED, release=RELEASE, distribution="k3s"):
    return dp.plan_cluster(NodeFacts.from_reading(cluster_of(distribution, release)), settings or {}, list(nodes), runtimeclasses)


# --- the known-versions table -----------------------------------------------------------------------

def test_every_known_version_has_its_facts():
    assert release_rules.DEVICE_PLUGIN_CHART["default_version"] in release_rules.DEVICE_PLUGIN_VERSIONS
    for version, row in release_rules.DEVICE_PLUGIN_VERSIONS.items():
        assert row["image"] == "nvcr.io/nvidia/k8s-device-plugin:v" + version  # v<appVersion>, appVersion == version
        assert len(row["commit"]) == 40
        assert row["mig_strategies"] == ("none", "single", "mixed")
        assert "cdi-cri" in row["device_list_strategies"] and "envvar" in row["device_list_strategies"]
    assert dp.chart_facts("v0.20.0")["version"] == "0.20.0"
    with pytest.raises(K3sGpuError, match=r"gpu_node_device_plugin_chart_version is '0\.14\.0', a chart "
                       r"version this collection does not know .*use one of 0\.18\.2, 0\.19\.3, 0\.20\.0"):
        plan({"chart_version": "0.14.0"})


# --- the default HelmChart ------------------------------------------------------------------------------

def test_default_values():
    result = plan()
    assert result["values"] == {
        "runtimeClassName": "nvidia",
        "deviceListStrategy": "envvar",
        "migStrategy": "none",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}},
        "gfd": {"enabled": False},
    }
    assert result["node_labels"] == {"gpu1": {"nvidia.com/gpu.present": "true"}, "gpu2": {"nvidia.com/gpu.present": "true"}}
    assert result["device_list_reason"] == "envvar: CDI is off in containerd on gpu2; no NVIDIA CDI spec on gpu2"
    spec = result["objects"][0]["spec"]
    assert (spec["chart"], spec["repo"], spec["version"], spec["targetNamespace"], spec["createNamespace"]) == (
        "nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.20.0", "nvidia-device-plugin", True)
    assert yaml.safe_load(spec["valuesContent"]) == result["values"]
    assert result["chart_archive_path"] is None and result["configs"] == []


# (distribution, release, helm-controller version), as in the operator-mode test
RELEASE_LINES = [
    ("k3s", "v1.28.15+k3s1", "v0.15.15"), ("rke2", "v1.29.15+rke2r1", "v0.15.16"), ("rke2", "v1.30.14+rke2r4", "v0.16.13"),
    ("k3s", "v1.31.14+k3s1", "v0.16.16"), ("k3s", "v1.32.13+k3s1", "v0.16.17"), ("rke2", "v1.33.13+rke2r2", "v0.16.26"),
    ("k3s", "v1.33.11+k3s1", "v0.17.1"), ("k3s", "v1.35.7+k3s1", "v0.17.7"), ("rke2", "v1.36.3+rke2r1", "v0.17.7"),
]


@pytest.mark.parametrize("distribution, release, controller", RELEASE_LINES, ids=str)
def test_helmchart_is_valid_for_the_release_line(distribution, release, controller):
    settings = {"sharing": {"strategy": "time-slicing", "replicas": 4}, "gfd": True, "image_registry": "registry.local:5000"}
    result = plan(settings, release=release, distribution=distribution)
    assert release_rules.helm_controller_version(distro.profile(distribution, release)) == controller
    text = dp.render_manifest(result)
    chart = valid_helmchart(text, controller, "nvidia-device-plugin")
    assert yaml.safe_load(chart["spec"]["valuesContent"]) == result["values"]


def test_manifest_is_byte_stable():
    settings = {"sharing": {"replicas": 4, "strategy": "time-slicing"},
                "configs": {"b": {"strategy": "mps", "replicas": 2}, "a": None}}
    nodes = [dict(PLAIN_NODE, config="b"), dict(CDI_NODE, config="a")]
    first = dp.render_manifest(plan(settings, nodes))
    reordered = {"configs": {"a": None, "b": {"replicas": 2, "strategy": "mps"}},
                 "sharing": {"strategy": "time-slicing", "replicas": 4}}
    assert dp.render_manifest(plan(reordered, list(reversed(nodes)), list(reversed(SHIPPED)))) == first
    assert first.startswith("# Managed by k3s_gpu.nvidia; edits are overwritten. NVIDIA device plugin 0.20.0")


def test_no_gpu_node_wants_no_manifest():
    result = plan(nodes=[])
    assert result["wanted"] is False and result["objects"] == []
    with pytest.raises(K3sGpuError, match="remove the manifest instead"):
        dp.render_manifest(result)


# --- runtimeClassName -----------------------------------------------------------------------------------

@pytest.mark.parametrize("available, nodes, wanted, chosen", [
    (["crun", "nvidia", "nvidia-cdi"], [CDI_NODE], "", "nvidia"),
    # nvidia-cdi resolves the plugin's NVIDIA_VISIBLE_DEVICES through the CDI spec: only with specs everywhere
    (["crun", "nvidia-cdi"], [CDI_NODE], "", "nvidia-cdi"),
    (["nvidia-cdi", "nvidia-legacy"], [dict(CDI_NODE, handlers=None), dict(PLAIN_NODE, handlers=None)], "", "nvidia-legacy"),
    # a RuntimeClass named otherwise, by its handler
    ([{"name": "gpu", "handler": "nvidia"}, "crun"], [CDI_NODE], "", "gpu"),
    # the handler must be on every node that reported its handlers
    (["nvidia", "nvidia-cdi"], [dict(CDI_NODE, handlers=["nvidia-cdi"])], "", "nvidia-cdi"),
    (["nvidia", "nvidia-legacy"], [CDI_NODE], "nvidia-legacy", "nvidia-legacy"),
])
def test_runtime_class_choice(available, nodes, wanted, chosen):
    if wanted == "nvidia-legacy":
        nodes = [dict(node, handlers=None) for node in nodes]
    assert dp.choose_runtime_class(available, nodes, wanted) == chosen


@pytest.mark.parametrize("available, nodes, wanted, message", [
    (["crun"], [CDI_NODE], "", r"the cluster has no NVIDIA RuntimeClass whose handler every GPU node has \(RuntimeClasses: "
     r"crun \(handler crun\)\); without one the plugin runs under runc and cannot load NVML, so create them with the "
     r"k3s_gpu.nvidia.runtimeclasses playbook, or set gpu_node_device_plugin_runtime_class"),
    (["nvidia-cdi"], [PLAIN_NODE], "", r"no NVIDIA RuntimeClass whose handler every GPU node has"),
    (["nvidia"], [CDI_NODE], "nvidia-legacy", r"gpu_node_device_plugin_runtime_class is 'nvidia-legacy', but the cluster "
     r"has no RuntimeClass of that name \(it has nvidia\)"),
    (["nvidia", "nvidia-cdi"], [PLAIN_NODE], "nvidia-cdi", r"gpu_node_device_plugin_runtime_class is nvidia-cdi, whose "
     r"handler nvidia-cdi is not configured in containerd on gpu2"),
])
def test_runtime_class_refusals(available, nodes, wanted, message):
    with pytest.raises(K3sGpuError, match=message):
        dp.choose_runtime_class(available, nodes, wanted)


# --- deviceListStrategy ---------------------------------------------------------------------------------

def test_cdi_cri_where_every_node_has_cdi_and_specs():
    result = plan(nodes=[CDI_NODE, dict(CDI_NODE, host="gpu3")])
    assert result["device_list_strategy"] == "cdi-cri" and result["values"]["deviceListStrategy"] == "cdi-cri"
    assert result["device_list_reason"] == "cdi-cri: every GPU node's containerd has CDI on and an NVIDIA CDI spec"


@pytest.mark.parametrize("nodes, release, reason", [
    ([CDI_NODE, dict(CDI_NODE, host="gpu3", cdi_spec=False)], RELEASE, "envvar: no NVIDIA CDI spec on gpu3"),
    ([dict(CDI_NODE, cdi_enabled=False)], RELEASE, "envvar: CDI is off in containerd on gpu1"),
    # KEP-4009: the kubelet's CDIDevices field is off by default in 1.28
    ([CDI_NODE], "v1.28.15+k3s1", "envvar: the kubelet of k3s v1.28.15+k3s1 does not pass CDI devices (Kubernetes 1.29+)"),
])
def test_envvar_otherwise(nodes, release, reason):
    result = plan(nodes=nodes, release=release)
    assert (result["device_list_strategy"], result["device_list_reason"]) == ("envvar", reason)


def test_explicit_strategies():
    assert plan({"device_list_strategy": "envvar"}, nodes=[CDI_NODE])["device_list_strategy"] == "envvar"
    assert plan({"device_list_strategy": "cdi-cri"}, nodes=[CDI_NODE])["device_list_strategy"] == "cdi-cri"
    # cdi-annotations needs no kubelet support
    assert plan({"device_list_strategy": "cdi-annotations"}, nodes=[CDI_NODE],
                release="v1.28.15+k3s1")["device_list_strategy"] == "cdi-annotations"
    with pytest.raises(K3sGpuError, match=r"gpu_node_device_plugin_device_list_strategy is cdi-cri, but CDI "
                       r"is off in containerd on gpu2; no NVIDIA CDI spec on gpu2; enable CDI and generate the specs"):
        plan({"device_list_strategy": "cdi-cri"})
    with pytest.raises(K3sGpuError, match=r"gpu_node_device_plugin_device_list_strategy is 'cdi_cri' \(did "
                       r"you mean cdi-cri\?\); use one of auto, envvar, volume-mounts, cdi-annotations, cdi-cri"):
        plan({"device_list_strategy": "cdi_cri"})


# --- GPU sharing ----------------------------------------------------------------------------------------

def config_of(result, name="default"):
    return yaml.safe_load(result["values"]["config"]["map"][name])


def test_time_slicing():
    result = plan({"sharing": {"strategy": "time-slicing", "replicas": 4, "rename_by_default": False,
                               "fail_requests_greater_than_one": False}})
    assert result["values"]["config"]["default"] == "default" and result["configs"] == ["default"]
    assert config_of(result) == {"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "renameByDefault": False, "failRequestsGreaterThanOne": False,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert all("nvidia.com/mps.capable" not in labels for labels in result["node_labels"].values())


def test_mps():
    result = plan({"sharing": {"strategy": "mps", "replicas": 8, "rename_by_default": True}, "mig_strategy": "single"})
    # failRequestsGreaterThanOne: the plugin's own default for MPS, written out
    assert config_of(result) == {"version": "v1", "flags": {"migStrategy": "single"}, "sharing": {"mps": {
        "renameByDefault": True, "failRequestsGreaterThanOne": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 8}]}}}
    assert result["values"]["migStrategy"] == "single"
    # the chart's MPS control daemon runs only where nvidia.com/mps.capable=true (set by GFD, which is off)
    assert result["node_labels"]["gpu1"] == {"nvidia.com/gpu.present": "true", "nvidia.com/mps.capable": "true"}


def test_named_per_node_configs():
    settings = {"sharing": {"strategy": "time-slicing", "replicas": 2},
                "configs": {"mps-4": {"strategy": "mps", "replicas": 4}, "exclusive": {"strategy": "none"}}}
    result = plan(settings, [dict(CDI_NODE, config="mps-4"), dict(PLAIN_NODE, config="exclusive"),
                             {"host": "gpu3", "handlers": ["nvidia"]}])
    assert result["configs"] == ["default", "exclusive", "mps-4"]
    assert config_of(result, "exclusive") == {"version": "v1", "flags": {"migStrategy": "none"}}
    assert config_of(result, "mps-4")["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert result["node_labels"] == {
        "gpu1": {"nvidia.com/gpu.present": "true", "nvidia.com/device-plugin.config": "mps-4", "nvidia.com/mps.capable": "true"},
        "gpu2": {"nvidia.com/gpu.present": "true", "nvidia.com/device-plugin.config": "exclusive"},
        "gpu3": {"nvidia.com/gpu.present": "true"}}
    # configs without cluster-wide sharing: the default config shares nothing
    alone = plan({"configs": {"ts": {"strategy": "time-slicing", "replicas": 3}}})
    assert config_of(alone) == {"version": "v1", "flags": {"migStrategy": "none"}}


@pytest.mark.parametrize("settings, message", [
    ({"sharing": {"strategy": "time-slicing", "replicas": 1}}, r"gpu_node_gpu_sharing\.replicas is 1; set a whole number "
     r"of 2 or more"),
    ({"sharing": {"strategy": "time-slicing", "replicas": "4"}}, r"gpu_node_gpu_sharing\.replicas is '4'; set a whole number"),
    ({"sharing": {"strategy": "time-slicing", "replicas": True}}, r"gpu_node_gpu_sharing\.replicas is True"),
    ({"sharing": {"strategy": "time-slicing", "replicas": 2.5}}, r"gpu_node_gpu_sharing\.replicas is 2\.5"),
    ({"sharing": {"strategy": "time-slicing"}}, r"gpu_node_gpu_sharing\.replicas is None"),
    ({"sharing": {"strategy": "time-slicing", "replica": 4}}, r"gpu_node_gpu_sharing has no key replica \(did you mean "
     r"replicas\?\); its keys are strategy, replicas, rename_by_default, fail_requests_greater_than_one"),
    ({"sharing": {"strategy": "timeslicing", "replicas": 4}}, r"gpu_node_gpu_sharing\.strategy is 'timeslicing' \(did you "
     r"mean time-slicing\?\); use time-slicing or mps \(or none\)"),
    ({"sharing": {"strategy": "mps", "replicas": 4}, "mig_strategy": "mixed"}, r"gpu_node_gpu_sharing uses MPS, which the "
     r"plugin refuses with MIG strategy mixed; set gpu_node_device_plugin_mig_strategy to none or single, or share with "
     r"time-slicing"),
    ({"sharing": {"strategy": "mps", "replicas": 49}}, r"gpu_node_gpu_sharing\.replicas is 49, above the 48 clients one "
     r"MPS server takes"),
    ({"sharing": {"strategy": "none", "replicas": 4}}, r"gpu_node_gpu_sharing: strategy none shares nothing, so replicas "
     r"has no meaning"),
    ({"sharing": {"strategy": "time-slicing", "replicas": 4, "rename_by_default": "yes"}},
     r"gpu_node_gpu_sharing\.rename_by_default must be true or false, got 'yes'"),
    ({"sharing": "time-slicing"}, r"gpu_node_gpu_sharing must be a dict such as \{strategy: time-slicing, replicas: 4\}"),
    ({"configs": {"big": {"strategy": "mps", "replicas": 4}}, "mig_strategy": "mixed"},
     r"gpu_node_device_plugin_configs\.big uses MPS, which the plugin refuses with MIG strategy mixed"),
    ({"configs": {"default": {"strategy": "mps", "replicas": 4}}}, r"gpu_node_device_plugin_configs names a config "
     r"'default', the name of the cluster-wide config \(set that one with gpu_node_gpu_sharing\); rename it"),
    ({"configs": {"a b": None}}, r"gpu_node_device_plugin_configs has the config name 'a b'; use letters, digits"),
    ({"configs": ["a"]}, r"gpu_node_device_plugin_configs must be a dict of config name -> sharing setting, got list"),
    ({"mig_strategy": "mix"}, r"gpu_node_device_plugin_mig_strategy is 'mix' \(did you mean mixed\?\); use one of none, "
     r"single, mixed"),
    ({"device_discovery_strategy": "nvlm"}, r"gpu_node_device_plugin_device_discovery_strategy is 'nvlm' \(did you mean "
     r"nvml\?\); use one of auto, nvml, tegra"),
    ({"gfd": "true"}, r"gpu_node_device_plugin_gfd must be true or false, got 'true'"),
    ({"namespace": "default"}, r"gpu_node_device_plugin_namespace is default, which the chart refuses"),
    ({"namespace": "GPU"}, r"gpu_node_device_plugin_namespace is 'GPU'; give a namespace name"),
    ({"chart_archive": "chart.tar"}, r"gpu_node_device_plugin_chart_archive is 'chart.tar'; give a file name ending in .tgz"),
    ({"chart_repo": "nvidia.github.io"}, r"gpu_node_device_plugin_chart_repo is 'nvidia.github.io'; give the chart "
     r"repository as an https://"),
    ({"image_registry": "https://registry.local"}, r"gpu_node_device_plugin_image_registry is 'https://registry.local'; "
     r"give the registry that mirrors the images as host\[:port\]\[/path\]"),
    ({"gpu_sharing": {}}, r"the device plugin settings has no key gpu_sharing"),
    ({"runtimeclass": "nvidia"}, r"the device plugin settings has no key runtimeclass \(did you mean runtime_class\?\)"),
])
def test_bad_settings(settings, message):
    with pytest.raises(K3sGpuError, match=message):
        plan(settings)


def test_messages_are_one_sentence():
    with pytest.raises(K3sGpuError) as caught:
        plan({"sharing": {"strategy": "mps", "replicas": 1}})
    assert str(caught.value).count(". ") == 0 and not str(caught.value).endswith(".")  # a clause: callers end it


def test_node_config_must_be_defined():
    with pytest.raises(K3sGpuError, match=r"a node asks for the plugin config mps-8, which "
                       r"gpu_node_device_plugin_configs does not define \(it defines none\)"):
        plan(nodes=[dict(CDI_NODE, config="mps-8")])


@pytest.mark.parametrize("nodes, message", [
    ([{"host": "gpu1", "cdi_specs": True}], r"the facts of node gpu1 has no key cdi_specs \(did you mean cdi_spec\?\)"),
    ([{"host": ""}], r"a node's host must be its inventory hostname"),
    ([CDI_NODE, CDI_NODE], r"node gpu1 is listed twice"),
    ([dict(CDI_NODE, cdi_enabled="yes")], r"the facts of node gpu1: cdi_enabled must be true or false"),
    ([dict(CDI_NODE, handlers="nvidia")], r"the facts of node gpu1: handlers must be a list"),
])
def test_bad_node_facts(nodes, message):
    with pytest.raises(K3sGpuError, match=message):
        plan(nodes=nodes)


def test_plugin_node_dataclass_is_an_input_too():
    facts = dp.PluginNode(host="gpu1", cdi_enabled=True, cdi_spec=True, handlers=("nvidia",))
    assert plan(nodes=[facts])["device_list_strategy"] == "cdi-cri"


# --- air-gapped sites and options -------------------------------------------------------------------------

def test_air_gapped_chart_and_mirrored_images():
    result = plan({"chart_archive": "nvidia-device-plugin-0.20.0.tgz", "image_registry": "registry.local:5000/mirror",
                   "gfd": True}, distribution="rke2", release="v1.33.10+rke2r1")
    spec = result["objects"][0]["spec"]
    assert spec["chart"] == "https://%{KUBERNETES_API}%/static/charts/nvidia-device-plugin-0.20.0.tgz"
    assert "repo" not in spec and "version" not in spec
    assert result["chart_archive_path"] == "/var/lib/rancher/rke2/server/static/charts/nvidia-device-plugin-0.20.0.tgz"
    assert result["values"]["image"] == {"repository": "registry.local:5000/mirror/nvidia/k8s-device-plugin"}
    assert result["values"]["nfd"] == {"image": {"repository": "registry.local:5000/mirror/nfd/node-feature-discovery"}}
    assert result["values"]["gfd"] == {"enabled": True}
    jsonschema.validate(documents(dp.render_manifest(result))[0], helmchart_schema("v0.16.26"))


def test_options():
    result = plan({"device_discovery_strategy": "nvml", "namespace": "gpu", "chart_version": "0.19.3",
                   "image_registry": "registry.local"})
    assert result["values"]["deviceDiscoveryStrategy"] == "nvml"
    assert result["values"]["image"] == {"repository": "registry.local/nvidia/k8s-device-plugin"}
    assert "nfd" not in result["values"]  # NFD only comes with GFD
    spec = result["objects"][0]["spec"]
    assert (spec["targetNamespace"], spec["version"]) == ("gpu", "0.19.3")


def test_bad_cluster():
    with pytest.raises(K3sGpuError, match="runtime_info result of a k3s or rke2 server"):
        dp.plan_cluster(NodeFacts.from_reading(server_reading("containerd", "2.1.4")), {}, [CDI_NODE], SHIPPED)
