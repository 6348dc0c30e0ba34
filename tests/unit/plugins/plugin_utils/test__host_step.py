# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The host step's device decisions: the /dev/char links and their udev rule (gpu_node_dev_char_symlinks), and the
toolkit's nvidia-cdi-refresh.path (gpu_node_cdi_refresh), from a sandbox node's reading."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules

RELEASE = "v1.34.6+k3s1"
CTK = "/usr/bin/nvidia-ctk"
UNIT = "/usr/lib/systemd/system/nvidia-cdi-refresh.path"
WANTS = "/etc/systemd/system/multi-user.target.wants/nvidia-cdi-refresh.path"
HOST_PLAN = host_state.RolePlan.from_dict({"selected": True, "live": True, "mode": {"mode": "host"}})
SANDBOX_PLAN = dataclasses.replace(HOST_PLAN, live=False)
OPERATOR_PLAN = dataclasses.replace(HOST_PLAN, mode=host_state.Mode(mode="operator"))
SETTINGS = {"state": "present", "dev_char_symlinks": True, "cdi_refresh": True, "cdi_generate": True,
            "cdi_spec_path": "/var/run/cdi/nvidia.yaml"}


def gpu_node(sandbox, loaded=True, linked=()):
    sandbox.k3s("k3s", "package")
    sandbox.binary(CTK)
    sandbox.mkdir("/etc/udev/rules.d")  # udev is installed
    if loaded:
        sandbox.write("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05\n")
    for dev, minor in (("nvidia0", 0), ("nvidiactl", 255)):
        sandbox.write("/dev/" + dev)
        if dev in linked:
            sandbox.symlink("/dev/char/195:%d" % minor, "../" + dev)
    sandbox.write("/dev/nvidia-uvm")  # its own major: not among the links the doctor and the role look at
    return read(sandbox)


def read(sandbox):
    return NodeFacts.from_reading(detect.gather(sandbox.root, "k3s", RELEASE))


def test_the_rule_and_the_links_are_due_on_a_loaded_driver_without_them(sandbox):
    due = host_step.dev_char_due(gpu_node(sandbox), HOST_PLAN, SETTINGS)
    assert due == {"rule": "write", "links": True, "path": distro.DEV_CHAR_RULE, "nvidia_ctk": CTK,
                   "text": release_rules.DEV_CHAR_RULE_MARKER + '\nACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
                                                                'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'}


def test_nothing_is_due_once_the_rule_is_there_and_every_device_is_linked(sandbox):
    info = gpu_node(sandbox, linked=("nvidia0", "nvidiactl"))
    sandbox.write(distro.DEV_CHAR_RULE, host_step.dev_char_rule_text(CTK))
    assert host_step.dev_char_due(read(sandbox), HOST_PLAN, SETTINGS) is None
    assert host_step.dev_char_due(info, HOST_PLAN, SETTINGS)["links"] is False  # read before the rule was written


def test_without_a_driver_only_the_rule_is_written_and_a_foreign_rule_stays(sandbox):
    due = host_step.dev_char_due(gpu_node(sandbox, loaded=False), HOST_PLAN, SETTINGS)
    assert (due["rule"], due["links"]) == ("write", False)
    sandbox.write(distro.DEV_CHAR_RULE, "# the admin's own rule\n")
    assert host_step.dev_char_due(read(sandbox), HOST_PLAN, SETTINGS) is None


def test_a_rule_of_ours_for_another_nvidia_ctk_is_written_again(sandbox):
    gpu_node(sandbox, linked=("nvidia0", "nvidiactl"))
    sandbox.write(distro.DEV_CHAR_RULE, host_step.dev_char_rule_text("/usr/local/bin/nvidia-ctk"))
    due = host_step.dev_char_due(read(sandbox), HOST_PLAN, SETTINGS)
    assert (due["rule"], due["links"]) == ("write", False)


