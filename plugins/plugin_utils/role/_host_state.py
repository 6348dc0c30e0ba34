# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the gpu_node role knows of one host, typed: the node's reading (_node_facts.NodeFacts), the role's decision
(RolePlan) and what the containerd step changed (Changes), carried between the role's tasks as one HostState.

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
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import UNCHANGED, NodeFacts


@dataclass(frozen=True)
class Mode:
    """What the role does on the node before containerd is configured (_host_plan.plan_node, or the take-back)."""
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
class RolePlan:
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
    plan: RolePlan
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
        return cls(facts=NodeFacts.from_reading(node.get("facts"), what + ".facts"), plan=RolePlan.from_dict(node["plan"]),
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
