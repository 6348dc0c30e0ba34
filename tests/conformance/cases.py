# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Engine cases for the conformance suite: for each k3s/rke2 release line and node layout, run
the engine on a sandbox node, apply what it writes, and compose the config k3s would load.

FAKED, because it cannot run here: k3s itself (compose() does its template step) and the NVIDIA
runtimes (wrappers that log their arguments and exec runc). Everything else is real.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

from . import base_fixtures

# One release per line (the newest known), plus the releases where the engine's output changes.
RELEASES = {
    "k3s": ["v1.28.14+k3s1", "v1.28.15+k3s1", "v1.29.15+k3s1", "v1.30.14+k3s1", "v1.31.5+k3s1", "v1.31.6+k3s1",
            "v1.32.13+k3s1", "v1.33.9+k3s1", "v1.33.10+k3s1", "v1.34.6+k3s1", "v1.35.3+k3s1", "v1.36.2+k3s1"],
    "rke2": ["v1.28.15+rke2r1", "v1.29.15+rke2r1", "v1.30.14+rke2r1", "v1.31.5+rke2r1", "v1.31.6+rke2r1",
             "v1.32.13+rke2r1", "v1.33.10+rke2r1", "v1.34.6+rke2r1", "v1.35.3+rke2r1", "v1.36.2+rke2r1"],
}

TOOLKIT_DIR = "/opt/nvidia/toolkit"
# layout -> (binaries on the node, containerd_runtimes options)
LAYOUTS = {
    "nothing": ([], {}),
    "package": (["/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
                 "/usr/bin/nvidia-container-runtime.legacy"], {}),
    "operator": (["/usr/local/nvidia/toolkit/nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi",
                  "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy"], {}),
    "default-runtime": (["/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
                         "/usr/bin/nvidia-container-runtime.legacy"], {"default_runtime": "nvidia"}),
    "custom-dir": ([TOOLKIT_DIR + "/nvidia-container-runtime", TOOLKIT_DIR + "/nvidia-container-runtime.cdi",
                    TOOLKIT_DIR + "/nvidia-container-runtime.legacy"], {"toolkit_dirs": [TOOLKIT_DIR]}),
}

WRAPPER = """#!/bin/sh
echo "$0 $*" >> {log}
exec runc "$@"
"""


PAUSE_IMAGE = "localhost/lab/pause:1"  # what the lab imports (tests/conformance/lab.py)


def template_params(root, distribution=distro.K3S):
    """The k3s/rke2 template parameters for a node whose / is root (containerd's root under the distribution's data
    dir; rke2 shares k3s's state dir and socket). A lab daemon runs on its own root/state/socket (command-line flags,
    as k3s passes them for v2 configs) whatever these say."""
    data_dir = distro.distribution_paths(distribution)["data_dir"]
    return {"root": root + data_dir + "/agent/containerd", "state": root + "/run/k3s/containerd",
            "address": root + "/run/k3s/containerd/containerd.sock", "opt": root + "/opt",
            "pause_image": PAUSE_IMAGE, "snapshotter": "overlayfs", "cni_bin_dir": root + "/cni/bin",
            "cni_conf_dir": root + "/cni/net.d", "registry_dir": root + "/certs.d"}


def relocate(text, root, binaries):
    """Node paths of the runtime binaries -> their place under root (where the wrappers are)."""
    for binary in binaries:
        text = text.replace('"%s"' % binary, '"%s"' % (root + binary))
    return text


class Loaded:
    """What containerd loads on a k3s/rke2 node after the next start: the composed config.toml and
    the drop-ins it imports (host path, text), with the runtime binaries relocated under root."""

    def __init__(self, facts, schema, base_text, config_text, dropin):
        self.facts, self.profile, self.schema = facts, facts["profile"], schema
        self.base_text, self.config_text, self.dropin = base_text, config_text, dropin


