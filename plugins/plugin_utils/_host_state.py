# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the gpu_node role knows of one host, typed: the node's reading (NodeFacts), the role's decision (Plan) and
what the containerd step changed (Changes), carried between the role's tasks as one HostState.

The host step serializes a HostState once, as JSON text, into gpu_node_result.node; the next phase, the package step,
the handler and the cluster step read it back with HostState.from_result. Text, not a nested dict: Ansible's main
process walks every key of every registered result (TaskResult.result, the callbacks), and with a dict the host state
was most of that walk, about 0.4 s of a 6.8 s no-op run at 100 hosts under mitogen_linear (benchmarks/RESULTS.md).
PRIVATE to the collection."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

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
    for the node side's planner (module_utils/_plan), which takes the dict. The engine (_gpu_operator.plan_host,
    _changes.compute, _template_check, _configure.run, _doctor.check_node) takes a NodeFacts, and so does the cluster
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


@dataclass(frozen=True)
class Mode:
    """What the role does on the node before containerd is configured (_gpu_operator.plan_node, or the take-back)."""
    mode: str = "host"
    state: str = "present"
    install_toolkit: bool = False
    install_driver: bool = False
    remove_host_toolkit: bool = False
    remove_toolkit_source: bool = False
    remove_driver: bool = False
    remove_operator_leftovers: bool = False
    generate_cdi: bool = False
    default_runtime: str = ""
    pending: List[str] = field(default_factory=list)
    owners: Dict[str, str] = field(default_factory=dict)
    operator_handlers: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, values):
        """The Mode of plan_node's decision (a dict with these fields; {} for a host the role leaves alone)."""
        return cls(**(values or {}))

    @property
    def installs_or_removes(self):
        return bool(self.install_driver or self.install_toolkit or self.remove_host_toolkit or self.remove_driver
                    or self.remove_operator_leftovers)


@dataclass(frozen=True)
class Plan:
    """The role's decision about a host: whether it is a GPU node the role configures (selected), on a real root
    (live), what it does first (mode), what it tells the user (messages), and gpu_node_result's skeleton (result)."""
    selected: bool
    live: bool
    mode: Mode
    messages: List[str]
    result: Dict[str, Any]

    @classmethod
    def from_dict(cls, values):
        return cls(selected=bool(values.get("selected")), live=bool(values.get("live")),
                   mode=Mode.from_dict(values.get("mode")), messages=list(values.get("messages") or []),
                   result=dict(values.get("result") or {}))

    def to_dict(self):
        return {"selected": self.selected, "live": self.live, "mode": asdict(self.mode), "messages": list(self.messages),
                "result": dict(self.result)}


def handlers_of(outcome):
    """The runtime handlers containerd serves after a containerd step (containerd_runtimes' result): those it wrote
    and those the release renders itself."""
    names = [r["name"] for r in (outcome.get("runtimes_written") or []) + (outcome.get("runtimes_skipped") or [])]
    return sorted(set(names))


@dataclass(frozen=True)
class Changes:
    """What the containerd step wrote (containerd_runtimes' result): the handler (restart, verify, roll back) needs
    the files with their backups and the runtime tables the loaded config must then declare."""
    files: List[Dict[str, Any]] = field(default_factory=list)
    handlers: List[str] = field(default_factory=list)

    @classmethod
    def of_step(cls, outcome):
        return cls(files=list(outcome.get("files") or []), handlers=handlers_of(outcome))

    @classmethod
    def from_dict(cls, values):
        return cls(files=list(values.get("files") or []), handlers=list(values.get("handlers") or []))


@dataclass(frozen=True)
class HostState:
    """What one phase of the host step hands to the next (through gpu_node_result.node)."""
    facts: NodeFacts
    plan: Plan
    cdi_marker: str = ""
    changes: Optional[Changes] = None

    def to_result(self):
        """The host state as compact JSON text (gpu_node_result.node)."""
        return json.dumps({"facts": self.facts.reading, "plan": self.plan.to_dict(), "cdi_marker": self.cdi_marker,
                           "changes": asdict(self.changes) if self.changes is not None else None},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_result(cls, node, what="gpu_node_result.node"):
        """The HostState an earlier phase registered: its JSON text, or that text decoded (an argument spec of type
        dict decodes it). Raises K3sGpuError for anything else."""
        node = decoded(node)
        if not isinstance(node, dict) or not isinstance(node.get("plan"), dict):
            raise K3sGpuError("%s holds no host state of the role's host step" % what, UNCHANGED)
        changes = node.get("changes")
        return cls(facts=NodeFacts.from_reading(node.get("facts"), what + ".facts"), plan=Plan.from_dict(node["plan"]),
                   cdi_marker=str(node.get("cdi_marker") or ""),
                   changes=Changes.from_dict(changes) if isinstance(changes, dict) else None)


def decoded(node):
    """gpu_node_result.node as a dict (its JSON text decoded), else None."""
    if isinstance(node, str):
        try:
            node = json.loads(node)
        except ValueError:
            return None
    return node if isinstance(node, dict) else None
