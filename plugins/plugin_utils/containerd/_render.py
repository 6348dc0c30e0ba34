# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The render step: from an EditPlan to the exact new text of each file (a Rendered), checked as k3s/rke2 or
containerd will read it: the target's edit (_toml), the template rendered whole with the release's base
(_template_check), the files of earlier releases and layouts, the config.yaml.d file of the default runtime and the
node labels, and, for the gpu_node role, the bookkeeping that lets it take its edits back (_bookkeeping). The write
step (_node_write) comes after it.

PRIVATE to the collection. Controller side, no I/O."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _bookkeeping as bookkeeping
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _claims_cdi as claims_cdi
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _layers as config_layers
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as template_check
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan, FileChange, Rendered, Verdict
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import file_change
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

# the first line of the labels file the gpu_node role wrote before this task took the labels over
LEGACY_LABELS_HEADER = "# Managed by k3s_gpu.nvidia (gpu_node)"
# the files the collection writes whole, at names of its own: it knows its own by their first line
_WHOLLY_OURS = release_rules.OWN_DROPINS + ("default_runtime_file",)


def render(facts: NodeFacts, plan: EditPlan, params: Mapping[str, Any], own_files: bool = False,
           check_cache: Any = None, extra_changes: Sequence[FileChange] = ()) -> Rendered:
    """Every file's new text for the plan, checked. own_files (the gpu_node role): the bookkeeping that keeps a user's
    file before its first edit and puts it back on state absent; check_cache: a _check_cache.CheckCache the template
    checks share; extra_changes: more files of the role's (its CDI spec), written with these. Raises K3sGpuError;
    nothing is written then."""
    target = plan.target
    in_template = target["mode"] == planner.MODE_TEMPLATE
    current = plan.normalized if plan.normalized is not None and in_template else node_reading.config_text(facts, target["key"])
    # a template is checked whole right after (_check_rendered), composed with the base it really gets
    applied = toml.edit_target(current, plan, target["path"], in_template, facts.profile,
                               checked_after=in_template and facts.distribution != distro.CONTAINERD)
    after = applied.text
    verdict = _dropin_on_target(plan, _check_rendered(facts, plan, after, check_cache) or plan.verdict)
    if plan.state == "present":
        where = config_layers.Where.of_plan(plan)
        refused = config_layers.replaced_runtimes(facts, where, after, plan.write)
        if refused is None and params.get("allocation") == k8s_labels.ALLOCATION_DRA:
            refused = claims_cdi.refusal(facts, config_layers.compose(facts, where, after), target["schema"])
        if refused:
            raise refused
    notes = list(plan.notes) + list(applied.notes)
    note = toml.inheritance_note(applied.inherited_from) if plan.state == "present" and plan.write else None
    if note:
        notes.append(note)
    warnings = list(verdict.warnings) + list(applied.warnings)  # then what the edit itself changed of the user's
    if facts.distribution == distro.CONTAINERD and target["mode"] in (planner.MODE_CONFIG, planner.MODE_DROPIN):
        toml.check_plain_result(after, plan, target["path"], target["schema"])
    mismatch = None
    if facts.distribution == distro.CONTAINERD and plan.state == "present":
        mismatch, warning = _cgroup_driver_mismatch(facts, plan, after)
        warnings.extend(warning)
    changes = [file_change(facts, target["key"], target["path"], after, "target")]
    if plan.normalized is not None and not in_template:
        key = target["template"]
        changes.append(file_change(facts, key, facts.files[key]["path"], plan.normalized, "template"))
    changes.extend(_earlier_file_changes(facts, plan))
    labels = None
    if facts.profile["distribution"] != distro.CONTAINERD:
        labels, more = _default_runtime_file_changes(facts, plan, params)
        changes.extend(more)
    changes, left_alone = _not_taking_over(plan, [c for c in changes if c is not None and c.changes_file])
    rendered = Rendered(
        plan=plan, changes=tuple(changes), notes=tuple(notes + left_alone), warnings=tuple(warnings), verdict=verdict,
        removed_for_base=applied.removed_for_base, removed_stale=applied.removed_stale,
        inherited_from=applied.inherited_from, node_labels=labels, cgroup_driver_mismatch=mismatch)
    if own_files:
        rendered = bookkeeping.role_bookkeeping(facts, rendered, bool(params.get("backup")))
    return rendered.with_changes(extra_changes) if extra_changes else rendered


