# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The role's handler as decisions: whether to restart, whether the restarted unit is healthy, the rollback."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _restart as restart

LOADED = {"path": "/run/k3s/containerd/config.toml", "runtimes": ["runc", "nvidia", "nvidia-cdi"]}


@pytest.mark.parametrize("check, wanted, live, units, reason", [
    (True, True, True, ["k3s"], "check mode"), (False, False, True, ["k3s"], "gpu_node_restart is false"),
    (False, True, False, ["k3s"], "gpu_node_root is a sandbox tree"), (False, True, True, [], "no systemd unit found"),
    (False, True, True, ["k3s"], "")])
def test_why_not(check, wanted, live, units, reason):
    assert restart.why_not(check, wanted, live, units) == reason


@pytest.mark.parametrize("check, wanted, live, notified", [
    (False, True, True, True), (True, True, True, False), (False, False, True, False), (False, True, False, False)])
def test_only_a_change_that_can_be_restarted_goes_through_the_handler(check, wanted, live, notified):
    assert restart.notified(check, wanted, live) is notified
    # where the role does not notify, why_not names the reason the host step prints
    assert bool(restart.why_not(check, wanted, live, ["k3s"])) is not notified


def test_a_healthy_restart_has_no_problem():
    state = restart.unit_state({"ActiveState": "active", "SubState": "running", "NRestarts": 0})
    assert state == ["active", "running", "0"]
    expected = host_state.Changes.of_step({"runtimes_written": [{"name": "nvidia-cdi"}], "runtimes_skipped": [{"name": "nvidia"}]}).handlers
    assert expected == ["nvidia", "nvidia-cdi"]
    assert restart.problems("k3s", state, state, expected, LOADED, 120, 10) == []


def test_inactive_crash_looping_and_missing_tables_are_each_named():
    first, second = ["activating", "auto-restart", "3"], ["active", "running", "4"]
    found = restart.problems("k3s-agent", first, second, ["nvidia", "nvidia-legacy"], LOADED, 30, 6)
    assert found == ["k3s-agent did not become active within 30 s (activating/auto-restart/3)",
                     "k3s-agent is not stable (ActiveState/SubState/NRestarts activating/auto-restart/3, then 6 s later "
                     "active/running/4)",
                     "/run/k3s/containerd/config.toml lacks the runtime tables nvidia-legacy"]
    message = restart.failure("gpu1", found[2:], "k3s-agent", ["level=fatal msg=x" + "y" * 400])
    assert message.startswith("gpu1: the new containerd configuration was rolled back because /run/k3s/containerd/config.toml "
                              "lacks the runtime tables nvidia-legacy. The old files are restored and k3s-agent was restarted")
    assert len(message) < 600


def test_rollback_removes_created_files_and_restores_backups():
    files = [{"path": "/a", "action": "created", "backup_file": None}, {"path": "/b", "action": "updated", "backup_file": "/b.bak"},
             {"path": "/c", "action": "removed", "backup_file": "/c.bak"}, {"path": "/d", "action": "updated", "backup_file": None}]
    assert restart.rollback(files) == (["/a"], [("/b.bak", "/b"), ("/c.bak", "/c")])
