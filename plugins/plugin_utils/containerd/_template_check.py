# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What k3s/rke2 will render from a user's containerd template, and whether containerd loads it.

PRIVATE to the collection. Controller side.

check() takes the template text and the node reading, parses it with the Go template model
(_gotemplate), renders it for this node's data (the release's field set, the base the release emits
for what is detected and for the flags in use; both ways where a branch cannot be decided) and runs
every check on the composed config: duplicate tables and keys between base and the user's text,
`imports` beside a base that emits it, registry `mirrors` beside base's `config_path`, plugin paths of
the other schema, an empty result, no base include. It does so for the node as it is, as it will be
once the toolkit is installed (k3s then detects nvidia), and, with target_release, on the release the
node is about to get. The outcome table is docs/template-outcomes.md; every finding has a code there.
"""

from __future__ import annotations

import re
import tomllib
from typing import TYPE_CHECKING, Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, several
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _gotemplate as gotemplate
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml_read as toml_read

if TYPE_CHECKING:  # check() imports it only when given a cache: its import reads the engine's files (the digest)
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._check_cache import CheckCache

REFUSE = "refuse"
WARN = "warn"
NOW = "now"
AFTER_INSTALL = "after_install"
UPGRADE = "upgrade"

# code -> (severity, what it means); the docs table is generated from the same words (tests compare)
CODES = {
    "encoding_bom": (REFUSE, "the file starts with a UTF-8 byte order mark, which containerd 2.x refuses"),
    "encoding_crlf": (REFUSE, "the file has CR (Windows) line endings; an edit would mix line endings"),
    "encoding_nul": (REFUSE, "the file contains NUL bytes"),
    "encoding_utf8": (REFUSE, "the file is not valid UTF-8, which containerd 2.x refuses even in comments"),
    "empty": (REFUSE, "the template renders an empty config: containerd runs on built-in defaults, without "
                      "k3s's CNI, sandbox image and registry settings"),
    "parse_error": (REFUSE, "Go's template parser refuses the file, so k3s cannot render the config"),
    "unknown_function": (REFUSE, "the template calls a function k3s does not define"),
    "unknown_template": (REFUSE, "the template calls a template name that does not exist (only base and its own defines)"),
    "missing_field": (REFUSE, "the template reads a field the release's template data does not have"),
    "removed_field": (WARN, "the template reads a field a later release removes"),
    "dropin_not_read": (WARN, "the release the node is about to get does not import the drop-in the collection wrote"),
    "unverified_field": (WARN, "the template reads a field the collection's field list does not have; it may not exist"),
    "exec_error": (REFUSE, "executing the template fails"),
    "duplicate_table": (REFUSE, "a table is declared twice in what containerd loads (`table ... already exists`)"),
    "duplicate_key": (REFUSE, "a key is set twice in what containerd loads"),
    "imports_clash": (REFUSE, "the template sets `imports` beside a base that sets it too"),
    "mirrors_config_path": (REFUSE, "registry mirrors/configs.tls beside base's config_path: the CRI plugin refuses to start"),
    "toml_invalid": (REFUSE, "what k3s renders is not valid TOML"),
    "after_install_duplicate": (REFUSE, "a table becomes a duplicate once k3s detects the NVIDIA toolkit this role installs"),
    "wrong_schema_path": (WARN, "a table under a plugin path of the other config schema: containerd ignores it"),
    "no_base": (WARN, "the template does not include {{ template \"base\" . }}: k3s's own settings are not rendered"),
    "action_in_comment": (WARN, "a template action inside a TOML comment: k3s executes it all the same"),
    # on the config containerd loads, composed from every layer (_layers)
    "runtimes_replaced": (REFUSE, "containerd before 2.1 replaces the CRI plugin's whole table with a later imported "
                                  "file's: the runtimes written would not be loaded"),
    # allocation dra only (_claims_cdi): on the config containerd loads, composed from every layer
    "cdi_off_for_claims": (REFUSE, "on a DRA node, what containerd loads turns CDI off: no claim pod can start"),
    "cdi_dir_for_claims": (REFUSE, "on a DRA node, cdi_spec_dirs leaves out /var/run/cdi, where NVIDIA's DRA driver "
                                   "writes each claim's CDI spec"),
}


def k3s_funcs(profile: Mapping[str, Any]) -> Tuple[str, ...]:
    """k3s's FuncMap for this release (distro.TEMPLATE_FUNCS; docs/template-data.md)."""
    release = distro.Release(profile["distribution"], profile["release"])
    return tuple(name for name, feature in release_rules.TEMPLATE_FUNCS if _present(release, feature))


def _present(release, feature):
    """Whether a feature row ("!row": its absence) holds for the release."""
    return distro.has_feature(release, feature.lstrip("!")) != feature.startswith("!")


def _deschemify(url):
    return url  # identity on Linux (templates_linux.go); Windows strips the scheme


def _to_json(value):
    import json

    def plain(item: Any) -> Any:  # a struct marshals its fields in declaration order, a map by sorted keys
        if isinstance(item, gotemplate.Struct):
            return {name: plain(item.values.get(name)) for name in item.type.get("fields", {})}
        if isinstance(item, dict):
            return {key: plain(item[key]) for key in sorted(item)}
        if isinstance(item, (list, tuple)):
            return [plain(v) for v in item]
        return item
    return json.dumps(plain(value), separators=(",", ":"))


def _filepathjoin(*parts):
    import posixpath
    return posixpath.join(*[str(p) for p in parts])


FUNC_IMPLS = {"deschemify": _deschemify, "toJson": _to_json, "filepathjoin": _filepathjoin}


