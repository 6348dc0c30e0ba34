# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""k3s/rke2's config.yaml read as YAML on the controller (issue 44): each legal form the node's line reader misread,
read right; the keys that decided how the node was read refused by name when the two readers disagree; a file that is
not valid YAML refused with its path and line."""

from __future__ import annotations

import os

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

RELEASES = {"k3s": "v1.33.10+k3s1", "rke2": "v1.34.6+rke2r1"}


def node(tmp_path, files, distribution="k3s", data_dir=None):
    """A sandbox node with these files under /etc/rancher/<distribution>/, read by the node side, then by the
    controller; (NodeFacts, the raw reading)."""
    for name, text in files.items():
        target = tmp_path / "etc" / "rancher" / distribution / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    (tmp_path / "var" / "lib" / "rancher" / distribution / "agent" / "etc" / "containerd").mkdir(parents=True)
    reading = detect.gather(str(tmp_path), distribution, RELEASES[distribution], data_dir=data_dir)
    return NodeFacts.from_reading(reading), reading


# (config.yaml and its drop-ins, default-runtime, disable) as k3s reads them; the forms the line reader misread
FORMS = [
    ("plain lines", {"config.yaml": "default-runtime: nvidia\ndisable: [traefik]\n"}, "nvidia", ["traefik"]),
    ("a quoted key", {"config.yaml": '"default-runtime": nvidia\n\'disable\': runtimes\n'}, "nvidia", ["runtimes"]),
    ("a flow mapping", {"config.yaml": "{default-runtime: nvidia, disable: [runtimes, traefik]}\n"}, "nvidia",
     ["runtimes", "traefik"]),
    ("an anchor and an alias", {"config.yaml": "disable: &off [runtimes]\ndefault-runtime: &r nvidia\n",
                                "config.yaml.d/50-more.yaml": "disable+: [traefik]\n"}, "nvidia", ["runtimes", "traefik"]),
    ("a block scalar", {"config.yaml": "default-runtime: >-\n  nvidia\n"}, "nvidia", []),
    ("a flow list over lines", {"config.yaml": "disable: [\n  runtimes,\n  traefik\n]\n"}, None, ["runtimes", "traefik"]),
    ("a block list and a comment", {"config.yaml": "disable:\n  - runtimes # the RuntimeClasses\n  - traefik\n"
                                                   "default-runtime: nvidia # the GPU one\n"}, "nvidia", ["runtimes", "traefik"]),
    ("a later file wins, + appends", {"config.yaml": "default-runtime: crun\ndisable: [servicelb]\n",
                                      "config.yaml.d/10-a.yaml": "default-runtime: nvidia\ndisable+: runtimes,traefik\n"},
     "nvidia", ["servicelb", "runtimes", "traefik"]),
    ("a document marker and an empty drop-in", {"config.yaml": "---\ndefault-runtime: 'nvidia'\n",
                                                "config.yaml.d/00-empty.yaml": ""}, "nvidia", []),
    ("a list replaced by a later file", {"config.yaml": "disable: [runtimes]\n", "config.yaml.d/20-b.yml": "disable: []\n"},
     None, []),
]


@pytest.mark.parametrize("form, files, runtime, disabled", FORMS, ids=[form[0] for form in FORMS])
def test_each_legal_form_is_read_as_yaml_reads_it(tmp_path, form, files, runtime, disabled):
    facts, reading = node(tmp_path, files)
    assert facts.reading["default_runtime"]["value"] == runtime, form
    assert reading["disabled_components"] == disabled, form
    assert reading["runtimeclasses_disabled"] is ("runtimes" in disabled)
    if runtime:
        assert reading["default_runtime"]["source"].startswith("/etc/rancher/k3s/config.yaml")


def test_rke2_reads_its_own_file_and_its_own_disable_item(tmp_path):
    _facts, reading = node(tmp_path, {"config.yaml": '{"disable": ["rke2-runtimeclasses"]}\n'}, "rke2")
    assert reading["disabled_components"] == ["rke2-runtimeclasses"] and reading["runtimeclasses_disabled"] is True


@pytest.mark.parametrize("files, words", [
    ({"config.yaml": '"docker": true\n'},
     "/etc/rancher/k3s/config.yaml: `docker` reads as 'true' by YAML's rules but as unset by the node's line reader"),
    ({"config.yaml": "{container-runtime-endpoint: /run/containerd/containerd.sock}\n"},
     "`container-runtime-endpoint` reads as '/run/containerd/containerd.sock' by YAML's rules but as unset"),
    ({"config.yaml": "data-dir: >-\n  /srv/k3s\n"},
     "`data-dir` reads as '/srv/k3s' by YAML's rules but as '>-' by the node's line reader"),
])
def test_a_key_that_decided_how_the_node_was_read_is_refused_when_the_readers_disagree(tmp_path, files, words):
    with pytest.raises(K3sGpuError) as caught:
        node(tmp_path, files)
    assert words in str(caught.value) and "nothing was changed" in str(caught.value), str(caught.value)


def test_a_given_data_dir_makes_config_yaml_s_irrelevant(tmp_path):
    facts, _reading = node(tmp_path, {"config.yaml": "data-dir: >-\n  /srv/k3s\n"}, data_dir="/var/lib/rancher/k3s")
    assert facts.paths["data_dir"] == "/var/lib/rancher/k3s"


@pytest.mark.parametrize("text, words", [
    ("default-runtime: [nvidia\n", "/etc/rancher/k3s/config.yaml, line 2 is not valid YAML"),
    ("default-runtime: nvidia\n  disable: x\n", "/etc/rancher/k3s/config.yaml, line 2 is not valid YAML"),
    ("- default-runtime: nvidia\n", "/etc/rancher/k3s/config.yaml holds a YAML list, not a mapping of settings"),
])
def test_a_file_that_is_not_a_yaml_mapping_is_refused_with_its_line(tmp_path, text, words):
    with pytest.raises(K3sGpuError) as caught:
        node(tmp_path, {"config.yaml": text})
    assert words in str(caught.value), str(caught.value)


def test_a_unit_flag_still_wins_over_the_files(tmp_path):
    unit = tmp_path / "etc" / "systemd" / "system" / "k3s.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/local/bin/k3s server --default-runtime=crun\n", encoding="utf-8")
    facts, _reading = node(tmp_path, {"config.yaml": '"default-runtime": nvidia\n'})
    assert facts.reading["default_runtime"]["value"] == "crun", facts.reading["default_runtime"]
    assert os.path.basename(facts.reading["default_runtime"]["source"]) == "k3s.service"


def test_on_the_host_containerd_config_yaml_decides_only_the_endpoint(tmp_path):
    """k3s pointed at the host's containerd: that containerd's config sets the default runtime, not k3s's
    default-runtime; a quoted key still counts for the endpoint check."""
    files = {"config.yaml": "container-runtime-endpoint: /run/containerd/containerd.sock\n\"default-runtime\": nvidia\n"}
    for name, text in files.items():
        target = tmp_path / "etc" / "rancher" / "k3s" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    (tmp_path / "etc" / "containerd").mkdir(parents=True)
    (tmp_path / "etc" / "containerd" / "config.toml").write_text("version = 2\n", encoding="utf-8")
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "containerd").write_text("", encoding="utf-8")
    (tmp_path / "var" / "lib" / "dpkg").mkdir(parents=True)
    (tmp_path / "var" / "lib" / "dpkg" / "status").write_text(
        "Package: containerd\nStatus: install ok installed\nVersion: 1.7.24~ds1-6+b4\n", encoding="utf-8")
    reading = detect.gather(str(tmp_path), "k3s", RELEASES["k3s"])
    assert reading["distribution"] == "containerd" and "k3s_config" in reading, reading.get("distribution")
    facts = NodeFacts.from_reading(reading)
    assert facts.reading["default_runtime"] == {"value": None, "source": None}
    assert facts.reading["disabled_components"] == []


# kubelet's root dir (a DRA driver registers below it): kubelet-arg as k3s hands it on, rootless k3s, the default
ROOT_DIRS = [
    ("no config", {}, "/var/lib/kubelet"),
    ("other kubelet args", {"config.yaml": "kubelet-arg: [max-pods=200]\n"}, "/var/lib/kubelet"),
    ("root-dir", {"config.yaml": "kubelet-arg:\n  - root-dir=/data/kubelet\n  - max-pods=200\n"}, "/data/kubelet"),
    ("dashes and a drop-in that appends, the last wins", {
        "config.yaml": "kubelet-arg: ['--root-dir=/a']\n", "config.yaml.d/50-b.yaml": "kubelet-arg+: [root-dir=/b]\n"},
     "/b"),
    ("a drop-in that replaces the list", {"config.yaml": "kubelet-arg: [root-dir=/a]\n",
                                          "config.yaml.d/50-b.yaml": "kubelet-arg: [max-pods=10]\n"}, "/var/lib/kubelet"),
    ("rootless", {"config.yaml": "rootless: true\n"}, "/var/lib/rancher/k3s/agent/kubelet"),
]


@pytest.mark.parametrize("form, files, root", ROOT_DIRS, ids=[form[0] for form in ROOT_DIRS])
def test_kubelet_root_dir_as_kubelet_gets_it(tmp_path, form, files, root):
    facts, _reading = node(tmp_path, files)
    assert facts.reading["kubelet_root_dir"] == root, form
