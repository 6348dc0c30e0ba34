# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The role's variables as its argument spec converts them (text from -e and INI included)."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _role_vars as role_vars


def identity(value):
    return value


@pytest.mark.parametrize("text,expected", [("false", False), ("False", False), ("no", False), ("0", False),
                                           ("true", True), ("yes", True), (True, True), (False, False)])
def test_text_booleans_are_booleans(text, expected):
    settings = role_vars.read({"gpu_node_force": text, "gpu_node_toolkit_install": text}, identity)
    assert settings["force"] is expected and settings["toolkit_install"] is expected


def test_defaults_lists_and_ints_come_from_the_spec():
    settings = role_vars.read({"gpu_node_toolkit_dirs": "/opt/a,/opt/b", "gpu_node_restart_timeout_seconds": "60"},
                              identity)
    assert settings["toolkit_dirs"] == ["/opt/a", "/opt/b"] and settings["restart_timeout_seconds"] == 60
    assert settings["mode"] == "host" and settings["root"] == "/"


@pytest.mark.parametrize("text,expected", [("auto", "auto"), ("false", False), ("true", True)])
def test_operator_driver_is_auto_or_a_boolean(text, expected):
    settings = role_vars.read({"gpu_node_operator_driver": text}, identity)
    assert settings["operator_driver"] == expected


def test_a_bad_value_names_the_variable():
    with pytest.raises(role_vars.RoleVarsError, match="gpu_node_mode"):
        role_vars.read({"gpu_node_mode": "hybrid"}, identity)
    with pytest.raises(role_vars.RoleVarsError, match="gpu_node_force"):
        role_vars.read({"gpu_node_force": "maybe"}, identity)


def test_only_the_names_asked_for_are_read():
    settings = role_vars.read({"gpu_node_mode": "hybrid", "gpu_node_force": "yes"}, identity, ["gpu_node_force"])
    assert settings == {"force": True}


def test_unknown_variables_get_the_closest_name():
    warnings = role_vars.unknown_variables({"gpu_node_forse": True, "gpu_node_result": {}, "gpu_node__info": {},
                                            "gpu_node_mode": "host", "gpu_node_zzz": 1})
    assert warnings == [
        "gpu_node_forse is not a variable of the k3s_gpu.nvidia.gpu_node role and is ignored; did you mean gpu_node_force?",
        "gpu_node_zzz is not a variable of the k3s_gpu.nvidia.gpu_node role and is ignored"]


@pytest.mark.parametrize("inventory,expected", [
    ({"k3s_version": "v1.33.10+k3s1"}, "v1.33.10+k3s1"),
    ({"rke2_install_version": " v1.34.2+rke2r1 ", "rke2_version": "v1.32.1+rke2r1"}, "v1.34.2+rke2r1"),
    ({"k3s_version": "", "rke2_version": "v1.32.1+rke2r1"}, "v1.32.1+rke2r1"),
    ({}, ""),
    ({"k3s_version": "v1.33.10+k3s1", "gpu_node_target_release": "v1.35.3+k3s1"}, "v1.35.3+k3s1"),
])
def test_an_empty_target_release_is_the_one_the_inventory_asks_for(inventory, expected):
    settings = role_vars.read(inventory, identity, ["gpu_node_target_release"])
    assert settings == {"target_release": expected}
