# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The role's variables as its argument spec converts them (text from -e and INI included)."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


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
    with pytest.raises(K3sGpuError, match="gpu_node_mode"):
        role_vars.read({"gpu_node_mode": "hybrid"}, identity)
    with pytest.raises(K3sGpuError, match="gpu_node_force"):
        role_vars.read({"gpu_node_force": "maybe"}, identity)


def test_only_the_names_asked_for_are_read():
    settings = role_vars.read({"gpu_node_mode": "hybrid", "gpu_node_force": "yes"}, identity, ["gpu_node_force"])
    assert settings == {"force": True}


def test_unknown_variables_get_the_closest_name():
    warnings = role_vars.unknown_variables({"gpu_node_forse": True, "gpu_node_result": {}, "gpu_node__facts": {},
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


@pytest.mark.parametrize("value,message", [
    (False, 'gpu_node_default_runtime: false is a boolean, not a text; set a runtime name such as nvidia, or "" for none'),
    (True, 'gpu_node_default_runtime: true is a boolean, not a text; set a runtime name such as nvidia, or "" for none'),
    (1.5, 'gpu_node_default_runtime: 1.5 is a number, not a text; set a runtime name such as nvidia, or "" for none'),
    (["nvidia"], 'gpu_node_default_runtime: ["nvidia"] is a list, not a text; set a runtime name such as nvidia, or "" '
                 'for none'),
    ({"name": "nvidia"}, 'gpu_node_default_runtime: {"name": "nvidia"} is a dictionary, not a text; set a runtime name '
                         'such as nvidia, or "" for none'),
])
def test_a_text_variable_refuses_what_is_not_a_text(value, message):
    with pytest.raises(K3sGpuError) as caught:
        role_vars.read({"gpu_node_default_runtime": value}, identity)
    assert str(caught.value) == message


@pytest.mark.parametrize("name,value,fix", [
    ("gpu_node_toolkit_version", 1.2, "gpu_node_toolkit_version: 1.2 is a number, not a text; write it in quotes as you "
                                      "mean it (YAML reads an unquoted 1.20 as the number 1.2)"),
    ("gpu_node_mode", False, "gpu_node_mode: false is a boolean, not a text; set one of host, operator"),
    ("gpu_node_cdi_spec_path", ["/etc/cdi/nvidia.yaml"], 'gpu_node_cdi_spec_path: ["/etc/cdi/nvidia.yaml"] is a list, '
                                                         'not a text; set a text such as "/var/run/cdi/nvidia.yaml" '
                                                         '(the default)'),
    ("gpu_node_root", {"path": "/srv"}, 'gpu_node_root: {"path": "/srv"} is a dictionary, not a text; set a text such as '
                                        '"/" (the default)'),
    ("gpu_node_data_dir", 0.5, "gpu_node_data_dir: 0.5 is a number, not a text; write it in quotes as you mean it (YAML "
                               "reads an unquoted 1.20 as the number 1.2)"),
    ("gpu_node_release", False, 'gpu_node_release: false is a boolean, not a text; set a release such as v1.35.3+k3s1, '
                                'or "" to read it from the node'),
])
def test_the_refusal_names_the_role_variable_and_the_fix(name, value, fix):
    with pytest.raises(K3sGpuError) as caught:
        role_vars.read({name: value}, identity, [name])
    assert str(caught.value) == fix


def test_every_text_variable_refused_is_named_once():
    with pytest.raises(K3sGpuError) as caught:
        role_vars.read({"gpu_node_default_runtime": False, "gpu_node_toolkit_version": 1.2, "gpu_node_force": False}, identity)
    assert str(caught.value).count("gpu_node_default_runtime: false") == 1
    assert "gpu_node_toolkit_version: 1.2" in str(caught.value) and "gpu_node_force" not in str(caught.value)


def test_an_integer_reads_as_its_digits():
    # an INI inventory's gpu_node_driver_branch=580 is the integer 580: no digit is lost, so it is taken as "580"
    assert role_vars.read({"gpu_node_driver_branch": 580}, identity, ["gpu_node_driver_branch"]) == {"driver_branch": "580"}


def test_texts_and_templated_texts_are_taken():
    templated = {"{{ runtime }}": "nvidia-cdi", "{{ branch }}": "575", "{{ empty }}": ""}
    settings = role_vars.read({"gpu_node_default_runtime": "{{ runtime }}", "gpu_node_driver_branch": "{{ branch }}",
                               "gpu_node_release": "{{ empty }}", "gpu_node_root": "/srv/node", "gpu_node_mode": "operator",
                               "gpu_node_device_plugin_runtime_class": "nvidia"},
                              lambda value: templated.get(value, value))
    assert (settings["default_runtime"], settings["driver_branch"], settings["release"], settings["root"]) == (
        "nvidia-cdi", "575", "", "/srv/node")
    assert settings["mode"] == "operator" and settings["device_plugin_runtime_class"] == "nvidia"


def test_a_text_that_reads_as_a_boolean_stays_a_text():
    # -e gpu_node_default_runtime=false arrives as text: a name (the plan refuses a runtime the node lacks)
    assert role_vars.read({"gpu_node_default_runtime": "false"}, identity, ["gpu_node_default_runtime"]) == {
        "default_runtime": "false"}


@pytest.mark.parametrize("distribution, release, inventory, expected", [
    ("auto", "", {"k3s_version": "v1.33.10+k3s1"}, ("k3s", "v1.33.10+k3s1", "k3s_version")),
    ("auto", "", {"rke2_version": "v1.34.6+rke2r1"}, ("rke2", "v1.34.6+rke2r1", "rke2_version")),
    ("auto", "v1.31.6+k3s1", {"k3s_version": "v1.33.10+k3s1"}, ("auto", "v1.31.6+k3s1", None)),  # gpu_node_release wins
    ("rke2", "", {"k3s_version": "v1.33.10+k3s1"}, ("rke2", "", None)),  # another distribution's release is not taken
    ("auto", "", {}, ("auto", "", None)),
])
def test_the_release_read_is_gpu_node_release_else_the_inventorys(distribution, release, inventory, expected):
    assert role_vars.release_to_read(distribution, release, inventory, identity) == expected
