# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""RuntimeClass plan: one case per release line, operator ownership, every bad input, rendering,
and every rendered manifest checked against the real Kubernetes schema of the release's minor.

The expectations are written out by hand from the reference facts (k3s runtimes.yaml since #8936 in
v1.28.5 and all of 1.29+; rke2 chart rke2-runtimeclasses from v1.29.13, v1.30.9, v1.31.5, v1.32.1
and all of 1.33+), not computed from _distro's feature table, so a wrong row there makes these fail.

Schema: kubernetes-validate (tests/unit/requirements.txt) bundles the JSON schemas generated from
the Kubernetes OpenAPI of every minor from 1.25; the tests block the network, so they prove the
package works offline.
"""

from __future__ import annotations

import inspect
import socket

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as rc
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

try:
    import kubernetes_validate
    from kubernetes_validate import utils as kv_utils
except ImportError:  # the tests that need it fail with the install hint; the others still run
    kubernetes_validate = None
    kv_utils = None

KV_HINT = ("kubernetes-validate is missing: pip install -r tests/unit/requirements.txt "
           "(scripts/test.sh installs it into .venv)")

K3S_SHIPS = ["crun", "lunatic", "nvidia", "nvidia-experimental", "slight", "spin", "wasmedge", "wasmer",
             "wasmtime", "wws"]
RKE2_SHIPS = ["crun", "nvidia", "nvidia-experimental"]
ALL_NVIDIA = ["nvidia", "nvidia-cdi", "nvidia-experimental", "nvidia-legacy"]
NOT_SHIPPED = ["nvidia-cdi", "nvidia-legacy"]
K3S_HOW = "runtimes.yaml manifest"
RKE2_HOW = "rke2-runtimeclasses chart"

# distribution, release, what the release ships (None: nothing)
RELEASES = [
    ("k3s", "v1.28.4+k3s2", None),
    ("k3s", "v1.28.5+k3s1", K3S_SHIPS),
    ("k3s", "v1.28.15+k3s1", K3S_SHIPS),
    ("k3s", "v1.29.0+k3s1", K3S_SHIPS),
    ("k3s", "v1.30.6+k3s1", K3S_SHIPS),
    ("k3s", "v1.31.6+k3s1", K3S_SHIPS),
    ("k3s", "v1.32.2+k3s1", K3S_SHIPS),
    ("k3s", "v1.33.10+k3s1", K3S_SHIPS),
    ("k3s", "v1.34.6+k3s1", K3S_SHIPS),
    ("k3s", "v1.35.3+k3s1", K3S_SHIPS),
    ("k3s", "v1.36.0+k3s1", K3S_SHIPS),
    ("rke2", "v1.28.15+rke2r1", None),
    ("rke2", "v1.29.12+rke2r1", None),
    ("rke2", "v1.29.13+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.30.8+rke2r1", None),
    ("rke2", "v1.30.9+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.31.4+rke2r1", None),
    ("rke2", "v1.31.5+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.32.0+rke2r1", None),
    ("rke2", "v1.32.1+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.33.0+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.33.10+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.34.1+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.35.0+rke2r1", RKE2_SHIPS),
    ("rke2", "v1.36.2+rke2r1", RKE2_SHIPS),
]


def release_id(case):
    return "%s-%s-%s" % (case[0], case[1], "ships-nvidia" if case[2] else "ships-none")


FLEET = [
    {"host": "gpu1", "handlers": ["runc", "nvidia", "nvidia-cdi"]},
    {"host": "gpu2", "handlers": ["nvidia-legacy", "nvidia", "nvidia-experimental", "nvidia-cdi", "crun"]},
    {"host": "cpu1", "handlers": ["runc"]},
]
SELECTOR = {"nvidia.com/gpu.present": "true", "node-role.example.com/gpu": ""}
OVERHEAD = {"memory": "64Mi", "cpu": "250m"}


def cluster(distribution="k3s", release="v1.33.10+k3s1", **extra):
    """A cluster described by a dict, as the runtimeclass_plan filter takes it (plan_runtimeclasses_described)."""
    result = {"distribution": distribution, "release": release}
    result.update(extra)
    return result


def names(manifests):
    return [manifest["metadata"]["name"] for manifest in manifests]


# --- release lines -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", RELEASES, ids=release_id)
def test_release_line(case):
    distribution, release, ships = case
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading(distribution, release)), FLEET)
    assert sorted(plan) == ["handlers", "manifests", "owners", "shipped", "skipped"]
    assert plan["shipped"] == (ships or [])
    expected = NOT_SHIPPED if ships else ALL_NVIDIA
    assert plan["owners"] == dict((name, "k3s_gpu.nvidia" if name in expected else distribution) for name in ALL_NVIDIA)
    assert names(plan["manifests"]) == expected
    assert [manifest["handler"] for manifest in plan["manifests"]] == expected
    assert "nvidia-cdi" in expected  # never shipped by any release
    if ships:
        how = K3S_HOW if distribution == "k3s" else RKE2_HOW
        assert [item["name"] for item in plan["skipped"]] == ["nvidia", "nvidia-experimental"]
        for item in plan["skipped"]:
            assert item["reason"] == "%s %s ships the RuntimeClass %s in its %s%s" % (
                distribution, release, item["name"], how,
                " (applied by its deploy controller)" if distribution == "k3s" else "")
    else:
        assert plan["skipped"] == []
    assert plan["handlers"] == {
        "crun": ["gpu2"], "nvidia": ["gpu1", "gpu2"], "nvidia-cdi": ["gpu1", "gpu2"],
        "nvidia-experimental": ["gpu2"], "nvidia-legacy": ["gpu2"], "runc": ["cpu1", "gpu1"]}


def test_manifest_shape():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), [{"host": "gpu1", "handlers": ["nvidia-cdi"]}],
                                  node_selector=SELECTOR, overhead=OVERHEAD)
    assert plan["manifests"] == [{
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia-cdi", "labels": {"app.kubernetes.io/managed-by": "k3s_gpu.nvidia"}},
        "handler": "nvidia-cdi",
        "overhead": {"podFixed": {"cpu": "250m", "memory": "64Mi"}},
        "scheduling": {"nodeSelector": {"node-role.example.com/gpu": "", "nvidia.com/gpu.present": "true"}},
    }]
    assert (k8s_labels.MANAGED_BY_LABEL, k8s_labels.MANAGED_BY) == ("app.kubernetes.io/managed-by", "k3s_gpu.nvidia")


def test_gpu_operator_node_implies_every_class_the_operator_manages():
    """A node with the operator layout in an unknown mode: the operator creates or deletes nvidia, nvidia-cdi and
    nvidia-legacy (by its CDI mode), so none of them is ours; an explicit list overrides."""
    nodes = [{"host": "gpu1", "handlers": ["nvidia", "nvidia-cdi", "nvidia-experimental"], "gpu_operator": True}]
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading("rke2", "v1.29.12+rke2r1")), nodes)
    assert names(plan["manifests"]) == ["nvidia-experimental"]
    assert [s["name"] for s in plan["skipped"]] == ["nvidia", "nvidia-cdi"]
    assert "GPU Operator manages it (it creates or deletes" in plan["skipped"][1]["reason"]
    assert plan["owners"] == {"nvidia": "gpu-operator", "nvidia-cdi": "gpu-operator", "nvidia-experimental": "k3s_gpu.nvidia"}
    nodes[0]["operator_runtimeclasses"] = []
    assert names(rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading("rke2", "v1.29.12+rke2r1")), nodes)["manifests"]) == [
        "nvidia", "nvidia-cdi", "nvidia-experimental"]
    with pytest.raises(K3sGpuError, match=r"nodes\[0\] \(gpu1\).gpu_operator must be true or false"):
        rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), [{"host": "gpu1", "handlers": [], "gpu_operator": "yes"}])


def test_select_by_handler_label():
    """Each class selects the nodes the gpu_node role labelled with its own handler, plus the common selector."""
    nodes = [{"host": "gpu1", "handlers": ["nvidia", "nvidia-cdi", "nvidia-legacy"]}]
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading(release="v1.28.15+k3s1")), nodes, node_selector={"nvidia.com/gpu.present": "true"},
                                  select_by_handler_label=True)
    assert {m["metadata"]["name"]: m["scheduling"]["nodeSelector"] for m in plan["manifests"]} == {
        "nvidia-cdi": {"k3s-gpu.nvidia/handler.nvidia-cdi": "true", "nvidia.com/gpu.present": "true"},
        "nvidia-legacy": {"k3s-gpu.nvidia/handler.nvidia-legacy": "true", "nvidia.com/gpu.present": "true"},
    }
    assert rc.handler_label("nvidia-cdi") == "k3s-gpu.nvidia/handler.nvidia-cdi"


def test_select_by_handler_label_must_be_a_bool():
    with pytest.raises(K3sGpuError, match="select_by_handler_label is 'yes'; use true or false"):
        rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), FLEET, select_by_handler_label="yes")


@pytest.mark.parametrize("node_selector,overhead", [(None, None), ({}, {})], ids=["none", "empty"])
def test_no_selector_no_overhead(node_selector, overhead):
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), FLEET, node_selector=node_selector, overhead=overhead)
    for manifest in plan["manifests"]:
        assert "scheduling" not in manifest and "overhead" not in manifest


def test_integer_quantity_becomes_a_string():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), FLEET, overhead={"cpu": 1, "hugepages-2Mi": "0", "memory": "1e3"})
    assert plan["manifests"][0]["overhead"] == {"podFixed": {"cpu": "1", "hugepages-2Mi": "0", "memory": "1e3"}}


def test_only_shipped_handlers_need_nothing():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading("rke2", "v1.33.10+rke2r1")), [{"host": "a", "handlers": ["nvidia"]}])
    assert plan["manifests"] == []
    reason = "rke2 v1.33.10+rke2r1 ships the RuntimeClass nvidia in its rke2-runtimeclasses chart"
    assert plan["skipped"] == [{"name": "nvidia", "reason": reason}]


@pytest.mark.parametrize("nodes", [[], [{"host": "a", "handlers": []}], [{"host": "a", "handlers": ["runc", "crun"]}]],
                         ids=["no-nodes", "no-handlers", "no-nvidia-handler"])
def test_empty_fleet(nodes):
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), nodes)
    assert plan["manifests"] == [] and plan["skipped"] == []
    assert plan["shipped"] == K3S_SHIPS
    assert set(plan["handlers"]) <= {"runc", "crun"}


def test_runtimeclasses_disabled_on_the_server():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading(runtimeclasses_disabled=True)), FLEET)
    assert plan["shipped"] == [] and plan["skipped"] == []
    assert names(plan["manifests"]) == ALL_NVIDIA


def test_other_cluster_keys_are_ignored():
    info = {"distribution": "k3s", "release": "v1.33.10+k3s1", "paths": {}, "profile": {}, "changed": False}
    assert rc.plan_runtimeclasses_described(info, FLEET) == rc.plan_runtimeclasses_described(cluster(), FLEET)
    # the filter's cluster and the server's reading make one plan
    assert rc.plan_runtimeclasses_described(cluster(), FLEET) == rc.plan_runtimeclasses(
        NodeFacts.from_reading(server_reading()), FLEET)


# --- the GPU Operator ----------------------------------------------------------------------------

def test_operator_owned_before_the_rke2_chart():
    nodes = [{"host": "gpu1", "handlers": ["nvidia", "nvidia-cdi"], "operator_runtimeclasses": ["nvidia"]},
             {"host": "gpu2", "handlers": ["nvidia"]}]
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading("rke2", "v1.31.4+rke2r1")), nodes)
    assert plan["shipped"] == []
    assert names(plan["manifests"]) == ["nvidia-cdi"]
    reason = "the NVIDIA GPU Operator manages it (it creates or deletes the RuntimeClass nvidia; for gpu1)"
    assert plan["skipped"] == [{"name": "nvidia", "reason": reason}]
    assert plan["owners"] == {"nvidia": "gpu-operator", "nvidia-cdi": "k3s_gpu.nvidia"}


def test_operator_owned_and_shipped():
    nodes = [{"host": "gpu2", "handlers": ["nvidia"], "operator_runtimeclasses": ["nvidia"]},
             {"host": "gpu1", "handlers": ["nvidia"], "operator_runtimeclasses": ["nvidia", "nvidia-cdi"]}]
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), nodes)
    assert plan["manifests"] == []
    assert plan["skipped"] == [{"name": "nvidia", "reason": (
        "k3s v1.33.10+k3s1 ships the RuntimeClass nvidia in its runtimes.yaml manifest (applied by its deploy "
        "controller); the NVIDIA GPU Operator manages it (it creates or deletes the RuntimeClass nvidia; for gpu1, gpu2)")}]
    assert plan["owners"] == {"nvidia": "k3s"}


def test_operator_class_without_the_handler_is_not_reported():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), [{"host": "a", "handlers": ["nvidia-cdi"], "operator_runtimeclasses": ["nvidia"]}])
    assert names(plan["manifests"]) == ["nvidia-cdi"]
    assert plan["skipped"] == []


# --- bad input -----------------------------------------------------------------------------------

GOOD_NODES = [{"host": "a", "handlers": ["nvidia-cdi"]}]

# one row per refused input, rows alike by nature (docs/architecture-duplicates.md)
BAD_INPUT = [
    ("cluster-not-dict", "k3s", GOOD_NODES, {}, r"^cluster must be a dict with distribution \(k3s or rke2\) and release"),
    ("distribution-containerd", cluster("containerd", "1.7.24"), GOOD_NODES, {},
     r"^cluster.distribution must be k3s or rke2 \(the distribution of the server .*got 'containerd'"),
    ("distribution-missing", {"release": "v1.33.1+k3s1"}, GOOD_NODES, {}, r"^cluster.distribution must be k3s or rke2.*got None"),
    ("release-missing", {"distribution": "rke2"}, GOOD_NODES, {},
     r"^cluster.release must be the server's release string, such as v1.33.10\+rke2r1, got None"),
    ("release-garbage", cluster(release="1.33"), GOOD_NODES, {},
     r"^cluster.release: release '1.33' is not a k3s version; expected the form v1.31.6\+k3s1"),
    ("release-too-old", cluster(release="v1.27.16+k3s1"), GOOD_NODES, {},
     r"^cluster.release: k3s v1.27.16\+k3s1 is older than the oldest release line .*upgrade the node to 1.28"),
    ("release-unknown-line", cluster(release="v1.40.0+k3s1"), GOOD_NODES, {},
     r"^cluster.release: k3s v1.40.0\+k3s1 belongs to release line 1.40, which this collection does not know yet"),
    ("release-other-distribution", cluster(release="v1.33.1+rke2r1"), GOOD_NODES, {},
     r"^cluster.release: release 'v1.33.1\+rke2r1' is a rke2 release, but distribution is k3s"),
    ("disabled-not-bool", cluster(runtimeclasses_disabled="yes"), GOOD_NODES, {},
     r"^cluster.runtimeclasses_disabled must be true or false \(true when the servers run with disable: \[runtimes\]\), got 'yes'"),
    ("nodes-dict", cluster(), {"host": "a", "handlers": []}, {},
     r"^nodes must be a list of \{host, handlers\[, gpu_operator, operator_runtimeclasses\]\} dicts, got dict"),
    ("node-str", cluster(), ["gpu1"], {}, r"^nodes\[0\] must be a dict with host and handlers, got str 'gpu1'"),
    ("node-unknown-key", cluster(), [{"host": "a", "handler": ["nvidia"]}], {},
     r"^nodes\[0\] has unknown key\(s\) handler; the keys are host, handlers, gpu_operator, operator_runtimeclasses$"),
    ("host-missing", cluster(), [{"handlers": []}], {},
     r"^nodes\[0\].host must be the inventory hostname \(a non-empty string\), got None"),
    ("host-empty", cluster(), [{"host": " ", "handlers": []}], {}, r"^nodes\[0\].host must be the inventory hostname"),
    ("handlers-missing", cluster(), [{"host": "a"}], {},
     r"^nodes\[0\] \(a\).handlers is missing: list the runtime handlers the node has, \[\] for none$"),
    ("handlers-str", cluster(), [{"host": "a", "handlers": "nvidia"}], {},
     r"^nodes\[0\] \(a\).handlers must be a list of runtime handler names, such as \['nvidia', 'nvidia-cdi'\], got str 'nvidia'$"),
    ("handlers-none", cluster(), [{"host": "a", "handlers": None}], {},
     r"^nodes\[0\] \(a\).handlers must be a list of runtime handler names.*got NoneType None$"),
    ("handler-upper", cluster(), [{"host": "a", "handlers": ["Nvidia"]}], {},
     r"^nodes\[0\] \(a\).handlers\[0\]: 'Nvidia' is not a valid runtime handler name: a RuntimeClass name and handler "
     r"must be a lowercase DNS-1123 label"),
    ("handler-dot", cluster(), [{"host": "a", "handlers": ["nvidia", "nvidia.cdi"]}], {},
     r"^nodes\[0\] \(a\).handlers\[1\]: 'nvidia.cdi' is not a valid runtime handler name"),
    ("handler-newline", cluster(), [{"host": "a", "handlers": ["nvidia\n"]}], {},
     r"^nodes\[0\] \(a\).handlers\[0\]: 'nvidia\\n' is not a valid"),
    ("handler-long", cluster(), [{"host": "a", "handlers": ["n" * 64]}], {}, r"at most 63 characters"),
    ("handler-int", cluster(), [{"host": "a", "handlers": [5]}], {}, r"^nodes\[0\] \(a\).handlers\[0\]: 5 is not a valid"),
    ("operator-str", cluster(), [{"host": "a", "handlers": [], "operator_runtimeclasses": "nvidia"}], {},
     r"^nodes\[0\] \(a\).operator_runtimeclasses must be a list of RuntimeClass names"),
    ("operator-bad-name", cluster(), [{"host": "a", "handlers": [], "operator_runtimeclasses": ["NVIDIA"]}], {},
     r"^nodes\[0\] \(a\).operator_runtimeclasses\[0\]: 'NVIDIA' is not a valid RuntimeClass name"),
    ("selector-list", cluster(), GOOD_NODES, {"node_selector": ["gpu=true"]},
     r"^node_selector must be a dict of node label -> value, such as \{'nvidia.com/gpu.present': 'true'\}, got list"),
    ("selector-key-two-slashes", cluster(), GOOD_NODES, {"node_selector": {"a/b/c": "x"}},
     r"^node_selector: label key 'a/b/c' is not valid: it has more than one '/'"),
    ("selector-key-upper-prefix", cluster(), GOOD_NODES, {"node_selector": {"NVIDIA.com/gpu": "x"}},
     r"^node_selector: label key 'NVIDIA.com/gpu' is not valid: the prefix before '/' must be a lowercase DNS subdomain"),
    ("selector-key-empty-prefix", cluster(), GOOD_NODES, {"node_selector": {"/gpu": "x"}},
     r"^node_selector: label key '/gpu' is not valid: the prefix"),
    ("selector-key-dash", cluster(), GOOD_NODES, {"node_selector": {"-gpu": "x"}},
     r"^node_selector: label key '-gpu' is not valid: the name must be at most 63 characters"),
    ("selector-key-long", cluster(), GOOD_NODES, {"node_selector": {"g" * 64: "x"}}, r"the name must be at most 63"),
    ("selector-key-empty", cluster(), GOOD_NODES, {"node_selector": {"": "x"}},
     r"^node_selector: label key '' must be a non-empty string"),
    ("selector-value-bool", cluster(), GOOD_NODES, {"node_selector": {"nvidia.com/gpu.present": True}},
     r"^node_selector\['nvidia.com/gpu.present'\] must be a string, got bool True; quote it in YAML \(for example 'true'"),
    ("selector-value-space", cluster(), GOOD_NODES, {"node_selector": {"gpu": "a b"}},
     r"^node_selector\['gpu'\]: label value 'a b' is not valid: at most 63 characters"),
    ("selector-value-long", cluster(), GOOD_NODES, {"node_selector": {"gpu": "v" * 64}}, r"label value 'v+' is not valid"),
    ("selector-value-dash", cluster(), GOOD_NODES, {"node_selector": {"gpu": "x-"}}, r"label value 'x-' is not valid"),
    ("overhead-str", cluster(), GOOD_NODES, {"overhead": "250m"},
     r"^overhead must be a dict of resource -> quantity \(overhead.podFixed\), such as \{'cpu': '250m', 'memory': '64Mi'\}, got str"),
    ("overhead-podfixed-wrapper", cluster(), GOOD_NODES, {"overhead": {"podFixed": {"cpu": "1"}}},
     r"^overhead is the podFixed map itself; pass \{'cpu': '250m', 'memory': '64Mi'\}, not \{'podFixed': \{...\}\}$"),
    ("quantity-word", cluster(), GOOD_NODES, {"overhead": {"cpu": "lots"}},
     r"^overhead\['cpu'\] = 'lots' is not a Kubernetes quantity: write a number with an optional suffix"),
    ("quantity-space", cluster(), GOOD_NODES, {"overhead": {"cpu": "250 m"}}, r"^overhead\['cpu'\] = '250 m' is not a Kubernetes quantity"),
    ("quantity-two-dots", cluster(), GOOD_NODES, {"overhead": {"memory": "1.5.0Gi"}}, r"'1.5.0Gi' is not a Kubernetes quantity"),
    ("quantity-bad-suffix", cluster(), GOOD_NODES, {"overhead": {"memory": "64MB"}}, r"'64MB' is not a Kubernetes quantity"),
    ("quantity-empty", cluster(), GOOD_NODES, {"overhead": {"memory": ""}}, r"'' is not a Kubernetes quantity"),
    ("quantity-negative", cluster(), GOOD_NODES, {"overhead": {"cpu": "-100m"}},
     r"^overhead\['cpu'\] = '-100m' is negative; pod overhead must be zero or more$"),
    ("quantity-negative-int", cluster(), GOOD_NODES, {"overhead": {"cpu": -1}}, r"= -1 is negative"),
    ("quantity-float", cluster(), GOOD_NODES, {"overhead": {"cpu": 0.5}},
     r"^overhead\['cpu'\] must be a Kubernetes quantity string such as '250m' or '64Mi' \(or an integer\), got float 0.5; quote it$"),
    ("quantity-bool", cluster(), GOOD_NODES, {"overhead": {"cpu": True}}, r"got bool True; quote it"),
    ("resource-empty", cluster(), GOOD_NODES, {"overhead": {"": "1"}},
     r"^overhead: resource name '' must be a non-empty string such as cpu or memory$"),
    ("resource-unknown", cluster(), GOOD_NODES, {"overhead": {"gpu": "1"}},
     r"^overhead: resource name 'gpu' is not one Kubernetes accepts in overhead.podFixed; use cpu, memory"),
    ("resource-bad-extended", cluster(), GOOD_NODES, {"overhead": {"Example.com/x": "1"}},
     r"^overhead: resource name 'Example.com/x' is not a valid extended resource name"),
    ("hugepages-alone", cluster(), GOOD_NODES, {"overhead": {"hugepages-2Mi": "2Mi"}},
     r"^overhead: hugepages need cpu or memory too"),
]


@pytest.mark.parametrize("cluster_arg,nodes,kwargs,message", [case[1:] for case in BAD_INPUT],
                         ids=[case[0] for case in BAD_INPUT])
def test_bad_input(cluster_arg, nodes, kwargs, message):
    with pytest.raises(K3sGpuError, match=message) as error:
        rc.plan_runtimeclasses_described(cluster_arg, nodes, **kwargs)
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("quantity", ["0", "1", "+1", "250m", "0.5", ".5", "5.", "64Mi", "1Gi", "2Ei", "1k", "1E",
                                      "1e3", "1E-3", "12e+6"])
def test_good_quantities(quantity):
    assert rc.check_overhead({"cpu": quantity}) == {"cpu": quantity}


@pytest.mark.parametrize("key", ["gpu", "nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present",
                                 "a_b.c-d", "Upper", "k3s.io/hostname"])
def test_good_label_keys(key):
    assert k8s_labels.check_node_selector({key: "v"}) == {key: "v"}


# --- rendering -----------------------------------------------------------------------------------

def test_render_round_trip_and_stable_order():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading("rke2", "v1.31.4+rke2r1")), FLEET, node_selector=SELECTOR, overhead=OVERHEAD)
    text = rc.render_manifest_yaml(plan["manifests"])
    first_line = ("# Managed by k3s_gpu.nvidia; edits are overwritten. RuntimeClasses for the "
                  "handlers: nvidia, nvidia-cdi, nvidia-experimental, nvidia-legacy")
    assert text.splitlines()[0] == first_line
    assert text.count("\n---\n") == 4 and text.endswith("\n")
    assert list(yaml.safe_load_all(text)) == plan["manifests"]
    # the same objects in any order and with keys in any order give the same bytes
    shuffled = [dict(reversed(list(manifest.items()))) for manifest in reversed(plan["manifests"])]
    assert rc.render_manifest_yaml(shuffled) == text
    assert rc.render_manifest_yaml(tuple(plan["manifests"])) == text


def test_render_exact_text():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), [{"host": "a", "handlers": ["nvidia-cdi"]}], node_selector={"gpu": "true"},
                                  overhead={"cpu": "250m"})
    assert rc.render_manifest_yaml(plan["manifests"]) == (
        "# Managed by k3s_gpu.nvidia; edits are overwritten. RuntimeClasses for the handlers: nvidia-cdi\n"
        "---\n"
        "apiVersion: \"node.k8s.io/v1\"\n"
        "kind: \"RuntimeClass\"\n"
        "metadata:\n"
        "  name: \"nvidia-cdi\"\n"
        "  labels:\n"
        "    \"app.kubernetes.io/managed-by\": \"k3s_gpu.nvidia\"\n"
        "handler: \"nvidia-cdi\"\n"
        "overhead:\n"
        "  podFixed:\n"
        "    cpu: \"250m\"\n"
        "scheduling:\n"
        "  nodeSelector:\n"
        "    gpu: \"true\"\n")


def test_render_keeps_yaml_lookalikes_strings():
    selector = {"yes": "true", "on": "null", "n": "0x10", "y": "1e3", "Off": "NULL", "True": "False", "gpu": ""}
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), GOOD_NODES, node_selector=selector, overhead={"cpu": "1e3"})
    loaded = list(yaml.safe_load_all(rc.render_manifest_yaml(plan["manifests"])))
    assert loaded[0]["scheduling"]["nodeSelector"] == selector
    assert loaded[0]["overhead"]["podFixed"] == {"cpu": "1e3"}


def test_render_nothing():
    text = rc.render_manifest_yaml([])
    assert text == "# Managed by k3s_gpu.nvidia; edits are overwritten. RuntimeClasses for the handlers: none\n"
    assert list(yaml.safe_load_all(text)) == []


@pytest.mark.parametrize("manifests,message", [
    ({"manifests": []}, r"^manifests must be a list of RuntimeClass dicts \(the plan's manifests\), got dict$"),
    (["x"], r"^manifests\[0\] must be a dict, got str 'x'$"),
    ([{"metadata": {"name": "nvidia"}}], r"^manifests\[0\].handler: None is not a valid RuntimeClass handler: "),
    ([{"handler": "nvidia", "metadata": {}}], r"^manifests\[0\].metadata.name: None is not a valid RuntimeClass name"),
    ([{"handler": "nvidia\n# x", "metadata": {"name": "nvidia"}}], r"^manifests\[0\].handler: 'nvidia\\n# x' is not"),
])
def test_render_bad_input(manifests, message):
    with pytest.raises(K3sGpuError, match=message):
        rc.render_manifest_yaml(manifests)


def test_renders_without_pyyaml():
    assert "import yaml" not in inspect.getsource(rc)  # _manifest_yaml: the same bytes on every controller


# --- the real Kubernetes schema, offline ---------------------------------------------------------

@pytest.fixture
def offline(monkeypatch):
    """No network: kubernetes-validate must use its bundled schemas only."""
    def refuse(*_args, **_kwargs):
        raise OSError("network access attempted during an offline schema test")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def validator(offline):
    if kubernetes_validate is None:
        pytest.fail(KV_HINT)
    return kubernetes_validate


def bundled_minors():
    if kv_utils is None:
        return []
    return sorted({kv_utils.major_minor(version) for version in kv_utils.all_versions()},
                  key=lambda minor: tuple(int(part) for part in minor.split(".")))


def schema_minor(release):
    """The schema minor for a release: its own Kubernetes minor, or the newest bundled one, and a note."""
    line = release.lstrip("v").split("+")[0].rsplit(".", 1)[0]
    minors = bundled_minors()
    if not minors:
        return line, "kubernetes-validate missing"
    if line in minors:
        return line, "schema-%s" % line
    return minors[-1], "schema-%s-NEWEST-BUNDLED-no-%s-schema" % (minors[-1], line)


SCHEMA_CASES = []
for _case in RELEASES:
    for _extras in ("plain", "selector+overhead"):
        _minor, _note = schema_minor(_case[1])
        SCHEMA_CASES.append(pytest.param(_case, _extras, _minor, id="%s-%s-%s" % (_case[0], _case[1], _extras) + "-" + _note))


@pytest.mark.parametrize("case,extras,minor", SCHEMA_CASES)
def test_rendered_manifests_match_the_kubernetes_schema(validator, case, extras, minor):
    distribution, release, _ships = case
    kwargs = {"node_selector": SELECTOR, "overhead": dict(OVERHEAD, **{"hugepages-2Mi": "0"})} if extras != "plain" else {}
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading(distribution, release)), FLEET, **kwargs)
    documents = list(yaml.safe_load_all(rc.render_manifest_yaml(plan["manifests"])))
    assert len(documents) == len(plan["manifests"]) >= 2
    for document in plan["manifests"] + documents:
        assert validator.validate(document, minor, strict=True) == minor


def valid_manifest():
    plan = rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), GOOD_NODES, node_selector=SELECTOR, overhead=OVERHEAD)
    return plan["manifests"][0]


def broken(change):
    manifest = valid_manifest()
    change(manifest)
    return manifest


BROKEN = [
    ("handler-missing", lambda m: m.pop("handler"), "'handler' is a required property"),
    ("handler-not-string", lambda m: m.update(handler=5), "5 is not of type"),
    ("label-value-int", lambda m: m["metadata"]["labels"].update(gpu=1), "1 is not of type"),
    ("overhead-typo", lambda m: m["overhead"].update(podfixed=m["overhead"].pop("podFixed")), "Additional properties"),
    ("quantity-not-scalar", lambda m: m["overhead"]["podFixed"].update(cpu=["250m"]), "is not valid under any of the given schemas"),
    ("quantity-null", lambda m: m["overhead"]["podFixed"].update(cpu=None), "is valid under each of"),
    ("selector-value-int", lambda m: m["scheduling"]["nodeSelector"].update(gpu=1), "1 is not of type"),
    ("scheduling-typo", lambda m: m["scheduling"].update(nodeselector={}), "Additional properties"),
    ("top-level-typo", lambda m: m.update(spec={}), "Additional properties"),
]


@pytest.mark.parametrize("minor", sorted({schema_minor(case[1])[0] for case in RELEASES}))
@pytest.mark.parametrize("change,message", [pytest.param(case[1], case[2], id=case[0]) for case in BROKEN])
def test_schema_rejects_broken_manifests(validator, minor, change, message):
    """Negative controls: the schema check can fail."""
    assert validator.validate(valid_manifest(), minor, strict=True) == minor
    with pytest.raises(validator.ValidationError) as error:
        validator.validate(broken(change), minor, strict=True)
    assert message in error.value.message


def test_schema_does_not_check_quantity_syntax_so_the_engine_does(validator):
    """The OpenAPI Quantity is any string: a bad quantity passes the schema and only our check stops it."""
    manifest = broken(lambda m: m["overhead"]["podFixed"].update(cpu="lots"))
    assert validator.validate(manifest, bundled_minors()[-1], strict=True)
    with pytest.raises(K3sGpuError, match="'lots' is not a Kubernetes quantity"):
        rc.plan_runtimeclasses(NodeFacts.from_reading(server_reading()), GOOD_NODES, overhead={"cpu": "lots"})


def test_schema_fallback_names_the_missing_minor():
    if kv_utils is None:
        pytest.fail(KV_HINT)
    newest = bundled_minors()[-1]
    assert schema_minor("v1.99.0+k3s1") == (newest, "schema-%s-NEWEST-BUNDLED-no-1.99-schema" % newest)
    assert schema_minor("v1.33.10+rke2r1") == ("1.33", "schema-1.33")


def test_a_newer_release_follows_the_policy_of_the_servers_reading():
    newer = {"distribution": "k3s", "release": "v1.38.0+k3s1"}
    with pytest.raises(K3sGpuError, match="newer_release=assume_newest_known"):
        rc.plan_runtimeclasses_described(newer, FLEET)
    assumed = dict(newer, read_options={"newer_release": "assume_newest_known"})
    known = rc.plan_runtimeclasses_described({"distribution": "k3s", "release": "v1.37.2+k3s1"}, FLEET)["shipped"]
    assert rc.plan_runtimeclasses_described(assumed, FLEET)["shipped"] == known
    # the server's reading: runtime_info made its profile with the policy
    server = NodeFacts.from_reading(server_reading(release="v1.38.0+k3s1", newer_release="assume_newest_known"))
    assert rc.plan_runtimeclasses(server, FLEET)["shipped"] == known


@pytest.mark.parametrize("reading, message", [
    (server_reading("containerd", "1.7.24"), r"^cluster.distribution must be k3s or rke2 .*got 'containerd'"),
    (server_reading(runtimeclasses_disabled="yes"), r"^cluster.runtimeclasses_disabled must be true or false .*got 'yes'"),
], ids=["containerd", "disabled-not-bool"])
def test_a_server_reading_is_refused_as_a_described_cluster(reading, message):
    with pytest.raises(K3sGpuError, match=message):
        rc.plan_runtimeclasses(NodeFacts.from_reading(reading), GOOD_NODES)
