# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The handler's roll back after a failed restart: which modules put the old files back.

A file the run removed without a copy on the node (the collection's own template, which the take-back keeps no
backup of) is written back from the text the run read, by the collection's node_files; the copy module cannot
take `content` when called as a module (that is its action plugin's work), which left the file missing on the
node (molecule nspawn_restart). A step of the roll back that fails is named in the failure."""

from __future__ import annotations

from unittest import mock

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _handler as handler
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_phases as phases
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state

TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
DROPIN = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"
TEXT = '{{ template "base" . }}\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-legacy]\n'


def roll_back(files, failing=()):
    calls = []

    def execute_module(name, args):
        calls.append((name, args))
        return {"failed": True, "msg": "boom"} if name in failing else {"changed": True}

    task = phases.HostTask(host="gpu1", check_mode=False, diff=False, template=mock.MagicMock(), display=mock.MagicMock(),
                           execute_module=execute_module)
    result = {}
    handler.roll_back(task, result, host_state.Changes(files=files), "k3s-agent", ["k3s-agent did not become active"])
    return result, calls


FILES = [{"path": DROPIN, "action": "created", "backup_file": None},
         {"path": TEMPLATE, "action": "removed", "backup_file": None, "restore_content": TEXT}]


def test_a_removed_file_without_a_copy_is_written_back_by_node_files():
    result, calls = roll_back(FILES)
    assert calls[1] == ("ansible.builtin.file", {"path": DROPIN, "state": "absent"})
    assert calls[2] == ("k3s_gpu.nvidia.node_files", {"files": [{"path": TEMPLATE, "state": "file", "content": TEXT}]})
    assert calls[3][0] == "ansible.builtin.systemd_service"
    assert not any(name == "ansible.builtin.copy" for name, _args in calls)
    assert result["failed"] and "rolled back" in result["msg"] and "Could NOT" not in result["msg"]


def test_a_backup_is_copied_back_and_a_failed_step_is_named():
    files = [{"path": TEMPLATE, "action": "updated", "backup_file": "/var/backups/k3s-gpu-nvidia/x~"}]
    result, calls = roll_back(files, failing=("ansible.builtin.copy",))
    assert ("ansible.builtin.copy", {"src": "/var/backups/k3s-gpu-nvidia/x~", "dest": TEMPLATE, "remote_src": True,
                                     "mode": "preserve"}) in calls
    assert "Could NOT put back: %s (boom)" % TEMPLATE in result["msg"]