def test_nothing_is_due_off_the_setting_in_a_sandbox_in_operator_mode_or_without_nvidia_ctk(sandbox):
    info = gpu_node(sandbox)
    assert host_step.dev_char_due(info, HOST_PLAN, dict(SETTINGS, dev_char_symlinks=False)) is None
    assert host_step.dev_char_due(info, SANDBOX_PLAN, SETTINGS) is None
    assert host_step.dev_char_due(info, OPERATOR_PLAN, SETTINGS) is None
    os.remove(sandbox.path(CTK))
    assert host_step.dev_char_due(read(sandbox), HOST_PLAN, SETTINGS) is None


def test_state_absent_removes_only_the_rule_the_role_wrote(sandbox):
    absent = dict(SETTINGS, state="absent")
    gpu_node(sandbox)
    sandbox.write(distro.DEV_CHAR_RULE, host_step.dev_char_rule_text(CTK))
    due = host_step.dev_char_due(read(sandbox), HOST_PLAN, absent)
    assert (due["rule"], due["links"], due["path"]) == ("remove", False, distro.DEV_CHAR_RULE)
    sandbox.write(distro.DEV_CHAR_RULE, "# the admin's own rule\n")
    assert host_step.dev_char_due(read(sandbox), HOST_PLAN, absent) is None


def test_the_refresh_unit_is_enabled_where_the_toolkit_ships_it_and_only_once(sandbox):
    assert host_step.cdi_refresh_due(gpu_node(sandbox), HOST_PLAN, SETTINGS) is False  # no unit: toolkit before 1.18
    sandbox.write(UNIT, "[Path]\n")
    info = read(sandbox)
    assert host_step.cdi_refresh_due(info, HOST_PLAN, SETTINGS) is True
    for plan, settings in ((HOST_PLAN, dict(SETTINGS, cdi_refresh=False)), (HOST_PLAN, dict(SETTINGS, state="absent")),
                           (HOST_PLAN, dict(SETTINGS, cdi_spec_path="/etc/cdi/nvidia.yaml")),
                           (SANDBOX_PLAN, SETTINGS), (OPERATOR_PLAN, SETTINGS)):
        assert host_step.cdi_refresh_due(info, plan, settings) is False, (plan, settings)
    sandbox.symlink(WANTS, UNIT)
    assert host_step.cdi_refresh_due(read(sandbox), HOST_PLAN, SETTINGS) is False


def test_without_udev_only_the_links_are_made(sandbox):
    info = gpu_node(sandbox)
    info.driver["dev_char_rule"]["parent_exists"] = False  # no /etc/udev/rules.d: udev is not installed
    due = host_step.dev_char_due(info, HOST_PLAN, SETTINGS)
    assert (due["rule"], due["links"]) == (None, True)


def test_the_host_state_crosses_tasks_as_one_json_text_and_comes_back_whole(sandbox):
    state = host_state.HostState(gpu_node(sandbox), HOST_PLAN, "# generated by k3s_gpu.nvidia",
                                 host_state.Changes(files=["/etc/x.toml"], handlers=["restart"]))
    text = state.to_result()
    assert isinstance(text, str) and "\n" not in text  # one string in gpu_node_result, not a tree of keys
    for node in (text, json.loads(text)):  # the text, or the dict an argument spec of type dict decodes it to
        back = host_state.HostState.from_result(node)
        assert back.facts.reading == state.facts.reading
        assert (back.plan, back.cdi_marker, back.changes) == (state.plan, state.cdi_marker, state.changes)
    assert host_state.decoded(text)["cdi_marker"] == "# generated by k3s_gpu.nvidia"


@pytest.mark.parametrize("node", ['{"plan": ', "[]", "", None, {"facts": {}}])
def test_a_host_state_that_is_no_json_object_with_a_plan_is_refused(node):
    with pytest.raises(K3sGpuError) as caught:
        host_state.HostState.from_result(node, "gpu_node_result.node")
    assert str(caught.value).startswith("gpu_node_result.node holds no host state of the role's host step")
    assert caught.value.fix == host_state.UNCHANGED