def compose_node(root, distribution, release, binaries, toolkit_dirs=()):
    """k3s's start-up step for containerd, on a node tree: detection, template choice, base, compose."""
    facts = detect.gather(root, distribution, release, toolkit_dirs=toolkit_dirs)
    profile, paths = facts["profile"], facts["paths"]
    template_key = next((("template_v3" if name == distro.TEMPLATE_V3 else "template_v2") for name in profile["templates"]
                         if facts["files"]["template_v3" if name == distro.TEMPLATE_V3 else "template_v2"]["state"] == "file"), None)
    schema = distro.schema_of_template(os.path.basename(paths[template_key])) if template_key else profile["schema"]
    detected = [dict(r, binary=root + r["binary"]) for r in facts["release_runtimes"]]
    params = dict(template_params(root, distribution), detected=detected, systemd_cgroup=True,
                  default_runtime=facts["default_runtime"]["value"], containerd_dir=root + paths["containerd_dir"])
    base_text = base_fixtures.render_base(profile, schema, params)
    template_text = facts["files"][template_key]["content"] if template_key else None
    config_text = relocate(base_fixtures.compose(template_text, base_text), root, binaries)
    dropin = None
    dropin_key = "dropin_v3" if schema == 3 else "dropin_v2"
    if profile["dropin_imports"] and facts["files"][dropin_key]["state"] == "file":
        host = root + paths[dropin_key]
        with open(host) as handle:
            dropin = (host, relocate(handle.read(), root, binaries))
    return Loaded(facts, schema, base_text, config_text, dropin)


def start_node(root, distribution, release, binaries, toolkit_dirs=()):
    """k3s/rke2's start on a node tree, as far as containerd's config goes: compose config.toml and write it into the
    node's containerd dir with the node's own paths (k3s rewrites it at every start). Returns the Loaded."""
    loaded = compose_node(root, distribution, release, binaries, toolkit_dirs)
    target = root + loaded.facts["paths"]["config"]
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(loaded.config_text.replace('"%s/' % root, '"/'))
    return loaded


