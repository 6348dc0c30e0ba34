# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's package decisions (pure, controller side): which signed repository, which packages at
which version, which holds, for the NVIDIA container toolkit and the NVIDIA driver, on apt and dnf hosts.
The gpu_node_packages action carries them out with Ansible's own modules.

PRIVATE to the collection."""

from __future__ import annotations

import re

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

APT = "apt"
DNF = "dnf"
FAMILIES = {"Debian": APT, "RedHat": DNF}
TOOLKIT = "toolkit"
DRIVER = "driver"
SOURCE_NAMES = {TOOLKIT: "nvidia-container-toolkit", DRIVER: "nvidia-cuda"}
TITLES = {TOOLKIT: "NVIDIA container toolkit", DRIVER: "NVIDIA driver"}

# `dnf versionlock list` lines: name-[epoch:]version-release[.*], e.g. nvidia-container-toolkit-0:1.17.8-1.*
_LOCK_LINE = re.compile(r"^(?P<name>.+)-(?:[0-9]+:)?(?P<evr>[^-]+-[^-]+)$")


def package_family(settings, facts):
    """apt or dnf (gpu_node_package_manager, else the OS family), or "" where neither applies."""
    if settings.get("package_manager") not in (None, "", "auto"):
        return settings["package_manager"]
    return FAMILIES.get(facts.get("os_family") or "", "")


def os_key(facts):
    """"<distribution>-<major>" as NVIDIA's CUDA repository names its OS directories (RHEL rebuilds count as RedHat)."""
    name = facts.get("distribution") or ""
    if name in release_rules.REDHAT_REBUILDS:
        name = "RedHat"
    return "%s-%s" % (name, facts.get("distribution_major_version") or "")


def source_files(name, family):
    """(key path, repository file, one-line .list file of earlier versions or None) of a repository."""
    if family == DNF:
        return ("%s/RPM-GPG-KEY-%s" % (release_rules.KEYRING_DIRS[DNF], name), "/etc/yum.repos.d/%s.repo" % name, None)
    return ("%s/%s.asc" % (release_rules.KEYRING_DIRS[APT], name), "/etc/apt/sources.list.d/%s.sources" % name,
            "/etc/apt/sources.list.d/%s.list" % name)


def _source(kind, family, **fields):
    key_path, repo_file, legacy_file = source_files(SOURCE_NAMES[kind], family)
    source = dict(kind=kind, name=SOURCE_NAMES[kind], title=TITLES[kind], family=family, key_path=key_path,
                  repo_file=repo_file, legacy_file=legacy_file, preinstall=[], held=[], version="", gpgcheck=True,
                  repo_gpgcheck=False, dnf_module="")
    source.update(fields)
    return source


def toolkit_names(settings):
    return list(release_rules.TOOLKIT_PACKAGES) + ([release_rules.TOOLKIT_OPERATOR_EXTENSIONS]
                                                   if settings.get("toolkit_operator_extensions") else [])


def _pinned(names, version, family):
    return ["%s%s%s" % (name, "=" if family == APT else "-", version) for name in names]


def toolkit_source(settings, family, host):
    """The toolkit's repository (NVIDIA signs its metadata and, since 1.17, its packages) and pinned packages."""
    if family not in (APT, DNF):
        raise K3sGpuError(
            "%s: the role installs the NVIDIA container toolkit with apt (Debian, Ubuntu) or dnf (RHEL, Rocky, Alma), "
            "and this host's package manager is unknown" % host,
            fix="install the toolkit yourself and set gpu_node_toolkit_install=false, or set gpu_node_package_manager. "
                "Nothing was changed.")
    names = toolkit_names(settings)
    version = settings["toolkit_version"]
    return _source(TOOLKIT, family,
                   url=settings["toolkit_apt_repo_url"] + " /" if family == APT else settings["toolkit_dnf_repo_url"],
                   key_url=settings["toolkit_gpg_key_url"], fingerprint=settings["toolkit_gpg_fingerprint"],
                   packages=_pinned(names, version, family), held=names if settings["toolkit_hold"] else [],
                   version=version, gpgcheck=bool(settings["toolkit_dnf_gpgcheck"]), repo_gpgcheck=True)


