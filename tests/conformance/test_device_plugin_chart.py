# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The device-plugin HelmChart rendered by NVIDIA's own chart with Helm's own engine.

Each case takes the HelmChart that _device_plugin builds and renders its `valuesContent`, exactly, with
the nvidia-device-plugin 0.20.0 chart, under the HelmChart's name and target namespace (what
helm-controller's install job does). Helm is `helm-render` (tests/helm_render: our `helm template` on the
library of helm.sh/helm/v4 v4.3.2, offline), built at test time from the Go module proxy by
tests/testbins.py into its cache outside the clone; the chart archive comes from the project's shared
material ($K3S_GPU_SHARED, else <repo>/../shared: charts/nvidia-device-plugin-0.20.0.tgz), checked by
sha256. The render is told the release's Kubernetes version. Checked on the rendered objects: the DaemonSets'
runtimeClassName, an affinity that the labels the plan gives the nodes satisfy and an NFD-only node does not,
the device-list and MIG env of the plugin container, the ConfigMap that the config-manager reads, and every
object against the Kubernetes schema (kubernetes-validate, bundled schemas). Missing material FAILS with
the hint; it never skips.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as dp
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests import testbins
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - the failure says how to install it
    kubernetes_validate = None

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
CHART_ARCHIVE = ("charts/nvidia-device-plugin-0.20.0.tgz", "66065a7acf286e98a92f81c017905b3bf4bdfc630da93c44be4721f16c3be4d0")
RELEASE = "v1.33.10+k3s1"
KUBERNETES = "1.33"  # the release's Kubernetes minor: the render's Capabilities and the schema check
SHIPPED = ["nvidia", "nvidia-experimental", "crun"]
CDI_NODE = {"host": "gpu1", "cdi_enabled": True, "cdi_spec": True, "handlers": ["nvidia", "nvidia-cdi", "runc"]}
PLAIN_NODE = {"host": "gpu2", "handlers": ["nvidia", "runc"]}
# a node that only NFD calls NVIDIA: the chart's default affinity takes it, ours must not
NFD_ONLY_NODE_LABELS = {"feature.node.kubernetes.io/pci-10de.present": "true", "kubernetes.io/os": "linux"}


def shared_file(relative, sha256):
    """A file of the project's shared material ($K3S_GPU_SHARED, else <repo>/../shared), checked by sha256: missing or
    changed FAILS the test with the hint, never skips it."""
    shared = os.environ.get("K3S_GPU_SHARED") or os.path.join(os.path.dirname(REPO_ROOT), "shared")
    path = os.path.join(shared, relative)
    if not os.path.isfile(path):
        pytest.fail("%s not found: the shared material is missing: set K3S_GPU_SHARED to the directory holding %s "
                    "(default <repo>/../shared)" % (path, relative), pytrace=False)
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    if digest != sha256:
        pytest.fail("%s: sha256 %s, expected %s (see the README beside it)" % (path, digest, sha256), pytrace=False)
    return path


@pytest.fixture(scope="module")
def chart():
    return shared_file(*CHART_ARCHIVE)


@pytest.fixture(scope="module")
def helm_render():
    path = testbins.require("helm-render", "helm-render")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    assert version.returncode == 0 and "helm.sh/helm/v4 %s " % testbins.BUILDS["helm-render"].version in version.stdout, version
    return path


@pytest.fixture(scope="module")
def validator():
    if kubernetes_validate is None:
        pytest.fail("kubernetes-validate is missing: pip install -r tests/unit/requirements.txt", pytrace=False)
    return kubernetes_validate


def render(helm_render, chart, plan, tmp_path):
    """The chart's objects for the plan's HelmChart, as helm-controller's job would install them."""
    spec = plan["objects"][0]["spec"]
    values = tmp_path / "values.yaml"
    values.write_text(spec["valuesContent"], encoding="utf-8")
    proc = subprocess.run([helm_render, plan["objects"][0]["metadata"]["name"], chart, "-n", spec["targetNamespace"],
                           "-f", str(values), "--kube-version", RELEASE.split("+", maxsplit=1)[0]], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    objects = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in objects}


def plan_of(settings=None, nodes=(CDI_NODE, PLAIN_NODE), distribution="k3s"):
    reading = server_reading(distribution, RELEASE if distribution == "k3s" else "v1.33.10+rke2r1")
    return dp.plan_cluster(NodeFacts.from_reading(reading), settings or {}, list(nodes), SHIPPED)


