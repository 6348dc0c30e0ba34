# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The plan and the file changes: from the node's reading (a _node_facts.NodeFacts) and the task's options to the
exact new text of each file (controller side, no I/O). The facts step before it is _node_reading, the write step
after it _node_write.

PRIVATE to the collection.
"""

from __future__ import annotations

import hashlib
import tomllib

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _merge as merge
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as template_check
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

_TEMPLATES = ("template_v3", "template_v2")


def _change(facts, key, node_path, after, kind):
    info = facts.files.get(key) or {"state": "absent", "path": node_path}
    before = info.get("content") if info.get("state") == "file" else None
    if before is None and after is None:
        return None
    if info.get("state") not in ("absent", "file") or info.get("error"):
        planner._refuse_unusable(info, kind)
    return {"key": key, "node_path": node_path, "path": facts.host_path(node_path),
            "before": before, "after": after, "exists": info.get("state") == "file",
            "parent_exists": info.get("state") == "file" or bool(info.get("parent_exists"))}


# the first line of the labels file the gpu_node role wrote before this task took the labels over
LEGACY_LABELS_HEADER = "# Managed by k3s_gpu.nvidia (gpu_node)"


def node_labels(plan):
    """One `<prefix><handler>=true` label per NVIDIA handler the node serves (written here or rendered by k3s)."""
    handlers = sorted({r["name"] for r in plan["write"]} | {r["name"] for r in plan["skip"]})
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


def compute(facts, params, own_files=False, check_cache=None):
    """Plan and file changes for the task, from the node's reading (a _node_facts.NodeFacts: the node side's planner
    takes its dict, facts.reading). own_files: the gpu_node role's bookkeeping (own_files below); check_cache: a
    _check_cache.CheckCache the template checks share. Raises K3sGpuError; nothing is written then."""
    target_profile = _target_profile(facts, params)
    plan = planner.make_plan(
        facts.reading, runtimes=params.get("runtimes"), state=params.get("state") or "present",
        default_runtime=params.get("default_runtime"), enable_cdi=params.get("enable_cdi"), path=params.get("path"))
    target = plan["target"]
    profile = facts.profile
    info = facts.files.get(target["key"]) or {}
    current = info.get("content") if info.get("state") == "file" else None
    _keep_users_runtimes(facts, plan, target, current)
    default_flag = _flag_default_runtime(facts, plan)  # what k3s passes to its base after the next start
    # the base k3s renders for this node after the next start, worked out once: the template check, the release's own
    # runtime tables and the layers under a drop-in all read it
    base = None if facts.distribution == distro.CONTAINERD else template_check.node_base(
        facts, profile, target["schema"], list(facts.release_runtimes), default_flag)
    reader = _template_reader(facts, plan, params, default_flag, base, target_profile, check_cache)
    plan["backup"] = release_rules.backup_prefix(target["path"]) if params.get("backup") else None
    plan["release_tables"] = _release_tables(facts, plan, base)
    plan["base_included"] = target["mode"] == planner.MODE_TEMPLATE and planner.template_includes_base(facts.reading, target)
    if target["mode"] == planner.MODE_DROPIN:
        plan["inherited"] = _layered_default_runtime(facts, plan, target, base)
    plan["settings_added"] = _settings_added(facts, target)
    if reader is not None and reader.normalized is not None and target["mode"] == planner.MODE_TEMPLATE:
        current = reader.normalized  # opted in: the edit starts from the clean text (BOM and CR removed)
    # a template is checked whole right after (_check_rendered), composed with the base it really gets
    applied = toml.edit_target(current, plan, target["path"], target["mode"] == planner.MODE_TEMPLATE, profile,
                               checked_after=target["mode"] == planner.MODE_TEMPLATE and facts.distribution != distro.CONTAINERD)
    after = applied.text
    plan["removed_for_base"], plan["removed_stale"] = applied.removed_for_base, applied.removed_stale
    _check_rendered(facts, plan, reader, after, default_flag, base, target_profile, check_cache)
    _check_dropin_on_target(plan, target_profile)
    note = toml.inheritance_note(plan.get("inherited_from")) if plan["state"] == "present" and plan["write"] else None
    if note:
        plan["notes"].append(note)
    if plan.get("edit_warnings"):
        plan.setdefault("warnings", []).extend(plan["edit_warnings"])  # what the edit itself changed of the user's
    if facts.distribution == distro.CONTAINERD and target["mode"] in (planner.MODE_CONFIG, planner.MODE_DROPIN):
        toml.check_plain_result(after, plan, target["path"], target["schema"])
    if facts.distribution == distro.CONTAINERD and plan["state"] == "present":
        _check_cgroup_driver(facts, plan, target, after)
    changes = [_change(facts, target["key"], target["path"], after, "target")]
    if reader is not None and reader.normalized is not None and target["mode"] != planner.MODE_TEMPLATE:
        key = target["template"]
        changes.append(_change(facts, key, facts.files[key]["path"], reader.normalized, "template"))
    changes.extend(_earlier_file_changes(facts, plan, target, profile))
    if profile["distribution"] != distro.CONTAINERD:
        changes.extend(_default_runtime_file_changes(facts, plan, params))
    changes = _not_taking_over(plan, [c for c in changes if c is not None and c["before"] != c["after"]])
    if own_files:
        changes = role_bookkeeping(facts, plan, changes, bool(params.get("backup")))
    return plan, changes


def _keep_users_runtimes(facts, plan, target, current):
    """A runtime the user configured with a binary of their own is the user's: in the template or config this task
    edits in place, or in another drop-in of the directory (containerd reads ours later, so ours would win). It is kept
    as it is and skipped here, with the way to hand it over."""
    if plan["state"] != "present" or not plan["write"]:
        return
    names = [r["name"] for r in plan["write"]]
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
    for runtime in [r for r in plan["write"] if r["name"] in kept]:
        path, binary = kept[runtime["name"]]
        plan["write"].remove(runtime)
        plan["skip"].append({"name": runtime["name"], "reason": (
            "%s configures runtime %s with its own binary %s: it is yours and kept as it is (to hand it over to "
            "k3s_gpu.nvidia, remove that table and run again)" % (path, runtime["name"], binary))})


# the files the collection writes whole, at names of its own: it knows its own by their first line
_WHOLLY_OURS = release_rules.OWN_DROPINS + ("default_runtime_file",)


def _not_taking_over(plan, file_changes):
    """Refuse to write over a file at one of the collection's names that it did not write (no managed first line): the
    user's settings in it would be lost. The take-back (state absent) leaves such a file alone and says so."""
    kept = []
    for change in file_changes:
        before = change["before"]
        if change["key"] not in _WHOLLY_OURS or before is None or before.startswith(
                (toml.MANAGED_HEADER, toml.MANAGED_YAML_HEADER)):
            kept.append(change)
            continue
        if plan["state"] == "absent":
            plan["notes"].append("%s was not written by k3s_gpu.nvidia (it lacks the collection's first line): it is left "
                                 "as it is" % change["node_path"])
            continue
        raise K3sGpuError(
            "%s exists but was not written by k3s_gpu.nvidia (its first line is not %r), and the collection writes that "
            "file whole: your settings in it would be lost" % (change["node_path"], _header_of(change["node_path"])),
            fix="move your settings into a file of your own in that directory (such as 40-site%s) and remove %s, then "
                "run again; nothing was written" % (change["node_path"][change["node_path"].rfind("."):], change["node_path"]))
    return kept


