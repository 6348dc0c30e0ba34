# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The plan: which file to write and which runtime blocks go in it (pure decisions, no I/O).

PRIVATE to the collection. Stdlib only (runtime_info computes the plan on the node; the
containerd_runtimes action plugin computes it again on the controller with its own options).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib
import json
import posixpath
import re

from collections.abc import Mapping

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, shown

MODE_DROPIN = "dropin"
MODE_TEMPLATE = "template"
MODE_CONFIG = "config"

_BASE_INCLUDE = re.compile(r"\{\{-?\s*template\s+\"base\"\s+\.\s*-?\}\}")
_RUNTIME_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # \Z: "$" would accept a trailing newline


def includes_base(text):
    return bool(_BASE_INCLUDE.search(text or ""))


def template_includes_base(facts, target):
    """Whether the template target is rendered with the base (one this module creates starts with the include);
    without it k3s renders that file alone, and no table comes from the base."""
    text = _file_text(facts, target["template"]) if target.get("template") else None
    return text is None or includes_base(text)


def imports_dir(text, dirname):
    """Whether a template/config carries an `imports` line covering dirname/*.toml."""
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("imports") and dirname in stripped:
            return True
    return False


def _file_text(facts, key):
    info = facts["files"].get(key) or {}
    return info.get("content")


def _refuse_unusable(info, what):
    """Fail on a target that is not a plain, readable, UTF-8 file of sane size."""
    state = info.get("state")
    path = info.get("path")
    if state == "link":
        raise K3sGpuError(
            "%s %s is a symlink" % (what, path),
            fix="refusing to write through it. Point path= at the real file, or replace the link with a regular file")
    if state == "directory":
        raise K3sGpuError("%s %s is a directory" % (what, path), fix="expected a file. Remove or rename the directory")
    if state == "other":
        raise K3sGpuError("%s %s is not a regular file (a device, socket or FIFO)" % (what, path),
                          fix="containerd and k3s read only regular files: replace it with one; nothing was written")
    error = info.get("error")
    if error == "too_large":
        raise K3sGpuError(
            "%s %s is %d bytes, larger than the 1 MiB this module edits" % (what, path, info.get("size", 0)),
            fix="a containerd config is a few KiB, so check that this is the right file")
    if error == "not_utf8":
        raise K3sGpuError(
            "%s %s is not valid UTF-8 (first bad byte on line %d)" % (what, path, info.get("error_line", 0)),
            fix="TOML must be UTF-8 and containerd 2.x refuses anything else [encoding_utf8]. Convert the file to "
                "UTF-8 (iconv -t UTF-8); nothing was written")
    if error == "unreadable":
        raise K3sGpuError("%s %s cannot be read by the user the task runs as" % (what, path),
                          fix="run the task as root (become: true), as k3s and containerd do; nothing was written")