def term_matches(term, labels):
    """A nodeSelectorTerm against a node's labels (operators In, NotIn, Exists, DoesNotExist)."""
    for expression in term.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
        if operator == "NotIn" and labels.get(key) in expression["values"]:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def schedulable(pod_spec, labels):
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(term_matches(term, labels) for term in terms)


def plugin_container(daemonset):
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "nvidia-device-plugin-ctr")


def env_of(container):
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def check_common(objects, plan, validator):
    """What every case must show: the RuntimeClass, placement on the plan's nodes only, strategies, schema."""
    daemonset = objects[("DaemonSet", "nvidia-device-plugin")]
    pod = daemonset["spec"]["template"]["spec"]
    assert daemonset["metadata"]["namespace"] == plan["objects"][0]["spec"]["targetNamespace"]
    assert pod["runtimeClassName"] == plan["runtime_class"] == "nvidia"
    assert pod["affinity"] == plan["values"]["affinity"]  # the chart's default terms are gone
    for host, labels in plan["node_labels"].items():
        assert schedulable(pod, dict(labels, **{"kubernetes.io/hostname": host})), host
    assert not schedulable(pod, NFD_ONLY_NODE_LABELS)
    env = env_of(plugin_container(daemonset))
    assert env["DEVICE_LIST_STRATEGY"] == plan["device_list_strategy"]
    assert env["MIG_STRATEGY"] == plan["values"]["migStrategy"]
    # migStrategy none keeps the plugin unprivileged even with a config map (no CAP_SYS_ADMIN, no MIG monitor)
    if plan["values"]["migStrategy"] == "none":
        assert plugin_container(daemonset)["securityContext"] == {"allowPrivilegeEscalation": False,
                                                                  "capabilities": {"drop": ["ALL"]}}
        assert "NVIDIA_MIG_MONITOR_DEVICES" not in env
    for obj in objects.values():
        assert validator.validate(obj, KUBERNETES, strict=True) == KUBERNETES, obj["kind"]
    return daemonset, env


def test_default(helm_render, chart, validator, tmp_path):
    plan = plan_of()
    objects = render(helm_render, chart, plan, tmp_path)
    assert sorted(objects) == [
        ("ClusterRole", "nvidia-device-plugin-role"), ("ClusterRoleBinding", "nvidia-device-plugin-role-binding"),
        ("DaemonSet", "nvidia-device-plugin"), ("DaemonSet", "nvidia-device-plugin-mps-control-daemon"),
        ("ServiceAccount", "nvidia-device-plugin-service-account")]
    daemonset, env = check_common(objects, plan, validator)
    assert env["DEVICE_LIST_STRATEGY"] == "envvar"
    assert "CONFIG_FILE" not in env  # no sharing: no config map, no config-manager
    assert plugin_container(daemonset)["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert plugin_container(daemonset)["image"] == release_rules.DEVICE_PLUGIN_VERSIONS["0.20.0"]["image"]
    assert not any(kind == "DaemonSet" and "feature-discovery" in name for kind, name in objects)


def config_map_data(objects):
    return objects[("ConfigMap", "nvidia-device-plugin-configs")]["data"]


@pytest.mark.parametrize("strategy, key", [("time-slicing", "timeSlicing"), ("mps", "mps")])
def test_sharing(helm_render, chart, validator, tmp_path, strategy, key):
    plan = plan_of({"sharing": {"strategy": strategy, "replicas": 4}})
    objects = render(helm_render, chart, plan, tmp_path)
    daemonset, env = check_common(objects, plan, validator)
    data = config_map_data(objects)
    assert sorted(data) == ["default"]
    # the config-manager reads the ConfigMap's keys: the text the engine wrote, unchanged but for the chart's `|-`
    assert data["default"] == plan["values"]["config"]["map"]["default"].rstrip("\n")
    config = yaml.safe_load(data["default"])
    assert config["sharing"][key]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert config["sharing"][key]["failRequestsGreaterThanOne"] is (strategy == "mps")
    assert env["CONFIG_FILE"] == "/config/config.yaml"
    sidecar = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "nvidia-device-plugin-sidecar")
    sidecar_env = env_of(sidecar)
    assert (sidecar_env["NODE_LABEL"], sidecar_env["DEFAULT_CONFIG"]) == ("nvidia.com/device-plugin.config", "default")
    mps = objects[("DaemonSet", "nvidia-device-plugin-mps-control-daemon")]["spec"]["template"]["spec"]
    assert mps["runtimeClassName"] == "nvidia"
    # the MPS control daemon runs where the plan's labels say MPS, and nowhere else
    for host, labels in plan["node_labels"].items():
        assert schedulable(mps, labels) is (strategy == "mps"), host


