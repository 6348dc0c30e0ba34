# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The corpus (tests/corpus) against real containerd.

- Every case the engine edits or only warns about: the engine runs on a node tree with that template,
  its files are applied, the template is rendered as k3s will render it (the model, whose verdicts
  and output tests/conformance/test_template_model.py holds against Go) and the config containerd
  loads - with our drop-in where we wrote one - goes through `containerd config dump` of the
  release's containerd line: exit 0, the NVIDIA handlers the node has with their BinaryName, and a
  `wrong_schema_path` warning exactly where containerd 2.x logs `Ignoring unknown key`.
- A sample runs the daemon: the CRI plugin comes up `ok` and lists the handlers.
- Registry mirrors beside base's config_path (refused by the engine): the daemon's CRI plugin really
  refuses to start with it, and starts without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as check
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.corpus import corpus

from . import lab
from . import test_containerd_v4 as upstream

BINARIES = dict(distro.NVIDIA_RUNTIMES)
STUB = "#!/bin/sh\nexec runc \"$@\"\n"
ALL = corpus.load_cases()
LOADABLE = [c for c in ALL if c["expect"]["outcome"] in ("edit", "warn") and not c["target_release"]
            and "encoding_crlf" not in c["expect"]["codes"]]
DAEMON_SAMPLE = ("edit-v3-kata-custom", "edit-v2-17-runsc", "edit-v3-guarded-nvidia-fallback", "nobase-nvidia-ctk-dropin-v3")


def line_of(profile):
    return "1.7" if profile["containerd"] == "1.7" else "2.x"


# releases that embed containerd 2.2 or 2.3 are also loaded by that line's upstream build
UPSTREAM_OF = {"2.2": "2.2.7", "2.3": "2.3.4"}


class Node:
    """A node tree with the case's template, the engine's files applied, and what containerd loads."""

    def __init__(self, case):
        self.case = case
        self.root = tempfile.mkdtemp(prefix="k3sgpu-corpus-")
        release = case["release"]
        self.distribution = distro.RKE2 if "+rke2" in release else distro.K3S
        paths = distro.distribution_paths(self.distribution)
        self.paths = paths
        for name in case["detected"]:
            self._write("/usr/bin/" + BINARIES[name], STUB, 0o755)
        # the legacy wrapper k3s never detects: the engine writes its block itself
        self._write("/usr/bin/nvidia-container-runtime.legacy", STUB, 0o755)
        if case["default_runtime"]:
            self._write("/etc/rancher/%s/config.yaml" % self.distribution, "default-runtime: %s\n" % case["default_runtime"])
        self.template_path = paths["containerd_dir"] + "/" + case["template_name"]
        self._write(self.template_path, case["data"])
        facts = detect.gather(self.root, self.distribution, release)
        self.plan, file_changes = changes.compute(NodeFacts.from_reading(facts), {})
        for change in file_changes:
            if change.after is None:
                os.unlink(self.root + change.node_path)
            else:
                self._write(change.node_path, change.after)
        self.facts = detect.gather(self.root, self.distribution, release)
        self.profile = self.facts["profile"]
        text = self.facts["files"]["template_v3" if case["schema"] == 3 else "template_v2"]["content"]
        composed = check.render(text, NodeFacts.from_reading(self.facts), case["schema"], default_runtime=self.facts["default_runtime"]["value"])
        # the drop-in directories k3s's base imports: here under the node tree
        self.config = composed.replace('"%s/' % paths["containerd_dir"], '"%s%s/' % (self.root, paths["containerd_dir"]))
        self.expected = {r["name"]: r["binary"] for r in self.plan["write"]}
        self.expected.update((r["name"], r["binary"]) for r in self.facts["release_runtimes"])

    def _write(self, node_path, data, mode=0o600):
        host = self.root + node_path
        os.makedirs(os.path.dirname(host), exist_ok=True)
        with open(host, "wb") as handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        os.chmod(host, mode)

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def corpus_node():
    nodes = []

    def make(case):
        node = Node(case)
        nodes.append(node)
        return node
    yield make
    for node in nodes:
        node.close()


