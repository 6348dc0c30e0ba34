# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Operator mode: every coexistence rule on one node (from facts that real detection reads off a sandbox
tree), and the cluster's HelmChart checked against helm-controller's CRD schema per release line and
its values against the keys of each GPU Operator chart."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as op
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_plan as host_plan
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils.helmchart_checks import FIXTURES, documents, helmchart_schema, valid_helmchart
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

RELEASE = "v1.33.10+k3s1"


def facts_of(sandbox, layouts=("nothing",)):
    sandbox.k3s("k3s", layouts[0])
    for layout in layouts[1:]:
        sandbox.k3s("k3s", layout)
    return detect.gather(sandbox.root, "k3s", RELEASE)


# --- what detection reports per layout ----------------------------------------------------------

def test_detection_names_the_owner_of_each_runtime(sandbox):
    facts = facts_of(sandbox, ("operator",))
    assert [(r["name"], r["owner"]) for r in facts["runtimes"]] == [
        ("nvidia", "gpu-operator"), ("nvidia-cdi", "gpu-operator"), ("nvidia-legacy", "gpu-operator")]
    assert facts["gpu_operator"]["runtimes"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert facts["host_toolkit"] == {"present": False, "runtime_binaries": []}


def test_detection_finds_a_host_toolkit_masked_by_the_operator(sandbox):
    facts = facts_of(sandbox, ("operator", "package"))
    # k3s picks the operator's binaries first; the host's are still reported
    assert {r["owner"] for r in facts["runtimes"]} == {"gpu-operator"}
    assert facts["host_toolkit"] == {"present": True, "runtime_binaries": [
        "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
        "/usr/bin/nvidia-container-runtime.legacy"]}


def test_detection_host_only(sandbox):
    facts = facts_of(sandbox, ("package",))
    assert {r["owner"] for r in facts["runtimes"]} == {"host"}
    assert facts["gpu_operator"]["present"] is False and facts["gpu_operator"]["runtimes"] == []
    assert facts["host_toolkit"]["present"] is True


# --- host mode ------------------------------------------------------------------------------------

def test_host_mode_installs_the_toolkit_on_a_plain_node(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox)), "host")
    assert plan["install_toolkit"] is True and plan["remove_host_toolkit"] is False
    assert plan["generate_cdi"] is True and plan["pending"] == []


def test_host_mode_refuses_a_second_toolkit_next_to_the_operators(sandbox):
    with pytest.raises(K3sGpuError, match=r"gpu1 has the GPU Operator's toolkit in /usr/local/nvidia/toolkit "
                       r"\(nvidia-container-runtime, .*gpu_node_toolkit_install=false"):
        host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator",))), "host", toolkit_install=True, host="gpu1")


def test_host_mode_keeps_the_operators_toolkit_when_not_installing(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator",))), "host", toolkit_install=False)
    assert plan["install_toolkit"] is False
    assert plan["operator_handlers"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]


def test_host_mode_refuses_two_toolkits_even_without_installing(sandbox):
    with pytest.raises(K3sGpuError, match=r"two NVIDIA toolkits: the GPU Operator's in .* and the host's "
                       r"\(/usr/bin/nvidia-container-runtime, .*; keep one"):
        host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator", "package"))), "host", toolkit_install=False)


# --- operator mode ----------------------------------------------------------------------------------

def test_operator_mode_before_the_operator_arrives(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox)), "operator", default_runtime="nvidia", host="gpu1")
    assert plan["install_toolkit"] is False and plan["remove_host_toolkit"] is False
    assert plan["generate_cdi"] is False  # the operator's toolkit writes the CDI specs
    assert plan["default_runtime"] == ""
    assert plan["pending"] == ["gpu1: default runtime nvidia waits for the GPU Operator's toolkit (not on the node yet); "
                               "run the role again once /usr/local/nvidia/toolkit holds it"]


def test_operator_mode_with_the_operators_toolkit_in_place(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator",))), "operator", default_runtime="nvidia-cdi")
    assert plan["default_runtime"] == "nvidia-cdi" and plan["pending"] == []
    assert plan["owners"] == {"nvidia": "gpu-operator", "nvidia-cdi": "gpu-operator", "nvidia-legacy": "gpu-operator"}


def test_operator_mode_removes_the_host_toolkit_on_a_real_root(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("package",))), "operator", toolkit_install=True,
                               live=True, default_runtime="nvidia")
    assert plan["remove_host_toolkit"] is True and plan["install_toolkit"] is False
    # the host's nvidia goes away with its packages: the default waits for the operator's
    assert plan["default_runtime"] == "" and len(plan["pending"]) == 1


