# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_node_allocation on the host step (issue 45): a DRA node is labelled for NVIDIA's DRA driver (its kubelet
plugin selects the label, the device plugin keeps off it), tells the cluster step its kubelet root dir and who owns
its driver, and gets CDI turned on where its containerd needs it; dra is refused by name, with nothing changed, before
v1.34.2, on Docker, in operator mode, and on a containerd without CDI or with CDI turned off by the user."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import host_step

RELEASE = "v1.36.3+k3s1"
DROPIN = "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"


def refused(result, *parts):
    assert result.get("failed"), result
    for part in parts:
        assert part in result["msg"], (part, result["msg"])
    return result["msg"]


def test_a_dra_node_is_labelled_for_the_dra_driver_and_tells_the_cluster_step_what_it_needs(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write("/etc/rancher/k3s/config.yaml", "kubelet-arg:\n  - root-dir=/data/kubelet\n")
    result = host_step(sandbox, gpu_node_release=RELEASE, gpu_node_allocation="dra")
    assert not result.get("failed"), result.get("msg")
    labels = sandbox.read(DROPIN).decode()
    assert '"k3s-gpu.nvidia/gpu-allocation=dra"' in labels and '"nvidia.com/gpu.present=true"' in labels
    assert result["dra"] == {"kubelet_root_dir": "/data/kubelet", "operator_driver": False}
    assert result["settings"]["allocation"] == "dra"
    again = host_step(sandbox, gpu_node_release=RELEASE, gpu_node_allocation="dra")
    assert again["changed"] is False and not again.get("failed")


def test_a_device_plugin_node_gets_no_allocation_label(sandbox):
    sandbox.k3s("k3s", "package")
    result = host_step(sandbox, gpu_node_release=RELEASE)
    assert not result.get("failed"), result.get("msg")
    assert "gpu-allocation" not in sandbox.read(DROPIN).decode() and result["dra"] is None


@pytest.mark.parametrize("variables, parts", [
    ({"gpu_node_release": "v1.34.1+k3s1"}, ["gpu1: this node runs k3s v1.34.1+k3s1, which NVIDIA's DRA driver does not "
                                            "support: it needs Kubernetes 1.34.2 or newer", "upgrade the cluster to v1.34.2"]),
    ({"gpu_node_release": "v1.33.10+k3s1"}, ["runs k3s v1.33.10+k3s1"]),
    # on k3s too, not only on plain containerd: with CDI off containerd drops a claim's devices
    ({"gpu_node_enable_cdi": False}, ["gpu_node_allocation=dra with gpu_node_enable_cdi=false"]),
    ({"gpu_node_mode": "operator", "gpu_node_toolkit_install": False},
     ["gpu_node_allocation=dra with gpu_node_mode=operator", "NVIDIA/aicr #332", "keep gpu_node_allocation=device_plugin"]),
])
def test_dra_is_refused_where_nvidias_driver_cannot_serve_the_node(sandbox, variables, parts):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    result = host_step(sandbox, **dict({"gpu_node_release": RELEASE, "gpu_node_allocation": "dra"}, **variables))
    refused(result, *parts)
    assert sandbox.snapshot() == before


def test_dra_on_a_docker_node_names_cri_dockerd(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write("/etc/rancher/k3s/config.yaml", "docker: true\n")
    before = sandbox.snapshot()
    result = host_step(sandbox, gpu_node_release=RELEASE, gpu_node_allocation="dra")
    refused(result, "pods run on Docker", "Mirantis/cri-dockerd #558")
    assert sandbox.snapshot() == before


def test_plain_containerd_gets_cdi_where_its_line_needs_it_and_is_refused_without_cdi(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    plain = {"gpu_node_distribution": "containerd", "gpu_node_allocation": "dra"}
    old = host_step(sandbox, check_mode=True, gpu_node_release="1.6.20", **plain)
    refused(old, "containerd 1.6.20, which has no CDI", "upgrade containerd to 1.7.2 or newer")
    off = host_step(sandbox, check_mode=True, gpu_node_release="1.7.24", gpu_node_enable_cdi=False, **plain)
    refused(off, "gpu_node_allocation=dra with gpu_node_enable_cdi=false")
    on = host_step(sandbox, gpu_node_release="1.7.24", **plain)
    assert not on.get("failed"), on.get("msg")
    assert "enable_cdi = true" in sandbox.read("/etc/containerd/config.toml").decode()


AGENT = "/var/lib/rancher/k3s/agent/etc/containerd"
CRI_V3 = '[plugins."io.containerd.cri.v1.runtime"]\n'


@pytest.mark.parametrize("path, text, parts", [
    # a drop-in of the user's, imported after ours would be: containerd loads CDI off
    (AGENT + "/config-v3.toml.d/40-site.toml", "# site\n" + CRI_V3 + "  enable_cdi = false\n",
     [AGENT + "/config-v3.toml.d/40-site.toml: line 3: enable_cdi is false in what containerd loads on this DRA node",
      "[cdi_off_for_claims]", "take enable_cdi = false out of that file, or set it to true"]),
    (AGENT + "/config-v3.toml.d/90-late.toml", CRI_V3 + '  cdi_spec_dirs = ["/etc/cdi"]\n',
     ["90-late.toml: line 2: cdi_spec_dirs is ['/etc/cdi'], without /var/run/cdi", "[cdi_dir_for_claims]",
      "add /var/run/cdi to cdi_spec_dirs"]),
    # a template without the base renders the CRI table itself
    (AGENT + "/config-v3.toml.tmpl", 'version = 3\n' + CRI_V3 + '  cdi_spec_dirs = ["/etc/cdi"]\n',
     ["config-v3.toml.tmpl: line 3: cdi_spec_dirs is ['/etc/cdi']", "[cdi_dir_for_claims]"]),
])
def test_a_file_that_keeps_cdi_from_claims_is_refused_on_a_dra_node_only(sandbox, path, text, parts):
    sandbox.k3s("k3s", "package")
    sandbox.write(path, text)
    before = sandbox.snapshot()
    result = host_step(sandbox, gpu_node_release=RELEASE, gpu_node_allocation="dra")
    message = refused(result, *parts)
    assert "nothing was written" in message, message
    assert sandbox.snapshot() == before
    # the same file on a device-plugin node: claims are not its business
    assert not host_step(sandbox, gpu_node_release=RELEASE).get("failed")


def test_a_dra_node_whose_files_leave_cdi_on_is_written_and_names_no_finding(sandbox):
    sandbox.k3s("k3s", "package")
    sandbox.write(AGENT + "/config-v3.toml.d/40-site.toml", CRI_V3 + '  cdi_spec_dirs = ["/etc/cdi", "/run/cdi/"]\n')
    result = host_step(sandbox, gpu_node_release=RELEASE, gpu_node_allocation="dra")
    assert not result.get("failed"), result.get("msg")
    assert '"k3s-gpu.nvidia/gpu-allocation=dra"' in sandbox.read(DROPIN).decode()  # written, not only not refused


def test_plain_containerd_2_with_cdi_turned_off_is_refused_for_dra(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.binary("/usr/bin/nvidia-container-runtime")
    sandbox.write("/etc/containerd/config.toml", 'version = 3\n\n' + CRI_V3 + '  enable_cdi = false\n')
    before = sandbox.snapshot()
    plain = {"gpu_node_distribution": "containerd", "gpu_node_release": "2.1.4", "gpu_node_allocation": "dra"}
    refused(host_step(sandbox, **plain), "/etc/containerd/config.toml: line 4: enable_cdi is false", "[cdi_off_for_claims]")
    assert sandbox.snapshot() == before
