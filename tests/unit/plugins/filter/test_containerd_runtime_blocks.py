# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import tomllib

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.filter.containerd_runtime_blocks import FilterModule

blocks = FilterModule().filters()["containerd_runtime_blocks"]


def test_list_input_schema_2_and_3():
    runtimes = [{"name": "nvidia-legacy", "binary": "/usr/bin/nvidia-container-runtime.legacy"}]
    v2 = tomllib.loads(blocks(runtimes, schema=2, systemd_cgroup=True))
    entry = v2["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia-legacy"]
    assert entry == {"runtime_type": "io.containerd.runc.v2",
                     "options": {"BinaryName": "/usr/bin/nvidia-container-runtime.legacy", "SystemdCgroup": True}}
    v3 = tomllib.loads(blocks(runtimes))
    assert "SystemdCgroup" not in v3["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia-legacy"]["options"]
    assert blocks([]) == ""


def test_runtime_info_result_input():
    info = {"systemd_cgroup": True, "plan": {"schema": 2, "write": [
        {"name": "nvidia-cdi", "binary": "/usr/bin/nvidia-container-runtime.cdi", "runtime_type": "io.containerd.runc.v2"}]}}
    data = tomllib.loads(blocks(info))
    assert data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia-cdi"]["options"]["SystemdCgroup"] is True


@pytest.mark.parametrize("data,kwargs,message", [
    ([{"name": "a.b", "binary": "/x"}], {}, "lowercase DNS label"),
    ([{"name": "a", "binary": "x"}], {}, "absolute path"),
    ([{"name": "a", "binary": "/x", "options": {"BinaryNam": "/y"}}], {}, "did you mean BinaryName"),
    ([{"name": "a", "binary": "/x"}], {"schema": 5}, "schema must be one of 2, 3, 4"),
    ("text", {}, "expected a list of runtimes"),
    ({"plan": {"error": "boom"}}, {}, "boom"),
])
def test_bad_input(data, kwargs, message):
    with pytest.raises(AnsibleFilterError, match=message):
        blocks(data, **kwargs)
