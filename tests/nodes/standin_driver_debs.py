# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""STAND-IN NVIDIA driver packages of NVIDIA's CUDA repository for Debian 12, with shell stubs.

A real driver cannot be built or loaded here (no GPU, and the nodes share the host's kernel), so these
packages carry the names, versions, dependencies and branch-pinning behaviour the role relies on:
- `nvidia-driver-pinning-<branch>` and `nvidia-driver-pinning-<version>` drop an apt preferences file
  that holds the driver packages to that branch or version (Pin-Priority 1000), as NVIDIA's do;
- `nvidia-driver-cuda` (nvidia-smi) and the DKMS module sources `nvidia-kernel-open-dkms` /
  `nvidia-kernel-dkms`, which need `dkms`;
- `dkms` and the running kernel's `linux-headers-<kernel>`: stand-ins too, since DKMS would try to build
  a module against headers the host's kernel does not have here.
"""

from __future__ import annotations

VERSIONS = ("580.95.05-1", "580.105.08-1", "590.44.01-1")
BRANCHES = ("580", "590")
PINNED_PACKAGES = ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms")
DKMS_VERSION = "3.0.10-8+deb12u1+standin1"  # above Debian's, so the node's apt takes the stand-in

SMI = """#!/bin/sh
# STAND-IN nvidia-smi {upstream} (k3s_gpu.nvidia tests): no driver can load here.
case "$1" in
    --version) echo 'NVIDIA-SMI version  : {upstream}'; echo 'DRIVER version     : {upstream}'; exit 0 ;;
esac
echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2
exit 9
"""

DKMS = """#!/bin/sh
# STAND-IN dkms (k3s_gpu.nvidia tests): lists the module sources it was given, builds nothing.
case "$1" in
    status) for d in /usr/src/nvidia-*; do [ -f "$d/dkms.conf" ] && echo "${d#/usr/src/}: added (stand-in)"; done ;;
esac
exit 0
"""


def _pin(packages, version_glob):
    return "".join("Package: %s\nPin: version %s\nPin-Priority: 1000\n\n" % (name, version_glob) for name in packages)


def packages(version):
    """Driver packages of one version (e.g. 580.105.08-1): [{name, depends, files, conflicts}]."""
    upstream = version.split("-")[0]
    kmod_files = {"usr/src/nvidia-%s/dkms.conf" % upstream:
                  ('PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\n# STAND-IN, no sources\n' % upstream, 0o644)}
    return [
        {"name": "nvidia-driver-cuda",
         "depends": "nvidia-kernel-open-dkms (= {0}) | nvidia-kernel-dkms (= {0})".format(version),
         "files": {"usr/bin/nvidia-smi": (SMI.format(upstream=upstream), 0o755)}},
        {"name": "nvidia-kernel-open-dkms", "depends": "dkms", "conflicts": "nvidia-kernel-dkms", "files": kmod_files},
        {"name": "nvidia-kernel-dkms", "depends": "dkms", "conflicts": "nvidia-kernel-open-dkms", "files": kmod_files},
        # one pinning package per exact version, as NVIDIA's nvidia-driver-pinning-<version>
        {"name": "nvidia-driver-pinning-%s" % upstream, "depends": "",
         "files": {"etc/apt/preferences.d/nvidia-driver-pinning-%s" % upstream:
                   (_pin(PINNED_PACKAGES, version), 0o644)}},
    ]


def branch_packages(branch, version):
    """nvidia-driver-pinning-<branch> (packaged at `version`): holds the driver packages to <branch>.*"""
    return [{"name": "nvidia-driver-pinning-%s" % branch, "depends": "",
             "files": {"etc/apt/preferences.d/nvidia-driver-pinning-%s" % branch:
                       (_pin(PINNED_PACKAGES, "%s.*" % branch), 0o644)}}]


def support_packages(kernel):
    """dkms and the kernel headers of `kernel` (the node's uname -r, which is the host's)."""
    return [
        ({"name": "dkms", "depends": "", "files": {"usr/sbin/dkms": (DKMS, 0o755)}}, DKMS_VERSION),
        ({"name": "linux-headers-%s" % kernel, "depends": "",
          "files": {"usr/src/linux-headers-%s/Makefile" % kernel: ("# STAND-IN headers\n", 0o644)}}, "1.0-standin1"),
    ]


def all_packages(kernel):
    """[(package, version)] for the whole stand-in CUDA repository."""
    found = [(pkg, version) for version in VERSIONS for pkg in packages(version)]
    found += [(pkg, "%s.0-1" % branch) for branch in BRANCHES for pkg in branch_packages(branch, None)]
    return found + support_packages(kernel)
