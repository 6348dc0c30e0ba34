# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The role's handler as decisions: whether to restart, whether the restarted unit is healthy, the rollback."""

from __future__ import annotations

import os

import pytest
import yaml

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _restart as restart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _role_vars as role_vars

ROLE_VARS = os.path.join(os.path.dirname(os.path.dirname(role_vars.SPEC_FILE)), "vars", "main.yml")
HANDLER = "Restart the k3s/rke2 service and verify it"

LOADED = {"path": "/run/k3s/containerd/config.toml", "runtimes": ["runc", "nvidia", "nvidia-cdi"]}


@pytest.mark.parametrize("check, wanted, live, units, reason", [
    (True, True, True, ["k3s"], "check mode"), (False, False, True, ["k3s"], "gpu_node_restart is false"),
    (False, True, False, ["k3s"], "gpu_node_root is a sandbox tree"), (False, True, True, [], "no systemd unit found"),
    (False, True, True, ["k3s"], "")])
def test_why_not(check, wanted, live, units, reason):
    assert restart.why_not(check, wanted, live, units) == reason


@pytest.mark.parametrize("root", [None, "/", "", "/srv/node", "//", "/srv/node/"])
@pytest.mark.parametrize("wanted", [None, True, False, "no"])
@pytest.mark.parametrize("check", [False, True])
def test_the_role_notifies_the_handler_where_the_host_step_says_it_restarts(root, wanted, check):
    """The role's templated notify (decided before the task runs, from the raw variables) and _restart.notified
    (from the settings the host step validated, the spec's defaults applied) agree; where the role does not notify,
    the host step prints the restart line itself. A variable not set is left out, as an inventory leaves it."""
    with open(ROLE_VARS) as f:
        expression = yaml.safe_load(f)["gpu_node__restart_notify"]
    variables = {"ansible_check_mode": check}
    if root is not None:
        variables["gpu_node_root"] = root
    if wanted is not None:
        variables["gpu_node_restart"] = wanted
    notify = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))
    settings = role_vars.read(variables, lambda value: value, ("gpu_node_root", "gpu_node_restart"))
    assert notify == ([HANDLER] if restart.notified(check, settings["restart"], role_vars.live(settings["root"])) else [])


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
