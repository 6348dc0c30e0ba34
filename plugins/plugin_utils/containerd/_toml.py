# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd TOML on the controller: render runtime blocks, merge them into a config or a
k3s/rke2 Go template, remove them, and refuse to emit a table the base template emits.

PRIVATE to the collection. Controller side (Python 3.11+: tomllib). Blocks are rendered with
tomlkit, so keys are always quoted by the library. Edits are line-range surgery on the original
text: every byte outside the tables we manage stays as it was, comments and spacing included.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from typing import Any, Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

try:
    import tomlkit
except ImportError as exc:  # pragma: no cover - exercised by the sanity import test
    tomlkit = None
    TOMLKIT_IMPORT_ERROR = exc
else:
    TOMLKIT_IMPORT_ERROR = None

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import unquoted_find
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml_read as toml_read
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, several

MANAGED_HEADER = "# Managed by Ansible: k3s_gpu.nvidia.containerd_runtimes rewrites the runtime tables in this file."
MANAGED_YAML_HEADER = "# Managed by Ansible: k3s_gpu.nvidia.containerd_runtimes rewrites this file."
BASE_LINE = k3s_base.BASE_LINE


def require_tomlkit() -> None:
    if tomlkit is None:
        raise K3sGpuError("the Python library tomlkit is required on the Ansible controller (import error: %s)"
                          % TOMLKIT_IMPORT_ERROR,
                          fix="pip install 'tomlkit>=0.11.0,<1.0' (the range requirements.txt allows) into the "
                              "controller's Python, or the execution environment's")


# --- Go template lines --------------------------------------------------------------------------

_PLACEHOLDER = "#k3s-gpu-go-template-line:%d"
_PLACEHOLDER_RE = re.compile(r"^#k3s-gpu-go-template-line:(\d+)$")


def mask_template(text: str, path: str) -> Tuple[str, List[str]]:
    """Replace every line holding a Go template action by a TOML comment placeholder.

    Returns (masked text, original lines by placeholder index). An action left open on its
    line (`{{` without `}}`) is refused: the TOML between actions could not be told apart.
    """
    lines = text.split("\n")
    originals = []
    for number, line in enumerate(lines, 1):
        opened, closed = line.count("{{"), line.count("}}")
        if opened != closed:
            raise K3sGpuError(
                "%s: line %d: unbalanced Go template delimiters (%d `{{`, %d `}}`) "
                "in %r" % (path, number, opened, closed, line.strip()[:120]),
                fix="keep each template action on one line, closed with `}}`")
        if opened:
            lines[number - 1] = _PLACEHOLDER % len(originals)
            originals.append(line)
    return "\n".join(lines), originals


def unmask_template(masked: str, originals: Sequence[str]) -> str:
    if not originals:
        return masked
    lines = masked.split("\n")
    for index, line in enumerate(lines):
        match = _PLACEHOLDER_RE.match(line)
        if match:
            lines[index] = originals[int(match.group(1))]
    return "\n".join(lines)


# --- scanning tables with their line ranges -------------------------------------------------------

Table = toml_read.Table


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def parse_key(text: str) -> Tuple[str, ...]:
    """A dotted TOML key into its parts, honouring quotes."""
    parts, index, size = [], 0, len(text)
    while True:
        while index < size and text[index] in " \t":
            index += 1
        if index >= size:
            raise ValueError("empty key")
        char = text[index]
        if char == '"':
            end = index + 1
            while end < size and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            quoted = text[index:end + 1]
            # escapes are rare in keys; let the TOML parser decode them when present
            parts.append(tomllib.loads("k = " + quoted)["k"] if "\\" in quoted else quoted[1:-1])
            index = end + 1
        elif char == "'":
            end = text.index("'", index + 1)
            parts.append(text[index + 1:end])
            index = end + 1
        else:
            match = _BARE_KEY.match(text, index)
            if not match:
                raise ValueError("bad key")
            parts.append(match.group(0))
            index = match.end()
        while index < size and text[index] in " \t":
            index += 1
        if index >= size:
            return tuple(parts)
        if text[index] != ".":
            raise ValueError("bad key")
        index += 1


_SIMPLE_HEADER = re.compile(r"""^\[(\[?)((?:[A-Za-z0-9_.\- \t]|"[^"\\]*"|'[^']*')+)\](\]?)\s*(?:#.*)?$""")


def _header_key(stripped):
    """Key text of a `[a.b]` / `[[a.b]]` header line (comment removed), or None."""
    match = _SIMPLE_HEADER.match(stripped)
    if match and bool(match.group(1)) == bool(match.group(3)):
        return match.group(2), bool(match.group(1))
    array = stripped.startswith("[[")
    body = stripped[2:] if array else stripped[1:]
    end = unquoted_find(body, "]")
    return (body[:end] if end >= 0 else None), array


