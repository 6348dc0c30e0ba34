# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""runtime_info's reading of a k3s/rke2 server as the cluster side uses it, for the tests that plan a cluster's objects
without a node tree: the release's profile and paths as runtime_info makes them, every other section empty.

The tests type it where they hand it to the engine (NodeFacts.from_reading), as the collection does where a reading
enters."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro


def server_reading(distribution="k3s", release="v1.33.10+k3s1", data_dir=None, newer_release=distro.NEWER_RELEASE_REFUSE,
                   **sections):
    """The reading of a server of this release (sections: any section to set, such as runtimeclasses_disabled)."""
    profile = distro.profile(distribution, release, newer_release)
    reading = {"distribution": distribution, "release": profile["release"], "root": "/", "profile": profile,
               "paths": distro.distribution_paths(distribution, data_dir), "runtimes": [], "release_runtimes": [],
               "driver": {}, "toolkit": {}, "cdi": {}, "gpu_operator": {}, "units": [], "files": {},
               "runtimeclasses_disabled": False, "manifests": {}, "read_options": {"newer_release": newer_release}}
    reading.update(sections)
    return reading
