# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's package decisions: repositories, pinned packages, holds, locks, removal, reboot."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _packages as packages
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

UBUNTU = {"os_family": "Debian", "distribution": "Ubuntu", "distribution_major_version": "24",
          "distribution_version": "24.04", "architecture": "x86_64", "kernel": "6.8.0-49-generic"}
DEBIAN = dict(UBUNTU, distribution="Debian", distribution_major_version="12", distribution_version="12.8")
ROCKY = {"os_family": "RedHat", "distribution": "Rocky", "distribution_major_version": "9", "distribution_version": "9.5",
         "architecture": "aarch64", "kernel": "5.14.0-503.el9.aarch64"}
ARCH = {"os_family": "Archlinux", "distribution": "Archlinux", "distribution_major_version": "rolling",
        "architecture": "x86_64", "kernel": "6.12"}


def settings(**overrides):
    """The role's defaults (from its argument spec), as the action reads them, with overrides."""
    values = dict(("gpu_node_" + key, value) for key, value in overrides.items())
    return role_vars.read(values, lambda value: value)


def test_toolkit_apt_source_pins_every_package_and_trusts_only_its_key():
    source = packages.toolkit_source(settings(), "apt", "gpu1")
    assert source["url"] == "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"
    assert source["packages"] == ["nvidia-container-toolkit=1.20.0-1", "nvidia-container-toolkit-base=1.20.0-1",
                                  "libnvidia-container-tools=1.20.0-1", "libnvidia-container1=1.20.0-1",
                                  "nvidia-container-toolkit-operator-extensions=1.20.0-1"]
    assert source["held"] == [p.split("=")[0] for p in source["packages"]]
    assert (source["key_path"], source["repo_file"], source["legacy_file"]) == (
        "/etc/apt/keyrings/nvidia-container-toolkit.asc", "/etc/apt/sources.list.d/nvidia-container-toolkit.sources",
        "/etc/apt/sources.list.d/nvidia-container-toolkit.list")
    assert source["fingerprint"] == "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
    assert packages.stages(source) == [source["packages"]]


def test_toolkit_dnf_source_without_extensions_or_hold():
    source = packages.toolkit_source(settings(toolkit_operator_extensions=False, toolkit_hold=False,
                                              toolkit_version="1.17.8-1"), "dnf", "gpu1")
    assert source["url"] == "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch"
    assert source["packages"][0] == "nvidia-container-toolkit-1.17.8-1" and len(source["packages"]) == 4
    assert source["held"] == [] and source["repo_gpgcheck"] is True
    assert (source["key_path"], source["repo_file"], source["legacy_file"]) == (
        "/etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit", "/etc/yum.repos.d/nvidia-container-toolkit.repo", None)


def test_package_manager_setting_wins_over_the_os_family():
    assert packages.package_family(settings(), UBUNTU) == "apt"
    assert packages.package_family(settings(), ROCKY) == "dnf"
    assert packages.package_family(settings(), ARCH) == ""
    assert packages.package_family(settings(package_manager="dnf"), UBUNTU) == "dnf"


def test_unknown_package_manager_is_refused_in_the_users_terms():
    with pytest.raises(K3sGpuError, match=r"^gpu1: the role installs the NVIDIA container toolkit with apt.*"
                       r"gpu_node_toolkit_install=false, or set gpu_node_package_manager"):
        packages.toolkit_source(settings(), "", "gpu1")
    with pytest.raises(K3sGpuError, match=r"this host is Archlinux .*gpu_node_driver_packages"):
        packages.driver_source(settings(), ARCH, "apt", "gpu1")


@pytest.mark.parametrize("branch, version, names, pinning", [
    ("580", "", ["libnvidia-compute-580", "nvidia-utils-580", "nvidia-dkms-580-open"], ""),
    ("590", "", ["libnvidia-compute", "nvidia-utils", "nvidia-dkms-open"], "nvidia-driver-pinning-590"),
    ("590", "590.44.01", ["libnvidia-compute", "nvidia-utils", "nvidia-dkms-open"], "nvidia-driver-pinning-590.44.01"),
])
def test_ubuntu_driver_packages_by_branch(branch, version, names, pinning):
    chosen = settings(driver_branch=branch, driver_version=version)
    assert packages.driver_names(chosen, UBUNTU) == names
    assert packages.driver_pinning_package(chosen, UBUNTU) == pinning


def test_debian_driver_source_pins_with_the_pinning_package_first():
    source = packages.driver_source(settings(driver_version="580.105.08"), DEBIAN, "apt", "gpu1")
    assert source["url"] == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64 /"
    assert source["key_url"] == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub"
    assert source["fingerprint"] == "EB693B3035CD5710E231E123A4B469963BF863CC"
    assert source["preinstall"] == ["nvidia-driver-pinning-580.105.08"]
    # a bare version matches any packaging revision
    assert source["packages"] == ["nvidia-driver-cuda=580.105.08-*", "nvidia-kernel-open-dkms=580.105.08-*",
                                  "linux-headers-6.8.0-49-generic"]
    assert source["held"] == ["nvidia-driver-cuda", "nvidia-kernel-open-dkms"]
    assert packages.stages(source) == [source["preinstall"], source["packages"]]