def _scan_value_chars(line, state):
    """Update the multi-line state (open string / array depth) across one value line."""
    index, size = 0, len(line)
    while index < size:
        if state["ml"]:
            end = line.find(state["ml"], index)
            if end < 0:
                return
            index = end + 3
            state["ml"] = None
            continue
        char = line[index]
        if char == "#":
            return
        if line.startswith('"""', index) or line.startswith("'''", index):
            state["ml"] = line[index:index + 3]
            index += 3
            continue
        if char == '"':
            index += 1
            while index < size and line[index] != '"':
                index += 2 if line[index] == "\\" else 1
        elif char == "'":
            end = line.find("'", index + 1)
            index = size if end < 0 else end
        elif char in "[{":
            state["depth"] += 1
        elif char in "]}":
            state["depth"] -= 1
        index += 1


_MULTILINE_OPENERS = re.compile(r"[\[{]|\"\"\"|'''")


def scan_tables(lines: Sequence[str]) -> List[Table]:
    """Every explicit table header with its line range, in document order."""
    tables = []
    state = {"ml": None, "depth": 0}
    current = None
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not state["ml"] and state["depth"] == 0 and stripped.startswith("["):
            key_text, array = _header_key(stripped)
            if key_text is not None:
                current = Table(parse_key(key_text), array, number)
                tables.append(current)
                continue
        if current is not None:
            current.end = number + 1
            if state["ml"] or state["depth"] or (stripped and not stripped.startswith("#")):
                current.content_end = number + 1
        # single-line strings cannot carry state to the next line: only brackets and
        # triple quotes can, so most lines need no character scan
        if state["ml"] or state["depth"] or _MULTILINE_OPENERS.search(line):
            _scan_value_chars(line, state)
    return tables


# --- rendering ----------------------------------------------------------------------------------

_QUOTED = {}  # key part -> its TOML text (the same few parts come back in every header)


def _key_text(path):
    """Dotted key text, each part quoted by tomlkit only where TOML needs it."""
    require_tomlkit()
    for part in path:
        if part not in _QUOTED:
            _QUOTED[part] = tomlkit.key(part).as_string()
    return ".".join(_QUOTED[part] for part in path)


def render_table(path: Tuple[str, ...], values: Mapping[str, Any]) -> List[str]:
    """One table as lines: `[header]` then `  key = value` (k3s's layout)."""
    require_tomlkit()
    lines = ["[%s]" % _key_text(path)]
    for key, value in values.items():
        lines.append("  %s = %s" % (tomlkit.key(key).as_string(), tomlkit.item(value).as_string()))
    return lines


def render_tables(items: Iterable[Tuple[Tuple[str, ...], Mapping[str, Any]]]) -> str:
    """TOML text for [(key path, {key: value})]; a runtime's options table follows it directly."""
    lines = []
    for path, values in items:
        if lines and path[-1] != "options":
            lines.append("")
        lines.extend(render_table(path, values))
    return "\n".join(lines) + "\n"


def runtime_items(schema: int, runtime: Mapping[str, Any], systemd_cgroup_default: Optional[bool],
                  inherited: Optional[Mapping[str, Any]] = None) -> List[Tuple[Tuple[str, ...], Dict[str, Any]]]:
    """The two tables of one runtime: (runtime table, options table) as (path, values).

    inherited: the default runtime's table (inherited_runtime), which a runc-shim runtime starts from,
    as nvidia-ctk does; the runtime's own binary, systemd_cgroup and options are set over it."""
    path = distro.runtime_table(schema, runtime["name"])
    keys = {"runtime_type": runtime["runtime_type"]}
    options = {"BinaryName": runtime["binary"]}
    if inherited and runtime["runtime_type"] == distro.RUNC_V2:
        keys.update(inherited["keys"])
        options.update(inherited["options"])
    systemd_cgroup = runtime.get("systemd_cgroup")
    if systemd_cgroup is None and "SystemdCgroup" not in options:
        systemd_cgroup = systemd_cgroup_default
    if systemd_cgroup is not None:
        options["SystemdCgroup"] = bool(systemd_cgroup)
    options.update(runtime.get("options") or {})
    return [(path, keys), (path + ("options",), options)]


# runtime-level keys a new runtime does not take from the default runtime: its own type and options, and
# the runtime_engine/runtime_root of containerd 1.x's v1 shims (containerd 2 no longer reads them; a shared
# runtime_root would put two runtimes' state in one directory)
NOT_INHERITED = ("runtime_type", "options", "runtime_engine", "runtime_root")
RUNC_SHIMS = (distro.RUNC_V2, "io.containerd.runc.v1")


def own_runtime_names(plan: EditPlan) -> set:
    """The runtimes this module writes or manages: never a source of inheritance."""
    return set(plan.written_names) | set(name for name, _binary in distro.NVIDIA_RUNTIMES)