class Finding:
    __slots__ = ("code", "severity", "line", "message", "fix", "when", "table")

    def __init__(self, code, line, message, fix, when=NOW, severity=None, table=None):
        self.code, self.line, self.message, self.fix, self.when = code, line, message, fix, when
        self.severity = severity or CODES[code][0]
        self.table = table  # key path of the table a duplicate is about

    def as_dict(self) -> Dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "line": self.line, "message": self.message,
                "fix": self.fix, "when": self.when}

    def cause_text(self, path: str) -> str:
        where = "%s: line %d" % (path, self.line) if self.line else path
        return "%s: %s [%s]" % (where, self.message, self.code)

    def text(self, path: str) -> str:
        return "%s. Fix: %s" % (self.cause_text(path), self.fix)


class Report:
    def __init__(self, path):
        self.path = path
        self.findings = []
        self.runs = 0
        self.complete = True
        self.normalized = None  # the text after an opted-in normalisation
        self.user_tables = set()  # (key path, line) of the tables the template itself renders, now
        self.base_called = False  # whether a run of the template, now, executes {{ template "base" . }}

    def as_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "runs": self.runs, "complete": self.complete, "normalized": self.normalized,
                "findings": [dict(f.as_dict(), table=list(f.table) if f.table else None) for f in self.findings]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        report = cls(data["path"])
        report.runs, report.complete, report.normalized = data["runs"], data["complete"], data["normalized"]
        for item in data["findings"]:
            report.findings.append(Finding(item["code"], item["line"], item["message"], item["fix"], when=item["when"],
                                           severity=item["severity"], table=tuple(item["table"]) if item["table"] else None))
        return report

    def add(self, finding: Finding) -> None:
        for other in self.findings:
            if (other.code, other.line, other.when) == (finding.code, finding.line, finding.when):
                return
        self.findings.append(finding)

    @property
    def refusals(self) -> List[Finding]:
        return [f for f in self.findings if f.severity == REFUSE and f.when != UPGRADE]

    @property
    def warnings(self) -> List[Finding]:
        return [f for f in self.findings if f.severity == WARN and f.when != UPGRADE]

    @property
    def upgrade(self) -> List[Finding]:
        return [f for f in self.findings if f.when == UPGRADE]

    @property
    def outcome(self) -> str:
        if self.refusals:
            return REFUSE
        return WARN if self.warnings or self.upgrade else "edit"

    def refusal(self, findings: Optional[Sequence[Finding]] = None) -> K3sGpuError:
        """One K3sGpuError for the refused findings (default: all): their causes, then their fixes (each labelled
        with its line and code where there are several), and that nothing was written."""
        findings = self.refusals if findings is None else findings
        return several([("%s[%s]" % ("line %d " % f.line if f.line else "", f.code), f.cause_text(self.path), f.fix)
                        for f in findings], "nothing was written")


# --- the release's template data -----------------------------------------------------------------

def _struct(name, fields, open_=True):
    return {"kind": "struct", "name": name, "fields": fields, "open": open_}


_S, _B, _I = {"kind": "string"}, {"kind": "bool"}, {"kind": "int"}


_DATA_TYPES = {}


def data_type(profile: Mapping[str, Any]) -> Dict[str, Any]:
    """The type of the template data (k3s's ContainerdConfig) for a release, from the feature table
    (computed once per release: it depends on nothing else, and is never changed after)."""
    key = (profile["distribution"], profile["release"])
    if key not in _DATA_TYPES:
        _DATA_TYPES[key] = _data_type(profile)
    return _DATA_TYPES[key]


# the feature table's fields, parents before children, each path split once (the tree is built per release)
_FIELDS_BY_DEPTH = sorted(((path, tuple(path.split(".")), type_name, feature)
                           for path, type_name, feature in release_rules.TEMPLATE_FIELDS), key=lambda row: len(row[1]))


def _data_type(profile):
    release = distro.Release(profile["distribution"], profile["release"])
    present = {}  # many fields share one feature row
    root = _struct("templates.ContainerdConfig", {}, open_=False)
    gone = []
    for _path, parts, type_name, feature in _FIELDS_BY_DEPTH:
        if feature:
            if feature not in present:
                present[feature] = _present(release, feature)
            if not present[feature]:
                gone.append(parts)
                continue
        node = root
        for part in parts[:-1]:
            child = node["fields"].get(part)
            if child is None:
                child = node["fields"][part] = _struct(part, {})
            node = child["elem"] if child["kind"] == "map" else child
        node["fields"][parts[-1]] = _type_of(type_name, parts[-1])
    for parts in gone:  # known to be absent: refused, not merely unverified
        parent = _lookup(root, parts[:-1])
        if parent is not None and parent.get("kind") == "struct":
            parent.setdefault("gone", []).append(parts[-1])
    return root


_LEAF_TYPES = {"string": _S, "bool": _B, "int": _I}


def _type_of(kind, name):
    leaf = _LEAF_TYPES.get(kind)
    if leaf is not None:
        return leaf
    if kind in ("struct", "ptr-struct"):
        return _struct(name, {})
    if kind in ("closed-struct", "closed-ptr-struct"):
        return _struct(name, {}, open_=False)
    if kind == "map-runtime":
        return {"kind": "map", "elem": _struct("templates.ContainerdRuntimeConfig", {}, open_=False)}
    if kind.startswith("map"):
        return {"kind": "map", "elem": gotemplate.ANY}
    if kind.startswith("[]"):
        return {"kind": "slice", "elem": gotemplate.ANY}
    return gotemplate.ANY


def _set(struct, path, value):
    node = struct
    parts = path.split(".")
    for part in parts[:-1]:
        child = node.values.get(part)
        if not isinstance(child, gotemplate.Struct):
            child_type = node.type["fields"].get(part) or _struct(part, {})
            child = gotemplate.Struct(child_type)
            node.values[part] = child
        node = child
    if parts[-1] in node.type["fields"]:
        node.values[parts[-1]] = value