def test_rhel_rebuild_driver_source_uses_the_module_stream_and_sbsa():
    source = packages.driver_source(settings(driver_open_kernel_modules=False, driver_version="580.95.05-1"), ROCKY,
                                    "dnf", "gpu1")
    assert source["url"] == "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/sbsa"
    assert source["key_url"].endswith("/rhel9/sbsa/D42D0685.pub")
    assert source["dnf_module"] == "nvidia-driver:580-dkms"
    assert source["packages"] == ["nvidia-driver-cuda-580.95.05-1", "kmod-nvidia-latest-dkms-580.95.05-1",
                                  "kernel-devel-5.14.0-503.el9.aarch64", "kernel-headers"]
    assert source["preinstall"] == []


def test_custom_driver_packages_and_repository_on_an_os_without_a_cuda_repository():
    chosen = settings(driver_packages=["nvidia-open"], driver_repo_url="https://mirror.example/cuda",
                      driver_gpg_key_url="https://mirror.example/key", driver_gpg_fingerprint="AB CD",
                      driver_kernel_headers=False)
    source = packages.driver_source(chosen, dict(DEBIAN, distribution_major_version="13"), "apt", "gpu1")
    assert (source["url"], source["key_url"], source["fingerprint"]) == ("https://mirror.example/cuda /",
                                                                         "https://mirror.example/key", "AB CD")
    assert source["packages"] == ["nvidia-open"] and source["preinstall"] == [] and source["dnf_module"] == ""


def test_gpg_fingerprints_and_matching():
    colons = "pub:-:4096:1:DDCAE044F796ECB0:1:::::::scESC::::::23::0:\nfpr:::::::::C95B321B61E88C1809C4F759DDCAE044F796ECB0:\n"
    found = packages.key_fingerprints(colons)
    assert found == ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"]
    assert packages.fingerprint_matches("c95b 321b61e88c1809c4f759ddcae044f796ecb0", found)
    assert not packages.fingerprint_matches("EB693B3035CD5710E231E123A4B469963BF863CC", found)


def test_version_locks_stale_and_missing():
    lines = ["nvidia-container-toolkit-0:1.17.8-1.*", "nvidia-container-toolkit-base-1.17.8-1.*",
             "libnvidia-container1-0:1.18.0-1.*", "unrelated-pkg-2.0-3.el9.*", "garbage"]
    locks = packages.version_locks(lines)
    assert ("libnvidia-container1", "1.18.0-1.*") in locks and len(locks) == 4
    source = dict(held=["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                        "libnvidia-container1"], version="1.17.8-1")
    assert packages.locked_at(locks, "1.17.8-1") == ["nvidia-container-toolkit", "nvidia-container-toolkit-base"]
    assert packages.stale_locks(source, locks) == ["libnvidia-container1"]
    assert packages.locks_to_add(source, locks) == ["libnvidia-container-tools-1.17.8-1", "libnvidia-container1-1.17.8-1"]
    # a version that is only a prefix of the locked one's is not "at the version"
    assert packages.locked_at([("a", "1.17.80-1")], "1.17.8") == []


def test_removal_of_toolkit_and_driver():
    toolkit = packages.removal("toolkit", settings(), UBUNTU, "apt", "gpu1", remove_source=True)
    assert toolkit["packages"][0] == "nvidia-container-toolkit" and len(toolkit["packages"]) == 5
    assert toolkit["files"] == ["/etc/apt/sources.list.d/nvidia-container-toolkit.sources",
                                "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
                                "/etc/apt/keyrings/nvidia-container-toolkit.asc"]
    assert not toolkit["nouveau_blacklist"]
    driver = packages.removal("driver", settings(), DEBIAN, "apt", "gpu1", remove_source=True)
    assert driver["packages"] == ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-driver-pinning-580"]
    assert driver["nouveau_blacklist"] and "/etc/apt/keyrings/nvidia-cuda.asc" in driver["files"]
    kept = packages.removal("toolkit", settings(), ROCKY, "dnf", "gpu1", remove_source=False)
    assert kept["files"] == [] and kept["family"] == "dnf"
    with pytest.raises(K3sGpuError, match="removes the NVIDIA driver with apt or dnf"):
        packages.removal("driver", settings(), ARCH, "", "gpu1", remove_source=True)


@pytest.mark.parametrize("before, modinfo, nouveau, modprobe, expected", [
    ({"loaded": False}, "580.105.08", True, None, (True, "nouveau is loaded")),
    ({"loaded": True, "version": "580.95.05"}, "580.105.08", False, None,
     (True, "driver 580.95.05 is loaded, 580.105.08 installed")),
    ({"loaded": True, "version": "580.105.08"}, "580.105.08", False, None,
     (False, "driver 580.105.08 is loaded, 580.105.08 installed")),
    ({"loaded": False}, "580.105.08", False, {"rc": 0}, (False, "modprobe nvidia loaded it")),
    ({"loaded": False}, "", False, {"rc": 1, "stderr": "modprobe: FATAL: Module nvidia not found\n"},
     (True, "modprobe nvidia failed: modprobe: FATAL: Module nvidia not found")),
])
def test_reboot_decision(before, modinfo, nouveau, modprobe, expected):
    assert packages.reboot_decision(before, modinfo, nouveau, modprobe) == expected