# --- the device nodes before k3s/rke2 starts (gpu_node_allocation=dra) ------------------------------------------------

DRA = dict(SETTINGS, allocation="dra")
DROPIN = "/etc/systemd/system/k3s.service.d/50-k3s-gpu-nvidia-device-nodes.conf"


def dra_node(sandbox):
    sandbox.write("/etc/systemd/system/k3s.service", "[Service]\nExecStart=/usr/local/bin/k3s server\n")
    return gpu_node(sandbox)


def test_a_dra_node_gets_the_unit_drop_in_and_its_missing_device_nodes_made_now(sandbox):
    info = dra_node(sandbox)  # /dev/nvidia0, nvidiactl, nvidia-uvm: none missing
    assert list(info.units) == ["k3s"]
    due = host_step.device_nodes_due(info, HOST_PLAN, DRA)
    assert due == {"files": [{"path": DROPIN, "text": host_step.device_nodes_text(CTK)}], "now": False, "nvidia_ctk": CTK}
    text = due["files"][0]["text"]
    assert text.startswith(release_rules.DEVICE_NODES_MARKER + "\n[Service]\n")
    assert "ExecStartPre=-/usr/bin/timeout 60 nvidia-smi -L\n" in text
    assert "ExecStartPre=-/usr/bin/timeout 60 %s system create-device-nodes --control-devices --load-kernel-modules\n" % CTK in text
    os.remove(os.path.join(sandbox.root, "dev/nvidia-uvm"))  # the node CUDA needs and nvidia-smi does not make
    assert host_step.device_nodes_due(read(sandbox), HOST_PLAN, DRA)["now"] is True
    sandbox.write(DROPIN, text)
    sandbox.write("/dev/nvidia-uvm")
    assert host_step.device_nodes_due(read(sandbox), HOST_PLAN, DRA) is None  # converged


def test_the_drop_in_is_not_written_off_dra_or_off_a_real_root_and_a_users_file_stays(sandbox):
    info = dra_node(sandbox)
    assert host_step.device_nodes_due(info, HOST_PLAN, SETTINGS) is None  # a device-plugin node
    assert host_step.device_nodes_due(info, SANDBOX_PLAN, DRA) is None
    assert host_step.device_nodes_due(info, OPERATOR_PLAN, DRA) is None  # the operator's driver container makes them
    assert host_step.device_nodes_kept(info, HOST_PLAN, DRA) == []  # nothing at that name yet
    sandbox.write(DROPIN, "[Service]\nExecStartPre=/usr/local/bin/site-gpus\n")
    assert host_step.device_nodes_due(read(sandbox), HOST_PLAN, DRA) is None
    assert host_step.device_nodes_due(read(sandbox), HOST_PLAN, dict(DRA, state="absent")) is None
    # left alone, but said: the device nodes before the first claim pod are not the role's to vouch for on this node
    kept = host_step.device_nodes_kept(read(sandbox), HOST_PLAN, DRA)
    assert len(kept) == 1 and kept[0].startswith(DROPIN + " is not the role's") and "Move that file" in kept[0]
    assert host_step.device_nodes_kept(read(sandbox), HOST_PLAN, SETTINGS) == []  # a device-plugin node needs none
    assert host_step.device_nodes_kept(read(sandbox), HOST_PLAN, dict(DRA, state="absent")) == []


@pytest.mark.parametrize("settings", [SETTINGS, dict(DRA, state="absent")])
def test_the_roles_drop_in_is_removed_off_dra_and_on_state_absent(sandbox, settings):
    dra_node(sandbox)
    sandbox.write(DROPIN, host_step.device_nodes_text(CTK))
    assert host_step.device_nodes_due(read(sandbox), HOST_PLAN, settings) == {
        "files": [{"path": DROPIN, "text": None}], "now": False, "nvidia_ctk": CTK}
