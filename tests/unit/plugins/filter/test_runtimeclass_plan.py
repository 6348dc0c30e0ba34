# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The runtimeclass_plan and runtimeclass_manifest filters: glue over _runtimeclasses."""

from __future__ import annotations

import pytest
import yaml

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.filter.runtimeclass_manifest import FilterModule as ManifestFilters
from ansible_collections.k3s_gpu.nvidia.plugins.filter.runtimeclass_plan import FilterModule as PlanFilters
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as rc

plan_filter = PlanFilters().filters()["runtimeclass_plan"]
manifest_filter = ManifestFilters().filters()["runtimeclass_manifest"]

CLUSTER = {"distribution": "k3s", "release": "v1.33.10+k3s1"}
NODES = [{"host": "gpu1", "handlers": ["nvidia", "nvidia-cdi"]},
         {"host": "gpu2", "handlers": ["nvidia", "nvidia-legacy"]}]


def test_plan_is_the_engine_result():
    kwargs = {"node_selector": {"nvidia.com/gpu.present": "true"}, "overhead": {"cpu": "250m", "memory": "64Mi"}}
    plan = plan_filter(CLUSTER, NODES, **kwargs)
    assert plan == rc.plan_runtimeclasses_described(CLUSTER, NODES, **kwargs)
    assert [manifest["metadata"]["name"] for manifest in plan["manifests"]] == ["nvidia-cdi", "nvidia-legacy"]
    assert [item["name"] for item in plan["skipped"]] == ["nvidia"]


def test_playbook_defaults_empty_dicts():
    plan = plan_filter(CLUSTER, NODES, node_selector={}, overhead={})
    assert all("scheduling" not in manifest and "overhead" not in manifest for manifest in plan["manifests"])


@pytest.mark.parametrize("cluster,nodes,kwargs,message", [
    ({"distribution": "containerd", "release": "1.7.24"}, NODES, {},
     r"^runtimeclass_plan: cluster.distribution must be k3s or rke2"),
    (CLUSTER, [{"host": "gpu1", "handlers": "nvidia"}], {},
     r"^runtimeclass_plan: nodes\[0\] \(gpu1\).handlers must be a list of runtime handler names"),
    (CLUSTER, NODES, {"overhead": {"cpu": "lots"}}, r"^runtimeclass_plan: overhead\['cpu'\] = 'lots' is not a Kubernetes quantity"),
    (CLUSTER, NODES, {"node_selector": {"gpu": True}}, r"^runtimeclass_plan: node_selector\['gpu'\] must be a string"),
    ({"distribution": "rke2", "release": "v1.50.0+rke2r1"}, NODES, {},
     r"^runtimeclass_plan: cluster.release: rke2 v1.50.0\+rke2r1 belongs to release line 1.50"),
], ids=["distribution", "handlers", "quantity", "label-value", "release"])
def test_plan_errors(cluster, nodes, kwargs, message):
    with pytest.raises(AnsibleFilterError, match=message):
        plan_filter(cluster, nodes, **kwargs)


def test_manifest_from_plan_or_list():
    plan = plan_filter(CLUSTER, NODES)
    text = manifest_filter(plan)
    assert text == manifest_filter(plan["manifests"]) == rc.render_manifest_yaml(plan["manifests"])
    assert list(yaml.safe_load_all(text)) == plan["manifests"]
    assert text.startswith("# Managed by k3s_gpu.nvidia; ")


@pytest.mark.parametrize("data,message", [
    ({"shipped": []}, r"^runtimeclass_manifest: expected a runtimeclass_plan result \(with manifests\) or a list of "
                      r"RuntimeClass dicts, got a dict with keys shipped$"),
    ("nvidia", r"^runtimeclass_manifest: manifests must be a list of RuntimeClass dicts"),
    ([{"handler": "Nvidia", "metadata": {"name": "nvidia"}}], r"^runtimeclass_manifest: manifests\[0\].handler: 'Nvidia'"),
], ids=["dict-without-manifests", "string", "bad-handler"])
def test_manifest_errors(data, message):
    with pytest.raises(AnsibleFilterError, match=message):
        manifest_filter(data)