def inherited_runtime(data: Mapping[str, Any], schema: int, own: Collection[str] = ()) -> Optional[Dict[str, Any]]:
    """What a runtime this module adds inherits, the rule of nvidia-ctk: the table of the runtime that
    default_runtime_name names (runc's when unset, when that runtime is not a runc shim, or when it is
    one of the runtimes this module writes, `own`: a second run must not copy one NVIDIA runtime into
    the others), every runtime-level key and every option but BinaryName. None without such a table."""
    containerd = value_at(data, distro.containerd_table(schema))
    runtimes = containerd.get("runtimes") if isinstance(containerd, dict) else None
    if not isinstance(runtimes, dict):
        return None
    default = containerd.get("default_runtime_name") or "runc"
    name, table = default, runtimes.get(default)
    fallback = None
    if name in own:
        fallback = "the default runtime %s is one this module writes" % name
    elif not isinstance(table, dict):
        fallback = "the default runtime %s has no table in the config" % name
    elif table.get("runtime_type", distro.RUNC_V2) not in RUNC_SHIMS:
        fallback = "the default runtime %s is not a runc shim (runtime_type %s)" % (name, table.get("runtime_type"))
    if fallback:
        name, table = "runc", runtimes.get("runc")
    if not isinstance(table, dict):
        return None
    options = table.get("options")
    options = dict((k, v) for k, v in options.items() if k != "BinaryName") if isinstance(options, dict) else {}
    return {"name": name, "keys": dict((k, v) for k, v in table.items() if k not in NOT_INHERITED), "options": options,
            "default": default, "fallback": fallback}


def inheritance_note(inherited: Optional[Mapping[str, Any]]) -> Optional[str]:
    """What the result says about where new runtimes took their settings from (None: nowhere)."""
    if not inherited:
        return None
    copied = sorted(inherited["keys"]) + ["options.%s" % k for k in sorted(inherited["options"])]
    text = "new runc-shim runtimes start from the table of %s (%s)" % (
        inherited["name"], ", ".join(copied) if copied else "nothing to copy")
    if inherited.get("fallback"):
        text += ": runc's, because %s" % inherited["fallback"]
    return text


def render_runtime_blocks(schema: int, runtimes: Iterable[Mapping[str, Any]], systemd_cgroup_default: Optional[bool] = None) -> str:
    items = []
    for runtime in runtimes:
        items.extend(runtime_items(schema, runtime, systemd_cgroup_default))
    return render_tables(items) if items else ""


# --- reading values -------------------------------------------------------------------------------

def value_at(data, path):
    """The value at a key path of parsed TOML (None where a key is missing or a step is not a table)."""
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def containerd_section(data: Mapping[str, Any], schema: int) -> Optional[Dict[str, Any]]:
    """The CRI plugin's `containerd` table of a parsed config (runtimes, default_runtime_name), or None."""
    section = value_at(data, distro.containerd_table(schema))
    return section if isinstance(section, dict) else None


def loads(text: str) -> Dict[str, Any]:
    """tomllib.loads, by the one-pass reader where the text is plain TOML (the same answer, faster)."""
    plain = toml_read.read_plain(text.split("\n"))
    return plain[0] if plain is not None else tomllib.loads(text)


def read(lines: Sequence[str]) -> Tuple[Dict[str, Any], List[Table]]:
    """(data, tables) of a document as lines. Raises tomllib.TOMLDecodeError."""
    plain = toml_read.read_plain(lines)
    if plain is not None:
        return plain
    return tomllib.loads("\n".join(lines)), scan_tables(lines)


def _loads(masked, path):
    try:
        return loads(masked)
    except tomllib.TOMLDecodeError as exc:
        raise K3sGpuError("%s: %s [toml_invalid]" % (path, exc), fix="fix that line; nothing was written")


# --- the edit ------------------------------------------------------------------------------------

class Edit:
    """Line edits on one document, applied bottom-up: replace ranges, set lines, insert lines."""

    def __init__(self, lines):
        self.lines = lines
        self.replacements = []  # (start, end, new_lines, order)
        self.appends = []

    def replace(self, start: int, end: int, new_lines: Sequence[str]) -> None:
        for other_start, other_end, _new, _order in self.replacements:
            if start < other_end and other_start < end:
                # two edits of the same lines would lose one of them: refuse rather than guess
                raise K3sGpuError("internal: overlapping edits of lines %d-%d and %d-%d; nothing was written"
                                  % (start + 1, end, other_start + 1, other_end))
        self.replacements.append((start, end, new_lines, len(self.replacements)))

    def set_line(self, number: int, text: str) -> None:
        self.replace(number, number + 1, [text])

    def insert(self, number: int, new_lines: Iterable[str]) -> None:
        self.replacements.append((number, number, list(new_lines), len(self.replacements)))

    def result(self) -> str:
        lines = list(self.lines)
        for start, end, new_lines, _order in sorted(self.replacements, key=lambda r: (r[0], r[1], -r[3]), reverse=True):
            lines[start:end] = new_lines
        text = "\n".join(lines)
        if self.appends:
            text = text.rstrip("\n")
            text = (text + "\n\n" if text else "") + "\n".join(a.rstrip("\n") for a in self.appends) + "\n"
        return text


def _runtime_name_of(schema, path):
    prefix = distro.containerd_table(schema) + ("runtimes",)
    if len(path) > len(prefix) and path[:len(prefix)] == prefix:
        return path[len(prefix)]
    return None


def _ranges_of(tables, path):
    """Tables at path or below it (a runtime table and its options)."""
    return [t for t in tables if t.path[:len(path)] == path]


def _check_no_template_lines(lines, table, file_path):
    for number in range(table.start, table.content_end):
        if _PLACEHOLDER_RE.match(lines[number]):
            raise K3sGpuError(
                "%s: line %d: a Go template action sits inside the table [%s] this module "
                "manages" % (file_path, number + 1, _key_text(table.path)),
                fix="move the action out of that table")