def _header_of(node_path):
    return toml.MANAGED_YAML_HEADER if node_path.endswith(".yaml") else toml.MANAGED_HEADER


def _settings_added(facts, target):
    """Whether the default runtime in the user's template is the collection's: the text kept from before its first edit
    (<template>.k3s-gpu-nvidia.orig) sets none."""
    original = (facts.files.get(target["key"] + "_orig") or {}).get("content")
    if target["mode"] != planner.MODE_TEMPLATE or original is None:
        return False
    return "default_runtime_name" not in original


def _earlier_file_changes(facts, plan, target, profile):
    """Our tables taken out of the files this module wrote for an earlier release or layout."""
    out = []
    for key in release_rules.OWN_DROPINS + _TEMPLATES:
        if key == target["key"] or key not in facts.files:
            continue
        other = facts.files[key]
        text = other.get("content")
        if other.get("state") != "file" or text is None:
            continue
        if key in _TEMPLATES and not text.startswith(toml.MANAGED_HEADER):
            continue
        # a file this module wrote for an earlier release or layout: take our tables out of it
        cleanup = dict(plan, state="absent", remove=sorted({r["name"] for r in plan["write"]} | {n for n, _b in distro.NVIDIA_RUNTIMES}),
                       target=dict(target, mode=planner.MODE_TEMPLATE if key in _TEMPLATES else planner.MODE_DROPIN,
                                   schema=3 if key.endswith("v3") else target["schema"] if key == "dropin" else 2))
        cleaned = toml.apply_plan(text, cleanup, other["path"], key in _TEMPLATES, profile, created_by_us=True)
        out.append(_change(facts, key, other["path"], cleaned, "earlier file"))
    return out


