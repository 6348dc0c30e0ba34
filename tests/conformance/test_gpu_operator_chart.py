# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU Operator HelmChart rendered by NVIDIA's own chart (v26.7.0) with Helm's own engine.

Each case takes the HelmChart that _gpu_operator builds for chart_version v26.7.0 and renders its `valuesContent`
with the gpu-operator v26.7.0 archive of the project's shared material (checked by sha256), under the HelmChart's
name and target namespace, told the release's Kubernetes version; Helm is `helm-render`, as in
test_device_plugin_chart.py. Checked on the rendered ClusterPolicy: the operator mode's values (CDI, the NRI plugin),
the toolkit's socket and install directory (where k3s/rke2 look for the operator's runtimes), the driver as the
nodes want it, the RuntimeClass name; and the whole object against the ClusterPolicy CRD's own schema from the same
archive. Missing material FAILS with the hint; it never skips.
"""

from __future__ import annotations

import tarfile

import jsonschema
import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as op
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
# helm_render is a fixture: imported here, pytest finds it in this module too
from ansible_collections.k3s_gpu.nvidia.tests.conformance.test_device_plugin_chart import (  # pylint: disable=unused-import
    shared_file, helm_render, render)
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

CHART_VERSION = "v26.7.0"
CHART_ARCHIVE = ("charts/gpu-operator-v26.7.0.tgz", "23e6f95db25c44c8930403b7769563d9f8484f5a79a5753dddf7e9ac30a7bf7f")
CRD = "gpu-operator/crds/nvidia.com_clusterpolicies.yaml"
# the role installs the host driver on both nodes: the operator's driver is off for the cluster
NODES = [{"host": "gpu1", "mode": "operator", "driver_install": True}, {"host": "gpu2", "mode": "operator", "driver_install": True}]
CASES = {
    "cdi": ({}, {"enabled": True}),
    "legacy": ({"cdi": False}, {"enabled": False}),
    "nri": ({"values": {"cdi": {"nriPluginEnabled": True}}}, {"enabled": True, "nriPluginEnabled": True}),
}


@pytest.fixture(scope="module")
def chart():
    return shared_file(*CHART_ARCHIVE)


@pytest.fixture(scope="module")
def clusterpolicy_schema(chart):
    with tarfile.open(chart) as archive:
        crd = yaml.safe_load(archive.extractfile(CRD).read())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def plan_of(settings):
    server = NodeFacts.from_reading(server_reading("k3s", "v1.33.10+k3s1"))
    return op.plan_cluster(server, dict(settings, chart_version=CHART_VERSION), NODES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_renders_our_values_into_a_valid_clusterpolicy(helm_render, chart, clusterpolicy_schema, tmp_path, case):
    settings, cdi = CASES[case]
    plan = plan_of(settings)
    assert plan["operator_mode"] == case and plan["objects"][0]["spec"]["version"] == CHART_VERSION
    policy = render(helm_render, chart, plan, tmp_path)[("ClusterPolicy", "cluster-policy")]
    spec = policy["spec"]
    assert {key: spec["cdi"].get(key) for key in cdi} == cdi
    assert {"name": "CONTAINERD_SOCKET", "value": op.K3S_CONTAINERD_SOCKET} in spec["toolkit"]["env"]
    assert spec["toolkit"]["enabled"] is True
    assert spec["toolkit"]["installDir"] == release_rules.GPU_OPERATOR_CHART["install_dir"]
    assert spec["operator"]["runtimeClass"] == release_rules.GPU_OPERATOR_CHART["runtime_class"]
    assert spec["driver"]["enabled"] is False
    jsonschema.validate(policy, clusterpolicy_schema)


def test_the_schema_check_bites(clusterpolicy_schema):
    """The CRD schema refuses a value of the wrong type where ours go, so the check above can fail."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "x"},
                             "spec": {"cdi": {"enabled": "yes"}}}, clusterpolicy_schema)