class Case:
    """One engine case, built in its own short sandbox dir under /tmp."""

    def __init__(self, distribution, release, layout, options=None):
        self.distribution, self.release, self.layout = distribution, release, layout
        self.extra_options = options or {}
        self.id = "%s-%s-%s" % (distribution, release.split("+")[0], layout)
        self.root = None
        self.dropin = None  # (host path, relocated text) of a drop-in containerd imports

    def build(self):
        """Run the engine on the sandbox node, apply what it writes, compose what containerd loads."""
        self.root = tempfile.mkdtemp(prefix="kg-", dir="/tmp")
        if self.distribution == distro.CONTAINERD:
            return self._build_containerd()
        binaries, options = LAYOUTS[self.layout]
        paths = distro.distribution_paths(self.distribution)
        os.makedirs(self.root + paths["containerd_dir"])
        self._write_binaries(binaries)
        facts = detect.gather(self.root, self.distribution, self.release, toolkit_dirs=options.get("toolkit_dirs", ()))
        self.plan, file_changes = changes.compute(NodeFacts.from_reading(facts), dict(options))
        self._apply(file_changes)
        loaded = compose_node(self.root, self.distribution, self.release, binaries, options.get("toolkit_dirs", ()))
        self.profile, self.schema, self.base_text = loaded.profile, loaded.schema, loaded.base_text
        self.config_text, self.dropin = loaded.config_text, loaded.dropin
        self.write_dropin(run_pods=False)
        self.expected = self._expected_runtimes(loaded.facts)
        return self

    def _build_containerd(self):
        """Plain containerd: the engine edits /etc/containerd/config.toml (or a conf.d drop-in) itself."""
        binaries, options = LAYOUTS["package"]
        self._write_binaries(binaries)
        existing = self.extra_options.get("existing_config")
        if existing is not None:
            os.makedirs(self.root + "/etc/containerd")
            with open(self.root + "/etc/containerd/config.toml", "w") as handle:
                handle.write(existing)
        facts = detect.gather(self.root, distro.CONTAINERD, self.release)
        params = dict((k, v) for k, v in self.extra_options.items() if k != "existing_config")
        self.plan, file_changes = changes.compute(NodeFacts.from_reading(facts), params)
        self._apply(file_changes)
        self.profile = facts["profile"]
        self.schema = self.plan["target"]["schema"]
        with open(self.root + "/etc/containerd/config.toml") as handle:
            self.config_text = self.relocate(handle.read()).replace(
                '"/etc/containerd/conf.d/', '"%s/etc/containerd/conf.d/' % self.root)
        if self.plan["target"]["mode"] == "dropin":
            host = self.root + self.plan["target"]["path"]
            with open(host) as handle:
                self.dropin = (host, self.relocate(handle.read()))
            self.write_dropin(run_pods=False)
        self.expected = self._expected_runtimes(facts)
        return self

    def _write_binaries(self, binaries):
        self.wrapper_log = self.root + "/runtime-calls.log"
        for binary in binaries:
            os.makedirs(os.path.dirname(self.root + binary), exist_ok=True)
            with open(self.root + binary, "w") as handle:
                handle.write(WRAPPER.format(log=self.wrapper_log))
            os.chmod(self.root + binary, 0o755)

    def _apply(self, file_changes):
        for change in file_changes:
            host = change.path
            if change.after is None:
                os.unlink(host)
                continue
            os.makedirs(os.path.dirname(host), exist_ok=True)
            with open(host, "w") as handle:
                handle.write(change.after)
        self.written = {c.node_path: c.after for c in file_changes}

    def write_dropin(self, run_pods):
        """The drop-in as containerd imports it; for pods only SystemdCgroup differs (no systemd here)."""
        if self.dropin:
            host, text = self.dropin
            if run_pods:
                text = text.replace("SystemdCgroup = true", "SystemdCgroup = false")
            with open(host, "w") as handle:
                handle.write(text)

    def calls(self):
        try:
            with open(self.wrapper_log) as handle:
                return handle.read().splitlines()
        except FileNotFoundError:
            return []

    def relocate(self, text):
        layout = "package" if self.distribution == distro.CONTAINERD else self.layout
        return relocate(text, self.root, LAYOUTS[layout][0])

    def _expected_runtimes(self, facts):
        """handler -> (runtime_type, BinaryName, origin) that containerd must end up with."""
        expected = {}
        for runtime in facts["release_runtimes"]:
            expected[runtime["name"]] = (runtime["runtime_type"], self.root + runtime["binary"], "base")
        origin = self.plan["target"]["mode"]
        for runtime in self.plan["write"]:
            expected[runtime["name"]] = (runtime["runtime_type"], self.root + runtime["binary"], origin)
        return expected

    @property
    def containerd_lines(self):
        """Which real containerd majors load this config: the release's own (1.6 too for a k3s schema-2 release)."""
        if self.distribution == distro.CONTAINERD:
            return ["2.x" if self.profile["containerd"].startswith("2.") else self.profile["containerd"]]
        if self.profile["containerd"] == "1.7":
            return ["1.6", "1.7"]
        return ["2.x"]

    def cleanup(self):
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)


MINIMAL_V2 = "version = 2\n\n# site settings, kept\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"%s\"\n" % PAUSE_IMAGE
CONTAINERD_CASES = [
    ("1.6.20", "new-config", {}),
    ("1.6.20", "minimal-v2", {"existing_config": MINIMAL_V2}),
    ("1.7.24", "minimal-v2-cdi-default", {"existing_config": MINIMAL_V2, "enable_cdi": True, "default_runtime": "nvidia"}),
    ("2.1.9", "new-config-cdi-default", {"enable_cdi": True, "default_runtime": "nvidia-legacy"}),
    ("2.1.9", "conf-d-dropin", {"existing_config": 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
                                "[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"%s\"\n" % PAUSE_IMAGE}),
]


def all_cases():
    k3s_like = [Case(d, r, layout) for d, releases in RELEASES.items() for r in releases for layout in LAYOUTS]
    return k3s_like + [Case(distro.CONTAINERD, r, name, options) for r, name, options in CONTAINERD_CASES]