def outcome(facts: NodeFacts, rendered: Rendered, own_files: bool = False, want_diff: bool = False) -> Dict[str, Any]:
    """What the task says before anything is written: the reading, the plan, the findings, each file's change (the
    warnings go after the reading's)."""
    plan = rendered.plan
    present = plan.state == "present"
    fields = {
        "distribution": facts.distribution,
        "release": facts.release,
        "target": {k: plan.target.get(k) for k in ("mode", "path", "schema", "reason")},
        "runtimes_written": [{"name": r["name"], "binary": r["binary"], "runtime_type": r["runtime_type"]}
                             for r in plan.write] if present else [],
        "runtimes_skipped": list(plan.skip),
        "inherited_from": _inherited_result(rendered.inherited_from) if present and plan.write else None,
        "runtimes_removed": sorted(set(plan.remove if not present else ()) | set(rendered.removed_for_base)
                                   | set(rendered.removed_stale)),
        "default_runtime": plan.default_runtime,
        "node_labels": list(rendered.node_labels) if rendered.node_labels is not None else None,
        "notes": list(rendered.notes),
        "runtime_in_use": facts.reading.get("runtime_in_use"),
        "cgroup_driver_mismatch": rendered.cgroup_driver_mismatch,
        "template_outcome": rendered.verdict.outcome,
        "template_findings": list(rendered.verdict.findings),
        "upgrade_findings": list(rendered.verdict.upgrade_findings),
        "upgrade_messages": list(rendered.verdict.upgrade_messages),
    }
    if own_files:
        # user files put back to their bytes before the first edit, and those changed since the collection last
        # wrote them (only its tables taken out)
        fields.update(restored=list(rendered.restored), changed_since_written=list(rendered.changed_since_written))
    fields["changed"] = bool(rendered.changes)
    fields["files"] = [{"path": c.path, "node_path": c.node_path, "backup_file": None, "action": c.action}
                       for c in rendered.changes]
    if want_diff and rendered.changes:
        fields["diff"] = [dict(before=c.before or "", after=c.after or "", before_header=c.path, after_header=c.path)
                          for c in rendered.changes]
    return fields


def _inherited_result(inherited):
    if not inherited:
        return None
    return {"runtime": inherited["name"], "default_runtime": inherited.get("default"), "fallback": inherited.get("fallback"),
            "keys": sorted(inherited["keys"]), "options": sorted(inherited["options"])}


def node_labels(plan: EditPlan) -> List[str]:
    """One `<prefix><handler>=true` label per NVIDIA handler the node serves (written here or rendered by k3s)."""
    handlers = sorted(set(plan.written_names) | {r["name"] for r in plan.skip})
    return ["%s%s=%s" % (k8s_labels.HANDLER_LABEL_PREFIX, name, k8s_labels.HANDLER_LABEL_VALUE)
            for name in handlers if name in k8s_labels.NVIDIA_HANDLERS]


def _checked_labels(labels):
    """node_labels as "key=value", each a valid Kubernetes label (k3s refuses to start the node on a bad one)."""
    checked = []
    for label in labels or []:
        key, sep, value = str(label).partition("=")
        try:
            if not sep:
                raise K3sGpuError("node_labels: %r is not key=value" % label)
            k8s_labels.check_node_selector({key: value}, "node_labels")
        except K3sGpuError as exc:
            raise K3sGpuError(exc.cause, fix="; ".join(part for part in (exc.fix, "nothing was written") if part),
                              variable=exc.variable) from exc
        checked.append("%s=%s" % (key, value))
    return checked


def _check_rendered(facts, plan, after, check_cache):
    """The template we are about to write, rendered for the node now, after the toolkit install and on
    target_release: refuse anything that would break it (nothing is written then). Returns its Verdict (None: no
    template is written)."""
    target = plan.target
    if facts.distribution == distro.CONTAINERD or target["mode"] != planner.MODE_TEMPLATE or after is None:
        return None
    schema = target["schema"] if plan.template_schema is None else plan.template_schema
    report = template_check.check(after, target["path"], facts, schema, default_runtime=plan.default_flag,
                                  target_profile=plan.target_profile, ours=set(plan.written_names),
                                  cache=check_cache, base=plan.base)
    if report.refusals:
        raise report.refusal()
    return Verdict.of(report)