def _remove_table_ranges(edit, tables, path, file_path):
    for table in _ranges_of(tables, path):
        _check_no_template_lines(edit.lines, table, file_path)
        edit.replace(table.start, table.content_end, [])


def _set_key(edit, tables, data, table_path, key, value, file_path):
    """Set `key = value` in a table: edit its line in place, else add the line (or the table at the end)."""
    current = value_at(data, table_path + (key,))
    if _same(current, value):
        return False
    rendered = render_table(table_path, {key: value})
    explicit = [t for t in tables if t.path == table_path and not t.array]
    if not explicit:
        if current is not None:
            raise K3sGpuError(
                "%s: %s is set with a dotted key or an inline table" % (file_path, key),
                fix="set it as %s = ... under [%s] by hand" % (key, _key_text(table_path)))
        edit.appends.append("\n".join(rendered))
        return True
    table = explicit[0]
    pattern = re.compile(r"^(\s*)%s\s*=" % re.escape(tomlkit.key(key).as_string()))
    for number in range(table.start + 1, table.content_end):
        match = pattern.match(edit.lines[number])
        if match:
            try:
                tomllib.loads(edit.lines[number].strip())
            except tomllib.TOMLDecodeError:
                raise K3sGpuError(
                    "%s: line %d: %s spans several lines" % (file_path, number + 1, key),
                    fix="put it on one line so it can be updated")
            edit.set_line(number, match.group(1) + rendered[1].strip())
            return True
    last = table.content_end - 1
    indent = re.match(r"^(\s*)", edit.lines[last]).group(1) if last > table.start else "  "
    edit.insert(table.content_end, [indent + rendered[1].strip()])
    return True


@dataclasses.dataclass(frozen=True)
class Applied:
    """What an edit gives: the new text (None: the file should not exist), the runtime tables it took out because the
    base now emits them (removed_for_base) or because their binary went away (removed_stale), the table the written
    runtimes inherit from, and what the edit says about the user's text (notes, warnings)."""

    text: Optional[str]
    removed_for_base: Tuple[str, ...] = ()
    removed_stale: Tuple[str, ...] = ()
    inherited_from: Optional[Mapping[str, Any]] = None
    notes: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()


class _Said:
    """What one edit has to say, gathered while it edits (the plan it reads stays as it is)."""

    def __init__(self):
        self.inherited_from = None
        self.notes = []
        self.warnings = []

    def applied(self, text: Optional[str], removed_for_base: Iterable[str] = (), removed_stale: Iterable[str] = ()) -> Applied:
        return Applied(text, tuple(sorted(set(removed_for_base))), tuple(removed_stale), self.inherited_from,
                       tuple(self.notes), tuple(self.warnings))


def apply_plan(text: Optional[str], plan: EditPlan, file_path: str, is_template: bool, profile: Mapping[str, Any],
               created_by_us: Optional[bool] = None, checked_after: bool = False) -> Optional[str]:
    """New text of the target for the plan (see edit_target)."""
    return edit_target(text, plan, file_path, is_template, profile, created_by_us, checked_after).text


def edit_target(text: Optional[str], plan: EditPlan, file_path: str, is_template: bool, profile: Mapping[str, Any],
                created_by_us: Optional[bool] = None, checked_after: bool = False) -> Applied:
    """The target's new text for the plan, as an Applied. text is the current content (None: absent).

    Raises K3sGpuError, leaving nothing written. checked_after: the caller renders the new template with the
    base and checks it whole (_template_check), so the quick composition with the base's headers is not needed.
    """
    schema = plan.target["schema"]
    mode = plan.target["mode"]
    said = _Said()
    if mode == planner.MODE_DROPIN:
        return said.applied(_render_dropin(plan, schema, said))
    if created_by_us is None:
        created_by_us = text is not None and text.startswith(MANAGED_HEADER)
    if text is None:
        if not _has_changes(plan):
            return said.applied(None)
        text = _new_file_text(schema, is_template)
    masked, originals = mask_template(text, file_path) if is_template else (text, [])
    lines = masked.split("\n")
    try:
        data, tables = read(lines)
    except tomllib.TOMLDecodeError as exc:
        raise K3sGpuError("%s: %s [toml_invalid]" % (file_path, exc), fix="fix that line; nothing was written")
    edit = Edit(lines)
    reserved = set(tuple(t) for t in plan.reserved_tables)
    removed_for_base = _drop_tables_base_emits(edit, lines, data, tables, reserved, plan, schema, file_path, profile,
                                               created_by_us)
    stale = []
    if plan.state == "absent":
        _edit_absent(edit, data, tables, plan, schema, file_path)
    else:
        stale = _edit_present(edit, lines, data, tables, originals, plan, profile, created_by_us, removed_for_base,
                              file_path, said)
    new_masked = edit.result()
    if new_masked == masked:
        return said.applied(text, removed_for_base, stale)  # nothing to change; the text was parsed above
    if profile["distribution"] == distro.CONTAINERD and mode == planner.MODE_CONFIG and data.get("version") is None:
        # an empty or comment-only file: without a version line containerd reads it as version 1 and
        # ignores every table written for the version of its own (the comments stay below it)
        new_masked = "version = %d\n%s" % (schema, new_masked)
    if is_template and reserved and not checked_after:
        _check_composition(new_masked, reserved, file_path)  # also proves the new text alone parses
    else:
        _loads(new_masked, file_path + " (after the edit)")
    if created_by_us and _only_scaffolding(new_masked, is_template):
        return said.applied(None, removed_for_base, stale)
    return said.applied(unmask_template(new_masked, originals), removed_for_base, stale)


