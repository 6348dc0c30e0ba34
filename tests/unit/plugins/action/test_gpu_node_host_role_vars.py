# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 41 on the host step: gpu_node_proxy_env's password is in no result of any phase (a success, a refusal, the
doctor, the upgrade check), and a bad role variable is refused by name before the node is read or written."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_node_host
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import RELEASE, host_step, make

PROXY = {"https_proxy": "http://alice:S3cr3t@proxy:3128", "no_proxy": "localhost"}


def assert_no_secret(result):
    text = json.dumps(result, default=str)
    assert "S3cr3t" not in text, text[:2000]


@pytest.mark.parametrize("args, check_mode, extra", [
    ({}, False, {}),  # the plan phase, which configures the sandbox
    ({}, True, {}),
    ({"phase": "doctor"}, True, {}),
    ({"phase": "upgrade_check"}, True, {"gpu_node_target_release": "v1.33.10+k3s1"}),
    ({}, False, {"gpu_node_default_runtime": "bogus"}),  # a refusal after the settings were read
    ({}, False, {"gpu_node_mode": "hybrid"}),  # a refusal of the settings
])
def test_no_result_holds_the_proxy_password(sandbox, args, check_mode, extra):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, args, check_mode, gpu_node_proxy_env=PROXY, **extra)
    assert_no_secret(result)
    assert "proxy_env" not in (result.get("settings") or {})


@pytest.mark.parametrize("proxy_env", [
    {"https_proxy": {"url": "http://alice:S3cr3t@proxy:3128"}},
    "http://alice:S3cr3t@proxy:3128",
    ["https_proxy=http://alice:S3cr3t@proxy:3128"],
])
def test_a_refused_proxy_env_keeps_its_password(sandbox, proxy_env):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, gpu_node_proxy_env=proxy_env)
    assert result["failed"] and "gpu_node_proxy_env" in result["msg"]
    assert_no_secret(result)


def test_a_configure_phase_result_holds_no_proxy_password(sandbox):
    sandbox.k3s("k3s", "package")
    first = host_step(sandbox, gpu_node_proxy_env=PROXY)
    again = host_step(sandbox, {"phase": "configure", "node": first["node"]}, gpu_node_proxy_env=PROXY)
    assert "settings" in again and "proxy_env" not in again["settings"]
    assert_no_secret(again)


def test_a_missing_root_is_refused_and_never_created(sandbox):
    missing = os.path.join(sandbox.root, "not-there")
    result = host_step(sandbox, gpu_node_root=missing, gpu_node_force=True)
    assert result["failed"] and "gpu_node_root" in result["msg"] and "Nothing was changed" in result["msg"], result
    assert "no NVIDIA GPU" not in result["msg"] and not os.path.exists(missing)


@pytest.mark.parametrize("phase_args, variables, expected", [
    ({}, {"gpu_node_root": "relative/root"}, "gpu_node_root: 'relative/root' is not an absolute path"),
    ({}, {"gpu_node_data_dir": "var/lib/rancher/k3s"}, "gpu_node_data_dir: 'var/lib/rancher/k3s' is not an absolute path"),
    ({}, {"gpu_node_toolkit_dirs": ["/opt/nvidia/bin\n"]}, "gpu_node_toolkit_dirs[0]: '/opt/nvidia/bin\\n' holds a newline"),
    ({}, {"gpu_node_runtimes": [{"name": "nvidia-x", "binary": "/usr/bin/nvidia-container-runtime", "runtime_type":
                                 "not a type"}]}, "gpu_node_runtimes[0].runtime_type: 'not a type' is not a containerd"),
    ({}, {"gpu_node_cdi_spec_path": "nvidia.yaml"}, "gpu_node_cdi_spec_path: 'nvidia.yaml' is not an absolute path"),
    ({"phase": "restart"}, {"gpu_node_restart_settle_seconds": -5}, "gpu_node_restart_settle_seconds: -5 is below 0"),
    ({"phase": "restart"}, {"gpu_node_restart_timeout_seconds": "0"}, "gpu_node_restart_timeout_seconds: 0 is below 1"),
    ({}, {"gpu_node_driver_reboot_timeout_seconds": -1}, "gpu_node_driver_reboot_timeout_seconds: -1 is below 1"),
    ({"phase": "doctor"}, {"gpu_node_runtimes": ["nvidia"]}, "gpu_node_runtimes[0]: 'nvidia' is not a mapping"),
    ({"phase": "upgrade_check"}, {"gpu_node_toolkit_dirs": ["opt"]}, "gpu_node_toolkit_dirs[0]: 'opt' is not an absolute"),
])
def test_a_bad_variable_is_refused_before_the_node_is_read(sandbox, phase_args, variables, expected):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    action = make(gpu_node_host, phase_args, check_mode=bool(phase_args))
    action._execute_module = mock.MagicMock(side_effect=AssertionError("nothing may run"))
    task_vars = dict({"inventory_hostname": "gpu1", "ansible_connection": "local", "gpu_node_root": sandbox.root,
                      "gpu_node_release": RELEASE, "gpu_node_force": True, "gpu_node_toolkit_install": False}, **variables)
    result = action.run(task_vars=task_vars)
    assert result["failed"] and result["msg"].startswith("gpu1: " + expected), result["msg"]
    assert result["msg"].endswith("Nothing was changed.") and "\n" not in result["msg"]
    assert sandbox.snapshot() == before


def test_a_megabyte_default_runtime_is_refused_in_a_short_line(sandbox):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, gpu_node_default_runtime="a" * 1048576)
    assert result["failed"] and "gpu_node_default_runtime: '%s…' (1048576 characters)" % ("a" * 60) in result["msg"]
    assert len(json.dumps(result)) < 2000
