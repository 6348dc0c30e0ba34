# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Nothing of the user's is lost (issue 41): a user's file at the collection's name is never taken over nor deleted,
a runtime the user configured with a binary of their own is kept, directories are made as k3s makes them and go
again with the take-back. The role's host step on sandbox nodes; each case failed on 0baaf98."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import host_step

YAML = "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"
DROPIN = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"
USER_DROPIN = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/10-user.toml"
TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
DROPIN_RELEASE = "v1.33.10+k3s1"
V3 = "plugins.'io.containerd.cri.v1.runtime'.containerd"
WRAPPER = ("[%s.runtimes.nvidia-legacy]\n  runtime_type = \"io.containerd.runc.v2\"\n"
           "[%s.runtimes.nvidia-legacy.options]\n  BinaryName = \"/usr/local/bin/gpu-wrapper\"\n" % (V3, V3))


@pytest.mark.parametrize("path, text, release", [
    (YAML, "kubelet-arg:\n  - max-pods=250\n", "v1.31.6+k3s1"),
    (DROPIN, "[plugins.'io.containerd.grpc.v1.cri']\n  max_container_log_line_size = 65536\n", DROPIN_RELEASE),
    (YAML, "", "v1.31.6+k3s1"),  # even an empty one: it is not the collection's
])
def test_a_users_file_at_the_collections_name_is_refused_and_kept(sandbox, path, text, release):
    sandbox.k3s("k3s", "package")
    sandbox.write(path, text, 0o640)
    before = sandbox.snapshot()
    result = host_step(sandbox, gpu_node_release=release, gpu_node_default_runtime="nvidia")
    assert result.get("failed") and path in result["msg"] and "was not written by k3s_gpu.nvidia" in result["msg"]
    assert "move your settings into a file of your own" in result["msg"] and "nothing was written" in result["msg"]
    assert sandbox.snapshot() == before
    # the take-back leaves it too, and says so
    absent = host_step(sandbox, gpu_node_release=release, gpu_node_state="absent")
    assert not absent.get("failed"), absent.get("msg")
    assert sandbox.snapshot() == before


def test_a_users_dropin_runtime_is_kept_not_overridden(sandbox):
    # containerd reads 50- after 10-: the collection's table would win over the user's wrapper
    sandbox.k3s("k3s", "package")
    sandbox.write(USER_DROPIN, WRAPPER)
    result = host_step(sandbox, gpu_node_release=DROPIN_RELEASE)
    assert not result.get("failed"), result.get("msg")
    ours = sandbox.read(DROPIN).decode() if sandbox.exists(DROPIN) else ""
    assert "nvidia-legacy" not in ours and sandbox.read(USER_DROPIN).decode() == WRAPPER
    skipped = [s for s in result["runtimes_skipped"] if s["name"] == "nvidia-legacy"]
    assert skipped and USER_DROPIN in skipped[0]["reason"] and "gpu-wrapper" in skipped[0]["reason"]
    assert "nvidia-legacy" in result["handlers"]  # the handler is there (the user's), and labelled


def test_a_users_template_runtime_keeps_its_binary(sandbox):
    sandbox.k3s("k3s", "package")
    text = '{{ template "base" . }}\n' + WRAPPER
    sandbox.write(TEMPLATE, text)
    result = host_step(sandbox)
    assert not result.get("failed"), result.get("msg")
    assert sandbox.read(TEMPLATE).decode() == text
    assert not [w for w in result.get("warnings") or [] if "runtime_table_updated" in w]


def test_directories_are_made_0755_and_go_with_the_take_back(sandbox):
    # nothing of k3s's config directories exists yet (an image built before k3s is installed); k3s's own data
    # directories are there and empty: they stay
    sandbox.k3s("k3s", "package")
    sandbox.mkdir("/etc")
    before = sandbox.snapshot()
    dirs_before = sorted(d for d, _s, _f in os.walk(sandbox.root))
    result = host_step(sandbox, gpu_node_release=DROPIN_RELEASE, gpu_node_default_runtime="nvidia")
    assert not result.get("failed"), result.get("msg")
    for directory in ("/etc/rancher", "/etc/rancher/k3s", "/etc/rancher/k3s/config.yaml.d"):
        assert stat.S_IMODE(os.stat(sandbox.path(directory)).st_mode) == 0o755, directory
    absent = host_step(sandbox, gpu_node_release=DROPIN_RELEASE, gpu_node_state="absent")
    assert not absent.get("failed"), absent.get("msg")
    assert sandbox.snapshot() == before
    assert sorted(d for d, _s, _f in os.walk(sandbox.root)) == dirs_before


@pytest.mark.parametrize("link", ["/var/lib/rancher", "/etc/rancher", "/var/backups"])
def test_the_role_never_writes_outside_the_root_through_an_absolute_symlink(sandbox, tmp_path, link):
    # image trees carry links such as /var/lib/rancher -> /data/rancher: that is /data/rancher of the image
    build_host = tmp_path / "build-host"
    (build_host / "data").mkdir(parents=True)
    target = str(build_host / "data" / link.strip("/").replace("/", "-"))
    os.makedirs(target)
    sandbox.mkdir(os.path.dirname(link))
    if link == "/var/lib/rancher":
        sandbox.mkdir(target[len(""):] + "/k3s/agent/etc/containerd")  # inside the image: <root><target>
    os.symlink(target, sandbox.path(link))
    sandbox.k3s("k3s", "package")
    sandbox.write(TEMPLATE, '{{ template "base" . }}\n')
    before = sorted(os.walk(str(build_host)))
    result = host_step(sandbox, gpu_node_default_runtime="nvidia", gpu_node_backup=True)
    assert not result.get("failed"), result.get("msg")
    assert sorted(os.walk(str(build_host))) == before
    again = host_step(sandbox, gpu_node_default_runtime="nvidia", gpu_node_backup=True, gpu_node_state="absent")
    assert not again.get("failed"), again.get("msg")
    assert sorted(os.walk(str(build_host))) == before  # nothing on the machine running the role


def test_a_data_dir_that_climbs_above_the_root_stays_in_it(sandbox, tmp_path):
    # data-dir: /../../../x in the node's config.yaml is /x on the node, and <root>/x here
    sandbox.write("/etc/rancher/k3s/config.yaml", "data-dir: /../../../x\n")
    sandbox.mkdir("/x/agent/etc/containerd")
    sandbox.k3s("k3s", "package")
    # where root + data-dir leads when the OS follows the dots: the machine running the role (other tests write
    # beside the sandbox at the same time, so that place is checked, not its whole directory)
    escaped = os.path.normpath(sandbox.root + "/../../../x/agent/etc/containerd/config-v3.toml.d")
    existed = os.path.exists(escaped)
    result = host_step(sandbox, gpu_node_release=DROPIN_RELEASE, gpu_node_default_runtime="nvidia-legacy")
    assert not result.get("failed"), result.get("msg")
    assert sandbox.exists("/x/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml")
    assert os.path.exists(escaped) == existed