@pytest.mark.parametrize("toolkit_install, live", [(False, True), (True, False)])
def test_operator_mode_refuses_a_host_toolkit_it_may_not_remove(sandbox, toolkit_install, live):
    with pytest.raises(K3sGpuError, match=r"operator mode, where the GPU Operator installs the toolkit, but a "
                       r"host toolkit is there \(/usr/bin/nvidia-container-runtime, .*gpu_node_operator_toolkit=false"):
        host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("package",))), "operator", toolkit_install=toolkit_install, live=live)


def test_operator_mode_with_the_host_toolkit_kept(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("package",))), "operator", operator_toolkit=False, default_runtime="nvidia")
    assert plan["install_toolkit"] is True and plan["remove_host_toolkit"] is False
    assert plan["generate_cdi"] is True and plan["default_runtime"] == "nvidia" and plan["pending"] == []


def test_operator_mode_refuses_stale_operator_files_when_its_toolkit_is_off(sandbox):
    with pytest.raises(K3sGpuError, match=r"toolkit is off \(gpu_node_operator_toolkit=false\), yet "
                       r"/usr/local/nvidia/toolkit .*search that directory first"):
        host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator",))), "operator", operator_toolkit=False)


def test_operator_mode_refuses_two_driver_owners(sandbox):
    with pytest.raises(K3sGpuError, match=r"gpu_node_driver_install=true and the GPU Operator's driver is on"):
        host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox)), "operator", operator_driver=True, driver_install=True)


def test_operator_mode_keeps_the_role_driver_when_the_operators_is_off(sandbox):
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox)), "operator", operator_driver=False, driver_install=True)
    assert plan["install_driver"] is True


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "both"}, r"gpu_node_mode is 'both'; use host .* or operator"),
    ({"mode": "operator", "operator_toolkit": "yes"}, r"operator_toolkit must be true or false, got 'yes'"),
    ({"mode": "host", "live": 1}, r"live must be true or false, got 1"),
])
def test_bad_input(sandbox, kwargs, message):
    facts = facts_of(sandbox)
    with pytest.raises(K3sGpuError, match=message):
        host_plan.plan_node(NodeFacts.from_reading(facts), **kwargs)


# --- one cluster: the HelmChart ------------------------------------------------------------------------
#
# The HelmChart is validated against the CRD schema of the helm-controller each release line compiles
# in (tests/unit/fixtures/helmchart/, with the added `additionalProperties: false` so a field the
# release does not know fails here instead of being pruned silently). The versions are written out by
# hand from that README's table, not computed from _distro, so a wrong feature-table row fails.


# (distribution, release, helm-controller version): the newest tag of each line that was read
RELEASE_LINES = [
    ("k3s", "v1.28.15+k3s1", "v0.15.15"), ("rke2", "v1.28.15+rke2r1", "v0.15.15"),
    ("k3s", "v1.29.15+k3s1", "v0.15.16"), ("rke2", "v1.29.15+rke2r1", "v0.15.16"),
    ("rke2", "v1.30.14+rke2r4", "v0.16.13"),
    ("k3s", "v1.31.14+k3s1", "v0.16.16"), ("rke2", "v1.31.14+rke2r2", "v0.16.16"),
    ("k3s", "v1.32.13+k3s1", "v0.16.17"), ("rke2", "v1.32.13+rke2r2", "v0.16.17"),
    ("rke2", "v1.33.13+rke2r2", "v0.16.26"), ("k3s", "v1.33.11+k3s1", "v0.17.1"),
    ("k3s", "v1.34.10+k3s1", "v0.16.26"), ("rke2", "v1.34.10+rke2r1", "v0.16.26"),
    ("k3s", "v1.35.7+k3s1", "v0.17.7"), ("rke2", "v1.35.7+rke2r1", "v0.17.7"),
    ("k3s", "v1.36.3+k3s1", "v0.17.7"), ("rke2", "v1.36.3+rke2r1", "v0.17.7"),
    ("k3s", "v1.36.0+k3s1", "v0.17.1"),
]
CHART_VERSIONS = ["v24.9.2", "v25.3.4", "v25.10.1", "v26.3.3", "v26.7.0"]