def node_data(facts: NodeFacts, profile: Mapping[str, Any], detected: Sequence[Mapping[str, Any]],
              default_runtime: Optional[str]) -> gotemplate.Struct:
    """The template data as far as the controller knows it; the rest is Unknown (typical values)."""
    type_ = data_type(profile)
    data = gotemplate.Struct(type_)
    paths = facts.paths
    runtime_type = type_["fields"].get("ExtraRuntimes", {}).get("elem")
    if runtime_type is not None:
        data.values["ExtraRuntimes"] = gotemplate.TypedMap(runtime_type, (
            (r["name"], gotemplate.Struct(runtime_type, {"RuntimeType": r["runtime_type"], "BinaryName": r["binary"]}))
            for r in detected))
    known = {
        "Program": facts.distribution,
        "SystemdCgroup": facts.systemd_cgroup,
        "NodeConfig.DefaultRuntime": default_runtime or "",
        "NodeConfig.Containerd.Template": paths["containerd_dir"],
        "NodeConfig.Containerd.Config": paths["config"],
    }
    for path, typical in release_rules.TEMPLATE_TYPICAL.items():
        parts = path.split(".")
        field_type = _lookup(type_, parts)
        if field_type is not None:
            _set(data, path, gotemplate.Unknown(field_type, typical))
    for path, value in known.items():
        if _lookup(type_, path.split(".")) is not None:
            _set(data, path, value)
    return data


def _lookup(type_, parts):
    node = type_
    for part in parts:
        if node.get("kind") != "struct" or part not in node["fields"]:
            return None
        node = node["fields"][part]
    return node


def base_params(facts: NodeFacts, profile: Mapping[str, Any], detected: Sequence[Mapping[str, Any]],
                default_runtime: Optional[str]) -> Dict[str, Any]:
    """The parameters _k3s_base renders with, for this node (paths from its data dir)."""
    paths = facts.paths
    data_dir = paths["data_dir"]
    state = "/run/k3s/containerd"
    return {"root": data_dir + "/agent/containerd", "state": state, "address": state + "/containerd.sock",
            "opt": data_dir + "/agent/containerd", "pause_image": release_rules.TEMPLATE_TYPICAL["NodeConfig.AgentConfig.PauseImage"],
            "snapshotter": "overlayfs", "cni_bin_dir": data_dir + "/data/current/bin",
            "cni_conf_dir": data_dir + "/agent/etc/cni/net.d", "registry_dir": paths["containerd_dir"] + "/certs.d",
            "detected": detected, "systemd_cgroup": facts.systemd_cgroup,
            "default_runtime": default_runtime, "containerd_dir": paths["containerd_dir"]}


def node_base(facts: NodeFacts, profile: Mapping[str, Any], schema: int, detected: Sequence[Mapping[str, Any]],
              default_runtime: Optional[str]) -> k3s_base.Rendering:
    """The base k3s renders for this node state, as a k3s_base.Rendering: worked out once per task and read by the
    template check, the release's own runtime tables and the layers under a drop-in (_decide)."""
    return _base_of(facts, profile, schema, detected, default_runtime, None)


def _base_of(facts, profile, schema, detected, default_runtime, given):
    """given (the caller's rendering) where it is of this node state, else a new one."""
    params = base_params(facts, profile, detected, default_runtime)
    return given if given is not None and given.fits(profile, schema, params) else k3s_base.Rendering(profile, schema, params)


def _base_external(base):
    """The base line's output for the template model: base.text, each line marked as the base's."""
    lines = base.text.splitlines(True)

    def render(_execution: gotemplate.Execution, _dot: Any, output: gotemplate.Output) -> None:
        for number, line in enumerate(lines, 1):
            output.write(line, ("base", number))
    return render


# --- the check -----------------------------------------------------------------------------------