def _drop_tables_base_emits(edit, lines, data, tables, reserved, plan, schema, file_path, profile, created_by_us=False):
    """Take out our own blocks of runtimes the release now renders; refuse any other table it renders too.

    One rule for every runtime the release renders itself (a binary k3s detects): a table of it in the file is
    taken out only when it is exactly what this module writes (its layout, only its keys) and holds nothing that
    differs from the release's own table, so nothing of anyone's is lost; any other table of it is refused
    [duplicate_table], naming the settings that differ from what the release renders and how to keep them. In a file
    this module created (created_by_us) every block in its layout is its own, so it goes even where it differs.
    A table of the base's that holds only a setting this module writes, as it writes it (default_runtime_name after an
    earlier run, now passed to k3s as default-runtime), is taken out too."""
    renders = plan.release_tables
    removed, refused = [], []
    handled = set()
    for table in tables:
        if table.path not in reserved:
            continue
        name = _runtime_name_of(schema, table.path)
        if name not in renders and _only_our_setting(lines, data, table, plan, created_by_us):
            _check_no_template_lines(lines, table, file_path)
            edit.replace(table.start, table.content_end, [])
            continue
        if name not in renders:
            raise K3sGpuError(
                "%s: line %d: [%s] is already emitted by the base template of %s %s, so containerd would "
                "refuse the config (`table already exists`) and k3s would restart in a loop [duplicate_table]" % (
                    file_path, table.start + 1, _key_text(table.path), profile["distribution"], profile["release"]),
                fix="remove that table from the template (a drop-in or default-runtime: in config.yaml is the way to "
                    "change it); nothing was written")
        if name in handled:
            continue
        handled.add(name)
        path = distro.runtime_table(schema, name)
        ranges = _ranges_of(tables, path)
        differs = _differences(value_at(data, path), renders[name])
        if (created_by_us or not differs) and _written_by_us(lines, data, ranges):
            # a block this module wrote while the release did not detect the runtime: it renders the same now
            for found in ranges:
                _check_no_template_lines(lines, found, file_path)
                edit.replace(found.start, found.content_end, [])
            removed.append(name)
            continue
        refused.append((name, table, differs))
    if refused:
        base_included = plan.base_included
        raise several([("[%s]" % name,) + _user_table_refusal(file_path, name, table, differs, renders[name], schema,
                                                              profile, base_included)
                       for name, table, differs in refused], "nothing was written")
    return removed


def _user_table_refusal(file_path, name, table, differs, rendered, schema, profile, base_included=True):
    """(cause, fix) of a user's own table that the release renders too."""
    label = "%s %s" % (profile["distribution"], profile["release"])
    keep = "give your table a runtime name of your own (such as %s-custom) and point your RuntimeClass at it" % name
    if profile.get("dropin_imports"):
        keep += (", or keep the release's own %s table and put only those settings into a drop-in %s/<name>.toml "
                 "(containerd merges it over the release's table)" % (name, distro.DROPIN_DIRS[3 if schema >= 3 else 2]))
    else:
        keep += ", or use the release's own %s table as it renders it" % name
    settings = ("its settings that differ from what %s renders: %s" % (label, ", ".join(differs)) if differs else
                "its settings are the same as the release's")
    by = "the base template of %s" % label if base_included else "%s (the template's own range)" % label
    cause = ("%s: line %d: [%s] is already emitted by %s, which renders runtime %s itself (it detects %s), and here "
             "it is a table of your own: containerd would refuse the config with both (`table %s already exists`) and "
             "k3s would restart in a loop [duplicate_table]; %s" % (
                 file_path, table.start + 1, _key_text(distro.runtime_table(schema, name)), by, name,
                 (rendered.get("options") or {}).get("BinaryName", "its binary"), name, settings))
    return cause, ("this task does not delete a table you wrote: to keep those settings, %s; otherwise remove the "
                   "table (and its sub-tables) yourself" % keep)


def _flatten(table, prefix=""):
    out = {}
    for key, value in (table or {}).items():
        if isinstance(value, dict):
            out.update(_flatten(value, prefix + key + "."))
        else:
            out[prefix + key] = value
    return out


def _differences(user, rendered):
    """`key mine → theirs` for each setting of the user's table that the release renders otherwise or not at all."""
    mine, theirs = _flatten(user if isinstance(user, dict) else {}), _flatten(rendered)
    return ["%s %s \u2192 %s" % (key, _value_text(mine[key]), _value_text(theirs.get(key)))
            for key in sorted(mine) if not _same(mine[key], theirs.get(key))]