def _branch_number(settings):
    digits = re.match(r"[0-9]*", str(settings["driver_branch"])).group(0)
    return int(digits) if digits else 0


def driver_names(settings, facts):
    """The driver's packages: gpu_node_driver_packages, else the compute-only set of the OS family and branch."""
    if settings.get("driver_packages"):
        return list(settings["driver_packages"])
    family_key = os_key(facts).split("-")[0]
    branch, open_modules = str(settings["driver_branch"]), settings["driver_open_kernel_modules"]
    if family_key == "Ubuntu":
        if _branch_number(settings) < release_rules.UBUNTU_UNBRANCHED_DRIVER_FROM:
            return ["libnvidia-compute-" + branch, "nvidia-utils-" + branch,
                    "nvidia-dkms-" + branch + ("-open" if open_modules else "")]
        return ["libnvidia-compute", "nvidia-utils", "nvidia-dkms" + ("-open" if open_modules else "")]
    if family_key == "Debian":
        return ["nvidia-driver-cuda", "nvidia-kernel-open-dkms" if open_modules else "nvidia-kernel-dkms"]
    return ["nvidia-driver-cuda", "kmod-nvidia-open-dkms" if open_modules else "kmod-nvidia-latest-dkms"]


def driver_pinning_package(settings, facts):
    """NVIDIA's nvidia-driver-pinning-<branch or version> (Debian; Ubuntu from 590 on), or ""."""
    if settings.get("driver_packages"):
        return ""
    family_key = os_key(facts).split("-")[0]
    if family_key == "Debian" or (family_key == "Ubuntu"
                                  and _branch_number(settings) >= release_rules.UBUNTU_UNBRANCHED_DRIVER_FROM):
        return "nvidia-driver-pinning-%s" % (settings["driver_version"] or settings["driver_branch"])
    return ""


def driver_source(settings, facts, family, host):
    """NVIDIA's CUDA repository for this OS and machine, and the pinned driver packages (kernel headers included)."""
    key = os_key(facts)
    custom = bool(settings["driver_packages"]) and bool(settings["driver_repo_url"])
    if family not in (APT, DNF) or (key not in release_rules.CUDA_REPO_OS and not custom):
        raise K3sGpuError(
            "%s: the role installs the NVIDIA driver on Ubuntu 22.04/24.04, Debian 12 and RHEL/Rocky/Alma 8 "
            "and 9" % (host,),
            fix="this host is %s %s. Install the driver yourself and set gpu_node_driver_install=false, or name the "
                "packages in gpu_node_driver_packages and the repository in gpu_node_driver_repo_url. Nothing was "
                "changed." % (facts.get("distribution") or "unknown", facts.get("distribution_version") or ""))
    arch = facts.get("architecture") or ""
    url = settings["driver_repo_url"] or "%s/%s/%s" % (
        release_rules.CUDA_REPO_URL, release_rules.CUDA_REPO_OS.get(key, ""), release_rules.CUDA_REPO_ARCH.get(arch, arch))
    key_file, fingerprint = release_rules.CUDA_REPO_KEYS[family]
    names = driver_names(settings, facts)
    version = settings["driver_version"]
    if version:
        # a bare version (580.95.05) matches any packaging revision; a full one (580.95.05-1) only itself
        packages = _pinned(names, version + ("" if "-" in version or family == DNF else "-*"), family)
    else:
        packages = list(names)
    if settings["driver_kernel_headers"]:
        kernel = facts.get("kernel") or ""
        packages += ["linux-headers-" + kernel] if family == APT else ["kernel-devel-" + kernel, "kernel-headers"]
    pinning = driver_pinning_package(settings, facts)
    dnf_module = ""
    if os_key(facts).startswith("RedHat-") and not settings["driver_packages"]:
        dnf_module = "nvidia-driver:%s%s" % (settings["driver_branch"],
                                             "-open" if settings["driver_open_kernel_modules"] else "-dkms")
    return _source(DRIVER, family, url=url + (" /" if family == APT else ""),
                   key_url=settings["driver_gpg_key_url"] or "%s/%s" % (url, key_file),
                   fingerprint=settings["driver_gpg_fingerprint"] or fingerprint,
                   # NVIDIA's pinning package selects the branch (or version) only once it is installed
                   preinstall=[pinning] if pinning else [], packages=packages,
                   held=names if version and settings["driver_hold"] else [], version=version, dnf_module=dnf_module)


