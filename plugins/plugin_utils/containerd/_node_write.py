# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The write step: the file changes of a Rendered (_render) as k3s_gpu.nvidia.node_files entries (each written only if
the file is still the text the change was computed from), one node_files execution, and each file's outcome in the
task's result.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Mapping, Optional

from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _bookkeeping as bookkeeping
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import FileChange, Rendered

# owner/group/mode/SELinux options of the task, passed on to every file it writes
_NOT_FILE_ARGS = ("src", "follow", "force", "content", "backup", "remote_src", "regexp", "delimiter", "directory_mode")
FILE_ARGS = tuple(k for k in FILE_COMMON_ARGUMENTS if k not in _NOT_FILE_ARGS)
# k3s creates its configuration directories 0755: a 0700 /etc/rancher made before k3s is installed would keep a
# kubeconfig written with write-kubeconfig-mode 644 from the users it is meant for (the backups stay 0700)
NEW_DIR_MODE = "0755"
# directories of the OS that a take-back never removes, even empty
SYSTEM_DIRECTORIES = ("/", "/etc", "/var", "/var/lib", "/opt", "/usr", "/usr/local", "/run", "/srv", "/home")


def write(result: Dict[str, Any], facts: NodeFacts, rendered: Rendered, params: Mapping[str, Any],
          execute_module: Callable[[str, Dict[str, Any]], Dict[str, Any]], own_files: bool,
          write_now: bool = True) -> Dict[str, Any]:
    """Write the changes on the node (one node_files execution) and note each file's outcome in result["files"].
    write_now=False: only result["write_due"], whether node_files would run."""
    changes = rendered.changes
    validate = node_validate(facts, params)
    entries = [write_entry(change, params, validate, own_files) for change in changes]
    entries += attribute_entries(facts, rendered.plan.target, changes, params)
    entries += leftover_entries(facts, entries, params, own_files)
    if not write_now:
        result["write_due"] = bool(entries)
        return result
    if not entries:
        return result
    written = execute_module("k3s_gpu.nvidia.node_files", dict(files=entries, root=facts.root or "/"))
    outcomes = written.get("files") or []
    for entry, outcome, change in zip(result["files"], outcomes, changes):
        entry["backup_file"] = outcome.get("backup_file")
        if own_files and not entry["backup_file"] and change.before is not None and change.key != "cdi_spec":
            # no copy on the node (the take-back keeps none): a rollback after a failed restart writes this text back
            entry["restore_content"] = change.before
        if outcome.get("parent_removed"):
            entry["parent_removed"] = outcome["parent_removed"]  # an emptied directory of ours (state absent)
    if any(o.get("action") == "attributes" for o in outcomes[len(changes):]):
        result["changed"] = True
    if written.get("failed"):
        # files applied before the failure stay applied; report exactly those
        result.update(failed=True, changed=bool(outcomes), files=result["files"][:len(outcomes)],
                      msg="writing the containerd files failed: %s" % written.get("msg"))
    return result


def node_validate(facts: NodeFacts, params: Mapping[str, Any]) -> Optional[str]:
    """The validate command for containerd's TOML: the task's own (an empty string turns it off), else on
    plain containerd with root / the node's containerd reading the new file before it replaces the old one
    (`config dump` fails on what containerd would refuse at start). The binary is one of the fixed paths
    runtime_info looks at, never user input."""
    if params.get("validate") is not None:
        return params["validate"] or None
    binary = facts.reading.get("containerd_binary")
    if facts.distribution == distro.CONTAINERD and facts.root == "/" and binary:
        return "%s --config %%s config dump" % binary
    return None


def _sha1(text):
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# the collection's own files, by change key: removing one needs no backup (nobody else ever wrote it)
_OWN_KEYS = release_rules.OWN_DROPINS + ("default_runtime_file", "labels_file_legacy", "cdi_spec")


def only_ours(change: FileChange) -> bool:
    """Whether only the collection ever wrote this file: its drop-ins, default-runtime file, bookkeeping, generated
    CDI spec, or a file it created (the managed header first)."""
    before = change.before or ""
    return (change.key in _OWN_KEYS or change.key.endswith(("_orig", "_record")) or bool(change.mode)
            or before.startswith((toml.MANAGED_HEADER, toml.MANAGED_YAML_HEADER)))


# where a take-back may climb, emptied directory by directory: k3s/rke2's configuration (/etc/rancher/k3s holds
# nothing but what a user or an installer put there) and the copies' tree; never into a data dir, whose directories
# k3s makes at its start
_PRUNABLE_TOPS = ("/etc/rancher", "/var/backups")


def prune_top(node_path: str) -> str:
    """The highest directory above node_path that a take-back may remove once it is empty: /etc/rancher for
    /etc/rancher/k3s/config.yaml.d/x, /var/backups for the copies, else the file's own directory (a drop-in's)."""
    parent = node_path.rsplit("/", 1)[0] or "/"
    for top in _PRUNABLE_TOPS:
        if parent == top or parent.startswith(top + "/"):
            return top
    return parent