def users_runtimes(text: str, schema: int, is_template: bool, file_path: str, names: Iterable[str]) -> Optional[Dict[str, str]]:
    """{name: BinaryName} of each runtime among names that a file of the user's declares with a binary of its own: not
    one of NVIDIA's runtime binaries (a wrapper, a script), which an earlier run or NVIDIA's tools wrote and a later
    run may point at the toolkit the node has now. None when the text does not parse (the file's own check names
    that)."""
    try:
        masked = mask_template(text, file_path)[0] if is_template else text
        data = read(masked.split("\n"))[0]
    except (tomllib.TOMLDecodeError, K3sGpuError, ValueError):
        return None
    found = {}
    for name in names:
        path = distro.runtime_table(schema, name)
        binary = value_at(data, path + ("options", "BinaryName"))
        if isinstance(binary, str) and binary and binary.rsplit("/", 1)[-1] not in _NVIDIA_BINARIES:
            found[name] = binary
    return found


_NVIDIA_BINARIES = set(binary for _name, binary in distro.NVIDIA_RUNTIMES)

# the settings outside runtime tables that this module writes (default runtime, CDI)
_OUR_SETTINGS = {"default_runtime_name", "enable_cdi"}


def _only_our_setting(lines, data, table, plan, created_by_us):
    """Whether a table holds only settings this module writes, in its layout, and a default runtime it manages: what an
    earlier run left where the base now emits the table (the default runtime moved to k3s's default-runtime). Only in a
    file this module created, or in a user's file whose text before the collection's first edit lacks those settings
    (plan.settings_added), or where the setting moves to config.yaml unchanged: a user's own default stays refused."""
    values = value_at(data, table.path)
    if table.array or not isinstance(values, dict):
        return False
    values = dict((k, v) for k, v in values.items() if not isinstance(v, dict))  # sub-tables have headers of their own
    if not values or not set(values) <= _OUR_SETTINGS:
        return False
    ours = set(name for name, _binary in distro.NVIDIA_RUNTIMES) | set(plan.written_names)
    if "default_runtime_name" in values and values["default_runtime_name"] not in ours:
        return False
    wanted = {"default_runtime_name": plan.default_how() == "toml", "enable_cdi": plan.enable_cdi is not None}
    if any(wanted[key] for key in values):
        return False  # still wanted here: the refusal says where it must go instead
    body = [line for line in lines[table.start + 1:table.content_end] if line.strip()]
    if body != render_table(table.path, values)[1:]:
        return False
    moved = plan.default_how() == "config_yaml" and set(values) == {"default_runtime_name"} \
        and values["default_runtime_name"] == plan.default_runtime["name"]
    return created_by_us or plan.settings_added or moved


def _written_by_us(lines, data, ranges):
    """Whether a runtime's tables are exactly what render_table writes: its keys only, its layout, line by line."""
    if not ranges or len(ranges) > 2:
        return False
    for found in ranges:
        values = value_at(data, found.path)
        if not isinstance(values, dict):
            return False
        plain = dict((k, v) for k, v in values.items() if not isinstance(v, dict))
        if not set(plain) <= _OUR_KEYS or found.array:
            return False
        body = [line for line in lines[found.start + 1:found.content_end] if line.strip()]
        if body != render_table(found.path, plain)[1:]:
            return False
    return True


def _edit_absent(edit, data, tables, plan, schema, file_path):
    for name in dict.fromkeys(plan.remove):  # each name once, in order
        path = distro.runtime_table(schema, name)
        if value_at(data, path) is not None:
            if not _ranges_of(tables, path):
                raise K3sGpuError(
                    "%s: runtime %s is defined with dotted keys or inline tables" % (file_path, name),
                    fix="remove it by hand")
            _remove_table_ranges(edit, tables, path, file_path)
    default_name = value_at(data, distro.containerd_table(schema) + ("default_runtime_name",))
    if default_name in plan.remove:
        _drop_key(edit, tables, distro.containerd_table(schema), "default_runtime_name")


def _edit_present(edit, lines, data, tables, originals, plan, profile, created_by_us, removed_for_base, file_path, said):
    """Write or update each planned runtime, the default runtime and enable_cdi. Returns the stale names removed."""
    schema = plan.target["schema"]
    plain = profile["distribution"] == distro.CONTAINERD
    systemd_default = _runc_systemd_cgroup(data, schema) if plain else plan.systemd_cgroup_default
    # the runtimes start from the default runtime's table: the file's own (plain containerd, or a
    # template that declares runc itself), else the one the plan brings (a drop-in's root config)
    inherited = inherited_runtime(data, schema, own_runtime_names(plan)) or plan.inherited
    said.inherited_from = inherited
    stale = []
    if created_by_us and not plan.runtimes_explicit:
        # our own file holds exactly the NVIDIA runtimes still wanted: a block whose binary went away
        # (toolkit removed, operator mode) would point containerd at a missing file
        wanted_names = set(plan.written_names) | set(removed_for_base)
        stale = [name for name, _binary in distro.NVIDIA_RUNTIMES if name not in wanted_names
                 and value_at(data, distro.runtime_table(schema, name)) is not None
                 and _ranges_of(tables, distro.runtime_table(schema, name))]
        for name in stale:
            _remove_table_ranges(edit, tables, distro.runtime_table(schema, name), file_path)
    blocks = []
    templated = _templated_keys(lines, tables, originals) if originals else set()
    for runtime in plan.write:
        items = runtime_items(schema, runtime, systemd_default, inherited)
        if value_at(data, items[0][0]) is None:
            blocks.extend(items)
        else:
            said.warnings.extend(_update_runtime(edit, lines, data, tables, templated, runtime, items, file_path, plan,
                                                 created_by_us))
    if blocks:
        edit.appends.append(render_tables(blocks))
    if plan.default_how() == "toml":
        _set_key(edit, tables, data, distro.containerd_table(schema), "default_runtime_name",
                 plan.default_runtime["name"], file_path)
    if plan.enable_cdi is not None:
        _set_key(edit, tables, data, distro.cri_table(schema), "enable_cdi", plan.enable_cdi, file_path)
    if plan.target["mode"] == planner.MODE_CONFIG and profile["containerd"].startswith("1.") and plan.write:
        said.notes.extend(_ensure_runc(edit, data, schema, systemd_default))
    return stale