def _default_runtime_file_changes(facts, plan, params):
    """The k3s/rke2 config.yaml.d file of the default runtime and node labels (and the legacy labels file)."""
    out = []
    wanted_yaml = None
    default = plan["default_runtime"]
    own_yaml = facts.files.get("default_runtime_file") or {}
    default_name = default["name"] if default and default["how"] == "config_yaml" else None
    handler_labels = params.get("handler_labels")
    if handler_labels is not None:
        # the task owns the whole file: the default runtime if given, a label per handler if asked
        plan["node_labels"] = []
        if plan["state"] != "absent":
            # the handler labels when asked, then the extra labels (the device plugin's), each once
            wanted = (node_labels(plan) if handler_labels else []) + _checked_labels(params.get("node_labels"))
            plan["node_labels"] = [label for index, label in enumerate(wanted) if label not in wanted[:index]]
        wanted_yaml = toml.render_default_runtime_yaml(default_name, plan["node_labels"])
        legacy = facts.files.get("labels_file_legacy") or {}
        if (legacy.get("content") or "").startswith(LEGACY_LABELS_HEADER):
            out.append(_change(facts, "labels_file_legacy", legacy["path"], None, "earlier labels file"))
    elif default_name:
        wanted_yaml = toml.render_default_runtime_yaml(default_name)
    elif plan["state"] != "absent" and not default:
        wanted_yaml = own_yaml.get("content")  # not managed by this task: leave it as it is
    out.append(_change(facts, "default_runtime_file", facts.paths["default_runtime_file"], wanted_yaml,
                       "default runtime file"))
    return out


# --- what the gpu_node role keeps to take its edits back (compute's own_files) ------------------------------

# user files edited in place whose bytes before the first edit are kept (their <key>_orig and <key>_record facts)
ORIGINAL_KEYS = ("template_v3", "template_v2", "config")
# our files whose directory goes with them when they leave it empty (k3s/rke2 create none of these directories)
PRUNED_PARENTS = ("dropin_v3", "dropin_v2", "default_runtime_file", "labels_file_legacy")


def _sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# the record's second line: the text the edit replaced, as a comment (`sha256sum -c` checks the first line only)
_PREVIOUS = "# the text before this edit: "


def record_text(node_path, text, previous=None):
    """The record of what the collection leaves in node_path: a sha256sum line of the text it writes, then a comment
    with the SHA-256 of the text it replaces (previous, when that was the collection's too, or the original). The
    record is written before the edit, so a run killed between the two leaves a file whose text the record names."""
    lines = ["%s  %s\n" % (_sha256(text), node_path.rsplit("/", 1)[-1])]
    if previous is not None and previous != text:
        lines.append("%s%s\n" % (_PREVIOUS, _sha256(previous)))
    return "".join(lines)


def recorded_sums(record):
    """The SHA-256 sums a record names (empty: no record, or not one)."""
    sums = set()
    for line in (record or "").splitlines():
        fields = line[len(_PREVIOUS):].split() if line.startswith(_PREVIOUS) else line.split()
        if fields and len(fields[0]) == 64:
            sums.add(fields[0].lower())
    return sums


def _text_of(facts, key):
    info = facts.files.get(key) or {}
    return info.get("content") if info.get("state") == "file" else None


def _schema_of(facts, plan, key):
    return distro.schema_of_template(facts.paths[key].rsplit("/", 1)[-1]) if key in _TEMPLATES else plan["target"]["schema"]


def runtime_names_in(text, schema, is_template, path):
    """Names of the runtime tables a containerd template/config declares (None: it does not parse)."""
    try:
        masked = toml.mask_template(text, path)[0] if is_template else text
        section = toml.containerd_section(toml.loads(masked), schema) or {}
    except (tomllib.TOMLDecodeError, K3sGpuError, ValueError):
        return None
    runtimes = section.get("runtimes")
    return sorted(runtimes) if isinstance(runtimes, dict) else []


