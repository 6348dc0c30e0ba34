# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The facts step: one runtime_info reading of the node with the file texts (or the one the task was handed, where it
fits the task's options), typed as a _node_facts.NodeFacts, and what the engine and the doctor read out of it.

PRIVATE to the collection. Controller side. `execute_module(name, args)` runs a module on the host of the task."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


def facts_for(result: Dict[str, Any], params: Mapping[str, Any], execute_module: Callable[[str, Dict[str, Any]], Dict[str, Any]],
              binaries: Sequence[str]) -> Optional[NodeFacts]:
    """The NodeFacts containerd_runtimes works on, for its options (binaries: the runtimes' own binaries, each
    looked at on the node). Notes in the task's result where they come from (facts_source) and the reading's
    warnings; None where the task fails (result["failed"] and its message set)."""
    reading, result["facts_source"] = node_facts(params, execute_module, binaries)
    if reading.get("failed"):
        result.update(failed=True, msg=reading.get("msg"), error=reading.get("error"))
        return None
    if result["facts_source"] == "read":
        # the reading's warnings become this task's (ansible-core 2.19+ hands them over as WarningSummary
        # objects, which Display.warning does not take; the task result's `warnings` takes both)
        result.setdefault("warnings", []).extend(reading.get("warnings") or [])
    try:
        facts = typed(reading, result["facts_source"])
    except K3sGpuError as exc:
        result.update(failed=True, msg=exc.text(), error=exc.as_dict(), changed=False)
        return None
    if result["facts_source"] == "node_facts" and facts.profile.get("assumed_warning"):
        result.setdefault("warnings", []).append(facts.profile["assumed_warning"])  # this task writes on it too
    for binary in binaries:
        facts.reading["binaries"].setdefault(binary, {"path": binary, "state": "relative"})
    return facts


def node_facts(params: Mapping[str, Any], execute_module: Callable[[str, Dict[str, Any]], Dict[str, Any]],
               binaries: Sequence[str]) -> Tuple[Dict[str, Any], str]:
    """(reading, source) for containerd_runtimes' options: params["node_facts"] where it fits them (a copy, source
    "node_facts") and was read with the same newer_release policy, else the node read now ("read"). A failed reading
    is returned as the module's result."""
    reading = given_facts(params, binaries)
    if reading is not None and (reading.get("read_options") or {}).get("newer_release", "refuse") != params["newer_release"]:
        reading = None  # read with another newer_release policy: the profile may be refused or assumed differently
    if reading is not None:
        return reading, "node_facts"
    return read_node(execute_module, params, binaries), "read"


def typed(reading: Dict[str, Any], source: str) -> NodeFacts:
    """The NodeFacts of a reading of node_facts(). Raises K3sGpuError naming the option where node_facts is not
    runtime_info's result."""
    if source == "node_facts":
        return NodeFacts.from_reading(reading, "{node_facts}", "pass the registered result of "
                                      "k3s_gpu.nvidia.runtime_info (include_content: true), unchanged",
                                      "node_facts")
    return NodeFacts.from_reading(reading, "runtime_info's reading of the node", "")


def given_facts(params: Mapping[str, Any], binaries: Sequence[str]) -> Optional[Dict[str, Any]]:
    """A copy of params["node_facts"] when that reading fits this task's options, else None (read the node)."""
    given = params.get("node_facts")
    if not given or given.get("failed") or given.get("skipped"):
        return None
    options = given.get("read_options") or {}
    fits = (options.get("include_content") is True
            and options.get("root") == params["root"]
            and params["distribution"] in ("auto", given.get("distribution"))
            and params["release"] in (None, given.get("release"))
            and options.get("data_dir") == params["data_dir"]
            and list(options.get("toolkit_dirs") or []) == list(params["toolkit_dirs"] or [])
            and options.get("path") == params["path"]
            and all(b in (given.get("binaries") or {}) for b in binaries if b.startswith("/")))
    return copy.deepcopy(dict(given)) if fits else None


def read_node(execute_module: Callable[[str, Dict[str, Any]], Dict[str, Any]], params: Mapping[str, Any],
              binaries: Sequence[str] = ()) -> Dict[str, Any]:
    """A runtime_info reading with the file texts, for these options. The module's result (failed included)."""
    return execute_module("k3s_gpu.nvidia.runtime_info", dict(
        root=params["root"], distribution=params["distribution"], release=params["release"], data_dir=params["data_dir"],
        toolkit_dirs=params["toolkit_dirs"], path=params.get("path"), newer_release=params["newer_release"],
        binaries=[b for b in binaries if b.startswith("/")], include_content=True, include_plan=False))


def config_text(facts: NodeFacts, key: str) -> Optional[str]:
    """The text of one of the files a reading (read_node, as a NodeFacts) has under `files` (key: generated_config,
    dropin_v3, ...), or None where it is not a file or was read without its text."""
    entry = facts.files.get(key) or {}
    return entry.get("content") if entry.get("state") == "file" else None


def loaded_runtimes(facts: NodeFacts) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """{handler: (BinaryName or None, file)} of the NVIDIA tables in what containerd loads, from a reading (a
    NodeFacts) with the file texts: the config.toml k3s/rke2 wrote and the drop-ins (ours and the others). The drop-ins
    count also before k3s/rke2 has started once (no config.toml yet): containerd imports them at its first start."""
    schema = facts.profile.get("schema") or 2
    paths = facts.paths
    texts = [(paths.get("config"), config_text(facts, "generated_config"))]
    for key in ("dropin_v3", "dropin_v2", "dropin"):
        if key in paths:
            texts.append((paths[key], config_text(facts, key)))
    texts += [(d.get("path"), d.get("content")) for d in facts.other_dropins]
    found = {}
    for path, text in texts:
        if not text:
            continue
        try:
            data = toml.loads(text)
        except ValueError:
            continue
        for file_schema in (schema, 3, 2):
            section = toml.containerd_section(data, file_schema)
            if section and isinstance(section.get("runtimes"), dict):
                for name, table in section["runtimes"].items():
                    if name.startswith("nvidia") and isinstance(table, dict):
                        binary = (table.get("options") or {}).get("BinaryName") if isinstance(table.get("options"), dict) else None
                        found[name] = (binary, path)
                break
    return found