def select_target(facts, path=None):
    """Where the blocks go: {mode, path, schema, key, reason}. Raises K3sGpuError."""
    profile = facts["profile"]
    files = facts["files"]
    if profile["distribution"] == distro.CONTAINERD:
        return _select_containerd(facts, path)
    paths = facts["paths"]
    active = None
    for name in profile["templates"]:
        key = "template_v3" if name == distro.TEMPLATE_V3 else "template_v2"
        if files[key]["state"] != "absent":
            active = key
            break
    schema = distro.schema_of_template(posixpath.basename(paths[active])) if active else profile["schema"]
    if path:
        return _select_override(facts, path, schema)
    if active:
        _refuse_unusable(files[active], "template")
    active_text = _file_text(facts, active) if active else None
    dropin_dir = paths["dropin_dir_v3" if schema == 3 else "dropin_dir_v2"]
    dropin_key = "dropin_v3" if schema == 3 else "dropin_v2"
    dropin = {"mode": MODE_DROPIN, "path": paths[dropin_key], "schema": schema, "key": dropin_key, "template": active}
    if profile["dropin_imports"] and profile["dropin_deep_merge"]:
        if active is None:
            dropin["reason"] = "%s %s imports %s/*.toml from its base template" % (
                profile["distribution"], profile["release"], posixpath.basename(dropin_dir))
            return dropin
        if includes_base(active_text) or imports_dir(active_text, posixpath.basename(dropin_dir)):
            dropin["reason"] = "the template %s includes base (or imports %s), so the drop-in is read" % (
                paths[active], posixpath.basename(dropin_dir))
            return dropin
        return {"mode": MODE_TEMPLATE, "path": paths[active], "schema": schema, "key": active, "template": active,
                "reason": "the template %s neither includes base nor imports %s, so k3s would ignore a "
                          "drop-in; editing that template instead" % (paths[active], posixpath.basename(dropin_dir))}
    if active:
        return {"mode": MODE_TEMPLATE, "path": paths[active], "schema": schema, "key": active, "template": active,
                "reason": "%s %s reads the existing template %s; edited in place" % (
                    profile["distribution"], profile["release"], paths[active])}
    key = "template_v3" if schema == 3 else "template_v2"
    target = {"mode": MODE_TEMPLATE, "path": paths[key], "schema": schema, "key": key, "template": None,
              "reason": "%s %s has no drop-in support; a template that includes base is created" % (
                  profile["distribution"], profile["release"])}
    if not profile["base_template"]:
        target["unsupported"] = (
            "%s %s has no `{{ template \"base\" . }}` (it came with v1.28.1), so adding a runtime would "
            "need a full copy of k3s's template. Upgrade to v1.28.1 or newer" % (
                profile["distribution"], profile["release"]))
    return target


_DISABLED_PLUGINS = re.compile(r"^[ \t]*disabled_plugins[ \t]*=[ \t]*\[(.*?)\]", re.M | re.S)
_FIRST_TABLE = re.compile(r"^[ \t]*\[", re.M)
_QUOTED = re.compile(r"\"([^\"]*)\"|'([^']*)'")
# every name under which containerd accepts turning its CRI plugin off (v1 short ID, 1.x/2.x URIs)
CRI_PLUGIN_IDS = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images")


def cri_disabled(text):
    """(name, line) of a CRI plugin listed in the top-level disabled_plugins, else None."""
    text = text or ""
    first_table = _FIRST_TABLE.search(text)
    match = _DISABLED_PLUGINS.search(text, 0, first_table.start() if first_table else len(text))
    if not match:
        return None
    for pair in _QUOTED.findall(match.group(1)):
        name = pair[0] or pair[1]
        if name in CRI_PLUGIN_IDS:
            return name, text.count("\n", 0, match.start()) + 1
    return None


def _refuse_cri_disabled(info):
    found = cri_disabled(info.get("content"))
    if found:
        raise K3sGpuError(
            "%s: line %d: disabled_plugins turns off containerd's CRI plugin (%s), so the kubelet cannot use this "
            "containerd at all (Docker's containerd.io package ships such a file, for Docker alone) [cri_disabled]" % (
                info["path"], found[1], json.dumps(found[0])),
            fix="write containerd's own config (`containerd config default > %s`, then your changes) or remove %s "
                "from disabled_plugins, then run the role again; nothing was written" % (
                    info["path"], json.dumps(found[0])))


def _select_containerd(facts, path):
    profile = facts["profile"]
    config = facts["files"]["config"]
    if config["state"] == "file":
        _refuse_unusable(config, "containerd config")
        _refuse_cri_disabled(config)
    schema = _config_schema(config, profile)
    if path:
        return _select_override(facts, path, schema)
    text = config.get("content")
    if profile["dropin_deep_merge"] and imports_dir(text, posixpath.basename(facts["paths"]["dropin_dir"])):
        return {"mode": MODE_DROPIN, "path": facts["paths"]["dropin"], "schema": schema, "key": "dropin",
                "template": None, "reason": "%s imports %s/*.toml and containerd %s merges drop-ins deeply" % (
                    config["path"], facts["paths"]["dropin_dir"], profile["containerd"])}
    return {"mode": MODE_CONFIG, "path": config["path"], "schema": schema, "key": "config", "template": None,
            "reason": "containerd %s: %s is edited in place" % (profile["containerd"], config["path"])}