def runtimes_of(data):
    plugin = "io.containerd.cri.v1.runtime" if int(data.get("version", 1)) >= 3 else "io.containerd.grpc.v1.cri"
    return ((data.get("plugins") or {}).get(plugin) or {}).get("containerd", {}).get("runtimes", {})


@pytest.mark.parametrize("case", LOADABLE, ids=[c["id"] for c in LOADABLE])
def test_what_the_engine_leaves_loads_in_real_containerd(lab_versions, corpus_node, case):
    node = corpus_node(case)
    line = line_of(node.profile)
    result = lab.config_dump(line, node.config)
    assert result.rc == 0, "%s on containerd %s: %s\n%s" % (case["id"], line, result.stderr[-1500:], node.config)
    runtimes = runtimes_of(result.data)
    for name, binary in node.expected.items():
        assert runtimes[name]["options"]["BinaryName"] == binary, (name, runtimes.get(name))
    if line == "2.x" and node.profile["schema"] == 3 and case["schema"] == 3:
        ignored = "Ignoring unknown key" in result.stderr
        assert ignored == ("wrong_schema_path" in case["expect"]["codes"]), result.stderr[-1500:]
    version = UPSTREAM_OF.get(node.profile["containerd"])
    if version:
        path = os.path.join(node.root, "config.toml")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(node.config)
        rc, data, stderr = upstream.config_dump(version, path)
        assert rc == 0, "%s on containerd %s: %s" % (case["id"], version, stderr[-1500:])
        for name, binary in node.expected.items():
            assert runtimes_of(data)[name]["options"]["BinaryName"] == binary, (version, name)


def test_the_loadable_cases_cover_both_outcomes_and_every_line():
    outcomes = set(c["expect"]["outcome"] for c in LOADABLE)
    profiles = [distro.profile(distro.RKE2 if "+rke2" in c["release"] else distro.K3S, c["release"]) for c in LOADABLE]
    assert outcomes == {"edit", "warn"} and set(line_of(p) for p in profiles) == {"1.7", "2.x"} and len(LOADABLE) >= 20
    assert set(p["containerd"] for p in profiles) >= {"1.7", "2.0", "2.2", "2.3"}


@pytest.mark.parametrize("case_id", DAEMON_SAMPLE)
def test_a_sample_runs_the_cri_plugin_with_every_handler(lab_versions, corpus_node, lab_daemon, case_id):
    case = next(c for c in ALL if c["id"] == case_id)
    node = corpus_node(case)
    line = line_of(node.profile)
    config, _applied = lab.apply_lab_overrides(node.config, line, run_pods=False)
    daemon = lab_daemon(line, config)
    status = daemon.plugin_status("cri")
    assert status.status == "ok", status
    runtimes = daemon.cri_status()["containerd"]["runtimes"]
    for name, binary in node.expected.items():
        assert runtimes[name]["options"]["BinaryName"] == binary, (name, runtimes.get(name))


MIRRORS = "\n[plugins.'io.containerd.cri.v1.images'.registry.mirrors.'docker.io']\n  endpoint = ['https://mirror.example']\n"


def test_mirrors_beside_config_path_stop_the_cri_plugin(lab_versions, lab_daemon, lab_base_params):
    profile = distro.profile("k3s", "v1.33.10+k3s1")
    from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
    params = dict(lab_base_params, detected=[], default_runtime=None, containerd_dir=lab_base_params["root"])
    base = k3s_base.render_base(profile, 3, params)
    for text, want in ((base, "ok"), (base + MIRRORS, "error")):
        config, _applied = lab.apply_lab_overrides(text, "2.x", run_pods=False)
        daemon = lab_daemon("2.x", config)
        try:
            status = daemon.plugin_status("cri")
            assert (status.status == "ok") == (want == "ok"), (want, status)
            if want == "error":
                assert "mirrors" in (status.error or "") + daemon.log(), status
        finally:
            daemon.close()