def _dropin_on_target(plan, verdict):
    """An upgrade finding where target_release does not import the drop-in this task writes: the directory came in
    v1.33.10, v1.34.6 and v1.35.3, so an earlier patch of a later line (or an older line) reads no drop-in, and the
    runtimes written there are gone after the upgrade; the template check cannot see it (there may be no template)."""
    target, target_profile = plan.target, plan.target_profile
    if target_profile is None or target["mode"] != planner.MODE_DROPIN or plan.state == "absent" or not plan.write:
        return verdict
    if target_profile["dropin_imports"]:
        return verdict
    finding = template_check.Finding(
        "dropin_not_read", 0, "%s %s does not import the drop-in directory, so the runtimes written here (%s) are gone "
        "after the upgrade and pods of their RuntimeClasses fail" % (
            target_profile["distribution"], target_profile["release"], ", ".join(plan.written_names)),
        "run k3s_gpu.nvidia.site right after the upgrade (on that release it writes them into the containerd template), "
        "or upgrade to a release that imports the drop-in directory", when=template_check.UPGRADE)
    return verdict.with_upgrade_finding(finding.as_dict(), finding.text(target["path"]))


def _effective_runtimes(facts, plan, after):
    """(config path, default runtime name, {name: runtime table}) as containerd loads its layers after this write
    (_layers: the root config, then the drop-ins it imports, merged as the node's containerd line merges them)."""
    where = config_layers.Where.of_plan(plan)
    loaded = config_layers.merged(config_layers.compose(facts, where, after), config_layers.deep_merge_of(facts))
    containerd = toml.containerd_section(loaded, plan.target["schema"]) or {}
    runtimes = dict((name, table) for name, table in (containerd.get("runtimes") or {}).items() if isinstance(table, dict))
    return ((facts.files.get("config") or {}).get("path") or plan.target["path"],
            containerd.get("default_runtime_name") or "runc", runtimes)


def _cgroup_driver_mismatch(facts, plan, after):
    """Where the kubelet's cgroupDriver and SystemdCgroup of the runtimes that run pods disagree (the best-known cause
    of crash-looping pods on kubeadm nodes): (the result's cgroup_driver_mismatch, None where they agree or the
    kubelet's driver is unknown; the warnings). Never rewrites runc: that is the user's call."""
    kubelet = facts.reading.get("kubelet") or {}
    driver = (kubelet.get("cgroup_driver") or "").strip().lower()
    if driver not in ("systemd", "cgroupfs"):
        return None, []
    path, default, runtimes = _effective_runtimes(facts, plan, after)
    names = [default] + sorted(name for name in plan.written_names if name != default)
    wanted = driver == "systemd"
    effective = dict((name, bool((runtimes[name].get("options") or {}).get("SystemdCgroup", False)))
                     for name in names if name in runtimes)
    wrong = [name for name, value in effective.items() if value != wanted]
    if not wrong:
        return None, []
    mismatch = {"kubelet_cgroup_driver": driver, "kubelet_config": kubelet.get("source"), "containerd_config": path,
                "systemd_cgroup": effective, "runtimes": wrong}
    return mismatch, [
        "[cgroup_driver_mismatch] the kubelet's cgroupDriver is %s (%s) but in %s SystemdCgroup is %s for %s: pods "
        "of those runtimes crash-loop or get killed; set SystemdCgroup = %s in %s's options and restart containerd "
        "(the NVIDIA runtimes inherit it), or give this module's runtimes systemd_cgroup: %s" % (
            driver, kubelet.get("source"), path, str(not wanted).lower(), ", ".join(wrong), str(wanted).lower(),
            default, str(wanted).lower())]


