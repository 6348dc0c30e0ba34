# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the k3s/rke2 base template renders (the generated config.toml), per template era, as data.

PRIVATE to the collection. Stdlib only and self-contained: it runs on a node (_plan reads which tables the
base emits; Python 3.8+), and the stand-in k3s of the node tests (tests/nodes) carries this file as it is.

Each era below lists, in order, the tables the base emits and their keys, with the template's
parameters (root, state, socket, snapshotter, pause image, CNI dirs, SystemdCgroup, the default
runtime, the detected runtimes) filled in by render_base(). It was written by reading the k3s
template sources recorded in SOURCES; no template code is copied. rke2 links the same k3s agent
code (rke2 tags pin a k3s commit), so rke2 releases of a line use the same era.

compose() builds what k3s loads from a template whose only action is the base line (the stand-in
k3s and the conformance cases); the template model (_template_check) renders any other template.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

SOURCES = {
    "v2-legacy": "k3s pkg/agent/templates/templates_linux.go, v1.31.5+k3s1 (56ec5dd4d, pinned by rke2 v1.31.5+rke2r1); "
                 "same layout since the base-template change #7991 (546dc247a, v1.28.1); device_ownership_from_security_context "
                 "from #11200; SystemdCgroup in extra runtimes from #8470 (v1.28.3)",
    "unified": "k3s pkg/agent/templates/templates.go, v1.31.6+k3s1 (a7455eb9e, pinned by rke2 v1.31.6+rke2r1): "
               "one template for Linux and Windows (84522f022), schema 2 and 3, output through trimEmpty",
    "unified-imports": "k3s pkg/agent/templates/templates.go, v1.33.10+k3s1 (7b2aeb084; #13680 backported as 77b243929): "
                       "adds `imports` of config-v3.toml.d/config.toml.d; use_local_image_pull and bin_dirs (present at "
                       "v1.33.10, absent at v1.31.6; tied here to containerd 2.1+ releases, inferred)",
}

V2_CRI = "io.containerd.grpc.v1.cri"
V3_RUNTIME = "io.containerd.cri.v1.runtime"
V3_IMAGES = "io.containerd.cri.v1.images"


def era_of(profile, schema):
    if not profile["unified_template"]:
        return "v2-legacy"
    return "unified-imports" if profile["dropin_imports"] else "unified"


