# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One reading of a node by runtime_info, typed at its top level (NodeFacts): what every wing reads of a node, the
engine, the role, the cluster objects and the diagnosis alike.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _k3s_config as k3s_config

# the reading's sections every NodeFacts has (runtime_info documents each)
_SECTIONS = {"distribution": str, "release": str, "root": str, "profile": dict, "paths": dict, "runtimes": list,
             "release_runtimes": list, "driver": dict, "toolkit": dict, "cdi": dict, "gpu_operator": dict, "units": list,
             "files": dict}


# the fix of every refusal here: the host state is the role's own, handed from one task to the next
UNCHANGED = "pass the registered result of the role's host step (gpu_node_result.node) unchanged"


def _refuse(what, key, expected, reading, fix=UNCHANGED, variable=None):
    found = "a %s" % type(reading[key]).__name__ if key in reading else "missing"
    return K3sGpuError("%s: %s is %s, not a %s" % (what, key, found, expected), fix, variable)


@dataclass(frozen=True)
class NodeFacts:
    """One reading of a node by runtime_info, typed at its top level. `reading` is the whole result as the module
    returned it, for the sections that are not fields here (systemd, loaded_config, other_dropins, binaries, ...) and
    for the node side's planner (module_utils/_plan), which takes the dict. The engine (_host_plan.first_decision,
    _decide.decide, _render.render, _template_check, _configure.run, _doctor.check_node) takes a NodeFacts, and so does the cluster
    side for its server's reading (_cluster_step.decide, _gpu_operator.plan_cluster, _runtimeclasses.plan_runtimeclasses,
    _device_plugin.plan_cluster)."""
    distribution: str
    release: str
    root: str
    profile: Dict[str, Any]
    paths: Dict[str, Any]
    runtimes: List[Dict[str, Any]]
    release_runtimes: List[Dict[str, Any]]
    driver: Dict[str, Any]
    toolkit: Dict[str, Any]
    cdi: Dict[str, Any]
    gpu_operator: Dict[str, Any]
    units: List[str]
    files: Dict[str, Any]
    reading: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_reading(cls, reading, what="the node's reading", fix=UNCHANGED, variable=None):
        """NodeFacts of runtime_info's result (its warnings already taken by the caller). Raises K3sGpuError with
        fix and variable (the role's host state by default; containerd_runtimes names its option node_facts)."""
        if not isinstance(reading, dict):
            raise K3sGpuError("%s is a %s, not a mapping" % (what, type(reading).__name__), fix, variable)
        for key, expected in _SECTIONS.items():
            if not isinstance(reading.get(key), expected):
                raise _refuse(what, key, expected.__name__, reading, fix, variable)
        # config.yaml as YAML reads it (the node's stdlib reader follows plain lines only)
        k3s_config.apply(reading)
        return cls(reading=reading, **dict((key, reading[key]) for key in _SECTIONS))

    def host_path(self, node_path):
        """Where node_path lies on the host that was read (the same path unless root is a sandbox tree)."""
        return node_path if self.root in ("", "/") else self.root.rstrip("/") + node_path

    @property
    def handlers(self):
        """The runtime handlers the release renders itself (names)."""
        return [r["name"] for r in self.release_runtimes]

    @property
    def nvidia_ctk(self):
        return self.toolkit.get("nvidia_ctk")

    @property
    def systemd_cgroup(self):
        """Whether the node's runc runs with SystemdCgroup (the release's template data and base emit it)."""
        return bool(self.reading.get("systemd_cgroup"))

    @property
    def default_runtime(self):
        """The default runtime the node's containerd runs with now (None: runc), as runtime_info read it."""
        return (self.reading.get("default_runtime") or {}).get("value")

    @property
    def other_dropins(self):
        """The drop-ins of containerd's import directories that are not the collection's ([] where none were read)."""
        return self.reading.get("other_dropins") or []