def removal(kind, settings, facts, family, host, remove_source):
    """What taking the toolkit or the driver back removes: packages (holds and locks released first), and with
    remove_source the repository and its key (the driver also its nouveau blacklist)."""
    if family not in (APT, DNF):
        raise K3sGpuError(
            "%s: the role removes the %s with apt or dnf, and this host's package manager is "
            "unknown" % (host, TITLES[kind]),
            fix="remove its packages yourself, or set gpu_node_package_manager. Nothing was changed.")
    if kind == TOOLKIT:
        names = toolkit_names(settings)
    else:
        pinning = driver_pinning_package(settings, facts)
        names = driver_names(settings, facts) + ([pinning] if pinning else [])
    key_path, repo_file, legacy_file = source_files(SOURCE_NAMES[kind], family)
    files = [f for f in (repo_file, legacy_file, key_path) if f] if remove_source else []
    return dict(kind=kind, title=TITLES[kind], family=family, packages=names, files=files,
                nouveau_blacklist=kind == DRIVER and remove_source)


def key_fingerprints(gpg_colons):
    """The fingerprints in `gpg --show-keys --with-colons` output (fpr records, field 10)."""
    fingerprints = []
    for line in gpg_colons.splitlines():
        fields = line.split(":")
        if fields[0] == "fpr" and len(fields) > 9:
            fingerprints.append(fields[9])
    return fingerprints


def fingerprint_matches(wanted, fingerprints):
    return wanted.upper().replace(" ", "") in fingerprints


def version_locks(lines):
    """[(name, version-release)] of `dnf versionlock list` output."""
    locks = []
    for line in lines:
        found = _LOCK_LINE.match(line.strip())
        if found:
            locks.append((found.group("name"), found.group("evr")))
    return locks


def locked_at(locks, version):
    """The names locked at `version`: their version-release starts with "<version>-" or "<version>."."""
    return [name for name, evr in locks if evr.startswith(version + "-") or evr.startswith(version + ".")]


def stale_locks(source, locks):
    """Held names locked at another version (the pin moved): released before the install."""
    at_version = set(locked_at(locks, source["version"]))
    names = set(name for name, _evr in locks)
    return [name for name in source["held"] if name in names and name not in at_version]


def locks_to_add(source, locks):
    at_version = set(locked_at(locks, source["version"]))
    return ["%s-%s" % (name, source["version"]) for name in source["held"] if name not in at_version]


def stages(source):
    """The install steps in order: the pinning package alone first (it must be in place before the packages it pins
    are resolved), then the packages."""
    return [stage for stage in (source["preinstall"], source["packages"]) if stage]


def reboot_decision(before, modinfo_version, nouveau_loaded, modprobe):
    """After a driver change: (reboot needed, why). before: the driver the node had loaded ({loaded, version});
    modinfo_version: the installed module's version; modprobe: the `modprobe nvidia` result, or None if not run."""
    if nouveau_loaded:
        return True, "nouveau is loaded"
    if before.get("loaded"):
        installed = modinfo_version or "none"
        return before.get("version") != modinfo_version, "driver %s is loaded, %s installed" % (before.get("version"), installed)
    if modprobe is not None and modprobe.get("rc") == 0:
        return False, "modprobe nvidia loaded it"
    return True, "modprobe nvidia failed: %s" % ((modprobe or {}).get("stderr") or "").strip()