def cluster_of(distribution="k3s", release="v1.33.10+k3s1", data_dir=None):
    """runtime_info's reading of the cluster's server."""
    return server_reading(distribution, release, data_dir)


OPERATOR_NODES = [{"host": "gpu1", "mode": "operator"}, {"host": "gpu2", "mode": "operator", "driver_install": False}]


def chart_keys(version):
    return set(json.loads((FIXTURES / "gpu_operator" / ("values-keys-%s.json" % version)).read_text(encoding="utf-8"))["keys"])


@pytest.mark.parametrize("distribution, release, controller", RELEASE_LINES, ids=str)
def test_helmchart_is_valid_for_the_release_line(distribution, release, controller):
    settings = {"values": {"devicePlugin": {"env": [{"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]}}}
    if release.startswith(("v1.28.", "v1.29.", "v1.30.")):
        settings["cdi"] = False  # containerd 1.7: CDI mode needs containerd 2
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of(distribution, release)), settings, OPERATOR_NODES)
    assert release_rules.helm_controller_version(distro.profile(distribution, release)) == controller
    text = op.render_manifest(plan)
    chart = valid_helmchart(text, controller, "gpu-operator")
    spec = chart["spec"]
    assert (spec["chart"], spec["repo"], spec["version"], spec["targetNamespace"], spec["createNamespace"]) == (
        "gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "v26.3.3", "gpu-operator", True)
    assert yaml.safe_load(spec["valuesContent"]) == plan["values"]
    # the same plan gives the same bytes
    assert op.render_manifest(op.plan_cluster(NodeFacts.from_reading(cluster_of(distribution, release)), settings, OPERATOR_NODES)) == text


@pytest.mark.parametrize("controller", ["v0.15.15", "v0.16.13"])
def test_schema_fixtures_catch_a_field_the_release_does_not_know(controller):
    """Negative control: the fixtures reject what the real API server would prune silently."""
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of("rke2", "v1.36.3+rke2r1")), {"helmchart_spec": {"takeOwnership": True}}, OPERATOR_NODES)
    with pytest.raises(jsonschema.ValidationError, match="takeOwnership"):
        jsonschema.validate(documents(op.render_manifest(plan))[0], helmchart_schema(controller))


@pytest.mark.parametrize("chart_version", CHART_VERSIONS)
def test_values_the_collection_sets_exist_in_the_chart(chart_version):
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.33.10+k3s1")), {"chart_version": chart_version}, OPERATOR_NODES)
    keys = chart_keys(chart_version)
    ours = [path for path, _value in op._dotted(plan["values"])]
    assert sorted(ours) == ["cdi", "cdi.enabled", "driver", "driver.enabled", "toolkit", "toolkit.enabled", "toolkit.env"]
    assert set(ours) <= keys, set(ours) - keys
    # and what the guards read
    for path in ("toolkit.installDir", "operator.runtimeClass"):
        assert path in keys


def test_values_fit_k3s():
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of()), {}, OPERATOR_NODES)
    assert plan["values"] == {
        "cdi": {"enabled": True}, "driver": {"enabled": True},
        "toolkit": {"enabled": True, "env": [{"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"}]}}
    assert plan["operator_mode"] == "cdi" and plan["wanted"] is True and plan["operator_nodes"] == ["gpu1", "gpu2"]
    assert plan["runtimeclasses"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert plan["runtimeclasses_created"] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    text = op.render_manifest(plan)
    assert "agent/etc/containerd" not in text and "config.toml" not in text


def test_chart_defaults_per_line():
    """cdi.enabled follows the chart line's default when not set: off before v25.10, on from it."""
    for version, cdi in (("v24.9.2", False), ("v25.3.4", False), ("v25.10.1", True), ("v26.3.3", True), ("v26.7.0", True)):
        plan = op.plan_cluster(NodeFacts.from_reading(cluster_of()), {"chart_version": version}, OPERATOR_NODES)
        assert plan["values"]["cdi"] == {"enabled": cdi}
        assert plan["operator_mode"] == ("cdi" if cdi else "legacy")
    legacy = op.plan_cluster(NodeFacts.from_reading(cluster_of()), {"cdi": False}, OPERATOR_NODES)
    assert (legacy["runtimeclasses_created"], legacy["runtimeclasses_deleted"]) == (["nvidia"], ["nvidia-cdi", "nvidia-legacy"])


def test_host_driver_turns_the_operators_off():
    nodes = [{"host": "gpu1", "mode": "operator", "driver_install": True}, {"host": "gpu2", "mode": "operator", "driver_install": True}]
    assert op.plan_cluster(NodeFacts.from_reading(cluster_of()), {}, nodes)["values"]["driver"] == {"enabled": False}
    with pytest.raises(K3sGpuError, match=r"driver.enabled is one setting for the whole cluster, but the role "
                       r"installs the host driver on gpu1 and not on gpu2"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of()), {}, [nodes[0], {"host": "gpu2", "mode": "operator"}])
    with pytest.raises(K3sGpuError, match=r"gpu_node_operator_driver=true, but the role installs the host driver on gpu1, gpu2"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of()), {"driver": True}, nodes)
    assert op.plan_cluster(NodeFacts.from_reading(cluster_of()), {"driver": False}, OPERATOR_NODES)["values"]["driver"] == {"enabled": False}