def _host_of(host_path, node_path, other):
    """other (a path on the node) on the host of the file at host_path (node_path on the node): the same root prefix."""
    return host_path[:len(host_path) - len(node_path)] + other


def backup_fields(change: FileChange, params: Mapping[str, Any], own_files: bool = False) -> Dict[str, Any]:
    """node_files' backup options for one change: the copy goes under BACKUP_DIR (never into a directory k3s, rke2 or
    containerd import), the newest BACKUP_KEEP per file are kept; a file only the collection wrote is not copied when
    it is removed; the role's take-back (state absent) keeps no copy at all and drops the earlier ones of each file it
    puts back or removes, so the node ends as it was before the first converge."""
    root = change.path[:len(change.path) - len(change.node_path)]
    fields = {"backup_to": root + release_rules.backup_prefix(change.node_path),
              "backup_root": root + prune_top(release_rules.BACKUP_DIR),
              "backup_keep": release_rules.BACKUP_KEEP}
    if change.keep_copy:
        fields["backup"] = True
    elif own_files and params.get("state") == "absent":
        fields.update(backup=False, drop_backups=True)
    elif change.after is None and only_ours(change):
        fields["backup"] = False
    else:
        fields["backup"] = bool(params["backup"])
    return fields


def write_entry(change: FileChange, params: Mapping[str, Any], validate: Optional[str] = None,
                own_files: bool = False) -> Dict[str, Any]:
    """One k3s_gpu.nvidia.node_files entry: the new text (or removal) and the text it was computed from. validate: the
    command that checks containerd's TOML (node_validate), else the task's own."""
    entry = {"path": change.path, "directory_mode": NEW_DIR_MODE,
             "expected_state": "file" if change.exists else "absent",
             "expected_sha1": (change.sha1 or _sha1(change.before)) if change.exists else None}
    entry.update(backup_fields(change, params, own_files))
    if change.after is None:
        entry["state"] = "absent"
        if change.remove_empty_parent:
            entry["remove_empty_parent"] = True
            top = prune_top(change.node_path)
            if top not in SYSTEM_DIRECTORIES:
                entry["prune_parents_to"] = _host_of(change.path, change.node_path, top)
        return entry
    entry.update(state="file", content=change.after)
    if change.mode:
        entry["mode"] = change.mode  # the collection's own bookkeeping: fixed attributes, no validation
        return entry
    if change.key != "default_runtime_file":  # the validate command is for containerd's TOML
        entry["validate"] = validate if validate is not None else params.get("validate")
    for key in FILE_ARGS:
        if params.get(key) is not None:
            entry[key] = params[key]
    return entry


# the files the take-back looks after: the user's files it edits in place and its own, whose directory goes with them
_TAKEN_BACK = bookkeeping.ORIGINAL_KEYS + release_rules.OWN_DROPINS + bookkeeping.PRUNED_PARENTS


def leftover_entries(facts: NodeFacts, entries: List[Dict[str, Any]], params: Mapping[str, Any],
                     own_files: bool = False) -> List[Dict[str, Any]]:
    """The role's take-back (state absent) also clears what an interrupted take-back left of files it already put back
    or removed: their copies under the backup tree and the directories of ours they emptied. One entry per such file
    that no change covers; it changes nothing of the file itself (the kept original's copy of a file changed since
    the collection wrote it stays, as the take-back says)."""
    if not (own_files and params.get("state") == "absent"):
        return []
    listed = set(e["path"] for e in entries)
    out = []
    for key in dict.fromkeys(_TAKEN_BACK):
        if key == "config" and facts.distribution != distro.CONTAINERD:
            continue  # k3s/rke2 regenerate their config.toml at every start: never the collection's
        node_path = facts.paths.get(key)
        host = facts.host_path(node_path) if node_path else None
        if not node_path or host in listed:
            continue
        state = (facts.files.get(key) or {}).get("state") or "absent"
        if state not in ("absent", "file"):
            continue
        entry = {"path": host, "state": "tidy", "backup": False, "drop_backups": True,
                 "backup_to": _host_of(host, node_path, release_rules.backup_prefix(node_path)),
                 "backup_root": _host_of(host, node_path, prune_top(release_rules.BACKUP_DIR))}
        if key in bookkeeping.PRUNED_PARENTS and state == "absent":
            entry.update(remove_empty_parent=True, prune_parents_to=_host_of(host, node_path, prune_top(node_path)))
        out.append(entry)
    return out


def attribute_entries(facts: NodeFacts, target: Mapping[str, Any], changes: Any,
                      params: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """owner/group/mode/SELinux on the target even when its text is already right."""
    if not any(params.get(k) is not None for k in FILE_ARGS if k != "unsafe_writes"):
        return []
    target_path = facts.host_path(target["path"])
    if any(c.path == target_path for c in changes):
        return []  # its write entry carries the attributes
    if (facts.files.get(target["key"]) or {}).get("state") != "file":
        return []
    entry = {"path": target_path, "state": "file", "expected_state": "file"}
    entry.update((k, params[k]) for k in FILE_ARGS if params.get(k) is not None)
    return [entry]
