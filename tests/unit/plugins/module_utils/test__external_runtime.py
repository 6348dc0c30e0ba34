# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""k3s/rke2 nodes whose pods do not run on the embedded containerd: `container-runtime-endpoint` or k3s's
`docker`, in config.yaml, config.yaml.d or the unit's ExecStart (with the unit's variables). The host's
containerd is configured as plain containerd; Docker, CRI-O and endpoints nobody can identify are refused
by name, every file as it was."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts

K3S_CONFIG = "/etc/rancher/k3s/config.yaml"
UNIT = "/etc/systemd/system/k3s.service"
HOST_CONFIG = "/etc/containerd/config.toml"
DPKG = """Package: containerd
Status: install ok installed
Version: 1.7.24~ds1-1+b3

Package: nvidia-container-toolkit
Status: install ok installed
Version: 1.20.0-1
"""
DEFAULT_17 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def k3s_node(sandbox, distribution="k3s", dpkg=DPKG):
    sandbox.k3s(distribution, "package")
    sandbox.write(HOST_CONFIG, DEFAULT_17)
    if dpkg:
        sandbox.write("/var/lib/dpkg/status", dpkg)
    return sandbox


def gather(sandbox, distribution="k3s", release="v1.33.10+k3s1"):
    return detect.gather(sandbox.root, distribution, release)


@pytest.mark.parametrize("files", [
    {K3S_CONFIG: "container-runtime-endpoint: unix:///run/containerd/containerd.sock\n"},
    {K3S_CONFIG: "container-runtime-endpoint: '/var/run/containerd/containerd.sock'\n"},
    # config.yaml.d comes after config.yaml: its value wins
    {K3S_CONFIG: "container-runtime-endpoint: /run/crio/crio.sock\n",
     "/etc/rancher/k3s/config.yaml.d/10-runtime.yaml": "container-runtime-endpoint: /run/containerd/containerd.sock\n"},
    {UNIT: "[Service]\nExecStart=/usr/local/bin/k3s agent --container-runtime-endpoint=unix:///run/containerd/containerd.sock\n"},
    # the unit's own variables, as systemd substitutes them in ExecStart
    {UNIT: "[Service]\nEnvironmentFile=-/etc/default/k3s\nExecStart=/usr/local/bin/k3s agent $K3S_ARGS\n",
     "/etc/default/k3s": 'K3S_ARGS="--container-runtime-endpoint /run/containerd/containerd.sock"\nK3S_TOKEN=secret\n'},
    # a host containerd on its own [grpc] address
    {K3S_CONFIG: "container-runtime-endpoint: unix:///run/site/containerd.sock\n",
     HOST_CONFIG: DEFAULT_17 + '[grpc]\n  address = "/run/site/containerd.sock"\n'},
    # version 4 (containerd 2.3) moved the socket's table into plugins
    {K3S_CONFIG: "container-runtime-endpoint: unix:///run/site/containerd.sock\n",
     HOST_CONFIG: DEFAULT_17 + "[plugins.'io.containerd.server.v1.grpc']\n  address = '/run/site/containerd.sock'\n"},
], ids=["config-yaml", "var-run", "config-yaml-d-wins", "unit-flag", "unit-variable", "grpc-address", "grpc-address-v4"])
def test_host_containerd_endpoint_is_configured_as_plain_containerd(sandbox, files):
    k3s_node(sandbox)
    for path, text in files.items():
        sandbox.write(path, text)
    facts = gather(sandbox)
    assert facts["distribution"] == "containerd" and facts["release"] == "1.7.24"
    assert facts["release_source"] == "dpkg:containerd"
    in_use = facts["runtime_in_use"]
    assert in_use["runtime"] == "containerd" and in_use["distribution"] == "k3s" and in_use["release"] == "v1.33.10+k3s1"
    assert in_use["source"] in files
    assert "secret" not in repr(facts)  # the env file's token never reaches the facts
    plan, file_changes = changes.compute(NodeFacts.from_reading(facts), {})
    assert [c.node_path for c in file_changes] == [HOST_CONFIG]
    assert plan["target"]["mode"] == "config"
    assert sorted(r["name"] for r in plan["write"]) == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert any("runs its pods on the host's containerd" in note and in_use["source"] in note for note in plan["notes"])
    assert not sandbox.exists("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d")


