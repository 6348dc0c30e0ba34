# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What k3s_gpu.nvidia.containerd_runtimes does, for every caller on the controller (its own action plugin and
the gpu_node role's host step): facts from the node in one round trip (none when a fitting runtime_info result
is handed over), TOML decisions here, and every file that changes written in one k3s_gpu.nvidia.node_files
execution, each only if it is still the text the decision was made from.

PRIVATE to the collection. `execute_module(name, args)` runs a module on the host of the task."""

from __future__ import annotations

import os

from ansible import constants as C
from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import CONTAINERD_RUNTIMES_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _changes as changes_engine
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _check_cache as check_cache
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


# containerd_runtimes' options with the file options it passes on to node_files
SPEC = dict(CONTAINERD_RUNTIMES_SPEC)
SPEC.update((k, v) for k, v in FILE_COMMON_ARGUMENTS.items() if k in changes_engine.FILE_ARGS)


def read_node(execute_module, params, binaries=()):
    """A runtime_info reading with the file texts, for these options. The module's result (failed included)."""
    return execute_module("k3s_gpu.nvidia.runtime_info", dict(
        root=params["root"], distribution=params["distribution"], release=params["release"], data_dir=params["data_dir"],
        toolkit_dirs=params["toolkit_dirs"], path=params.get("path"), newer_release=params["newer_release"],
        binaries=[b for b in binaries if b.startswith("/")], include_content=True, include_plan=False))


def config_text(facts, key):
    """The text of one of the files a reading (read_node, as a NodeFacts) has under `files` (key: generated_config,
    dropin_v3, ...), or None where it is not a file or was read without its text."""
    entry = facts.files.get(key) or {}
    return entry.get("content") if entry.get("state") == "file" else None


def loaded_runtimes(facts):
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


def run(result, params, execute_module, want_diff, own_files=False, extra_changes=(), write=True):
    """Fill the task result of containerd_runtimes for params (validated by its argument spec).

    own_files (the gpu_node role): keep the bytes of a user's file before the first edit and put them back on state
    absent (_changes.own_files); extra_changes: more files of the role's, written in the same node_files execution.
    write=False decides only: result["write_due"] says whether node_files would run, and nothing is written."""
    binaries = sorted(set(r["binary"] for r in params["runtimes"] or [] if r.get("binary")))
    reading = changes_engine.given_facts(params, binaries)
    if reading is not None and (reading.get("read_options") or {}).get("newer_release", "refuse") != params["newer_release"]:
        reading = None  # read with another newer_release policy: the profile may be refused or assumed differently
    result["facts_source"] = "node_facts" if reading is not None else "read"
    if reading is None:
        reading = read_node(execute_module, params, binaries)
        if reading.get("failed"):
            result.update(failed=True, msg=reading.get("msg"), error=reading.get("error"))
            return result
        # the reading's warnings become this task's (ansible-core 2.19+ hands them over as WarningSummary
        # objects, which Display.warning does not take; the task result's `warnings` takes both)
        result.setdefault("warnings", []).extend(reading.get("warnings") or [])
    try:
        facts = _typed(reading, result["facts_source"])
    except K3sGpuError as exc:
        result.update(failed=True, msg=exc.text(), error=exc.as_dict(), changed=False)
        return result
    if result["facts_source"] == "node_facts" and facts.profile.get("assumed_warning"):
        result.setdefault("warnings", []).append(facts.profile["assumed_warning"])  # this task writes on it too
    for binary in binaries:
        facts.reading["binaries"].setdefault(binary, {"path": binary, "state": "relative"})
    # hosts of one run share the template checks' verdicts (the run's local temporary directory)
    params["_check_cache"] = check_cache.CheckCache(os.path.join(C.DEFAULT_LOCAL_TMP, "k3s-gpu-template-checks"))
    params["_own_files"] = own_files
    try:
        plan, changes = changes_engine.compute(facts, params)
    except K3sGpuError as exc:
        result.update(failed=True, msg=exc.text(), error=exc.as_dict(), changed=False)
        return result
    result.update(changes_engine.result_fields(facts, plan))
    changes = changes + list(extra_changes)
    if own_files:
        # user files put back to their bytes before the first edit, and those changed since the collection last
        # wrote them (only its tables taken out)
        result.update(restored=plan.get("restored") or [], changed_since_written=plan.get("changed_since_written") or [])
    if plan.get("warnings"):
        result.setdefault("warnings", []).extend(plan["warnings"])  # after the reading's (newer_release) ones
    result["changed"] = bool(changes)
    result["files"] = [{"path": c["path"], "node_path": c["node_path"], "backup_file": None,
                        "action": "removed" if c["after"] is None else "updated" if c["exists"] else "created"}
                       for c in changes]
    if want_diff and changes:
        result["diff"] = [dict(before=c["before"] or "", after=c["after"] or "", before_header=c["path"],
                               after_header=c["path"]) for c in changes]
    return _write(result, facts, plan, changes, params, execute_module, own_files, write)


def _typed(reading, source):
    """The NodeFacts of the reading run() works on: node_facts given (a copy), or its own of the node. Raises
    K3sGpuError naming the option where node_facts is not runtime_info's result."""
    if source == "node_facts":
        return host_state.NodeFacts.from_reading(reading, "{node_facts}", "pass the registered result of "
                                                 "k3s_gpu.nvidia.runtime_info (include_content: true), unchanged",
                                                 "node_facts")
    return host_state.NodeFacts.from_reading(reading, "runtime_info's reading of the node", "")


def _write(result, facts, plan, changes, params, execute_module, own_files, write=True):
    """Write the changes on the node (one node_files execution) and note each file's outcome in the result."""
    params["validate"] = changes_engine.node_validate(facts, params)
    entries = [changes_engine.write_entry(change, params) for change in changes]
    entries += changes_engine.attribute_entries(facts, plan, changes, params)
    if not write:
        result["write_due"] = bool(entries)
        return result
    if not entries:
        return result
    written = execute_module("k3s_gpu.nvidia.node_files", dict(files=entries))
    outcomes = written.get("files") or []
    for entry, outcome, change in zip(result["files"], outcomes, changes):
        entry["backup_file"] = outcome.get("backup_file")
        if own_files and not entry["backup_file"] and change["before"] is not None and change["key"] != "cdi_spec":
            # no copy on the node (the take-back keeps none): a rollback after a failed restart writes this text back
            entry["restore_content"] = change["before"]
        if outcome.get("parent_removed"):
            entry["parent_removed"] = outcome["parent_removed"]  # an emptied directory of ours (state absent)
    if any(o.get("action") == "attributes" for o in outcomes[len(changes):]):
        result["changed"] = True
    if written.get("failed"):
        # files applied before the failure stay applied; report exactly those
        result.update(failed=True, changed=bool(outcomes), files=result["files"][:len(outcomes)],
                      msg="writing the containerd files failed: %s" % written.get("msg"))
    return result
