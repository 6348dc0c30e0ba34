# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The decide step: from the node's reading (a NodeFacts) and the task's options to an EditPlan, no text written
yet. The node-side planner (module_utils/_plan) picks the target and the runtimes; here the controller adds what it
alone can know: the user's own runtimes kept, the base k3s/rke2 renders for the node, the template k3s reads now
checked, and what the layers under a drop-in hand down. The render step (_render) comes after it.

PRIVATE to the collection. Controller side, no I/O."""

from __future__ import annotations

import tomllib
from typing import Any, Mapping, Optional, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _layers as config_layers
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as template_check
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan, Verdict
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

# template findings that make the current text unusable as the start of an edit
_BEFORE_EDIT = ("encoding_bom", "encoding_crlf", "encoding_nul", "encoding_utf8", "empty", "parse_error",
                "unknown_function", "unknown_template")


def decide(facts: NodeFacts, params: Mapping[str, Any], check_cache: Any = None) -> EditPlan:
    """The plan for the task's options (validated by containerd_runtimes' spec) on this node. check_cache: a
    _check_cache.CheckCache the template checks share. Raises K3sGpuError; nothing is written then."""
    target_profile = _target_profile(facts, params)
    planned = planner.make_plan(
        facts.reading, runtimes=params.get("runtimes"), state=params.get("state") or "present",
        default_runtime=params.get("default_runtime"), enable_cdi=params.get("enable_cdi"), path=params.get("path"))
    target = planned["target"]
    write, skip = _keep_users_runtimes(facts, planned, target, node_reading.config_text(facts, target["key"]))
    planned = dict(planned, write=write, skip=skip)
    default_flag = _flag_default_runtime(facts, planned)  # what k3s passes to its base after the next start
    # the base k3s renders for this node after the next start, worked out once: the template check, the release's own
    # runtime tables and the layers under a drop-in all read it
    base = None if facts.distribution == distro.CONTAINERD else template_check.node_base(
        facts, facts.profile, target["schema"], list(facts.release_runtimes), default_flag)
    report = _current_template_report(facts, target, params, default_flag, base, target_profile, check_cache)
    notes = list(planned["notes"])
    if report is not None and report.normalized is not None:
        notes.append("%s: normalized the encoding (byte order mark / CR line endings removed), as normalize_encoding "
                     "asks" % report.path)
    decided = dict(
        notes=tuple(notes), default_flag=default_flag, target_profile=target_profile, base=base,
        verdict=Verdict.of(report) if report is not None else Verdict(),
        template_schema=report.schema if report is not None else None,
        normalized=report.normalized if report is not None else None,
        backup=release_rules.backup_prefix(target["path"]) if params.get("backup") else None,
        release_tables=_release_tables(facts, target, base),
        base_included=target["mode"] == planner.MODE_TEMPLATE and planner.template_includes_base(facts.reading, target))
    if target["mode"] == planner.MODE_DROPIN:
        where = config_layers.Where(target, decided["template_schema"], default_flag, base)
        decided["inherited"] = _layered_default_runtime(facts, where, [r["name"] for r in write])
    decided["settings_added"] = _settings_added(facts, target)
    return EditPlan.of(planned, **decided)


def _keep_users_runtimes(facts, planned, target, current):
    """A runtime the user configured with a binary of their own is the user's: in the template or config this task
    edits in place, or in another drop-in of the directory (containerd reads ours later, so ours would win). It is kept
    as it is and skipped here, with the way to hand it over. Returns (runtimes to write, runtimes skipped)."""
    write, skip = list(planned["write"]), list(planned["skip"])
    if planned["state"] != "present" or not write:
        return write, skip
    names = [r["name"] for r in write]
    sources = []
    if target["mode"] == planner.MODE_DROPIN:
        directory = target["path"].rsplit("/", 1)[0] + "/"
        sources = [(d["path"], d.get("content"), False) for d in facts.other_dropins
                   if d.get("path", "").startswith(directory) and d.get("content")]
    elif current is not None and not current.startswith(toml.MANAGED_HEADER):
        sources = [(target["path"], current, target["mode"] == planner.MODE_TEMPLATE)]
    kept = {}
    for path, text, is_template in sources:
        for name, binary in (toml.users_runtimes(text, target["schema"], is_template, path, names) or {}).items():
            kept[name] = (path, binary)
    for runtime in [r for r in write if r["name"] in kept]:
        path, binary = kept[runtime["name"]]
        write.remove(runtime)
        skip.append({"name": runtime["name"], "reason": (
            "%s configures runtime %s with its own binary %s: it is yours and kept as it is (to hand it over to "
            "k3s_gpu.nvidia, remove that table and run again)" % (path, runtime["name"], binary))})
    return write, skip


def _settings_added(facts, target):
    """Whether the default runtime in the user's template is the collection's: the text kept from before its first edit
    (<template>.k3s-gpu-nvidia.orig) sets none."""
    original = (facts.files.get(target["key"] + "_orig") or {}).get("content")
    if target["mode"] != planner.MODE_TEMPLATE or original is None:
        return False
    return "default_runtime_name" not in original


def _release_tables(facts, target, base):
    """{runtime name: its table as the release renders it} for each runtime the release renders into the template
    target itself (k3s detects its binary); {} elsewhere. base: the node's base rendering (node_base)."""
    if base is None or target["mode"] != planner.MODE_TEMPLATE:
        return {}
    renders = planner.release_renders(facts.reading, target)
    result = {}
    for name in renders:
        path = distro.runtime_table(target["schema"], name)
        values = dict(base.table(path) or {"runtime_type": renders[name]["runtime_type"]})
        values["options"] = base.table(path + ("options",)) or {"BinaryName": renders[name]["binary"]}
        result[name] = values
    return result