def _config_schema(info, profile):
    """Schema of an existing plain containerd config (its `version` line), else the release's.

    The file's own version is kept: a drop-in next to it gets the same version (containerd 2.3
    refuses a drop-in whose `version` is above the root config's, #12891), and an edited file keeps
    its `version` line. Version 4 (containerd 2.3+) uses the CRI paths of 3. A version the node's
    containerd cannot read is refused.
    """
    if info.get("state") != "file" or not (info.get("content") or "").strip():
        return profile["schema"]
    version = info.get("version_line")
    highest = profile.get("config_version_max") or profile["schema"]
    if version is None:
        if _has_toml_content(info.get("content")):
            raise K3sGpuError(
                "%s has no `version` line, so containerd reads it with the version 1 schema (plugin names such as "
                "\"cri\") and would ignore runtime tables written for version %d [config_version_1]" % (
                    info["path"], profile["schema"]),
                fix="containerd %s reads config versions %s (`containerd config default` writes %d): rewrite the file "
                    "for version %d, with `version = %d` at the top and the plugin names of that version, or start "
                    "from `containerd config default`, then run the role again; nothing was written" % (
                        profile["containerd"], ", ".join(str(v) for v in range(1, highest + 1)), highest,
                        profile["schema"], profile["schema"]))
        return profile["schema"]
    if version == 4 and highest == 3:
        # containerd 2.0-2.2 (message checked with 2.2.7)
        raise K3sGpuError(
            '%s declares `version = 4`, which containerd %s cannot read: it refuses to start ("expected containerd '
            'config version equal to or less than `3`, got `4`"; version 4 came with containerd 2.3)' % (
                info["path"], profile["containerd"]),
            fix="write the file as version 3 (the CRI runtime tables keep their paths; the [grpc], [ttrpc], [debug] and "
                "[metrics] settings move back from the io.containerd.server.v1.* plugin tables to the top level), or "
                "upgrade containerd to 2.3; nothing was changed")
    if version not in distro.CONFIG_VERSIONS or version > highest:
        raise K3sGpuError(
            "%s declares `version = %d`, which containerd %s does "
            "not read" % (info["path"], version, profile["containerd"]),
            fix="use version = %d" % (profile["schema"],))
    return version


def _has_toml_content(text):
    return any(line.strip() and not line.strip().startswith("#") for line in (text or "").splitlines())


def _select_override(facts, path, schema):
    if not path.startswith("/"):
        raise K3sGpuError("path %r must be absolute (a node path)" % (path,))
    info = facts["files"].get("override") or {"state": "absent", "path": path}
    if info["state"] != "absent":
        _refuse_unusable(info, "path")
    base = posixpath.basename(path)
    parent = posixpath.basename(posixpath.dirname(path))
    if base.endswith(".tmpl"):
        mode = MODE_TEMPLATE
        if base in (distro.TEMPLATE_V2, distro.TEMPLATE_V3):
            schema = distro.schema_of_template(base)
    elif parent.endswith(".d"):
        mode = MODE_DROPIN
        if parent == distro.DROPIN_DIRS[2]:
            schema = 2
        elif parent == distro.DROPIN_DIRS[3]:
            schema = 3
    else:
        mode = MODE_CONFIG
        if info.get("version_line") is not None and info["state"] == "file":
            # the file's own version, if the node reads it (4 only on containerd 2.3+)
            schema = _config_schema(info, facts["profile"])
    return {"mode": mode, "path": path, "schema": schema, "key": "override",
            "template": "override" if mode == MODE_TEMPLATE else None, "reason": "path= given"}