def _bookkeeping(facts, key, suffix_key, after):
    """A change of <key>_orig or <key>_record (None: none needed)."""
    node_path = facts.paths[key] + (distro.ORIGINAL_SUFFIX if suffix_key == "orig" else distro.RECORD_SUFFIX)
    change = _change(facts, "%s_%s" % (key, suffix_key), node_path, after, "kept original")
    if change is not None and change["before"] != change["after"]:
        change["mode"] = "0600"
        return change
    return None


def role_bookkeeping(facts, plan, changes, backup=False):
    """The role's bookkeeping around the engine's changes: keep the bytes of a user's file before its first edit
    (present), put them back or take out only our tables (absent), and let our directories go with our files."""
    by_key = dict((c["key"], c) for c in changes)
    first, extra = [], []  # node_files applies in order: an original is kept before the edit it predates
    # the files of this node's layout whose reading has the kept-original facts
    keys = [key for key in ORIGINAL_KEYS if key + "_orig" in facts.files and key in facts.paths]
    if plan["state"] == "present":
        for key in keys:
            change = by_key.get(key)
            if change is None or not change["exists"] or change["after"] is None:
                continue
            before = change["before"]
            if before.startswith(toml.MANAGED_HEADER):
                continue  # a file the collection created: absent removes it whole
            record = _text_of(facts, key + "_record")
            if (facts.files.get(key + "_orig") or {}).get("state") != "file":
                ours = set(plan["remove"]) | set(r["name"] for r in plan["write"]) | set(n for n, _b in distro.NVIDIA_RUNTIMES)
                found = runtime_names_in(before, _schema_of(facts, plan, key), key in _TEMPLATES, change["node_path"])
                if found is None or ours & set(found):
                    # it already holds tables of ours (an earlier version of the collection edited it), or we cannot
                    # tell: its first bytes are unknown, and absent takes out the NVIDIA tables by name
                    plan["notes"].append("%s already declares NVIDIA runtime tables (%s): its text before the "
                                         "collection's first edit is unknown and not kept" % (
                                             change["node_path"], ", ".join(sorted(ours & set(found or ())))))
                    continue
                first.append(_bookkeeping(facts, key, "orig", before))
                first.append(_bookkeeping(facts, key, "record", record_text(change["node_path"], change["after"], before)))
            elif _sha256(before) in recorded_sums(record) or (record is None and before == _text_of(facts, key + "_orig")):
                # still the collection's text (or the original, a run killed before its first record): the record names
                # the new text before the edit is made
                first.append(_bookkeeping(facts, key, "record", record_text(change["node_path"], change["after"], before)))
            else:
                # edited by someone else since the collection last wrote it: the chain back to the original is broken,
                # and absent takes out only our tables
                extra.append(_bookkeeping(facts, key, "record", None))
    else:
        for key in keys:
            original = _text_of(facts, key + "_orig")
            if original is None:
                extra.append(_bookkeeping(facts, key, "record", None))  # a record alone is of no use
                continue
            by_key[key] = _take_back(facts, plan, key, original, backup)
            orig = _bookkeeping(facts, key, "orig", None)
            if orig is not None and facts.paths[key] in (plan.get("changed_since_written") or ()) and backup:
                orig["keep_copy"] = True  # the user's text from before the first edit is not put back: its copy stays
            extra.append(orig)
            extra.append(_bookkeeping(facts, key, "record", None))
    result = [c for c in first if c is not None]
    for change in changes:
        if change["key"] in by_key:
            change = by_key.pop(change["key"])
        if change is not None:
            result.append(change)
    result.extend(c for c in by_key.values() if c is not None and c["before"] != c["after"])
    result.extend(c for c in extra if c is not None)
    for change in result:
        if change["after"] is None and change["key"] in PRUNED_PARENTS:
            change["remove_empty_parent"] = True
    return result