def test_named_per_node_configs(helm_render, chart, validator, tmp_path):
    settings = {"sharing": {"strategy": "time-slicing", "replicas": 2},
                "configs": {"mps-4": {"strategy": "mps", "replicas": 4}, "exclusive": None}}
    plan = plan_of(settings, [dict(CDI_NODE, config="mps-4"), dict(PLAIN_NODE, config="exclusive")])
    objects = render(helm_render, chart, plan, tmp_path)
    check_common(objects, plan, validator)
    data = config_map_data(objects)
    assert sorted(data) == ["default", "exclusive", "mps-4"]
    for name, text in plan["values"]["config"]["map"].items():
        assert data[name] == text.rstrip("\n")
    assert plan["node_labels"]["gpu1"]["nvidia.com/device-plugin.config"] == "mps-4"


def test_cdi_cri(helm_render, chart, validator, tmp_path):
    plan = plan_of(nodes=[CDI_NODE, dict(CDI_NODE, host="gpu3")])
    objects = render(helm_render, chart, plan, tmp_path)
    daemonset, env = check_common(objects, plan, validator)
    assert env["DEVICE_LIST_STRATEGY"] == "cdi-cri"
    # the plugin writes its own CDI spec there for cdi-cri
    assert {"name": "cdi-root", "mountPath": "/var/run/cdi"} in plugin_container(daemonset)["volumeMounts"]


def test_air_gap(helm_render, chart, validator, tmp_path):
    """The chart from the server's static/charts (the same archive) and images from a mirror, GFD on."""
    plan = plan_of({"chart_archive": os.path.basename(chart), "image_registry": "registry.local:5000/mirror", "gfd": True,
                    "device_discovery_strategy": "nvml"}, distribution="rke2")
    assert plan["objects"][0]["spec"]["chart"].endswith("/static/charts/nvidia-device-plugin-0.20.0.tgz")
    objects = render(helm_render, chart, plan, tmp_path)
    daemonset, env = check_common(objects, plan, validator)
    assert env["DEVICE_DISCOVERY_STRATEGY"] == "nvml"
    images = {c["image"] for doc in objects.values() if doc["kind"] in ("DaemonSet", "Deployment")
              for c in (doc["spec"]["template"]["spec"].get("initContainers") or []) + doc["spec"]["template"]["spec"]["containers"]}
    assert images and all(image.startswith("registry.local:5000/mirror/") for image in images), images
    assert "registry.local:5000/mirror/nvidia/k8s-device-plugin:v0.20.0" in images
    assert any(image.startswith("registry.local:5000/mirror/nfd/node-feature-discovery:") for image in images)
    gfd = next(doc for (kind, name), doc in objects.items() if kind == "DaemonSet" and "gpu-feature-discovery" in name)
    assert gfd["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert gfd["spec"]["template"]["spec"]["affinity"] == plan["values"]["affinity"]


def test_chart_defaults_are_what_the_engine_assumes(chart):
    """The facts of the known-versions row, read from the archive itself."""
    with tarfile.open(chart) as tar:
        values = yaml.safe_load(tar.extractfile("nvidia-device-plugin/values.yaml").read())
        chart_yaml = yaml.safe_load(tar.extractfile("nvidia-device-plugin/Chart.yaml").read())
    row = release_rules.DEVICE_PLUGIN_VERSIONS[chart_yaml["version"]]
    assert "%s:v%s" % (values["image"]["repository"], chart_yaml["appVersion"]) == row["image"]
    assert values["runtimeClassName"] is None and values["gfd"]["enabled"] is False
    assert values["config"]["fallbackStrategies"] == ["named", "single"]
    default_keys = {e["key"] for term in values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                    ["nodeSelectorTerms"] for e in term["matchExpressions"]}
    assert dp.GPU_PRESENT_LABEL in default_keys and "feature.node.kubernetes.io/pci-10de.present" in default_keys
    for key in ("migStrategy", "deviceListStrategy", "deviceDiscoveryStrategy"):
        assert key in values and values[key] is None


def test_a_chart_that_rejects_its_values_fails_with_its_own_message(helm_render, chart, tmp_path):
    """As `helm template`: the chart's validation template refuses the default namespace, exit 1."""
    proc = subprocess.run([helm_render, "nvdp", chart, "-n", "default"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "default" in proc.stderr and "namespace" in proc.stderr, proc.stderr