def after_install_runtimes(facts: NodeFacts, profile: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """What k3s detects once the toolkit packages are installed (nvidia-container-toolkit and its
    operator extensions put nvidia-container-runtime and .cdi into /usr/bin): today's detection plus
    those of the two it does not detect yet."""
    detected = list(facts.release_runtimes)
    names = set(r["name"] for r in detected)
    for runtime in profile["detected_runtimes"]:
        if runtime["name"] in ("nvidia", "nvidia-cdi") and runtime["name"] not in names:
            detected.append({"name": runtime["name"], "binary": "/usr/bin/" + runtime["binary"],
                             "runtime_type": runtime["runtime_type"]})
    return sorted(detected, key=lambda r: r["name"])


def check(text: str, path: str, facts: NodeFacts, schema: int, default_runtime: Optional[str] = None,
          after_install: Optional[Sequence[Mapping[str, Any]]] = None, target_profile: Optional[Mapping[str, Any]] = None,
          target_detected: Optional[Sequence[Mapping[str, Any]]] = None, normalize: bool = False, profile: Optional[Mapping[str, Any]] = None,
          ours: Collection[str] = (), light: bool = False, cache: Optional[CheckCache] = None,
          base: Optional[k3s_base.Rendering] = None) -> Report:
    """Report on a template k3s/rke2 will render. text: its current content; schema: 2 or 3 by name.
    ours: runtime names whose tables this module writes into the text (a later run takes them out
    once k3s detects the runtime, so they are no after-install duplicate). light: only what needs no
    rendering (encoding, parse, template names), for a text that is about to be edited and checked whole.
    cache: a _check_cache.CheckCache; the verdict of the same question is reused from it. base: the caller's
    rendering of the base (node_base), read wherever it is of the state being rendered."""
    profile = profile or facts.profile
    if cache is None:
        return _check(text, path, facts, schema, default_runtime, after_install, target_profile, target_detected,
                      normalize, profile, ours, light, base)
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _check_cache as check_cache
    after = after_install if after_install is not None else after_install_runtimes(facts, profile)
    key = check_cache.fingerprint(
        text=text, path=path, schema=schema, default_runtime=default_runtime, after=after,
        profile=[profile["distribution"], profile["release"]],
        target=[target_profile["distribution"], target_profile["release"]] if target_profile else None,
        target_detected=target_detected, normalize=normalize, ours=sorted(ours), light=light,
        detected=facts.release_runtimes, distribution=facts.distribution, paths=facts.paths,
        systemd_cgroup=facts.systemd_cgroup)
    cached = cache.get(key)
    if cached is not None:
        return Report.from_dict(cached)
    report = _check(text, path, facts, schema, default_runtime, after, target_profile, target_detected,
                    normalize, profile, ours, light, base)
    cache.put(key, report.as_dict())
    return report


def _check(text, path, facts, schema, default_runtime, after_install, target_profile, target_detected,
           normalize, profile, ours, light, base):
    report = Report(path)
    text, template = _parse_checked(text, report, normalize, profile)
    if template is None or report.refusals or light:
        return report
    detected_now = list(facts.release_runtimes)
    states = [(NOW, profile, detected_now)]
    after = after_install if after_install is not None else after_install_runtimes(facts, profile)
    added = sorted(set(r["name"] for r in after) - set(r["name"] for r in detected_now))
    # only a template that reads .ExtraRuntimes renders differently once more runtimes are detected;
    # for any other the install adds just the base's tables of the new runtimes, checked below
    rerender = bool(added) and "ExtraRuntimes" in text
    if rerender:
        states.append((AFTER_INSTALL, profile, after))
    if target_profile is not None:
        states.append((UPGRADE, target_profile, target_detected if target_detected is not None else after))
    baseline = None
    for when, state_profile, detected in states:
        found, keys = _check_state(template, facts, state_profile, schema, detected, default_runtime, when, report, base)
        if when == NOW:
            baseline = keys
            if added and not rerender:
                # the install adds tables to the base's output only: a template that never includes the base
                # renders the same text after it (k3s renders that file alone)
                found = _added_runtime_tables(report.user_tables, added, schema, profile) if report.base_called else []
                when = AFTER_INSTALL
        if when == AFTER_INSTALL:
            for finding in _after_install_findings(found, baseline, schema, ours, after):
                report.add(finding)
    return report


def _after_install_findings(found, baseline, schema, ours, after):
    """What the toolkit install breaks that is not broken now (baseline: the (code, line) keys found now)."""
    broken_now = any(code in ("duplicate_table", "duplicate_key", "imports_clash", "toml_invalid")
                     for code, _line in baseline)
    new = []
    for finding in found:
        if (finding.code, finding.line) in baseline:
            continue
        if broken_now and finding.code in ("duplicate_table", "duplicate_key", "toml_invalid"):
            continue  # the node is already broken there: one fix answers both
        if finding.code == "duplicate_table" and _runtime_of(finding.table, schema) in ours:
            continue
        finding.when = AFTER_INSTALL
        if finding.code in ("duplicate_table", "duplicate_key"):
            finding.code = "after_install_duplicate"
            finding.message += " once k3s detects the NVIDIA runtimes the toolkit install brings (%s)" % (
                ", ".join(sorted(r["name"] for r in after)))
        new.append(finding)
    return new


def _parse_checked(text, report, normalize, profile):
    """The checks that need no rendering (encoding, emptiness, parse, template names, actions after a `#`):
    (the text as k3s reads it, the parsed template or None where it cannot be rendered)."""
    text = _encoding(text, report, normalize)
    if report.refusals:
        return text, None
    if not text.strip():
        report.add(Finding("empty", 1, "the template is empty, so k3s renders an empty config.toml and containerd "
                                       "starts on built-in defaults (no CNI directories, sandbox image or registry "
                                       "config_path)",
                           "delete the file (k3s then renders its own config), or put {{ template \"base\" . }} in it"))
        return text, None
    try:
        template = gotemplate.parse(text, k3s_funcs(profile))
    except gotemplate.TemplateError as exc:
        report.add(Finding(exc.code, exc.line, "%s (Go's template parser)" % exc.message,
                           _parse_fix(exc, k3s_funcs(profile))))
        for line, kind, _trim in gotemplate.comment_actions_of(text):
            if kind == "keyword":
                report.add(_comment_finding(line, "this {{if}}/{{range}}/{{end}} sits after a TOML `#`, but k3s "
                                                  "parses it all the same, so the blocks do not balance"))
        return text, None
    # k3s parses base after the user's text: the stock base replaces a user's own define of it
    template.trees.pop("base", None)
    for name, line in template.calls:
        if name != "base" and name not in template.trees:
            close = "base" if _close(name, "base") else None
            report.add(Finding("unknown_template", line, "{{ template %s }} calls a template that is not defined; "
                               "k3s fails with `template %s not defined`" % (_q(name), _q(name)),
                               "use {{ template \"base\" . }}" if close else
                               "define it with {{ define %s }}...{{ end }} or remove the call" % _q(name)))
    for line, kind, trims in template.comment_actions:
        if kind == "template":
            report.add(_comment_finding(line, "this {{ template }} sits after a TOML `#`, but k3s executes it all "
                                              "the same: the first line of its output joins the comment, the rest is live"))
        elif trims:
            report.add(_comment_finding(line, "this action after a TOML `#` ends with `-}}`, which eats the newline: "
                                              "the next line joins the comment"))
    return text, template


def render(text: str, facts: NodeFacts, schema: int, detected: Optional[Sequence[Mapping[str, Any]]] = None,
           default_runtime: Optional[str] = None, profile: Optional[Mapping[str, Any]] = None, base: Any = None) -> str:
    """What k3s renders from text for this node with the typical values (config.toml as text). base: the caller's
    node_base, used where it is of this node state. Raises gotemplate.TemplateError where k3s cannot render it."""
    profile = profile or facts.profile
    detected = facts.release_runtimes if detected is None else detected
    template = gotemplate.parse(text, k3s_funcs(profile))
    template.trees.pop("base", None)
    render_base = _base_external(_base_of(facts, profile, schema, detected, default_runtime, base))
    execution = gotemplate.Execution(template, {"base": render_base}, FUNC_IMPLS)
    output = gotemplate.Output()
    execution.run("main", node_data(facts, profile, detected, default_runtime), output)
    return output.text()


_COMMENT_OR_BLANK = re.compile(r"^[ \t]*(?:#[^\n]*)?\n", re.M)


def _added_runtime_tables(user_tables, added, schema, profile):
    """Duplicates the install brings to a template that does not read .ExtraRuntimes: the user's own
    tables of the runtimes k3s then renders in its base."""
    found = []
    for name in added:
        runtime = distro.runtime_table(schema, name)
        for path, line in sorted(user_tables):
            if path in (runtime, runtime + ("options",)):
                found.append(Finding("duplicate_table", line, "[%s] is already emitted by the base template of %s %s; "
                                     "containerd refuses the config (`table %s already exists`) and k3s restarts in a "
                                     "loop" % (_header_text(path), profile["distribution"], profile["release"], path[-1]),
                                     _duplicate_fix(path, schema, profile), table=path))
    return found


def _check_state(template, facts, profile, schema, detected, default_runtime, when, report, base):
    """Render for one node state; add the findings (NOW) or return them (others, for the caller). base: the caller's
    rendering of the base, used where it is of this state."""
    data = node_data(facts, profile, detected, default_runtime)
    render_base = _base_external(_base_of(facts, profile, schema, detected, default_runtime, base))
    runs, complete = gotemplate.explore(template, data, {"base": render_base}, FUNC_IMPLS)
    report.runs += len(runs)
    report.complete = report.complete and complete
    found = []
    keys = set()

    def add(finding: Finding) -> None:
        if when == UPGRADE:
            finding.when = UPGRADE
            finding.severity = WARN
            finding.message = "on %s %s: %s" % (profile["distribution"], profile["release"], finding.message)
        if when in (NOW, UPGRADE):
            report.add(finding)
        found.append(finding)
        keys.add((finding.code, finding.line))

    base_called = False
    analyzed = set()
    for run in runs:
        for code, line, field in run.findings:
            if code == "action_in_comment":
                add(_comment_finding(line, "this action after a TOML `#` prints several lines: only the first one "
                                           "is commented out"))
                continue
            add(Finding("unverified_field", line, ".%s is not in the collection's list of template fields for %s %s, "
                        "so it could not be checked; k3s fails to render if the field does not exist" % (
                            field, profile["distribution"], profile["release"]),
                        "check the field in k3s's pkg/agent/templates for this release, or avoid it"))
        if run.error is not None:
            add(_exec_finding(run.error, profile, when))
            if any(line == run.error.line and kind != "keyword" for line, kind, _trim in template.comment_actions):
                add(_comment_finding(run.error.line, "the failing action sits after a TOML `#`: k3s executes it all the same"))
            continue
        if any(name == "base" for name, _line in run.calls):
            base_called = True
            if when == NOW:
                report.base_called = True
        base_lines = [line for name, line in run.calls if name == "base"]
        # another branch that renders the same TOML (comments and blank lines aside): nothing new to find
        text_out = _COMMENT_OR_BLANK.sub("", run.output.text())
        if text_out in analyzed:
            continue
        analyzed.add(text_out)
        tables = []
        for finding in analyze(run.output, schema, profile, _branch_note(run), base_lines, tables):
            add(finding)
        if when == NOW:
            report.user_tables.update(tables)
    if not base_called and runs and not any(r.error for r in runs) and not any(f.code == "empty" for f in found):
        add(_no_base_finding(runs[0].output.text(), schema, report.user_tables if when == NOW else (), detected))
    return found, keys


def _no_base_finding(text, schema, user_tables, detected):
    """no_base: k3s renders this file alone, so every setting its base would render comes from this file or is
    missing; named one by one, with the tables to take out once the base is included."""
    lost = _lost_settings(text, schema)
    frozen = [label for label in _BASE_SETTINGS if label not in lost]
    parts = []
    if lost:
        parts.append("missing: %s" % ", ".join(lost))
    if frozen:
        parts.append("fixed by hand in this file, no longer kept by k3s: %s" % ", ".join(frozen))
    message = ("the template never includes {{ template \"base\" . }}, so k3s renders this file alone and k3s's own "
               "settings are not in the node's containerd config (%s); drop-ins and release changes of the base are "
               "not picked up" % "; ".join(parts))
    base_paths = set(_BASE_RENDERED_TABLES[3 if schema >= 3 else 2])
    base_paths.update(distro.runtime_table(schema, name) for name in ["runc"] + [r["name"] for r in detected])
    duplicates = sorted(set(_header_text(path) for path, _line in user_tables if path in base_paths))
    fix = "add {{ template \"base\" . }} as the first line and remove the tables the base renders"
    if duplicates:
        fix += " (here: %s, with their sub-tables)" % ", ".join("[%s]" % d for d in duplicates)
    return Finding("no_base", 0, message, fix + "; keep only your own runtimes and settings")


def _runtime_of(table, schema):
    prefix = distro.containerd_table(schema) + ("runtimes",)
    if not table or tuple(table[:len(prefix)]) != prefix or len(table) <= len(prefix):
        return None
    return table[len(prefix)]


def _comment_finding(line, message):
    return Finding("action_in_comment", line, message, "delete the action, or disable it as {{/* ... */}}")


def _branch_note(run):
    flipped = run.flipped
    if not flipped:
        return ""
    lines = sorted(set(run.decision_lines[k][0] for k in flipped))
    return " (when the condition%s on line%s %s go%s the other way)" % (
        "s" if len(lines) > 1 else "", "s" if len(lines) > 1 else "", ", ".join(str(n) for n in lines),
        "" if len(lines) > 1 else "es")


def _exec_finding(error, profile, when):
    if error.code == "missing_field":
        field = error.message.split("field ")[1].split(" ")[0] if "field " in error.message else "?"
        code = "removed_field" if when == UPGRADE else "missing_field"
        return Finding(code, error.line, "k3s fails to render the config: %s (%s %s has no such field)" % (
            error.message, profile["distribution"], profile["release"]),
            "remove the reference to .%s (see docs/template-data.md for the fields of each release)" % field)
    if error.code == "unknown_template":
        return Finding("unknown_template", error.line, error.message, "use {{ template \"base\" . }} or define the name")
    return Finding("exec_error", error.line, "k3s fails to render the config: %s" % error.message,
                   "fix the action on that line")


# tables every base renders (the runtimes' own: each runtime table, named apart)
_BASE_RENDERED_TABLES = {
    2: (("plugins", "io.containerd.grpc.v1.cri"), ("plugins", "io.containerd.grpc.v1.cri", "containerd"),
        ("plugins", "io.containerd.grpc.v1.cri", "cni"), ("plugins", "io.containerd.grpc.v1.cri", "registry"),
        ("plugins", "io.containerd.internal.v1.opt")),
    3: (("plugins", "io.containerd.cri.v1.runtime"), ("plugins", "io.containerd.cri.v1.images"),
        ("plugins", "io.containerd.cri.v1.images", "pinned_images"), ("plugins", "io.containerd.cri.v1.runtime", "cni"),
        ("plugins", "io.containerd.cri.v1.images", "registry"), ("plugins", "io.containerd.internal.v1.opt"),
        ("grpc",)),
}

# each setting k3s's base renders: (schema-2 paths, schema-3 paths, what it is); every path of a group must be set
_LOST = (
    ((("plugins", "io.containerd.grpc.v1.cri", "cni", "conf_dir"), ("plugins", "io.containerd.grpc.v1.cri", "cni", "bin_dir")),
     (("plugins", "io.containerd.cri.v1.runtime", "cni", "conf_dir"), ("plugins", "io.containerd.cri.v1.runtime", "cni", "bin_dir|bin_dirs")),
     "the CNI bin and conf directories"),
    ((("plugins", "io.containerd.grpc.v1.cri", "sandbox_image"),), (("plugins", "io.containerd.cri.v1.images", "pinned_images", "sandbox"),),
     "the sandbox (pause) image"),
    ((("plugins", "io.containerd.grpc.v1.cri", "registry", "config_path"),), (("plugins", "io.containerd.cri.v1.images", "registry", "config_path"),),
     "the registry config_path (registries.yaml)"),
    ((("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "options", "SystemdCgroup"),),
     (("plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "runc", "options", "SystemdCgroup"),),
     "runc's SystemdCgroup"),
    ((("plugins", "io.containerd.grpc.v1.cri", "containerd", "snapshotter"),), (("plugins", "io.containerd.cri.v1.images", "snapshotter"),),
     "the snapshotter"),
)
_BASE_SETTINGS = tuple(label for _v2, _v3, label in _LOST)


def _is_set(data, path):
    return any(toml.value_at(data, path[:-1] + (last,)) is not None for last in path[-1].split("|"))


def _lost_settings(text, schema):
    try:
        data = toml.loads(text)
    except tomllib.TOMLDecodeError:
        return []
    lost = []
    for v2_paths, v3_paths, label in _LOST:
        if not all(_is_set(data, p) for p in (v3_paths if schema >= 3 else v2_paths)):
            lost.append(label)
    return lost


# --- checks on the composed TOML -----------------------------------------------------------------

_TOML_ERROR_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOP_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*[=.]""")
_V2_ONLY_IN_V3 = ("containerd", "registry", "cni", "sandbox_image", "enable_cdi", "cdi_spec_dirs",
                  "enable_selinux", "enable_unprivileged_ports", "enable_unprivileged_icmp",
                  "device_ownership_from_security_context", "max_container_log_line_size", "disable_apparmor")


def analyze(output: gotemplate.Output, schema: int, profile: Mapping[str, Any], note: str = "", base_lines: Sequence[int] = (),
            user_tables: Optional[List[Tuple[Tuple[str, ...], int]]] = None) -> List[Finding]:
    """Findings on one rendered config (an Output with origins)."""
    text = output.text()
    lines = text.split("\n")
    user_line, from_base = _origin_readers(output.line_origins())
    if not any(line.strip() and not line.strip().startswith("#") for line in lines):
        return [Finding("empty", 0, "the template renders no TOML at all%s, so containerd starts on built-in "
                        "defaults" % note, "include {{ template \"base\" . }}, or delete the template")]
    plain = toml_read.read_plain(lines)  # the values and the tables in one pass where the text is plain TOML
    tables = plain[1] if plain is not None else toml.scan_tables(lines)
    if user_tables is not None:
        user_tables.extend((t.path, user_line(t.start)) for t in tables if not from_base(t.start))
    findings = _duplicate_tables(lines, tables, schema, profile, note, base_lines, user_line, from_base)
    findings += _duplicate_top_keys(lines, tables, schema, profile, note, user_line, from_base)
    duplicated = bool(findings)  # each finding so far is a table or top-level key declared twice
    try:
        data = plain[0] if plain is not None else tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if duplicated:
            return findings
        match = _TOML_ERROR_LINE.search(str(exc))
        number = int(match.group(1)) - 1 if match else 0
        message = str(exc)
        code = "duplicate_key" if "overwrite" in message or "twice" in message else "toml_invalid"
        where = "in the base's output" if from_base(number) else ""
        findings.append(Finding(code, user_line(number), "the rendered config is not valid TOML%s: %s%s" % (
            where and " " + where, _TOML_ERROR_LINE.sub("", message).strip(), note),
            "fix that line (the template's rendered text must be TOML)"))
        return findings
    findings.extend(_registry(data, tables, schema, user_line, note))
    findings.extend(_wrong_schema(tables, schema, user_line, from_base, note))
    return findings


def _origin_readers(origins):
    """(user_line, from_base) for a rendered output's line origins: the template line that wrote an output line
    (0 for the base's), and whether the base wrote it."""
    def user_line(number: int) -> int:
        origin = origins[number] if number < len(origins) else None
        return origin[1] if origin and origin[0] != "base" else 0

    def from_base(number: int) -> bool:
        origin = origins[number] if number < len(origins) else None
        return bool(origin) and origin[0] == "base"
    return user_line, from_base


def _duplicate_tables(lines, tables, schema, profile, note, base_lines, user_line, from_base):
    """duplicate_table: a table declared twice (by the template, or by the template and the base)."""
    findings = []
    by_path = {}
    for table in tables:
        if not table.array:
            by_path.setdefault(table.path, []).append(table)
    for path, declared in by_path.items():
        if len(declared) < 2:
            continue
        user = [t for t in declared if not from_base(t.start)]
        in_base = [t for t in declared if from_base(t.start)]
        shown = user[-1] if user else declared[-1]
        name = _header_text(path)
        if not user and len(base_lines) > 1:
            findings.append(Finding("duplicate_table", base_lines[-1], "{{ template \"base\" . }} is executed %d times "
                                    "(lines %s), so every table of the base is declared twice%s" % (
                                        len(base_lines), ", ".join(str(n) for n in base_lines), note),
                                    "include the base once"))
            break
        if in_base and user:
            message = "[%s] is already emitted by the base template of %s %s%s; containerd refuses the config " \
                      "(`table %s already exists`) and k3s restarts in a loop" % (
                          name, profile["distribution"], profile["release"], note, path[-1])
            differs = _table_differences(lines, user[-1], in_base[0])
            if differs:
                message += "; your settings there that differ from what the release renders: %s" % ", ".join(differs)
            fix = _duplicate_fix(path, schema, profile)
        else:
            message = "[%s] is declared %d times%s" % (name, len(declared), note)
            fix = "declare the table once"
        findings.append(Finding("duplicate_table", user_line(shown.start), message, fix, table=path))
    return findings


def _duplicate_top_keys(lines, tables, schema, profile, note, user_line, from_base):
    """duplicate_key and imports_clash: a top-level key set twice (by the template, or by it and the base)."""
    findings = []
    top_end = tables[0].start if tables else len(lines)
    seen_top = {}
    for number in range(top_end):
        match = _TOP_KEY.match(lines[number])
        if not match or lines[number].lstrip().startswith("#"):
            continue
        key = match.group(1).strip("\"'")
        seen_top.setdefault(key, []).append(number)
    for key, numbers in seen_top.items():
        if len(numbers) < 2:
            continue
        user = [n for n in numbers if not from_base(n)]
        shown = user[-1] if user else numbers[-1]
        if key == "imports" and any(from_base(n) for n in numbers):
            findings.append(Finding("imports_clash", user_line(shown), "`imports` is set here and by the base of %s %s, "
                                    "which imports %s/*.toml itself (k3s #13680): `key imports is already defined`" % (
                                        profile["distribution"], profile["release"],
                                        distro.DROPIN_DIRS[3 if schema >= 3 else 2]),
                                    "remove this imports line and put the files into %s/ (k3s imports it)" % (
                                        distro.DROPIN_DIRS[3 if schema >= 3 else 2])))
        else:
            findings.append(Finding("duplicate_key", user_line(shown), "`%s` is set twice at the top of the config%s%s" % (
                key, " (the base sets it too)" if any(from_base(n) for n in numbers) else "", note),
                "remove this line; the base of the release sets %s" % key if any(from_base(n) for n in numbers)
                else "set %s once" % key))
    return findings


def _table_body(lines, table):
    try:
        return tomllib.loads("\n".join(lines[table.start + 1:table.content_end]))
    except tomllib.TOMLDecodeError:
        return None


def _table_differences(lines, user, base):
    """`key mine \u2192 theirs` for each key of the user's declaration of a table that the base's declares otherwise
    or not at all (what the user would lose by taking their table out)."""
    mine, theirs = _table_body(lines, user), _table_body(lines, base)
    if mine is None or theirs is None:
        return []
    return ["%s %s \u2192 %s" % (key, toml._value_text(mine[key]), toml._value_text(theirs.get(key)))
            for key in sorted(mine) if not isinstance(mine[key], dict)
            and not (mine[key] == theirs.get(key) and type(mine[key]) is type(theirs.get(key)))]


def _header_text(path):
    return ".".join(p if re.match(r"^[A-Za-z0-9_-]+$", p) else '"%s"' % p for p in path)


def _duplicate_fix(path, schema, profile):
    name = None
    runtimes_prefix = distro.containerd_table(schema) + ("runtimes",)
    if path[:len(runtimes_prefix)] == runtimes_prefix and len(path) > len(runtimes_prefix):
        name = path[len(runtimes_prefix)]
    if name and name not in ("runc", "runhcs-wcow-process"):
        fix = ("k3s renders runtime %s itself once it detects its binary: remove your table, or give your runtime "
               "another name (such as %s-custom)" % (name, name))
        if profile.get("dropin_imports"):
            fix += ("; to keep settings on the release's own %s table, put only those keys into a drop-in %s/<name>.toml "
                    "(containerd merges it over the base)" % (name, distro.DROPIN_DIRS[3 if schema >= 3 else 2]))
        return fix
    if profile.get("dropin_imports"):
        return "move your keys of that table into a drop-in %s/<name>.toml (containerd merges it) and remove the table here" % (
            distro.DROPIN_DIRS[3 if schema >= 3 else 2])
    return "remove the table from the template (set the value with a k3s flag such as default-runtime:, or use a release with drop-ins)"


def _registry(data, tables, schema, user_line, note):
    path = (("plugins", "io.containerd.cri.v1.images", "registry") if schema >= 3
            else ("plugins", "io.containerd.grpc.v1.cri", "registry"))
    registry = toml.value_at(data, path)
    if not isinstance(registry, dict) or not registry.get("config_path"):
        return []
    bad = []
    if registry.get("mirrors"):
        bad.append("mirrors")
    for host, config in (registry.get("configs") or {}).items():
        if isinstance(config, dict) and config.get("tls"):
            bad.append("configs.tls")
            break
    if not bad:
        return []
    line = 0
    for table in tables:
        if table.path[:len(path) + 1] in (path + ("mirrors",), path + ("configs",)):
            line = user_line(table.start)
            if line:
                break
    return [Finding("mirrors_config_path", line, "registry %s set beside the config_path the base sets; containerd's "
                    "CRI plugin refuses to start (`mirrors` cannot be set when `config_path` is provided)%s" % (
                        " and ".join(bad), note),
                    "move the mirrors to /etc/rancher/<k3s|rke2>/registries.yaml (k3s writes them as certs.d hosts) "
                    "and remove these tables")]


def _wrong_schema(tables, schema, user_line, from_base, note):
    findings = []
    for table in tables:
        if from_base(table.start):
            continue
        path = table.path
        if schema >= 3 and path[:2] == ("plugins", "io.containerd.grpc.v1.cri") and len(path) > 2 and path[2] in _V2_ONLY_IN_V3:
            moved = "io.containerd.cri.v1.images" if path[2] == "registry" else "io.containerd.cri.v1.runtime"
            findings.append(Finding("wrong_schema_path", user_line(table.start), "[%s] is a schema-2 path in a schema-3 "
                                    "template; containerd 2.x ignores it (`Ignoring unknown key`), so it never takes "
                                    "effect%s" % (_header_text(path), note),
                                    "use [%s] instead" % _header_text(("plugins", moved) + path[2:])))
        elif path[:2] in (("plugins", "cri"), ("plugins", "opt"), ("plugins", "linux")):
            findings.append(Finding("wrong_schema_path", user_line(table.start), "[%s] uses a version-1 short plugin "
                                    "name, which a version %d config does not read%s" % (_header_text(path), schema, note),
                                    "use the full plugin id (%s)" % (
                                        "io.containerd.cri.v1.runtime / io.containerd.cri.v1.images" if schema >= 3
                                        else "io.containerd.grpc.v1.cri")))
        elif schema == 2 and path[:2] in (("plugins", "io.containerd.cri.v1.runtime"), ("plugins", "io.containerd.cri.v1.images")):
            findings.append(Finding("wrong_schema_path", user_line(table.start), "[%s] is a schema-3 path in a schema-2 "
                                    "template (config.toml.tmpl)%s" % (_header_text(path), note),
                                    "use the io.containerd.grpc.v1.cri path, or rename the template to config-v3.toml.tmpl "
                                    "on a containerd 2 release"))
    return findings


# --- encoding ------------------------------------------------------------------------------------

_BOMS = ((b"\xef\xbb\xbf", "UTF-8"), (b"\xff\xfe", "UTF-16LE"), (b"\xfe\xff", "UTF-16BE"))


def check_bytes(data: bytes, path: str, facts: NodeFacts, schema: int, **kwargs: Any) -> Report:
    """check() on the raw bytes of a file: every encoding problem is named, then the text is checked."""
    report = Report(path)
    for bom, name in _BOMS:
        if data.startswith(bom) and name != "UTF-8":
            report.add(Finding("encoding_bom", 1, "the file starts with a %s byte order mark: it is not UTF-8 text" % name,
                               "save the file as UTF-8 without BOM"))
    if b"\x00" in data:
        report.add(Finding("encoding_nul", data[:data.index(b"\x00")].count(b"\n") + 1, "the file contains a NUL byte",
                           "remove it (the file is probably not a text file, or was damaged)"))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        report.add(Finding("encoding_utf8", data[:exc.start].count(b"\n") + 1, "the file is not valid UTF-8 (byte "
                           "0x%02x); containerd 2.x refuses the config" % data[exc.start],
                           "convert the file to UTF-8 (iconv -t UTF-8)"))
        return report
    if report.findings:
        _encoding(text.replace("\x00", ""), report, False)
        return report
    return check(text, path, facts, schema, **kwargs)


def _encoding(text, report, normalize):
    fixed = text
    if "\x00" in text:
        report.add(Finding("encoding_nul", text[:text.index("\x00")].count("\n") + 1, "the file contains a NUL byte",
                           "remove it (the file is probably not a text file, or was damaged)"))
        return text
    problems = []
    if text.startswith("\ufeff"):
        problems.append(Finding("encoding_bom", 1, "the file starts with a UTF-8 byte order mark; containerd 2.x refuses "
                                "the config (`invalid character at start of key: U+00EF`)",
                                "save the file without BOM, or set normalize_encoding: true to let this task remove it"))
        fixed = fixed[1:]
    if "\r" in fixed:
        problems.append(Finding("encoding_crlf", fixed[:fixed.index("\r")].count("\n") + 1, "the file has CR line "
                                "endings; an edit would write mixed line endings",
                                "convert it to LF line endings (dos2unix), or set normalize_encoding: true"))
        fixed = fixed.replace("\r\n", "\n").replace("\r", "\n")
    if not problems:
        return text
    if normalize:
        report.normalized = fixed
        return fixed
    for finding in problems:
        report.add(finding)
    return text


def _parse_fix(exc, funcs=()):
    if exc.code == "unknown_function":
        return "k3s's templates know Go's builtin functions and %s; remove or replace the call" % ", ".join(funcs)
    if "unclosed action" in exc.message:
        return "close the action with }} (an action may span lines, but must end)"
    if "EOF" in exc.message:
        return "add the missing {{ end }} for the if/range/with/define opened here"
    return "fix the action on that line"


def _q(name):
    return '"%s"' % name


def _close(name, other):
    import difflib
    return bool(difflib.get_close_matches(name, [other], 1, 0.6))