# --- what the target will already render --------------------------------------------------------

def release_renders(facts, target):
    """Runtimes the release renders itself into the config containerd loads with this target."""
    if facts["profile"]["distribution"] == distro.CONTAINERD:
        return {}
    runtimes = dict((r["name"], r) for r in facts["release_runtimes"])
    if target["mode"] == MODE_TEMPLATE and target.get("template"):
        text = _file_text(facts, target["template"])
        if text is None:
            return runtimes  # a template this module creates starts with the base include
        if not includes_base(text) and ".ExtraRuntimes" not in text:
            return {}  # a frozen template that does not range over the detected runtimes
    return runtimes


def reserved_tables(facts, target, default_runtime_via_flag):
    """Tables the base template emits for this release and node: ours must never repeat them."""
    if target["mode"] != MODE_TEMPLATE or facts["profile"]["distribution"] == distro.CONTAINERD:
        return []
    schema = target["schema"]
    text = _file_text(facts, target["template"]) if target.get("template") else None
    tables = []
    if text is None or includes_base(text):
        tables.extend(k3s_base.emitted_table_paths(facts["profile"], schema, default_runtime_via_flag))
    for name in sorted(release_renders(facts, target)):
        tables.append(distro.runtime_table(schema, name))
        tables.append(distro.runtime_table(schema, name) + ("options",))
    return [list(t) for t in tables]


# --- runtime requests -------------------------------------------------------------------------

def check_runtime_name(name, where=None, variable=None):
    """Refuse a runtime name containerd cannot serve to a RuntimeClass; `where` names it ({runtimes}[2].name)."""
    if not isinstance(name, str) or not _RUNTIME_NAME.match(name) or len(name) > 63:
        raise K3sGpuError(
            "%s: a containerd handler used by a RuntimeClass must be a lowercase DNS label (a-z, 0-9 and '-', at most "
            "63 characters, no quotes, dots, spaces or newlines)" % (
                "%s: %s is not a valid runtime name" % (where, shown(name)) if where
                else "runtime name %s is not valid" % shown(name)),
            fix="rename it, for example to 'nvidia-custom'", variable=variable)


# a runtimes entry's keys (containerd_runtimes' RUNTIME_SPEC)
RUNTIME_KEYS = ("name", "binary", "runtime_type", "options", "systemd_cgroup")
# containerd's name of a shim (io.containerd.<shim>.<version> runs containerd-shim-<shim>-<version>) or a shim's path
_RUNTIME_TYPE = re.compile(r"([A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+|/[!-~]+)\Z")
_BOOLEAN_TEXTS = ("true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "1", "0")


def _absolute_path(value):
    return isinstance(value, str) and value.startswith("/") and value.isprintable()


def _runtime_type(value):
    return value in (None, "") or (isinstance(value, str) and bool(_RUNTIME_TYPE.match(value)))


def _boolean(value):
    if isinstance(value, str):
        return value.strip().lower() in _BOOLEAN_TEXTS
    return value is None or isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))


# each value of an entry: (key, whether the value is one, what it is not, the fix)
_ENTRY_VALUES = (
    ("binary", lambda value: value is None or _absolute_path(value), "is not an absolute path",
     "give the runtime's path on the node, such as /usr/bin/nvidia-container-runtime, or leave binary out for the one "
     "detected"),
    ("runtime_type", _runtime_type, "is not a containerd runtime type",
     "write a shim's name such as io.containerd.runc.v2 (the default), or leave runtime_type out"),
    ("options", lambda value: value is None or isinstance(value, Mapping), "is not a mapping",
     "write the runtime's options as a mapping, such as {SystemdCgroup: true}"),
    ("systemd_cgroup", _boolean, "is not a boolean", "set true or false, or leave systemd_cgroup out"),
)


