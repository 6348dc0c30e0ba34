# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's defaults are declared once, in meta/argument_specs.yml: each option has the default the role
always had (the values of defaults/main.yml before it stopped declaring them), defaults/main.yml declares none of
them again, and the role's actions apply them to a variable the user did not set."""

from __future__ import annotations

import os

import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars

ROLE = os.path.dirname(os.path.dirname(role_vars.SPEC_FILE))

# defaults/main.yml of 3a1f168, the last that declared them; gpu_node_target_release was a Jinja expression over the
# inventory's k3s_version / rke2_install_version / rke2_version: its default is "", and _role_vars reads the inventory
DOCUMENTED = {
    "gpu_node_root": "/", "gpu_node_state": "present", "gpu_node_absent_remove_toolkit": False,
    "gpu_node_absent_remove_driver": False, "gpu_node_distribution": "auto", "gpu_node_release": "",
    "gpu_node_newer_release": "refuse", "gpu_node_data_dir": "", "gpu_node_toolkit_dirs": [],
    "gpu_node_target_release": "", "gpu_node_force": False, "gpu_node_runtimes": [], "gpu_node_default_runtime": "",
    "gpu_node_enable_cdi": None, "gpu_node_backup": True, "gpu_node_handler_labels": True, "gpu_node_mode": "host",
    "gpu_node_remove_operator_leftovers": False, "gpu_node_operator_state": "present",
    "gpu_node_operator_chart_version": "", "gpu_node_operator_chart_repo": "", "gpu_node_operator_chart_archive": "",
    "gpu_node_operator_namespace": "gpu-operator", "gpu_node_operator_cdi": None, "gpu_node_operator_driver": "auto",
    "gpu_node_operator_toolkit": True, "gpu_node_operator_values": {}, "gpu_node_operator_helmchart_spec": {},
    "gpu_node_restart": True, "gpu_node_restart_settle_seconds": 10, "gpu_node_restart_timeout_seconds": 120,
    "gpu_node_package_manager": "auto", "gpu_node_proxy_env": {}, "gpu_node_driver_install": False,
    "gpu_node_driver_branch": "580", "gpu_node_driver_version": "", "gpu_node_driver_hold": True,
    "gpu_node_driver_open_kernel_modules": True, "gpu_node_driver_packages": [],
    "gpu_node_driver_kernel_headers": True, "gpu_node_driver_blacklist_nouveau": True,
    "gpu_node_driver_repo_url": "", "gpu_node_driver_gpg_key_url": "", "gpu_node_driver_gpg_fingerprint": "",
    "gpu_node_driver_reboot": "if_needed", "gpu_node_driver_reboot_timeout_seconds": 900,
    "gpu_node_toolkit_install": True, "gpu_node_toolkit_version": "1.20.0-1",
    "gpu_node_toolkit_operator_extensions": True,
    "gpu_node_toolkit_apt_repo_url": "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)",
    "gpu_node_toolkit_dnf_repo_url": "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch",
    "gpu_node_toolkit_dnf_gpgcheck": True,
    "gpu_node_toolkit_gpg_key_url": "https://nvidia.github.io/libnvidia-container/gpgkey",
    "gpu_node_toolkit_gpg_fingerprint": "C95B321B61E88C1809C4F759DDCAE044F796ECB0", "gpu_node_toolkit_hold": True,
    "gpu_node_cdi_generate": True, "gpu_node_cdi_spec_path": "/var/run/cdi/nvidia.yaml",
    "gpu_node_cdi_refresh": True, "gpu_node_dev_char_symlinks": True, "gpu_node_device_plugin_state": "present",
    "gpu_node_device_plugin_chart_version": "", "gpu_node_device_plugin_chart_repo": "",
    "gpu_node_device_plugin_chart_archive": "", "gpu_node_device_plugin_namespace": "nvidia-device-plugin",
    "gpu_node_device_plugin_runtime_class": "", "gpu_node_device_plugin_device_list_strategy": "auto",
    "gpu_node_device_plugin_device_discovery_strategy": "", "gpu_node_device_plugin_mig_strategy": "none",
    "gpu_node_device_plugin_gfd": False, "gpu_node_device_plugin_image_registry": "", "gpu_node_gpu_sharing": {},
    "gpu_node_device_plugin_configs": {}, "gpu_node_device_plugin_config": "",
    "gpu_node_allocation": "device_plugin", "gpu_node_dra_driver_state": "present",
    "gpu_node_dra_driver_chart_version": "", "gpu_node_dra_driver_chart_repo": "", "gpu_node_dra_driver_chart_archive": "",
    "gpu_node_dra_driver_namespace": "nvidia-dra-driver-gpu", "gpu_node_dra_driver_compute_domains": False,
    "gpu_node_dra_driver_image_registry": "",
    # the safe rollout (issue 43)
    "gpu_node_kubeconfig": "", "gpu_node_kubernetes_node": "", "gpu_node_drain": "auto", "gpu_node_drain_scope": "gpu_pods",
    "gpu_node_drain_timeout_seconds": 600, "gpu_node_prove_timeout_seconds": 600,
    "gpu_node_prove_image": "docker.io/library/ubuntu:24.04", "gpu_node_prove_runtimeclass": "nvidia",
    "gpu_node_max_unavailable": "1", "gpu_node_disruptive_change": "",
}


def load(*path):
    with open(os.path.join(ROLE, *path), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def options():
    return load("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]


def test_every_option_has_its_documented_default():
    found = dict((name, option.get("default")) for name, option in options().items())
    assert sorted(found) == sorted(DOCUMENTED)
    wrong = dict((name, (found[name], DOCUMENTED[name])) for name in DOCUMENTED
                 if found[name] != DOCUMENTED[name] or type(found[name]) is not type(DOCUMENTED[name]))
    assert wrong == {}


def test_defaults_main_declares_no_variable_of_the_spec():
    declared = load("defaults", "main.yml") or {}
    assert isinstance(declared, dict)
    again = sorted(set(declared) & set(options()))
    assert again == [], "declared again in defaults/main.yml (meta/argument_specs.yml is the only place): %s" % again


def test_the_actions_apply_the_spec_defaults():
    settings = role_vars.read({}, lambda value: value)
    assert settings == dict((name[len(role_vars.PREFIX):], value) for name, value in DOCUMENTED.items())


def test_the_inventory_overrides_a_default():
    settings = role_vars.read({"gpu_node_cdi_spec_path": "/etc/cdi/nvidia.yaml", "gpu_node_restart": False},
                              lambda value: value, ["gpu_node_cdi_spec_path", "gpu_node_restart", "gpu_node_mode"])
    assert settings == {"cdi_spec_path": "/etc/cdi/nvidia.yaml", "restart": False, "mode": "host"}
