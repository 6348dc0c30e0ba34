# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the containerd engine decides and writes, as frozen values that pass from one step to the next:

    NodeFacts (_node_reading) -> EditPlan (_decide) -> Rendered (_render) -> node_files entries (_node_write)

No step changes what the step before it returned; a variant of a plan (the take-back of an earlier file) is a new
EditPlan made with dataclasses.replace. The runtimes, targets and default runtime inside a plan are the node-side
planner's mappings (module_utils/_plan.py, which runs on Python 2.7 nodes too and stays dict-based).

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner

Table = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the template check said about the template k3s/rke2 renders (the last text checked: the template as it is
    when it is not edited, else as it will be written)."""

    outcome: Optional[str] = None
    findings: Tuple[Table, ...] = ()
    upgrade_findings: Tuple[Table, ...] = ()
    upgrade_messages: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()

    @classmethod
    def of(cls, report: Any) -> "Verdict":
        """From a _template_check.Report."""
        return cls(outcome=report.outcome, findings=tuple(f.as_dict() for f in report.findings),
                   upgrade_findings=tuple(f.as_dict() for f in report.upgrade),
                   upgrade_messages=tuple(f.text(report.path) for f in report.upgrade),
                   warnings=tuple(f.text(report.path) for f in report.warnings + report.upgrade))

    def with_upgrade_finding(self, finding: Table, message: str) -> "Verdict":
        return dataclasses.replace(self, upgrade_findings=self.upgrade_findings + (finding,),
                                   upgrade_messages=self.upgrade_messages + (message,), warnings=self.warnings + (message,))


@dataclasses.dataclass(frozen=True)
class EditPlan:
    """What the task does to the node's containerd configuration: the node-side planner's decision (target, runtimes
    to write, skip or remove, default runtime, enable_cdi, the tables reserved for the base) and what the controller
    adds from the release's base rendering and the user's files. Render reads it; nothing changes it."""

    target: Table
    state: str = "present"
    write: Tuple[Table, ...] = ()
    skip: Tuple[Table, ...] = ()
    remove: Tuple[str, ...] = ()
    default_runtime: Optional[Table] = None
    enable_cdi: Optional[bool] = None
    notes: Tuple[str, ...] = ()
    runtimes_explicit: bool = False
    reserved_tables: Tuple[Any, ...] = ()
    systemd_cgroup_default: Optional[bool] = None
    # decided on the controller (_decide)
    backup: Optional[str] = None  # the prefix of the copies of the target (backup: true), for messages
    release_tables: Mapping[str, Table] = dataclasses.field(default_factory=dict)
    base_included: bool = True  # a template target calls {{ template "base" . }}
    inherited: Optional[Table] = None  # a drop-in's: the default runtime's table in the layers under it
    settings_added: bool = False  # the default runtime in the user's template is the collection's
    default_flag: Optional[str] = None  # what k3s passes to its base as --default-runtime after the next start
    target_profile: Optional[Table] = None  # target_release's profile (None: not set)
    verdict: Verdict = Verdict()  # the template k3s/rke2 reads now, checked before anything is decided on it
    template_schema: Optional[int] = None  # that template's schema (None: no template checked)
    normalized: Optional[str] = None  # that template's text after an opted-in normalisation of its encoding
    base: Any = dataclasses.field(default=None, compare=False, repr=False)  # _template_check's base rendering

    @classmethod
    def of(cls, plan: Mapping[str, Any], **decided: Any) -> "EditPlan":
        """From the node-side planner's dict (module_utils/_plan.make_plan), with what the controller decided."""
        names = set(f.name for f in dataclasses.fields(cls))
        values = dict((key, value) for key, value in plan.items() if key in names)
        for key in ("write", "skip", "remove", "notes", "reserved_tables"):
            values[key] = tuple(values.get(key) or ())
        values.update(decided)
        return cls(**values)

    @property
    def written_names(self) -> Tuple[str, ...]:
        return tuple(r["name"] for r in self.write)

    def replaced(self, **changed: Any) -> "EditPlan":
        """The plan with some decisions changed (the take-back of another file): a new EditPlan, this one stays."""
        return dataclasses.replace(self, **changed)

    def default_how(self) -> Optional[str]:
        """Where the default runtime goes: "toml", "config_yaml" (None: the task sets none)."""
        return (self.default_runtime or {}).get("how")


@dataclasses.dataclass(frozen=True)
class FileChange:
    """One file's new text (after None: removed), and the text it was decided from (before None: absent)."""

    key: str  # the reading's name of the file (template_v3, dropin_v3, default_runtime_file, ...)
    node_path: str  # the path on the node
    path: str  # the same path on the host of the task (under gpu_node_root on a sandbox)
    before: Optional[str]
    after: Optional[str]
    exists: bool
    parent_exists: bool
    mode: Optional[str] = None  # the collection's bookkeeping: a fixed mode and no validation
    keep_copy: bool = False  # removed with a copy under the backup tree even on a take-back
    remove_empty_parent: bool = False  # its directory goes with it when emptied
    sha1: Optional[str] = None  # the before text's SHA-1 where the text itself is not at hand (a CDI spec)

    def replaced(self, **changed: Any) -> "FileChange":
        return dataclasses.replace(self, **changed)

    @property
    def action(self) -> str:
        return "removed" if self.after is None else "updated" if self.exists else "created"

    @property
    def changes_file(self) -> bool:
        return self.before != self.after


@dataclasses.dataclass(frozen=True)
class Rendered:
    """The plan rendered into file texts, checked, with what the task reports: the render step's value."""

    plan: EditPlan
    changes: Tuple[FileChange, ...] = ()
    notes: Tuple[str, ...] = ()  # the plan's notes, then the render's
    warnings: Tuple[str, ...] = ()
    verdict: Verdict = Verdict()
    removed_for_base: Tuple[str, ...] = ()
    removed_stale: Tuple[str, ...] = ()
    inherited_from: Optional[Table] = None  # the table the written runtimes inherit their settings from
    node_labels: Optional[Tuple[str, ...]] = None  # the config.yaml.d file's labels (None: the task does not own them)
    cgroup_driver_mismatch: Optional[Table] = None
    restored: Tuple[str, ...] = ()  # user files put back to their text before the first edit (take-back)
    changed_since_written: Tuple[str, ...] = ()  # user files changed since the collection wrote them (take-back)

    def replaced(self, **changed: Any) -> "Rendered":
        return dataclasses.replace(self, **changed)

    def with_changes(self, more: Sequence[FileChange]) -> "Rendered":
        return dataclasses.replace(self, changes=self.changes + tuple(more))


def file_change(facts: Any, key: str, node_path: str, after: Optional[str], kind: str) -> Optional[FileChange]:
    """The change of the file the reading (a NodeFacts) names key to the text after (None: removed); None when it
    neither exists nor is to. A file the node could not read as a regular file is refused (kind names it)."""
    info = facts.files.get(key) or {"state": "absent", "path": node_path}
    before = info.get("content") if info.get("state") == "file" else None
    if before is None and after is None:
        return None
    if info.get("state") not in ("absent", "file") or info.get("error"):
        planner._refuse_unusable(info, kind)
    return FileChange(key=key, node_path=node_path, path=facts.host_path(node_path), before=before, after=after,
                      exists=info.get("state") == "file",
                      parent_exists=info.get("state") == "file" or bool(info.get("parent_exists")))