def _layered_default_runtime(facts, where, written):
    """The default runtime's table as containerd sees it around our drop-in (_layers: the root config or what k3s
    renders from the user's template or its base, then every other drop-in of the directory in import order, merged as
    the node's containerd merges them). A drop-in or template that makes another runtime the default is followed
    (nvidia-ctk's rule)."""
    config = facts.files.get("config") or {}
    if facts.distribution == distro.CONTAINERD and config.get("state") == "file" and config.get("content") is not None:
        try:
            toml.loads(config["content"])
        except tomllib.TOMLDecodeError as exc:
            raise K3sGpuError(
                "%s: %s [toml_invalid]: containerd cannot load it either" % (config["path"], exc),
                fix="fix that line; nothing was written") from exc
    merged = config_layers.merged(config_layers.compose(facts, where, None), config_layers.deep_merge_of(facts))
    own = set(written) | set(name for name, _binary in distro.NVIDIA_RUNTIMES)
    return toml.inherited_runtime(merged, where.target["schema"], own)


def _flag_default_runtime(facts, planned):
    """The default runtime k3s passes to its base after the next start (config.yaml(.d) or the unit)."""
    default = planned.get("default_runtime") or {}
    if default.get("how") == "config_yaml":
        return default["name"]
    current = facts.reading.get("default_runtime") or {}
    if current.get("source") == facts.paths.get("default_runtime_file") and (default or planned["state"] == "absent"):
        return None  # our own file, rewritten without it (the default goes into TOML) or removed
    return current.get("value")


def _target_profile(facts, params):
    """The profile of target_release (None: not set), worked out once before anything is planned: a text that is no
    release of the node's distribution, a line this collection does not know and a plain containerd node are refused by
    name whether or not the node has a template to render for it."""
    target_release = params.get("target_release")
    if not target_release:
        return None
    if facts.distribution == distro.CONTAINERD:
        raise K3sGpuError("{target_release} is for k3s and rke2 nodes (their templates change with the release); "
                          "this node runs plain containerd", fix="leave {target_release} unset here; nothing was written",
                          variable="target_release")
    try:
        return distro.profile(facts.distribution, target_release,
                              params.get("newer_release") or distro.NEWER_RELEASE_REFUSE, "target_release")
    except K3sGpuError as exc:
        variables = tuple(dict.fromkeys(("target_release",) + exc.variables))
        raise K3sGpuError("{target_release}: %s" % exc.cause, "; ".join(part for part in (exc.fix, "nothing was written") if part),
                          variables) from exc


def _current_template_report(facts, target, params, default_flag, base, target_profile, check_cache=None):
    """Check the template k3s/rke2 reads as it is now: refuse what breaks the node before anything is
    decided on top of it. Returns the _template_check.Report (None: no template, or plain containerd)."""
    if facts.distribution == distro.CONTAINERD:
        return None
    key = target.get("template")
    info = facts.files.get(key) if key else None
    if not info or info.get("state") != "file" or info.get("content") is None:
        return None
    schema = distro.schema_of_template(info["path"].rsplit("/", 1)[-1]) if key != "override" else target["schema"]
    edit_in_place = target["mode"] == planner.MODE_TEMPLATE and target["key"] == key
    # a template edited in place is checked whole once, as it will be written (_render)
    report = template_check.check(info["content"], info["path"], facts, schema,
                                  default_runtime=default_flag, target_profile=target_profile,
                                  normalize=bool(params.get("normalize_encoding")), light=edit_in_place,
                                  cache=check_cache, base=base)
    report.schema = schema
    blocking = report.refusals if not edit_in_place else [f for f in report.refusals if f.code in _BEFORE_EDIT]
    if blocking:
        raise report.refusal(blocking)
    return report


def refusal_before_install(facts: NodeFacts) -> Optional[K3sGpuError]:
    """Why the template k3s/rke2 reads must stop a toolkit install, as a K3sGpuError (None: it may go ahead).

    Refuses what the install itself would break (a duplicate once nvidia is detected) and a template
    that cannot be rendered or edited at all; what containerd_runtimes fixes with its own edit is left
    to it."""
    if facts.distribution == distro.CONTAINERD or not facts.files:
        return None
    try:
        target = planner.select_target(facts.reading)
    except K3sGpuError:
        return None  # containerd_runtimes reports it with its own options
    key = target.get("template")
    info = facts.files.get(key) if key else None
    if not info or info.get("state") != "file" or info.get("content") is None:
        return None
    schema = distro.schema_of_template(info["path"].rsplit("/", 1)[-1])
    # in a template this module created every NVIDIA table is its own: its next edit takes out those k3s renders
    ours: Tuple[str, ...] = tuple(n for n, _b in distro.NVIDIA_RUNTIMES) if info["content"].startswith(toml.MANAGED_HEADER) else ()
    report = template_check.check(info["content"], info["path"], facts, schema,
                                  default_runtime=facts.default_runtime, ours=ours)
    edited = target["mode"] == planner.MODE_TEMPLATE
    blocking = [f for f in report.refusals
                if f.when == template_check.AFTER_INSTALL or not edited or f.code in _BEFORE_EDIT]
    return report.refusal(blocking) if blocking else None