def _take_back(facts, plan, key, original, backup):
    """The change that takes the collection's edits out of a user's file that has its original kept (None: none)."""
    node_path = facts.paths[key]
    current = _text_of(facts, key)
    if current is None:
        plan["notes"].append("%s is gone (removed since the collection edited it); it is not brought back" % node_path)
        return None
    if current == original or _sha256(current) in recorded_sums(_text_of(facts, key + "_record")):
        plan.setdefault("restored", []).append(node_path)
        change = _change(facts, key, node_path, original, "original")
        return change if change["before"] != change["after"] else None
    schema = _schema_of(facts, plan, key)
    is_template = key in _TEMPLATES
    in_original = set(runtime_names_in(original, schema, is_template, node_path) or ())
    ours = [name for name in plan["remove"] if name not in in_original]
    mode = planner.MODE_TEMPLATE if is_template else planner.MODE_CONFIG
    cleanup = dict(plan, state="absent", remove=ours, reserved_tables=[],
                   target=dict(plan["target"], mode=mode, schema=schema, path=node_path, key=key))
    cleaned = toml.apply_plan(current, cleanup, node_path, is_template, facts.profile, created_by_us=False)
    if cleaned is not None and cleaned.endswith("\n\n") and not original.endswith("\n\n"):
        cleaned = cleaned.rstrip("\n") + "\n"  # the blank line our appended tables were separated by
    taken = [name for name in ours if name in (runtime_names_in(current, schema, is_template, node_path) or ())]
    plan.setdefault("changed_since_written", []).append(node_path)
    plan.setdefault("warnings", []).append(
        "%s changed since k3s_gpu.nvidia last wrote it, so its text from before the collection's first edit (%s) is "
        "not put back: only the collection's runtime tables (%s) were taken out and every other edit is kept; that "
        "original is removed now%s [changed_since_written]" % (
            node_path, node_path + distro.ORIGINAL_SUFFIX, ", ".join(taken) or "none left",
            " (a copy stays as %s.<time>~)" % release_rules.backup_prefix(node_path + distro.ORIGINAL_SUFFIX) if backup else ""))
    change = _change(facts, key, node_path, cleaned, "original")
    return change if change["before"] != change["after"] else None


def _release_tables(facts, plan, base):
    """{runtime name: its table as the release renders it} for each runtime the release renders into the template
    target itself (k3s detects its binary); {} elsewhere. base: the node's base rendering (node_base)."""
    target = plan["target"]
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


def _layered_default_runtime(facts, plan, target, base):
    """The default runtime's table as containerd sees it around our drop-in: the root config (plain containerd) or the
    base k3s renders with the user's template (k3s/rke2), then every other drop-in of the directory in import order.
    A drop-in or template that makes another runtime the default is followed (nvidia-ctk's rule)."""
    schema = target["schema"]
    layers = []
    if facts.distribution == distro.CONTAINERD:
        config = facts.files.get("config") or {}
        if config.get("state") == "file" and config.get("content") is not None:
            try:
                layers.append(toml.loads(config["content"]))
            except tomllib.TOMLDecodeError as exc:
                raise K3sGpuError(
                    "%s: %s [toml_invalid]: containerd cannot load it either" % (config["path"], exc),
                    fix="fix that line; nothing was written")
    else:
        layers.append(base.document())
        template = facts.files.get(target.get("template") or "") or {}
        if template.get("content"):
            try:
                layers.append(toml.loads(toml.mask_template(template["content"], template["path"])[0]))
            except (tomllib.TOMLDecodeError, K3sGpuError):
                pass  # the template check names what is wrong with it
    directory = target["path"].rsplit("/", 1)[0] + "/"
    for info in facts.other_dropins:
        if info.get("path", "").startswith(directory) and info.get("content") is not None:
            try:
                layers.append(toml.loads(info["content"]))
            except tomllib.TOMLDecodeError:
                continue  # containerd refuses it at start whatever this task does; not a source
    merged = {}
    for layer in layers:
        merged = merge.deep_merge(merged, layer)  # containerd merges each import over what it read before
    return toml.inherited_runtime(merged, schema, toml.own_runtime_names(plan))


def _effective_runtimes(facts, target, after):
    """(config path, default runtime name, {name: runtime table}) as containerd reads the root config and our
    drop-in after this write (a drop-in's runtime tables and default_runtime_name win over the root's)."""
    config = facts.files.get("config") or {}
    root_text = after if target["mode"] == planner.MODE_CONFIG else config.get("content")
    layers = [root_text] + ([after] if target["mode"] == planner.MODE_DROPIN else [])
    default, runtimes = None, {}
    for text in layers:
        if not text:
            continue
        try:
            containerd = toml.containerd_section(toml.loads(text), target["schema"])
        except tomllib.TOMLDecodeError:
            continue  # refused elsewhere with the line
        if containerd is None:
            continue
        default = containerd.get("default_runtime_name") or default
        runtimes.update((name, table) for name, table in (containerd.get("runtimes") or {}).items() if isinstance(table, dict))
    return config.get("path") or target["path"], default or "runc", runtimes


