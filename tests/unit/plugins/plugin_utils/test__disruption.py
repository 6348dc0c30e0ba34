# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which of the role's changes disrupt a node's GPU pods (issue 43), and whether the role drains the node first."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _disruption as disruption

LOADED = {"loaded": True, "version": "580.95.05"}
INSTALL = {"install_driver": True}
UPGRADE_PROBE = {"packages_changed": True}


def classify(mode=None, driver=None, probe=None, reboot="never", **extra):
    return disruption.classify(mode or {}, driver if driver is not None else LOADED, probe or {}, reboot, **extra)


def test_a_driver_upgrade_is_disruptive_and_names_the_loaded_version():
    found = classify(INSTALL, LOADED, UPGRADE_PROBE)
    assert found["disruptive"] is True
    assert found["reason"] == "driver upgrade from 580.95.05"
    [change] = found["changes"]
    assert change["change"] == "driver upgrade from 580.95.05" and change["disruptive"] is True
    assert "kernel module is replaced" in change["why"]


@pytest.mark.parametrize("driver", [{}, {"loaded": False, "version": "580.95.05"}, {"loaded": False}],
                         ids=["nothing-known", "installed-not-loaded", "not-loaded"])
def test_a_driver_on_a_node_without_a_loaded_driver_is_an_install(driver):
    found = classify(INSTALL, driver, UPGRADE_PROBE)
    assert found["disruptive"] is True and found["reason"] == "driver install"


@pytest.mark.parametrize("probe", [{"unseen": ["nvidia-driver-580"]}, {"driver_changed": True},
                                   {"packages_changed": True, "unseen": []}],
                         ids=["unseen", "driver_changed", "packages_changed"])
def test_each_sign_of_a_driver_change_in_the_probe_counts(probe):
    found = classify(INSTALL, LOADED, probe)
    assert found["disruptive"] is True and found["reason"] == "driver upgrade from 580.95.05"


@pytest.mark.parametrize("probe", [{}, {"skipped": True, "packages_changed": True},
                                   {"packages_changed": False, "unseen": [], "driver_changed": False}],
                         ids=["no-probe", "skipped", "nothing-to-change"])
def test_toolkit_cdi_and_a_containerd_restart_are_not_disruptive(probe):
    found = classify(INSTALL, LOADED, probe, toolkit_due=True, cdi_due=True, configure_due=True)
    assert found["disruptive"] is False and found["reason"] == ""
    assert [(c["change"], c["disruptive"]) for c in found["changes"]] == [
        ("container toolkit", False), ("CDI spec", False), ("containerd config and a k3s/rke2 restart", False)]
    assert all(c["why"] for c in found["changes"])


def test_nothing_due_is_no_change_at_all():
    assert classify() == {"disruptive": False, "reason": "", "changes": []}


@pytest.mark.parametrize("driver", [LOADED, {}, {"loaded": False}], ids=["loaded", "unknown", "not-loaded"])
def test_a_driver_removal_the_package_manager_would_make_is_disruptive(driver):
    found = classify({"remove_driver": True}, driver, removal_probe={"packages_changed": True})
    assert found["disruptive"] is True and found["reason"] == "driver removal"


@pytest.mark.parametrize("removal_probe", [{}, {"packages_changed": False}, {"skipped": True, "packages_changed": True}],
                         ids=["no-probe", "packages-gone", "skipped"])
def test_removing_a_driver_whose_packages_are_gone_is_no_change(removal_probe):
    """A second gpu_node_state=absent run: the packages are removed already, so nothing is drained again."""
    assert classify({"remove_driver": True}, LOADED, removal_probe=removal_probe)["disruptive"] is False


def test_a_declared_change_is_disruptive():
    found = classify(declared="kernel upgrade to 6.8")
    assert found["disruptive"] is True and found["reason"] == "kernel upgrade to 6.8"
    assert found["changes"][0]["why"] == "declared disruptive (gpu_node_disruptive_change)"


def test_a_resume_is_disruptive():
    found = classify(resume=True)
    assert found["disruptive"] is True and found["reason"] == "finish the rollout a stopped run left"


def test_the_reason_joins_every_disruptive_change_and_leaves_out_the_others():
    found = classify(INSTALL, LOADED, UPGRADE_PROBE, declared="kernel upgrade", resume=True, toolkit_due=True)
    assert found["reason"] == "driver upgrade from 580.95.05; kernel upgrade; finish the rollout a stopped run left"
    assert [c["disruptive"] for c in found["changes"]] == [True, True, True, False]


@pytest.mark.parametrize("reboot, driver, says", [
    ("always", LOADED, "gpu_node_driver_reboot: always reboots the node"),
    ("always", {}, "gpu_node_driver_reboot: always reboots the node"),
    ("if_needed", LOADED, "gpu_node_driver_reboot: if_needed reboots the node"),
    ("if_needed", {}, None),
    ("never", LOADED, None),
])
def test_the_reboot_policy_is_in_the_why_where_it_reboots(reboot, driver, says):
    why = classify(INSTALL, driver, UPGRADE_PROBE, reboot=reboot)["changes"][0]["why"]
    if says:
        assert says in why
    else:
        assert "reboot" not in why


# ---- drain_decision ----------------------------------------------------------------------------------------------

UPGRADE = disruption.classify(INSTALL, LOADED, UPGRADE_PROBE, "if_needed")
NOT_DISRUPTIVE = disruption.classify({}, LOADED, {}, "never", toolkit_due=True)


@pytest.mark.parametrize("drain, kubeconfig, runs", [("auto", "", True), ("auto", "/k.yaml", True), ("never", "", True)])
def test_a_change_that_does_not_disrupt_drains_nothing(drain, kubeconfig, runs):
    assert disruption.drain_decision("gpu1", NOT_DISRUPTIVE, drain, kubeconfig, runs) == {"drain": False, "note": ""}


def test_drain_never_leaves_the_node_alone_and_says_so():
    found = disruption.drain_decision("gpu1", UPGRADE, disruption.DRAIN_NEVER, "", True)
    assert found["drain"] is False
    assert found["note"].startswith("gpu1: driver upgrade from 580.95.05 disrupts its GPU pods")
    assert "gpu_node_drain: never" in found["note"]


def test_a_disruptive_change_on_a_kubernetes_node_without_a_kubeconfig_is_refused():
    with pytest.raises(K3sGpuError) as raised:
        disruption.drain_decision("gpu1", UPGRADE, disruption.DRAIN_AUTO, "", runs_kubernetes=True)
    error = raised.value
    assert "gpu1" in error.cause and "driver upgrade from 580.95.05" in error.cause
    assert "no kubeconfig" in error.cause
    assert "gpu_node_kubeconfig" in error.fix and "gpu_node_drain: never" in error.fix


def test_a_node_without_kubernetes_has_nothing_to_drain():
    found = disruption.drain_decision("gpu1", UPGRADE, disruption.DRAIN_AUTO, "", runs_kubernetes=False)
    assert found["drain"] is False
    assert "gpu1" in found["note"] and "nothing to drain" in found["note"]


@pytest.mark.parametrize("check_mode, verb", [(True, "would"), (False, "will")])
def test_with_a_kubeconfig_the_role_drains(check_mode, verb):
    found = disruption.drain_decision("gpu1", UPGRADE, disruption.DRAIN_AUTO, "/k.yaml", True, check_mode=check_mode)
    assert found["drain"] is True
    assert found["note"].startswith("gpu1: driver upgrade from 580.95.05: %s cordon the node" % verb)
    assert "prove it with a GPU pod" in found["note"]