# what an existing runtime table of the user's is brought to: what makes the handler run the planned binary
_ENFORCED_KEYS = ("runtime_type", "BinaryName")


def _update_runtime(edit, lines, data, tables, templated, runtime, items, file_path, plan, ours=False):
    """Bring an existing runtime table to the planned keys, in place.

    A table in a file of the user's keeps every setting the task does not ask for by name: runtime_type and
    BinaryName are set, SystemdCgroup and options when the task gives them; inherited and default values
    only fill in keys the table lacks. Each value of the user's that changes is named in a warning
    [runtime_table_updated]. Returns the warnings it has for the user."""
    path = items[0][0]
    if not ours:
        enforced = set(_ENFORCED_KEYS) | set(runtime.get("options") or {})
        if runtime.get("systemd_cgroup") is not None:
            enforced.add("SystemdCgroup")
        items = [(p, dict((k, v) for k, v in values.items() if k in enforced or value_at(data, p + (k,)) is None))
                 for p, values in items]
    # a key the template sets with an action (`SystemdCgroup = {{ .SystemdCgroup }}`) is the user's:
    # k3s renders it, so it is neither compared nor set a second time
    items = [(p, dict((k, v) for k, v in values.items() if (p, k) not in templated)) for p, values in items]
    if all(value_at(data, p) is not None and all(_same(value_at(data, p + (k,)), v) for k, v in values.items())
           for p, values in items):
        return []
    changed = ["%s %s \u2192 %s" % (key, _value_text(value_at(data, p + (key,))), _value_text(value))
               for p, values in items for key, value in values.items()
               if value_at(data, p + (key,)) is not None and not _same(value_at(data, p + (key,)), value)]
    warnings = []
    if changed and not ours:
        warnings.append(
            "%s: the table of runtime %s was already there; this task set %s (asked for by the task, or needed so "
            "that the handler runs %s); every other setting of that table is kept%s [runtime_table_updated]" % (
                file_path, runtime["name"], ", ".join(changed), runtime["binary"], backup_note(plan)))
    runtime_tables = [t for t in tables if t.path == path and not t.array]
    if not runtime_tables:
        raise K3sGpuError(
            "%s: runtime %s is defined with dotted keys or inline tables" % (file_path, runtime["name"]),
            fix="define it as [%s] or remove it, then rerun" % (_key_text(path),))
    for table in _ranges_of(tables, path):
        _check_no_template_lines(lines, table, file_path)
    for table_path, values in items:
        if any(t.path == table_path for t in tables):
            for key, value in values.items():
                _set_key(edit, tables, data, table_path, key, value, file_path)
        elif value_at(data, table_path) is None:
            edit.insert(runtime_tables[0].content_end, render_table(table_path, values))
        else:
            raise K3sGpuError(
                "%s: [%s] is defined with dotted keys or an inline table" % (file_path, _key_text(table_path)),
                fix="define it as a table or remove it, then rerun")
    return warnings