def _check_cgroup_driver(facts, plan, target, after):
    """Warn where the kubelet's cgroupDriver and SystemdCgroup of the runtimes that run pods disagree (the
    best-known cause of crash-looping pods on kubeadm nodes). Never rewrites runc: that is the user's call."""
    kubelet = facts.reading.get("kubelet") or {}
    driver = (kubelet.get("cgroup_driver") or "").strip().lower()
    if driver not in ("systemd", "cgroupfs"):
        plan["cgroup_driver_mismatch"] = None
        return
    path, default, runtimes = _effective_runtimes(facts, target, after)
    names = [default] + sorted(r["name"] for r in plan["write"] if r["name"] != default)
    wanted = driver == "systemd"
    effective = dict((name, bool((runtimes[name].get("options") or {}).get("SystemdCgroup", False)))
                     for name in names if name in runtimes)
    wrong = [name for name, value in effective.items() if value != wanted]
    if not wrong:
        plan["cgroup_driver_mismatch"] = None
        return
    plan["cgroup_driver_mismatch"] = {"kubelet_cgroup_driver": driver, "kubelet_config": kubelet.get("source"),
                                      "containerd_config": path, "systemd_cgroup": effective, "runtimes": wrong}
    plan.setdefault("warnings", []).append(
        "[cgroup_driver_mismatch] the kubelet's cgroupDriver is %s (%s) but in %s SystemdCgroup is %s for %s: pods "
        "of those runtimes crash-loop or get killed; set SystemdCgroup = %s in %s's options and restart containerd "
        "(the NVIDIA runtimes inherit it), or give this module's runtimes systemd_cgroup: %s" % (
            driver, kubelet.get("source"), path, str(not wanted).lower(), ", ".join(wrong), str(wanted).lower(),
            default, str(wanted).lower()))


# template findings that make the current text unusable as the start of an edit
_BEFORE_EDIT = ("encoding_bom", "encoding_crlf", "encoding_nul", "encoding_utf8", "empty", "parse_error",
                "unknown_function", "unknown_template")


def _template_path(facts, key):
    return (facts.files.get(key) or {}).get("path") or facts.paths.get(key) or key


def _flag_default_runtime(facts, plan):
    """The default runtime k3s passes to its base after the next start (config.yaml(.d) or the unit)."""
    default = plan.get("default_runtime") or {}
    if default.get("how") == "config_yaml":
        return default["name"]
    current = facts.reading.get("default_runtime") or {}
    if current.get("source") == facts.paths.get("default_runtime_file") and (default or plan["state"] == "absent"):
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


def _template_reader(facts, plan, params, default_flag, base, target_profile, check_cache=None):
    """Check the template k3s/rke2 reads as it is now: refuse what breaks the node before anything is
    decided on top of it. Returns the report (None: no template, or plain containerd)."""
    if facts.distribution == distro.CONTAINERD:
        return None
    target = plan["target"]
    key = target.get("template")
    info = facts.files.get(key) if key else None
    if not info or info.get("state") != "file" or info.get("content") is None:
        return None
    schema = distro.schema_of_template(info["path"].rsplit("/", 1)[-1]) if key != "override" else target["schema"]
    edit_in_place = target["mode"] == planner.MODE_TEMPLATE and target["key"] == key
    # a template edited in place is checked whole once, as it will be written (_check_rendered)
    report = template_check.check(info["content"], info["path"], facts, schema,
                                  default_runtime=default_flag, target_profile=target_profile,
                                  normalize=bool(params.get("normalize_encoding")), light=edit_in_place,
                                  cache=check_cache, base=base)
    report.schema = schema
    _record(plan, report)
    blocking = report.refusals if not edit_in_place else [f for f in report.refusals if f.code in _BEFORE_EDIT]
    if blocking:
        raise report.refusal(blocking)
    if report.normalized is not None:
        plan["notes"].append("%s: normalized the encoding (byte order mark / CR line endings removed), as "
                             "normalize_encoding asks" % info["path"])
    return report