def _q(value):
    """A TOML value as the template prints it (Go %q is JSON-compatible for these strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_q(v) for v in value) + "]"
    return json.dumps(value)


def _key(part):
    return part if part.replace("-", "").replace("_", "").isalnum() else json.dumps(part)


def _header(path):
    return "[" + ".".join(_key(p) for p in path) + "]"


def base_tables(profile, schema, params):
    """[(table path, [(key, value)])] and the top-level keys the base renders, in order."""
    era = era_of(profile, schema)
    detected = params["detected"]  # [{name, binary, runtime_type}]
    systemd = params["systemd_cgroup"]
    default_runtime = params.get("default_runtime")
    top = [("version", schema)]
    if era == "unified-imports":
        top.append(("imports", ["%s/%s/*.toml" % (params["containerd_dir"], "config-v3.toml.d" if schema == 3 else "config.toml.d")]))
    if era != "v2-legacy":
        top += [("root", params["root"]), ("state", params["state"])]
    tables = []
    if era != "v2-legacy":
        tables.append((("grpc",), [("address", params["address"])]))
    tables.append((("plugins", "io.containerd.internal.v1.opt"), [("path", params["opt"])]))
    nonroot = [("device_ownership_from_security_context", False)] if profile.get("nonroot_devices") else []
    unprivileged = [("enable_selinux", False), ("enable_unprivileged_ports", True), ("enable_unprivileged_icmp", True)]
    if schema == 2:
        cri = [("stream_server_address", "127.0.0.1"), ("stream_server_port", "10010")] + unprivileged + nonroot + [
            ("sandbox_image", params["pause_image"])]
        tables.append((("plugins", V2_CRI), cri))
        containerd = [("snapshotter", params["snapshotter"]), ("disable_snapshot_annotations", True)]
        if default_runtime:
            containerd.append(("default_runtime_name", default_runtime))
        tables.append((("plugins", V2_CRI, "containerd"), containerd))
        tables.append((("plugins", V2_CRI, "cni"), [("bin_dir", params["cni_bin_dir"]), ("conf_dir", params["cni_conf_dir"])]))
        runtimes = ("plugins", V2_CRI, "containerd", "runtimes")
        tables.append((runtimes + ("runc",), [("runtime_type", "io.containerd.runc.v2")]))
        tables.append((runtimes + ("runc", "options"), [("SystemdCgroup", systemd)]))
        if era != "v2-legacy":
            tables.append((runtimes + ("runhcs-wcow-process",), [("runtime_type", "io.containerd.runhcs.v1")]))
        tables.append((("plugins", V2_CRI, "registry"), [("config_path", params["registry_dir"])]))
        tables.extend(_extra_runtimes(runtimes, detected, systemd if profile["extra_runtime_systemd_cgroup"] else None))
        return top, tables
    tables.append((("plugins", "io.containerd.grpc.v1.cri"), [("stream_server_address", "127.0.0.1"), ("stream_server_port", "10010")]))
    tables.append((("plugins", V3_RUNTIME), unprivileged + nonroot))
    images = [("snapshotter", params["snapshotter"]), ("disable_snapshot_annotations", True)]
    if profile["containerd"] not in ("2.0",):
        images.append(("use_local_image_pull", True))
    tables.append((("plugins", V3_IMAGES), images))
    tables.append((("plugins", V3_IMAGES, "pinned_images"), [("sandbox", params["pause_image"])]))
    if profile["containerd"] == "2.0":
        cni = [("bin_dir", params["cni_bin_dir"]), ("conf_dir", params["cni_conf_dir"])]
    else:
        cni = [("bin_dirs", [params["cni_bin_dir"]]), ("conf_dir", params["cni_conf_dir"])]
    tables.append((("plugins", V3_RUNTIME, "cni"), cni))
    if default_runtime:
        tables.append((("plugins", V3_RUNTIME, "containerd"), [("default_runtime_name", default_runtime)]))
    runtimes = ("plugins", V3_RUNTIME, "containerd", "runtimes")
    tables.append((runtimes + ("runc",), [("runtime_type", "io.containerd.runc.v2")]))
    tables.append((runtimes + ("runc", "options"), [("SystemdCgroup", systemd)]))
    tables.append((runtimes + ("runhcs-wcow-process",), [("runtime_type", "io.containerd.runhcs.v1")]))
    tables.extend(_extra_runtimes(runtimes, detected, systemd))
    tables.append((("plugins", V3_IMAGES, "registry"), [("config_path", params["registry_dir"])]))
    return top, tables


def _extra_runtimes(runtimes_path, detected, systemd):
    out = []
    for runtime in sorted(detected, key=lambda r: r["name"]):  # Go templates range maps in key order
        out.append((runtimes_path + (runtime["name"],), [("runtime_type", runtime["runtime_type"])]))
        options = [("BinaryName", runtime["binary"])]
        if systemd is not None:
            options.append(("SystemdCgroup", systemd))
        out.append((runtimes_path + (runtime["name"], "options"), options))
    return out


class Rendering(object):
    """What the base emits for one node state (release profile, schema, parameters), worked out once and read three
    ways: `tables` (the release's own runtime tables), `text` (what the template model renders in place of the base
    line) and document() (the dict containerd reads from it: the first layer under a drop-in)."""

    def __init__(self, profile, schema, params):
        self.profile, self.schema, self.params = profile, schema, params
        self.top, self.tables = base_tables(profile, schema, params)
        self._text = None

    def fits(self, profile, schema, params):
        """Whether this is the rendering of that node state (a caller's rendering is reused only then)."""
        return schema == self.schema and params == self.params and (profile is self.profile or profile == self.profile)

    @property
    def text(self):
        if self._text is None:
            program = self.profile["distribution"]
            unified_v3 = self.schema == 3 and era_of(self.profile, self.schema) == "unified-imports"
            lines = ["# File generated by %s. DO NOT EDIT. Use %s instead." % (
                program, "config-v3.toml.tmpl" if unified_v3 else "config.toml.tmpl")]
            lines += ["%s = %s" % (key, _q(value)) for key, value in self.top]
            for path, keys in self.tables:
                lines += ["", _header(path)]
                lines += ["  %s = %s" % (key, _q(value)) for key, value in keys]
            self._text = "\n".join(lines) + "\n"
        return self._text

    def table(self, path):
        """{key: value} of the table at path (a tuple), or None where the base emits none."""
        for table_path, keys in self.tables:
            if table_path == path:
                return dict(keys)
        return None

    def document(self):
        """The text as a TOML parser reads it, built from the tables (a fresh dict: callers merge into it)."""
        document = dict((key, _copied(value)) for key, value in self.top)
        for path, keys in self.tables:
            table = document
            for part in path:
                table = table.setdefault(part, {})
            table.update((key, _copied(value)) for key, value in keys)
        return document


def _copied(value):
    return list(value) if isinstance(value, list) else value


def render_base(profile, schema, params):
    """The base template's output for these parameters, as TOML text."""
    return Rendering(profile, schema, params).text


def base_table_paths(profile, schema, params):
    return [path for path, _keys in base_tables(profile, schema, params)[1]]


# Parameters that change only the values the base renders, never which tables it emits.
_VALUE_ONLY_PARAMS = dict.fromkeys(("containerd_dir", "root", "state", "address", "opt", "pause_image", "snapshotter",
                                    "cni_bin_dir", "cni_conf_dir", "registry_dir"), "")


def emitted_table_paths(profile, schema, default_runtime_set):
    """The tables the base emits for this release and schema, the detected runtimes' own tables left out
    (a node's planner counts those apart: a template may render the base without ranging over them)."""
    params = dict(_VALUE_ONLY_PARAMS, detected=[], systemd_cgroup=False,
                  default_runtime="default" if default_runtime_set else None)
    return base_table_paths(profile, schema, params)


BASE_LINE = '{{ template "base" . }}'


def compose(template_text, base_text):
    """What k3s loads from a user template: base rendered in place of the base line."""
    if template_text is None:
        return base_text
    out = []
    for line in template_text.split("\n"):
        if line.strip() == BASE_LINE:
            out.append(base_text.rstrip("\n"))
        elif "{{" in line:
            raise ValueError("the conformance suite composes only templates whose sole action is the base line: %r" % line)
        else:
            out.append(line)
    return "\n".join(out)