def check_runtime_entry(index, entry):
    """Refuse a {runtimes} entry that is no runtime's settings, by its index and key ({runtimes}[2].name): a mapping
    of RUNTIME_KEYS, a valid name, an absolute binary, a runtime_type containerd runs, options as a mapping, a boolean
    systemd_cgroup. Whether the binary is there is a question for the node's reading (check_runtime_binary)."""
    where = "{runtimes}[%d]" % index
    if not isinstance(entry, Mapping):
        raise K3sGpuError("%s: %s is not a mapping" % (where, shown(entry)), variable="runtimes",
                          fix="write each runtime as a mapping, such as {name: nvidia-custom, binary: /usr/bin/x}")
    unknown = [key for key in entry if key not in RUNTIME_KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), RUNTIME_KEYS, 1, 0.6)
        raise K3sGpuError("%s: %s is not a runtime setting%s" % (where, shown(unknown[0]), (
            " (did you mean %s?)" % close[0]) if close else ""), "use %s" % ", ".join(RUNTIME_KEYS), "runtimes")
    if entry.get("name") is None:
        raise K3sGpuError("%s.name is missing" % where, "give each runtime a name, such as nvidia-custom", "runtimes")
    check_runtime_name(entry["name"], where + ".name", "runtimes")
    for key, fits, what, fix in _ENTRY_VALUES:
        if not fits(entry.get(key)):
            raise K3sGpuError("%s.%s: %s %s" % (where, key, shown(entry[key]), what), fix, "runtimes")


def check_runtime_binary(name, binary, binary_info):
    if not isinstance(binary, str) or not binary.startswith("/"):
        raise K3sGpuError("runtime %s: binary %r must be an absolute path on the node, such as "
                          "/usr/bin/nvidia-container-runtime" % (name, binary))
    state = (binary_info or {}).get("state")
    if state in ("absent", "dangling", None):
        raise K3sGpuError(
            "runtime %s: binary %s does not exist on the node%s" % (
                name, binary, " (dangling symlink)" if state == "dangling" else ""),
            fix="install the NVIDIA container toolkit (nvidia-container-toolkit-operator-extensions for the .cdi "
                "and .legacy binaries) or fix the path")
    if state == "directory":
        raise K3sGpuError("runtime %s: binary %s is a directory" % (name, binary))
    if not binary_info.get("executable"):
        raise K3sGpuError("runtime %s: binary %s is not executable" % (name, binary), fix="chmod 0755 it")


def check_options(name, runtime_type, options):
    if runtime_type != distro.RUNC_V2:
        return
    for key in options:
        if key not in distro.RUNC_OPTION_KEYS:
            close = difflib.get_close_matches(str(key), distro.RUNC_OPTION_KEYS, 1, 0.6) or \
                [k for k in distro.RUNC_OPTION_KEYS if k.lower() == str(key).lower()]
            hint = " (did you mean %s?)" % close[0] if close else ""
            raise K3sGpuError(
                "runtime %s: option %r is not an option of the %s shim%s" % (name, key, runtime_type, hint),
                fix="containerd would keep it silently and run pods on plain runc. Known options: "
                    "%s" % (", ".join(distro.RUNC_OPTION_KEYS),))


def check_runtime_entries(entries):
    """check_runtime_entry for each entry, and each name listed once: what needs no reading of the node."""
    seen = set()
    for index, entry in enumerate(entries):
        check_runtime_entry(index, entry)
        if entry["name"] in seen:
            raise K3sGpuError("{runtimes}[%d].name: %s is listed twice in {runtimes}" % (index, shown(entry["name"])),
                              "list it once", "runtimes")
        seen.add(entry["name"])