def _earlier_file_changes(facts, plan):
    """Our tables taken out of the files this module wrote for an earlier release or layout."""
    target = plan.target
    out = []
    for key in release_rules.OWN_DROPINS + bookkeeping.TEMPLATE_KEYS:
        if key == target["key"] or key not in facts.files:
            continue
        other = facts.files[key]
        text = other.get("content")
        if other.get("state") != "file" or text is None:
            continue
        if key in bookkeeping.TEMPLATE_KEYS and not text.startswith(toml.MANAGED_HEADER):
            continue
        # a file this module wrote for an earlier release or layout: take our tables out of it
        remove = tuple(sorted(set(plan.written_names) | {n for n, _b in distro.NVIDIA_RUNTIMES}))
        cleanup = plan.replaced(state="absent", remove=remove, target=dict(
            target, mode=planner.MODE_TEMPLATE if key in bookkeeping.TEMPLATE_KEYS else planner.MODE_DROPIN,
            schema=3 if key.endswith("v3") else target["schema"] if key == "dropin" else 2))
        cleaned = toml.apply_plan(text, cleanup, other["path"], key in bookkeeping.TEMPLATE_KEYS, facts.profile, created_by_us=True)
        out.append(file_change(facts, key, other["path"], cleaned, "earlier file"))
    return out


def _default_runtime_file_changes(facts, plan, params):
    """The k3s/rke2 config.yaml.d file of the default runtime and node labels (and the legacy labels file).
    Returns (the node labels the file holds, None where the task does not own them; the changes)."""
    out = []
    wanted_yaml = None
    labels = None
    default = plan.default_runtime
    own_yaml = facts.files.get("default_runtime_file") or {}
    default_name = default["name"] if default and default["how"] == "config_yaml" else None
    handler_labels = params.get("handler_labels")
    if handler_labels is not None:
        # the task owns the whole file: the default runtime if given, a label per handler if asked
        labels = []
        if plan.state != "absent":
            # the handler labels when asked, then the extra labels (the device plugin's), each once
            wanted = (node_labels(plan) if handler_labels else []) + _checked_labels(params.get("node_labels"))
            labels = [label for index, label in enumerate(wanted) if label not in wanted[:index]]
        wanted_yaml = toml.render_default_runtime_yaml(default_name, labels)
        legacy = facts.files.get("labels_file_legacy") or {}
        if (legacy.get("content") or "").startswith(LEGACY_LABELS_HEADER):
            out.append(file_change(facts, "labels_file_legacy", legacy["path"], None, "earlier labels file"))
    elif default_name:
        wanted_yaml = toml.render_default_runtime_yaml(default_name)
    elif plan.state != "absent" and not default:
        wanted_yaml = own_yaml.get("content")  # not managed by this task: leave it as it is
    out.append(file_change(facts, "default_runtime_file", facts.paths["default_runtime_file"], wanted_yaml,
                           "default runtime file"))
    return (tuple(labels) if labels is not None else None), out


def _not_taking_over(plan, file_changes) -> Tuple[List[FileChange], List[str]]:
    """Refuse to write over a file at one of the collection's names that it did not write (no managed first line): the
    user's settings in it would be lost. The take-back (state absent) leaves such a file alone and says so.
    Returns (the changes to make, the notes on the files left alone)."""
    kept, notes = [], []
    for one in file_changes:
        before = one.before
        if one.key not in _WHOLLY_OURS or before is None or before.startswith(
                (toml.MANAGED_HEADER, toml.MANAGED_YAML_HEADER)):
            kept.append(one)
            continue
        if plan.state == "absent":
            notes.append("%s was not written by k3s_gpu.nvidia (it lacks the collection's first line): it is left "
                         "as it is" % one.node_path)
            continue
        raise K3sGpuError(
            "%s exists but was not written by k3s_gpu.nvidia (its first line is not %r), and the collection writes that "
            "file whole: your settings in it would be lost" % (one.node_path, _header_of(one.node_path)),
            fix="move your settings into a file of your own in that directory (such as 40-site%s) and remove %s, then "
                "run again; nothing was written" % (one.node_path[one.node_path.rfind("."):], one.node_path))
    return kept, notes


def _header_of(node_path):
    return toml.MANAGED_YAML_HEADER if node_path.endswith(".yaml") else toml.MANAGED_HEADER