def test_host_toolkit_kept_turns_the_operators_off():
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of()), {"toolkit": False}, OPERATOR_NODES)
    assert plan["values"]["toolkit"] == {"enabled": False}


def test_air_gapped_chart_from_the_servers_static_charts():
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of("rke2", "v1.33.10+rke2r1")), {"chart_archive": "gpu-operator-v26.3.3.tgz"}, OPERATOR_NODES)
    spec = plan["objects"][0]["spec"]
    assert spec["chart"] == "https://%{KUBERNETES_API}%/static/charts/gpu-operator-v26.3.3.tgz"
    assert "repo" not in spec and "version" not in spec
    assert plan["chart_archive_path"] == "/var/lib/rancher/rke2/server/static/charts/gpu-operator-v26.3.3.tgz"
    jsonschema.validate(documents(op.render_manifest(plan))[0], helmchart_schema("v0.16.26"))


def test_user_values_merge():
    values = {"toolkit": {"env": [{"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "value": "true"},
                                  {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"}],
                          "version": "v1.19.1"},
              "cdi": {"enabled": True}, "validator": {"repository": "registry.local/nvidia"}}
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of()), {"values": values}, OPERATOR_NODES)
    assert plan["values"]["toolkit"] == {"enabled": True, "version": "v1.19.1", "env": [
        {"name": "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", "value": "true"},
        {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"}]}
    assert plan["values"]["validator"] == {"repository": "registry.local/nvidia"}
    assert values["toolkit"]["version"] == "v1.19.1" and "enabled" not in values["toolkit"]  # input not mutated


@pytest.mark.parametrize("settings, message", [
    ({"values": {"cdi": {"enabled": True}}}, r"sets cdi.enabled=True; set gpu_node_operator_cdi instead"),
    ({"values": {"driver": {"enabled": False}}}, r"sets driver.enabled=False; set gpu_node_operator_driver"),
    ({"values": {"toolkit": {"installDir": "/opt/nvidia"}}}, r"toolkit.installDir='/opt/nvidia': k3s and rke2 look for "
     r"the operator's runtimes only in /usr/local/nvidia/toolkit"),
    ({"values": {"operator": {"runtimeClass": "gpu"}}}, r"operator.runtimeClass='gpu': .*configure the handler nvidia only"),
    ({"values": {"toolkit": {"env": [{"name": "CONTAINERD_CONFIG",
                                      "value": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"}]}}},
     r"CONTAINERD_CONFIG=/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl points the operator at the containerd "
     r"config that k3s/rke2 regenerates"),
    ({"values": {"toolkit": {"env": [{"name": "RUNTIME_DROP_IN_CONFIG",
                                      "value": "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/99-nvidia.toml"}]}}},
     r"RUNTIME_DROP_IN_CONFIG=.*config-v3.toml.d/99-nvidia.toml points the operator"),
    ({"values": {"toolkit": {"env": [{"name": "CONTAINERD_SET_AS_DEFAULT", "value": "true"}]}}},
     r"CONTAINERD_SET_AS_DEFAULT=true: .*; set gpu_node_default_runtime instead"),
    ({"values": {"toolkit": {"env": [{"name": "CONTAINERD_SOCKET", "value": "/run/containerd/containerd.sock"}]}}},
     r"CONTAINERD_SOCKET=/run/containerd/containerd.sock: k3s and rke2 run containerd at /run/k3s/containerd/containerd.sock"),
    ({"values": {"toolkit": {"env": "CONTAINERD_SOCKET=x"}}}, r"toolkit.env must be a list of \{name, value\} dicts"),
    ({"chart_version": "v23.9.0"}, r"chart_version v23.9.0: this collection knows the GPU Operator lines 24.9, 25.3, 25.10, 26.3, 26.7"),
    ({"chart_version": "latest"}, r"chart_version 'latest' is not a chart version like v26.3.3"),
    ({"chart_repo": "ftp://mirror"}, r"gpu_node_operator_chart_repo 'ftp://mirror' is not an https://"),
    ({"chart_archive": "../gpu-operator.tgz"}, r"gpu_node_operator_chart_archive '../gpu-operator.tgz' must be a file name ending in .tgz"),
    ({"namespace": "GPU"}, r"gpu_node_operator_namespace 'GPU' is not a namespace name"),
    ({"cdi": "yes"}, r"gpu_node_operator_cdi must be true, false or null"),
    ({"driver": "maybe"}, r"gpu_node_operator_driver must be auto, true or false, got 'maybe'"),
    ({"values": []}, r"gpu_node_operator_values must be a dict, got list"),
    ({"helmchart_spec": {"repo": "https://x"}}, r"gpu_node_operator_helmchart_spec sets repo, which the collection writes"),
    ({"helmchart_spec": {"takeOwnership": True}}, r"helmchart_spec.takeOwnership: the HelmChart of k3s v1.28.15\+k3s1 "
     r"\(helm-controller v0.15.15\) has no such field; the API server would drop it silently"),
    ({"colour": "green"}, r"unknown setting\(s\) colour"),
])
def test_bad_settings(settings, message):
    settings = dict(settings)
    settings.setdefault("cdi", False)
    with pytest.raises(K3sGpuError, match=message):
        op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.28.15+k3s1")), settings, OPERATOR_NODES)


def test_cdi_mode_needs_containerd_2():
    with pytest.raises(K3sGpuError, match=r"CDI mode needs containerd 2.0 or newer, and k3s v1.31.5\+k3s1 ships "
                       r"containerd 1.7; set gpu_node_operator_cdi=false"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.31.5+k3s1")), {}, OPERATOR_NODES)
    assert op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.31.6+k3s1")), {}, OPERATOR_NODES)["operator_mode"] == "cdi"


def test_nri_mode():
    nri = {"values": {"cdi": {"nriPluginEnabled": True}}}
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.33.5+k3s1")), nri, OPERATOR_NODES)
    assert plan["operator_mode"] == "nri"
    assert (plan["runtimeclasses_created"], plan["runtimeclasses_deleted"]) == ([], ["nvidia", "nvidia-cdi", "nvidia-legacy"])
    with pytest.raises(K3sGpuError, match=r"NRI plugin mode needs containerd 2.1 or newer, and k3s v1.33.4\+k3s1 "
                       r"ships containerd 2.0"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.33.4+k3s1")), nri, OPERATOR_NODES)
    with pytest.raises(K3sGpuError, match=r"GPU Operator v25.10.1 has no NRI plugin mode"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.33.5+k3s1")), dict(nri, chart_version="v25.10.1"), OPERATOR_NODES)
    with pytest.raises(K3sGpuError, match=r"cdi.nriPluginEnabled needs CDI"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.33.5+k3s1")), dict(nri, cdi=False), OPERATOR_NODES)


def test_nri_mode_without_the_operators_toolkit_is_refused_from_26_7():
    """v26.7.0 refuses a ClusterPolicy with the NRI plugin and the toolkit off; v26.3.3 took it."""
    server = NodeFacts.from_reading(cluster_of("k3s", "v1.33.5+k3s1"))
    nri_no_toolkit = {"values": {"cdi": {"nriPluginEnabled": True}}, "toolkit": False}
    assert op.plan_cluster(server, dict(nri_no_toolkit, chart_version="v26.3.3"), OPERATOR_NODES)["operator_mode"] == "nri"
    with pytest.raises(K3sGpuError, match=r"GPU Operator v26.7.0 refuses its NRI plugin mode without its container "
                       r"toolkit; set gpu_node_operator_toolkit=true, or drop cdi.nriPluginEnabled"):
        op.plan_cluster(server, dict(nri_no_toolkit, chart_version="v26.7.0"), OPERATOR_NODES)
    assert op.plan_cluster(server, dict(nri_no_toolkit, chart_version="v26.7.0", toolkit=True),
                           OPERATOR_NODES)["operator_mode"] == "nri"


def test_one_mode_per_cluster():
    with pytest.raises(K3sGpuError, match=r"one cluster, two modes: gpu1 in operator mode, gpu3 in host mode"):
        op.plan_cluster(NodeFacts.from_reading(cluster_of()), {}, [{"host": "gpu1", "mode": "operator"}, {"host": "gpu3", "mode": "host"}])


def test_host_mode_cluster_is_never_refused_for_operator_settings():
    """The chart's CDI default needs containerd 2, but a cluster without operator-mode nodes wants no operator."""
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of("k3s", "v1.28.15+k3s1")), {}, [{"host": "gpu3", "mode": "host"}])
    assert plan["wanted"] is False and plan["objects"] == []


def test_no_operator_node_wants_no_manifest():
    plan = op.plan_cluster(NodeFacts.from_reading(cluster_of()), {}, [{"host": "gpu3", "mode": "host"}])
    assert plan["wanted"] is False and plan["objects"] == []
    with pytest.raises(K3sGpuError, match="remove the manifest instead"):
        op.render_manifest(plan)


@pytest.mark.parametrize("cluster, nodes, message", [
    (cluster_of("containerd", "2.1.4"), OPERATOR_NODES, r"cluster must be the runtime_info result of a k3s or rke2 server"),
    (cluster_of(), "gpu1", r"nodes must be a list"),
    (cluster_of(), [{"host": "gpu1", "mode": "operator", "colour": 1}], r"nodes\[0\] has unknown key\(s\) colour"),
    (cluster_of(), [{"host": "gpu1", "mode": "both"}], r"nodes\[0\] \(gpu1\): gpu_node_mode is 'both'"),
    (cluster_of(), [{"host": "", "mode": "operator"}], r"nodes\[0\].host must be the inventory hostname"),
    (cluster_of(), [{"host": "gpu1", "mode": "operator", "driver_install": "no"}], r"driver_install must be true or false"),
])
def test_bad_cluster_or_nodes(cluster, nodes, message):
    with pytest.raises(K3sGpuError, match=message):
        op.plan_cluster(NodeFacts.from_reading(cluster), {}, nodes)


def test_feature_table_matches_every_helmchart_fixture():
    """The per-branch field history in _distro gives exactly each fixture's spec properties."""
    for path in sorted((FIXTURES / "helmchart").glob("helm-controller-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        version = data["helm_controller_version"]
        fields = set(data["openAPIV3Schema"]["properties"]["spec"]["properties"])
        release = next(release for distribution, release, controller in RELEASE_LINES if controller == version
                       and distribution == "rke2") if version != "v0.17.1" else "v1.36.0+k3s1"
        distribution = "rke2" if "rke2" in release else "k3s"
        assert set(release_rules.helmchart_spec_fields(distro.profile(distribution, release))) == fields, version


def test_host_mode_takes_back_a_node_the_operator_left(sandbox):
    """An uninstalled operator leaves /usr/local/nvidia/toolkit behind; the role removes it when told to."""
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator",))), "host", toolkit_install=True, remove_operator_leftovers=True)
    assert plan["remove_operator_leftovers"] is True and plan["install_toolkit"] is True
    assert plan["operator_handlers"] == []
    # ignored in operator mode: the directory is the operator's own there
    plan = host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox, ("operator",))), "operator", remove_operator_leftovers=True)
    assert plan["remove_operator_leftovers"] is False


# --- the role's first decision in one call ----------------------------------------------------------

HOST_SETTINGS = {"force": False, "root": "/", "mode": "host", "operator_toolkit": True, "operator_driver": "auto",
                 "toolkit_install": False, "driver_install": False, "driver_reboot": "if_needed", "default_runtime": "",
                 "remove_operator_leftovers": False, "local_connection": False}


def gpu_facts(sandbox, layout="package", release=RELEASE):
    sandbox.k3s("k3s", layout)
    sandbox.write("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n")
    sandbox.write("/dev/nvidia0")
    return detect.gather(sandbox.root, "k3s", release)


def test_plan_host_leaves_a_host_without_a_gpu_alone(sandbox):
    decided = host_plan.first_decision(NodeFacts.from_reading(facts_of(sandbox)), dict(HOST_SETTINGS, root="/tmp/tree"), host="cpu1")
    assert (decided["selected"], decided["live"], decided["mode"]) == (False, False, {})
    assert decided["result"]["status"] == "skipped" and decided["result"]["reason"].startswith("no NVIDIA GPU")
    assert decided["messages"][0].startswith("cpu1: no NVIDIA GPU on the PCI bus")
    forced = host_plan.first_decision(NodeFacts.from_reading(facts_of(sandbox)), dict(HOST_SETTINGS, force=True))
    assert forced["selected"] is True and forced["result"]["status"] == "configured"


def test_plan_host_on_a_gpu_node(sandbox):
    decided = host_plan.first_decision(NodeFacts.from_reading(gpu_facts(sandbox)), dict(
        HOST_SETTINGS, mode="operator", toolkit_install=True, default_runtime="nvidia"), host="gpu1")
    assert decided["selected"] and decided["live"]
    assert decided["mode"]["remove_host_toolkit"] is True
    assert decided["result"]["mode"] == "operator" and decided["result"]["pending"] == decided["messages"]
    assert decided["result"]["runtimes_detected"] == ["nvidia", "nvidia-cdi"]


@pytest.mark.parametrize("settings, release, message", [
    ({"driver_install": True, "local_connection": True}, RELEASE,
     r"gpu1: gpu_node_driver_install is true with gpu_node_driver_reboot=if_needed, and this host is reached with the local "
     r"connection: .*does not reboot the machine that runs Ansible"),
    ({}, "v1.28.3+k3s1", r"gpu1: k3s v1.28.3\+k3s1: its template fails to render"),
    ({"mode": "host", "toolkit_install": True}, RELEASE, None),
])
def test_plan_host_refusals(sandbox, settings, release, message):
    facts = gpu_facts(sandbox, "operator" if message is None else "package", release)
    with pytest.raises(K3sGpuError, match=message or r"gpu1 has the GPU Operator's toolkit"):
        host_plan.first_decision(NodeFacts.from_reading(facts), dict(HOST_SETTINGS, **settings), host="gpu1")
    if settings.get("local_connection"):
        # the role never reboots: nothing to refuse
        never = dict(HOST_SETTINGS, **settings)
        never["driver_reboot"] = "never"
        assert host_plan.first_decision(NodeFacts.from_reading(facts), never, host="gpu1")["selected"] is True


def test_a_refusal_passes_its_fix_apart(sandbox):
    """The doctor and a task's `error` read the fix apart: the cause has no fix sentence, the fix ends the message."""
    with pytest.raises(K3sGpuError) as caught:
        host_plan.plan_node(NodeFacts.from_reading(facts_of(sandbox)), "operator", operator_driver=True, driver_install=True,
                            host="gpu1")
    error = caught.value
    assert error.cause.endswith("two owners for the kernel module") and "Set " not in error.cause
    assert error.fix.startswith("set gpu_node_operator_driver=false (the operator uses the host driver)")
    assert error.fix.endswith("nothing was changed")
    assert str(error) == "%s; %s" % (error.cause, error.fix)
    facts = gpu_facts(sandbox)
    with pytest.raises(K3sGpuError) as caught:
        host_plan.first_decision(NodeFacts.from_reading(facts), dict(HOST_SETTINGS, driver_install=True, local_connection=True),
                                 host="gpu1")
    error = caught.value
    assert error.cause.endswith("the role does not reboot the machine that runs Ansible")
    assert "Set " not in error.cause and "Nothing was changed" not in error.cause
    assert error.fix.startswith("set gpu_node_driver_reboot=never (you reboot when the role says so)")
    assert error.fix.endswith("nothing was changed")