def refusal_before_install(facts):
    """Why the template k3s/rke2 reads must stop a toolkit install, as a K3sGpuError (None: it may go ahead).
    facts: a NodeFacts.

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
    ours = [n for n, _b in distro.NVIDIA_RUNTIMES] if info["content"].startswith(toml.MANAGED_HEADER) else ()
    report = template_check.check(info["content"], info["path"], facts, schema,
                                  default_runtime=facts.default_runtime, ours=ours)
    edited = target["mode"] == planner.MODE_TEMPLATE
    blocking = [f for f in report.refusals
                if f.when == template_check.AFTER_INSTALL or not edited or f.code in _BEFORE_EDIT]
    return report.refusal(blocking) if blocking else None


def _check_rendered(facts, plan, reader, after, default_flag, base, target_profile, check_cache=None):
    """The template we are about to write, rendered for the node now, after the toolkit install and on
    target_release: refuse anything that would break it (nothing is written then)."""
    target = plan["target"]
    if facts.distribution == distro.CONTAINERD or target["mode"] != planner.MODE_TEMPLATE or after is None:
        return
    schema = target["schema"] if reader is None else reader.schema
    report = template_check.check(after, target["path"], facts, schema, default_runtime=default_flag,
                                  target_profile=target_profile, ours={r["name"] for r in plan["write"]},
                                  cache=check_cache, base=base)
    _record(plan, report, replace=True)
    if report.refusals:
        raise report.refusal()


def _check_dropin_on_target(plan, target_profile):
    """An upgrade finding where target_release does not import the drop-in this task writes: the directory came in
    v1.33.10, v1.34.6 and v1.35.3, so an earlier patch of a later line (or an older line) reads no drop-in, and the
    runtimes written there are gone after the upgrade; the template check cannot see it (there may be no template)."""
    target = plan["target"]
    if target_profile is None or target["mode"] != planner.MODE_DROPIN or plan["state"] == "absent" or not plan["write"]:
        return
    if target_profile["dropin_imports"]:
        return
    finding = template_check.Finding(
        "dropin_not_read", 0, "%s %s does not import the drop-in directory, so the runtimes written here (%s) are gone "
        "after the upgrade and pods of their RuntimeClasses fail" % (
            target_profile["distribution"], target_profile["release"], ", ".join(r["name"] for r in plan["write"])),
        "run k3s_gpu.nvidia.site right after the upgrade (on that release it writes them into the containerd template), "
        "or upgrade to a release that imports the drop-in directory", when=template_check.UPGRADE)
    plan.setdefault("upgrade_findings", []).append(finding.as_dict())
    plan.setdefault("upgrade_messages", []).append(finding.text(target["path"]))
    plan.setdefault("warnings", []).append(finding.text(target["path"]))


def _record(plan, report, replace=False):
    findings = [f.as_dict() for f in report.findings]
    if replace or "template_findings" not in plan:
        plan["template_findings"] = findings
    plan["template_outcome"] = report.outcome
    plan["upgrade_findings"] = [f.as_dict() for f in report.upgrade]
    plan["upgrade_messages"] = [f.text(report.path) for f in report.upgrade]
    plan["warnings"] = [f.text(report.path) for f in report.warnings + report.upgrade]


def result_fields(facts, plan):
    return {
        "distribution": facts.distribution,
        "release": facts.release,
        "target": {k: plan["target"].get(k) for k in ("mode", "path", "schema", "reason")},
        "runtimes_written": [{"name": r["name"], "binary": r["binary"], "runtime_type": r["runtime_type"]} for r in plan["write"]]
        if plan["state"] == "present" else [],
        "runtimes_skipped": plan["skip"],
        "inherited_from": _inherited_result(plan),
        "runtimes_removed": sorted(set(plan["remove"] if plan["state"] == "absent" else []) | set(plan.get("removed_for_base") or [])
                                   | set(plan.get("removed_stale") or [])),
        "default_runtime": plan["default_runtime"],
        "node_labels": plan.get("node_labels"),
        "notes": plan["notes"],
        "runtime_in_use": facts.reading.get("runtime_in_use"),
        "cgroup_driver_mismatch": plan.get("cgroup_driver_mismatch"),
        "template_outcome": plan.get("template_outcome"),
        "template_findings": plan.get("template_findings") or [],
        "upgrade_findings": plan.get("upgrade_findings") or [],
        "upgrade_messages": plan.get("upgrade_messages") or [],
    }


def _inherited_result(plan):
    inherited = plan.get("inherited_from") if plan["state"] == "present" and plan["write"] else None
    if not inherited:
        return None
    return {"runtime": inherited["name"], "default_runtime": inherited.get("default"), "fallback": inherited.get("fallback"),
            "keys": sorted(inherited["keys"]), "options": sorted(inherited["options"])}
