# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the gpu_node role keeps to take its edits back, rendered with the engine's changes (_render with own_files):
the bytes of a user's file before the collection's first edit (<file>.k3s-gpu-nvidia.orig), a record of the text it
leaves there (<file>.k3s-gpu-nvidia.sha256), and on state absent the original put back, or only the collection's
tables taken out of a file someone changed since.

PRIVATE to the collection. Controller side, no I/O."""

from __future__ import annotations

import dataclasses
import hashlib
import tomllib
from typing import List, Optional, Set

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import Rendered, file_change
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

# our files whose directory goes with them when they leave it empty (k3s/rke2 create none of these directories)
PRUNED_PARENTS = ("dropin_v3", "dropin_v2", "default_runtime_file", "labels_file_legacy")
# the templates k3s/rke2 render
TEMPLATE_KEYS = ("template_v3", "template_v2")
# user files edited in place whose bytes before the first edit are kept (their <key>_orig and <key>_record facts)
ORIGINAL_KEYS = TEMPLATE_KEYS + ("config",)


def _sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# the record's second line: the text the edit replaced, as a comment (`sha256sum -c` checks the first line only)
_PREVIOUS = "# the text before this edit: "


def record_text(node_path: str, text: str, previous: Optional[str] = None) -> str:
    """The record of what the collection leaves in node_path: a sha256sum line of the text it writes, then a comment
    with the SHA-256 of the text it replaces (previous, when that was the collection's too, or the original). The
    record is written before the edit, so a run killed between the two leaves a file whose text the record names."""
    lines = ["%s  %s\n" % (_sha256(text), node_path.rsplit("/", 1)[-1])]
    if previous is not None and previous != text:
        lines.append("%s%s\n" % (_PREVIOUS, _sha256(previous)))
    return "".join(lines)


def recorded_sums(record: Optional[str]) -> Set[str]:
    """The SHA-256 sums a record names (empty: no record, or not one)."""
    sums = set()
    for line in (record or "").splitlines():
        fields = line[len(_PREVIOUS):].split() if line.startswith(_PREVIOUS) else line.split()
        if fields and len(fields[0]) == 64:
            sums.add(fields[0].lower())
    return sums


def runtime_names_in(text: str, schema: int, is_template: bool, path: str) -> Optional[List[str]]:
    """Names of the runtime tables a containerd template/config declares (None: it does not parse)."""
    try:
        masked = toml.mask_template(text, path)[0] if is_template else text
        section = toml.containerd_section(toml.loads(masked), schema) or {}
    except (tomllib.TOMLDecodeError, K3sGpuError, ValueError):
        return None
    runtimes = section.get("runtimes")
    return sorted(runtimes) if isinstance(runtimes, dict) else []


def _schema_of(facts, plan, key):
    return distro.schema_of_template(facts.paths[key].rsplit("/", 1)[-1]) if key in TEMPLATE_KEYS else plan.target["schema"]


def _bookkeeping(facts, key, suffix_key, after):
    """A change of <key>_orig or <key>_record (None: none needed)."""
    node_path = facts.paths[key] + (distro.ORIGINAL_SUFFIX if suffix_key == "orig" else distro.RECORD_SUFFIX)
    change = file_change(facts, "%s_%s" % (key, suffix_key), node_path, after, "kept original")
    if change is not None and change.changes_file:
        return dataclasses.replace(change, mode="0600")
    return None


class _Said:
    """The notes and warnings of one bookkeeping pass, and the files it put back or found changed."""

    def __init__(self):
        self.notes, self.warnings, self.restored, self.changed_since_written = [], [], [], []


def role_bookkeeping(facts: NodeFacts, rendered: Rendered, backup: bool = False) -> Rendered:
    """The role's bookkeeping around the engine's changes: keep the bytes of a user's file before its first edit
    (present), put them back or take out only our tables (absent), and let our directories go with our files."""
    plan = rendered.plan
    by_key = dict((c.key, c) for c in rendered.changes)
    said = _Said()
    # the files of this node's layout whose reading has the kept-original facts
    keys = [key for key in ORIGINAL_KEYS if key + "_orig" in facts.files and key in facts.paths]
    if plan.state == "present":
        first, extra = _kept_originals(facts, plan, keys, by_key, said)
    else:
        first, extra = [], _put_back(facts, plan, keys, by_key, backup, said)
    result = [c for c in first if c is not None]  # node_files applies in order: an original is kept before the edit
    for change in rendered.changes:
        if change.key in by_key:
            change = by_key.pop(change.key)
        if change is not None:
            result.append(change)
    result.extend(c for c in by_key.values() if c is not None and c.changes_file)
    result.extend(c for c in extra if c is not None)
    result = [dataclasses.replace(c, remove_empty_parent=True) if c.after is None and c.key in PRUNED_PARENTS else c
              for c in result]
    return rendered.replaced(changes=tuple(result), notes=rendered.notes + tuple(said.notes),
                             warnings=rendered.warnings + tuple(said.warnings), restored=tuple(said.restored),
                             changed_since_written=tuple(said.changed_since_written))


def _kept_originals(facts, plan, keys, by_key, said):
    """State present: the original of each user file before its first edit, and the record of the text edited in."""
    first, extra = [], []
    for key in keys:
        change = by_key.get(key)
        if change is None or not change.exists or change.after is None:
            continue
        before = change.before
        if before.startswith(toml.MANAGED_HEADER):
            continue  # a file the collection created: absent removes it whole
        record = node_reading.config_text(facts, key + "_record")
        if (facts.files.get(key + "_orig") or {}).get("state") != "file":
            ours = set(plan.remove) | set(plan.written_names) | set(n for n, _b in distro.NVIDIA_RUNTIMES)
            found = runtime_names_in(before, _schema_of(facts, plan, key), key in TEMPLATE_KEYS, change.node_path)
            if found is None or ours & set(found):
                # it already holds tables of ours (an earlier version of the collection edited it), or we cannot
                # tell: its first bytes are unknown, and absent takes out the NVIDIA tables by name
                said.notes.append("%s already declares NVIDIA runtime tables (%s): its text before the "
                                  "collection's first edit is unknown and not kept" % (
                                      change.node_path, ", ".join(sorted(ours & set(found or ())))))
                continue
            first.append(_bookkeeping(facts, key, "orig", before))
            first.append(_bookkeeping(facts, key, "record", record_text(change.node_path, change.after, before)))
        elif _sha256(before) in recorded_sums(record) or (record is None and before == node_reading.config_text(facts, key + "_orig")):
            # still the collection's text (or the original, a run killed before its first record): the record names
            # the new text before the edit is made
            first.append(_bookkeeping(facts, key, "record", record_text(change.node_path, change.after, before)))
        else:
            # edited by someone else since the collection last wrote it: the chain back to the original is broken,
            # and absent takes out only our tables (the record goes, after the edits)
            extra.append(_bookkeeping(facts, key, "record", None))
    return first, extra


def _put_back(facts, plan, keys, by_key, backup, said):
    """State absent: each user file put back (its original) or cleaned (only our tables out), its bookkeeping gone."""
    extra = []
    for key in keys:
        original = node_reading.config_text(facts, key + "_orig")
        if original is None:
            extra.append(_bookkeeping(facts, key, "record", None))  # a record alone is of no use
            continue
        by_key[key] = _take_back(facts, plan, key, original, backup, said)
        orig = _bookkeeping(facts, key, "orig", None)
        if orig is not None and facts.paths[key] in said.changed_since_written and backup:
            orig = dataclasses.replace(orig, keep_copy=True)  # the user's text before the first edit is not put back
        extra.append(orig)
        extra.append(_bookkeeping(facts, key, "record", None))
    return extra


def _take_back(facts, plan, key, original, backup, said):
    """The change that takes the collection's edits out of a user's file that has its original kept (None: none)."""
    node_path = facts.paths[key]
    current = node_reading.config_text(facts, key)
    if current is None:
        said.notes.append("%s is gone (removed since the collection edited it); it is not brought back" % node_path)
        return None
    if current == original or _sha256(current) in recorded_sums(node_reading.config_text(facts, key + "_record")):
        said.restored.append(node_path)
        change = file_change(facts, key, node_path, original, "original")
        return change if change.changes_file else None
    schema = _schema_of(facts, plan, key)
    is_template = key in TEMPLATE_KEYS
    in_original = set(runtime_names_in(original, schema, is_template, node_path) or ())
    ours = tuple(name for name in plan.remove if name not in in_original)
    mode = planner.MODE_TEMPLATE if is_template else planner.MODE_CONFIG
    cleanup = plan.replaced(state="absent", remove=ours, reserved_tables=(),
                            target=dict(plan.target, mode=mode, schema=schema, path=node_path, key=key))
    cleaned = toml.apply_plan(current, cleanup, node_path, is_template, facts.profile, created_by_us=False)
    if cleaned is not None and cleaned.endswith("\n\n") and not original.endswith("\n\n"):
        cleaned = cleaned.rstrip("\n") + "\n"  # the blank line our appended tables were separated by
    taken = [name for name in ours if name in (runtime_names_in(current, schema, is_template, node_path) or ())]
    said.changed_since_written.append(node_path)
    said.warnings.append(
        "%s changed since k3s_gpu.nvidia last wrote it, so its text from before the collection's first edit (%s) is "
        "not put back: only the collection's runtime tables (%s) were taken out and every other edit is kept; that "
        "original is removed now%s [changed_since_written]" % (
            node_path, node_path + distro.ORIGINAL_SUFFIX, ", ".join(taken) or "none left",
            " (a copy stays as %s.<time>~)" % release_rules.backup_prefix(node_path + distro.ORIGINAL_SUFFIX) if backup else ""))
    change = file_change(facts, key, node_path, cleaned, "original")
    return change if change.changes_file else None