def normalize_runtimes(facts, requested):
    """The runtimes asked for (explicit list, or the NVIDIA runtimes found on the node)."""
    if requested is None:
        return [{"name": r["name"], "binary": r["binary"], "runtime_type": r["runtime_type"], "options": {},
                 "systemd_cgroup": None, "explicit": False} for r in facts["runtimes"]]
    result = []
    binaries = facts.get("binaries") or {}
    check_runtime_entries(requested)  # every entry's settings before what the node has
    for item in requested:
        name = item["name"]
        runtime_type = item.get("runtime_type") or distro.RUNC_V2
        binary = item.get("binary")
        if binary is None:
            found = [r for r in facts["runtimes"] if r["name"] == name]
            if not found:
                raise K3sGpuError("runtime %s in {runtimes}: no binary given and none detected on the node" % name,
                                  fix="give its binary (the runtime's path on the node), or install the NVIDIA Container "
                                      "Toolkit first; nothing was written", variable="runtimes")
            binary = found[0]["binary"]
        else:
            check_runtime_binary(name, binary, binaries.get(binary))
        options = dict(item.get("options") or {})
        if "BinaryName" in options:
            raise K3sGpuError("runtime %s in {runtimes}: options.BinaryName is set" % name,
                              fix="give the path as the runtime's binary instead; nothing was written", variable="runtimes")
        check_options(name, runtime_type, options)
        result.append({"name": name, "binary": binary, "runtime_type": runtime_type, "options": options,
                       "systemd_cgroup": item.get("systemd_cgroup"), "explicit": True})
    return result


# --- the plan --------------------------------------------------------------------------------------

# what to do instead, by the runtime a k3s/rke2 node runs its pods on (when it is not a containerd)
_EXTERNAL_RUNTIME_FIX = {
    distro.RUNTIME_DOCKER: "configure Docker's NVIDIA runtime instead (`nvidia-ctk runtime configure --runtime=docker`, "
                           "then restart docker), or drop `docker` to return to the embedded containerd",
    distro.RUNTIME_CRIO: "configure CRI-O's NVIDIA runtime instead (`nvidia-ctk runtime configure --runtime=crio`, "
                         "then restart crio)",
    distro.RUNTIME_UNKNOWN: "configure the NVIDIA runtimes in the runtime behind that endpoint yourself, or point the "
                            "endpoint at the host's containerd (/run/containerd/containerd.sock or the [grpc] address "
                            "of /etc/containerd/config.toml), which this module then configures",
}
_EXTERNAL_RUNTIME_NAME = {
    distro.RUNTIME_DOCKER: "Docker (through cri-dockerd)",
    distro.RUNTIME_CRIO: "CRI-O",
    distro.RUNTIME_UNKNOWN: "a runtime this module cannot identify",
}


def refuse_external_runtime(in_use):
    """K3sGpuError when a k3s/rke2 node's pods run on Docker, CRI-O or an unknown CRI endpoint: k3s then renders
    no containerd config, so nothing written for its embedded containerd would ever load."""
    if not in_use or in_use.get("runtime") not in _EXTERNAL_RUNTIME_FIX:
        return
    if in_use.get("docker"):
        setting = "`docker: true` (%s)" % in_use.get("docker_source")
    else:
        setting = "container-runtime-endpoint %s (%s)" % (in_use.get("endpoint"), in_use.get("source"))
    raise K3sGpuError(
        "[external_runtime] %s %s on this node runs its pods on %s, set by %s, not on its embedded containerd, so "
        "it reads no containerd template or drop-in and the NVIDIA runtimes written there would never load" % (
            in_use.get("distribution"), in_use.get("release"), _EXTERNAL_RUNTIME_NAME[in_use["runtime"]], setting),
        fix="%s; nothing was changed" % (_EXTERNAL_RUNTIME_FIX[in_use["runtime"]],))


