# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The action plugins' tests build their plugin here, as Ansible builds it for a task; on a sandbox node, the
modules the actions run on the node (the collection's runtime_info and node_files, Ansible's slurp) run in this
process against the sandbox tree, as AnsiballZ runs them there."""

from __future__ import annotations

import contextlib
import io
import json
from unittest import mock

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible.modules import slurp

from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_cluster, gpu_node_host
from ansible_collections.k3s_gpu.nvidia.plugins.modules import node_files, runtime_info

RELEASE = "v1.31.6+k3s1"
NODE_MODULES = {"k3s_gpu.nvidia.runtime_info": runtime_info, "k3s_gpu.nvidia.node_files": node_files,
                "ansible.builtin.slurp": slurp}


def make_action(module, args, check_mode=False, diff=None):
    """module's ActionModule for a task with these args: mocks for the connection, the loader and the rest, a templar
    that returns its value as it is. diff: the task's diff flag (None leaves the mock's)."""
    task = mock.MagicMock()
    task.args = dict(args)
    task.async_val = 0
    task.check_mode = check_mode
    if diff is not None:
        task.diff = diff
    connection = mock.MagicMock()
    connection._shell.tmpdir = "/tmp/remote"
    templar = mock.MagicMock()
    templar.template.side_effect = lambda value: value
    return module.ActionModule(task, connection, mock.MagicMock(), mock.MagicMock(), templar, mock.MagicMock())


def run_node_module(name, module_args, check_mode):
    """A module an action runs on the node (NODE_MODULES), run in this process as AnsiballZ runs it there."""
    args = dict(module_args, _ansible_check_mode=check_mode, _ansible_diff=True)
    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        NODE_MODULES[name].main()
    return json.loads(out.getvalue())


def make(module, args, check_mode=False):
    action = make_action(module, args, check_mode, diff=True)
    action._remove_tmp_path = lambda path: None
    action._execute_module = lambda module_name, module_args, task_vars: run_node_module(module_name, module_args, check_mode)
    return action


def host_step(sandbox, args=None, check_mode=False, **role_vars):
    task_vars = dict({"inventory_hostname": "gpu1", "ansible_connection": "local", "gpu_node_root": sandbox.root,
                      "gpu_node_release": RELEASE, "gpu_node_force": True, "gpu_node_toolkit_install": False}, **role_vars)
    return make(gpu_node_host, args or {}, check_mode).run(task_vars=task_vars)


def cluster_plan(hostvars, skip_unchanged=True):
    action = make(gpu_cluster, {"phase": "plan", "hosts": ["gpu1"], "pattern_hosts": ["gpu1"], "servers": ["gpu1"],
                                "skip_unchanged": skip_unchanged})
    result = action.run(task_vars={"hostvars": hostvars, "ansible_play_hosts": ["gpu1"]})
    assert not result.get("failed"), result.get("msg")
    return result