_TEMPLATED_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""")


def check_plain_result(text: Optional[str], plan: EditPlan, file_path: str, schema: int) -> None:
    """The file we are about to write on a plain containerd node, read as containerd will read it: its
    version, and every runtime of the plan where that version looks for runtimes. Raises K3sGpuError."""
    if text is None or plan.state == "absent":
        return
    data = _loads(text, file_path + " (after the edit)")
    version = data.get("version")
    problems = []
    if version != schema:
        problems.append("its version is %s, not %d (without a version line containerd reads the version 1 schema)" % (
            version, schema))
    disabled = planner.cri_disabled(text)
    if disabled:
        problems.append("disabled_plugins turns off the CRI plugin (%s)" % disabled[0])
    for runtime in plan.write:
        table = value_at(data, distro.runtime_table(schema, runtime["name"]))
        binary = value_at(table, ("options", "BinaryName")) if isinstance(table, dict) else None
        if binary != runtime["binary"]:
            problems.append("runtime %s is not where version %d reads runtimes ([%s])" % (
                runtime["name"], schema, _key_text(distro.runtime_table(schema, runtime["name"]))))
    if problems:
        raise K3sGpuError(
            "%s: containerd would not load the runtimes from the result: %s [runtime_not_loaded]. This is a fault of "
            "the collection or of an unusual file: nothing was written" % (file_path, "; ".join(problems)),
            fix="report it with the file")


def _templated_keys(lines, tables, originals):
    """(table path, key) of every `key = <action>` line, by the table it sits in."""
    found = set()
    for table in tables:
        for number in range(table.start + 1, table.end):
            match = _PLACEHOLDER_RE.match(lines[number])
            if match:
                key = _TEMPLATED_KEY.match(originals[int(match.group(1))])
                if key:
                    found.add((table.path, key.group(1).strip("\"'")))
    return found


_OUR_KEYS = {"runtime_type", "BinaryName", "SystemdCgroup"}


def _value_text(value):
    """A TOML value as a user wrote it (for messages)."""
    require_tomlkit()
    return tomlkit.item(value).as_string() if value is not None else "(unset)"


def backup_note(plan: EditPlan) -> str:
    """Where the copy of the file before this edit goes (plan.backup), for messages."""
    backup = plan.backup
    if backup:
        return "; the file before this edit is kept as %s.<time>~" % backup
    return "; no backup is kept (backup is off): the diff of this task shows what was there"


def _same(current, wanted):
    return current == wanted and type(current) is type(wanted)


def _drop_key(edit, tables, table_path, key):
    pattern = re.compile(r"^\s*%s\s*=" % re.escape(key))
    for table in tables:
        if table.path == table_path:
            for number in range(table.start + 1, table.content_end):
                if pattern.match(edit.lines[number]):
                    edit.replace(number, number + 1, [])


def _runc_systemd_cgroup(data, schema):
    value = value_at(data, distro.runtime_table(schema, "runc") + ("options", "SystemdCgroup"))
    return bool(value) if value is not None else False


def _ensure_runc(edit, data, schema, systemd_default):
    """containerd 1.x replaces its default runtimes map with the file's: keep runc in it.

    Without it the CRI plugin fails when runc is the default runtime, and pods that ask for
    the runc handler fail in every case. Returns the note that says so (none when runc is there).
    """
    if value_at(data, distro.runtime_table(schema, "runc")) is not None:
        return []
    runc = {"name": "runc", "binary": None, "runtime_type": distro.RUNC_V2, "options": {}, "systemd_cgroup": systemd_default}
    items = runtime_items(schema, runc, systemd_default)
    items[1][1].pop("BinaryName")
    edit.appends.insert(0, render_tables(items))
    return ["added a runc block: containerd 1.x replaces its default runtimes map with the file's, and "
            "the CRI plugin needs the runtime runc there"]


def _check_composition(masked, reserved, file_path):
    """Base tables + our text must load as one TOML document (what containerd will read)."""
    base = "\n".join("[%s]" % _key_text(path) for path in sorted(reserved, key=len))
    try:
        loads(base + "\n" + masked)
    except tomllib.TOMLDecodeError as exc:
        _loads(masked, file_path + " (after the edit)")  # a fault of the text itself is named first
        raise K3sGpuError("%s: composed with the base template, the config would not load (%s); "
                          "nothing was written" % (file_path, exc))


def _only_scaffolding(masked, is_template):
    for line in masked.split("\n"):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") and not _PLACEHOLDER_RE.match(stripped):
            continue
        if _PLACEHOLDER_RE.match(stripped) and is_template:
            continue
        if stripped.startswith("version"):
            continue
        return False
    return True


def _has_changes(plan):
    return bool(plan.write) or plan.default_how() == "toml" or plan.enable_cdi is not None


def _new_file_text(schema, is_template):
    """The scaffolding of a file this module creates: its header, and base or the version line."""
    head = [MANAGED_HEADER]
    if is_template:
        head.append(BASE_LINE)
    else:
        head.append("version = %d" % schema)
    return "\n".join(head) + "\n"


def _render_dropin(plan, schema, said):
    """A drop-in is wholly ours: its text follows from the plan alone."""
    if plan.state == "absent" or not _has_changes(plan):
        return None
    items = []
    if plan.enable_cdi is not None:
        items.append((distro.cri_table(schema), {"enable_cdi": plan.enable_cdi}))
    if plan.default_how() == "toml":
        items.append((distro.containerd_table(schema), {"default_runtime_name": plan.default_runtime["name"]}))
    inherited = plan.inherited
    said.inherited_from = inherited
    # k3s/rke2 plans carry the node's SystemdCgroup; on plain containerd the inherited table decides
    systemd_default = plan.systemd_cgroup_default
    if systemd_default is None and inherited is not None:
        systemd_default = False
    for runtime in plan.write:
        items.extend(runtime_items(schema, runtime, systemd_default, inherited))
    return "%s\nversion = %d\n\n%s" % (MANAGED_HEADER, schema, render_tables(items))


def render_default_runtime_yaml(name: Optional[str], node_labels: Sequence[str] = ()) -> Optional[str]:
    """config.yaml.d drop-in for k3s/rke2 (None when it would say nothing); JSON quoting is valid YAML.

    node_labels ("key=value") go under `node-label+:`, which k3s/rke2 apply to the node at every start.
    """
    if not name and not node_labels:
        return None
    lines = [MANAGED_YAML_HEADER]
    if name:
        lines.append("default-runtime: %s" % json.dumps(name))
    if node_labels:
        lines.append("node-label+:")
        lines.extend("  - %s" % json.dumps(label) for label in node_labels)
    return "\n".join(lines) + "\n"