def make_plan(facts, runtimes=None, state="present", default_runtime=None, enable_cdi=None, path=None):
    """Decide everything; raise K3sGpuError on input that cannot be applied safely."""
    if state == "present":
        refuse_external_runtime(facts.get("runtime_in_use"))
    profile = facts["profile"]
    target = select_target(facts, path)
    wanted = normalize_runtimes(facts, runtimes)
    renders = release_renders(facts, target)
    plan = {"target": target, "write": [], "skip": [], "remove": [], "default_runtime": None,
            "enable_cdi": None, "notes": [], "state": state, "runtimes_explicit": runtimes is not None}
    k3s_like = profile["distribution"] != distro.CONTAINERD
    label = "%s %s" % (profile["distribution"], profile["release"])
    in_use = facts.get("runtime_in_use") or {}
    if in_use.get("distribution") and in_use.get("runtime") == distro.RUNTIME_HOST_CONTAINERD:
        plan["notes"].append(
            "%s %s runs its pods on the host's containerd (container-runtime-endpoint %s in %s): configured as plain "
            "containerd %s, whose service restarts; the embedded containerd's files are not used" % (
                in_use["distribution"], in_use["release"], in_use["endpoint"], in_use["source"], profile["release"]))
    if state == "absent":
        names = [r["name"] for r in wanted] if runtimes is not None else [n for n, _b in distro.NVIDIA_RUNTIMES]
        plan["remove"] = names
        plan["reserved_tables"] = []
        return plan
    _plan_runtimes(plan, wanted, renders, target, label)
    if k3s_like:
        # k3s gives its own runtimes SystemdCgroup = .SystemdCgroup; a default runtime of the user's (a template
        # or drop-in that names one) comes first (_toml.runtime_items), then this
        plan["systemd_cgroup_default"] = bool(facts["systemd_cgroup"])
    _plan_default_runtime(facts, plan, default_runtime, renders, label)
    _plan_enable_cdi(facts, plan, enable_cdi, label)
    if target.get("unsupported") and (plan["write"] or plan["enable_cdi"] is not None or (
            plan["default_runtime"] or {}).get("how") == "toml"):
        raise K3sGpuError(target["unsupported"])
    how = (plan["default_runtime"] or {}).get("how")
    current = facts.get("default_runtime") or {}
    # set by someone else (config.yaml, another drop-in, ExecStart); ours is rewritten or removed below
    set_elsewhere = bool(current.get("value")) and current.get("source") != facts["paths"].get("default_runtime_file")
    if how == "toml" and set_elsewhere:
        raise K3sGpuError(
            "{default_runtime} %s must go into the containerd config (k3s does not detect it), but %s sets "
            "default-runtime: %s, which k3s validates against its detected runtimes" % (
                plan["default_runtime"]["name"], current["source"], current["value"]), "remove that setting",
            "default_runtime")
    # after the next restart k3s passes --default-runtime when config.yaml(.d) or the unit sets it
    via_flag = how == "config_yaml" or (set_elsewhere and how != "toml") or (
        how is None and bool(current.get("value")) and state == "present")
    plan["reserved_tables"] = reserved_tables(facts, target, via_flag)
    return plan


def _plan_runtimes(plan, wanted, renders, target, label):
    """Each wanted runtime: written, or skipped where the release renders the same block itself."""
    for runtime in wanted:
        rendered = renders.get(runtime["name"])
        if rendered is None:
            plan["write"].append(runtime)
            continue
        unchanged_table = not runtime["options"] and runtime["systemd_cgroup"] is None
        same = rendered["binary"] == runtime["binary"] and rendered["runtime_type"] == runtime["runtime_type"] and unchanged_table
        if same:
            plan["skip"].append({"name": runtime["name"], "reason": "%s detects %s and renders this runtime itself" % (
                label, rendered["binary"])})
        elif target["mode"] == MODE_DROPIN:
            plan["write"].append(runtime)
            plan["notes"].append("runtime %s: the drop-in overrides the block %s renders for %s" % (
                runtime["name"], label, rendered["binary"]))
        else:
            raise K3sGpuError(
                "runtime %s: %s renders this runtime itself with %s, and %s cannot declare its table a "
                "second time (containerd would refuse the config and k3s would restart in a loop)" % (
                    runtime["name"], label, rendered["binary"], target["path"]),
                fix="use another runtime name, or remove that binary so k3s does not detect it")


