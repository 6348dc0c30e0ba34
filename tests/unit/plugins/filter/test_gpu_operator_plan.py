# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_operator_plan filter: the server's runtime_info result typed once, then _gpu_operator's plan."""

from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.filter.gpu_operator_plan import FilterModule
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as op
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading

plan_filter = FilterModule().filters()["gpu_operator_plan"]
NODES = [{"host": "gpu1", "mode": "operator"}]


def test_plan_is_the_engine_result():
    reading = server_reading()
    plan = plan_filter(reading, {"cdi": True}, NODES)
    assert plan == op.plan_cluster(NodeFacts.from_reading(reading), {"cdi": True}, NODES)
    assert plan["wanted"] and plan["operator_nodes"] == ["gpu1"]


@pytest.mark.parametrize("cluster, message", [
    ("server1", r"^gpu_operator_plan: cluster is a str, not a mapping; cluster must be the runtime_info result of a k3s or "
                r"rke2 server \(distribution, release, paths\)$"),
    ({"distribution": "k3s", "release": "v1.33.10+k3s1", "paths": {}},
     r"^gpu_operator_plan: cluster: root is missing, not a str; cluster must be the runtime_info result"),
    (server_reading("containerd", "2.1.4"),
     r"^gpu_operator_plan: cluster must be the runtime_info result of a k3s or rke2 server \(distribution, release, paths\); "
     r"operator mode deploys a k3s/rke2 HelmChart$"),
], ids=["not-a-dict", "not-a-reading", "containerd"])
def test_what_is_not_a_k3s_or_rke2_servers_reading_is_refused_by_name(cluster, message):
    with pytest.raises(AnsibleFilterError, match=message):
        plan_filter(cluster, {}, NODES)