@pytest.mark.parametrize("distribution,files,runtime,named", [
    ("k3s", {K3S_CONFIG: "docker: true\n"}, "docker", "`docker: true` (%s)" % K3S_CONFIG),
    ("k3s", {UNIT: "[Service]\nExecStart=/usr/local/bin/k3s server --docker\n"}, "docker", UNIT),
    ("k3s", {K3S_CONFIG: "docker: true\ncontainer-runtime-endpoint: /run/cri-dockerd.sock\n"}, "docker", K3S_CONFIG),
    ("k3s", {K3S_CONFIG: "container-runtime-endpoint: unix:///var/run/cri-dockerd.sock\n"}, "docker",
     "unix:///var/run/cri-dockerd.sock"),
    ("k3s", {K3S_CONFIG: "container-runtime-endpoint: unix:///run/crio/crio.sock\n"}, "cri-o", "CRI-O"),
    ("rke2", {"/etc/rancher/rke2/config.yaml": "container-runtime-endpoint: /var/run/crio/crio.sock\n"}, "cri-o",
     "/etc/rancher/rke2/config.yaml"),
    ("k3s", {K3S_CONFIG: "container-runtime-endpoint: tcp://10.0.0.5:9000\n"}, "unknown", "tcp://10.0.0.5:9000"),
    # the embedded containerd's own socket: k3s starts no containerd once an endpoint is set
    ("k3s", {K3S_CONFIG: "container-runtime-endpoint: /run/k3s/containerd/containerd.sock\n"}, "unknown",
     "/run/k3s/containerd/containerd.sock"),
])
def test_other_runtimes_are_refused_by_name_and_nothing_changes(sandbox, distribution, files, runtime, named):
    k3s_node(sandbox, distribution)
    for path, text in files.items():
        sandbox.write(path, text)
    release = "v1.33.10+%s1" % ("k3s" if distribution == "k3s" else "rke2r")
    facts = gather(sandbox, distribution, release)
    assert facts["distribution"] == distribution and facts["runtime_in_use"]["runtime"] == runtime
    before = sandbox.snapshot()
    with pytest.raises(K3sGpuError) as raised:
        changes.compute(NodeFacts.from_reading(facts), {})
    message = str(raised.value)
    assert message.startswith("[external_runtime] %s %s on this node runs its pods on " % (distribution, release))
    assert named in message and message.endswith("; nothing was changed") and "\n" not in message
    assert sandbox.snapshot() == before
    # taking back what the collection wrote into the embedded containerd's directory stays possible
    changes.compute(NodeFacts.from_reading(facts), {"state": "absent"})


def test_embedded_containerd_by_default_and_docker_false(sandbox):
    k3s_node(sandbox)
    sandbox.write(K3S_CONFIG, "docker: false\n")
    facts = gather(sandbox)
    assert facts["distribution"] == "k3s"
    assert facts["runtime_in_use"] == {"runtime": "embedded-containerd", "distribution": "k3s", "release": "v1.33.10+k3s1",
                                       "endpoint": None, "source": None, "docker": False, "docker_source": None}


def test_rke2_has_no_docker_option(sandbox):
    k3s_node(sandbox, "rke2")
    sandbox.write("/etc/rancher/rke2/config.yaml", "docker: true\n")
    assert gather(sandbox, "rke2", "v1.33.10+rke2r1")["runtime_in_use"]["runtime"] == "embedded-containerd"


def test_host_containerd_version_unknown_is_an_error_that_says_what_to_set(sandbox):
    k3s_node(sandbox, dpkg=None)
    sandbox.write(K3S_CONFIG, "container-runtime-endpoint: /run/containerd/containerd.sock\n")
    with pytest.raises(K3sGpuError) as raised:
        gather(sandbox)
    assert "host's containerd" in str(raised.value) and "release: <its version" in str(raised.value)
    assert K3S_CONFIG in str(raised.value)


def test_plain_containerd_reports_itself(sandbox):
    sandbox.binary("/usr/bin/containerd")
    facts = detect.gather(sandbox.root, "containerd", "2.1.4")
    assert facts["runtime_in_use"]["runtime"] == "containerd" and facts["runtime_in_use"]["distribution"] is None