def _plan_default_runtime(facts, plan, name, renders, label):
    if not name:
        return
    profile = facts["profile"]
    target = plan["target"]
    written = [r["name"] for r in plan["write"]]
    if profile["distribution"] != distro.CONTAINERD:
        if not profile["default_runtime"]:
            raise K3sGpuError(
                "%s has no default-runtime setting (it came with v1.28.5 and v1.29.0)" % label,
                fix="upgrade, or give pods runtimeClassName instead")
        if name == "runc":
            raise K3sGpuError("{default_runtime} runc: %s checks default-runtime against the runtimes it detects, "
                              "which never include runc, so it would not start" % label,
                              "runc is already the default: leave {default_runtime} unset", "default_runtime")
        if name in renders:
            plan["default_runtime"] = {"name": name, "how": "config_yaml", "path": facts["paths"]["default_runtime_file"]}
            return
        if name not in written:
            raise K3sGpuError("{default_runtime} %s is neither detected by %s nor written by this task; "
                              "k3s would refuse to start (`default runtime %s was not found`)" % (name, label, name),
                              "set {default_runtime} to a runtime the node has, or add it to {runtimes}",
                              ("default_runtime", "runtimes"))
        if target["mode"] == MODE_TEMPLATE and target["schema"] == 2 and template_includes_base(facts, target):
            raise K3sGpuError(
                "{default_runtime} %s: %s does not detect this runtime, so it must be set as "
                "default_runtime_name in the containerd config, but the schema-2 base template already emits "
                "the table that holds it" % (name, label), "install the runtime where k3s detects it (then "
                "default-runtime: works), or use a release with containerd 2 (v1.31.6+, v1.32.2+)", "default_runtime")
        plan["default_runtime"] = {"name": name, "how": "toml", "path": target["path"]}
        return
    if name not in written and name != "runc":
        plan["notes"].append("default_runtime %s must already be configured in %s" % (name, target["path"]))
    plan["default_runtime"] = {"name": name, "how": "toml", "path": target["path"]}


def _plan_enable_cdi(facts, plan, enable_cdi, label):
    if enable_cdi is None:
        return
    profile = facts["profile"]
    target = plan["target"]
    if enable_cdi and not profile["cdi_supported"]:
        raise K3sGpuError("{enable_cdi}: containerd %s (%s) has no CDI support; it came with containerd 1.7" % (
            profile["containerd"], label), "leave {enable_cdi} unset, or upgrade containerd", "enable_cdi")
    if target["mode"] == MODE_TEMPLATE and template_includes_base(facts, target):
        if bool(enable_cdi) == profile["cdi_default_on"]:
            plan["notes"].append("enable_cdi: containerd %s already has enable_cdi = %s by default" % (
                profile["containerd"], str(bool(enable_cdi)).lower()))
            return
        raise K3sGpuError(
            "{enable_cdi}: %s ships containerd %s, where enable_cdi defaults to %s, and its base template "
            "already emits [plugins.\"%s\"] that holds it, so a template cannot set it without breaking "
            "containerd" % (label, profile["containerd"], str(profile["cdi_default_on"]).lower(),
                            distro.CRI_RUNTIME_PLUGIN[target["schema"]]),
            "use a release with containerd 2 (v1.31.6+, v1.32.2+, CDI on by default), or leave {enable_cdi} unset",
            "enable_cdi")
    plan["enable_cdi"] = bool(enable_cdi)


def summarize(plan):
    """The plan as the modules return it."""
    target = plan["target"]
    return {
        "mode": target["mode"],
        "path": target["path"],
        "schema": target["schema"],
        "reason": target.get("reason"),
        "write": [{"name": r["name"], "binary": r["binary"], "runtime_type": r["runtime_type"]} for r in plan["write"]],
        "skip": plan["skip"],
        "remove": plan["remove"],
        "default_runtime": plan["default_runtime"],
        "enable_cdi": plan["enable_cdi"],
        "notes": plan["notes"],
    }
