# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Plain containerd nodes: every runtime the module adds starts from the default runtime's table (as
nvidia-ctk does), an empty or comment-only file gets the version line containerd needs, and files
containerd cannot use for Kubernetes are refused by name, untouched."""

from __future__ import annotations

import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write
from ansible_collections.k3s_gpu.nvidia.tests.containerd_tables import RUNC_SYSTEMD, default_runtime, runtime
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import EditPlan

CONFIG = "/etc/containerd/config.toml"
V2 = 'plugins."io.containerd.grpc.v1.cri".containerd'
V3 = "plugins.'io.containerd.cri.v1.runtime'.containerd"
NVIDIA = ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy")


def typed(fields):
    """A NodeFacts of a reading with these sections and the others empty."""
    return NodeFacts.from_reading(dict({"distribution": "", "release": "", "root": "/", "profile": {}, "paths": {},
                                        "runtimes": [], "release_runtimes": [], "driver": {}, "toolkit": {}, "cdi": {},
                                        "gpu_operator": {}, "units": [], "files": {}}, **fields))


def node(sandbox, text, release="2.1.4"):
    sandbox.binary("/usr/bin/containerd")
    for binary in NVIDIA:
        sandbox.binary("/usr/bin/" + binary)
    if text is not None:
        sandbox.write(CONFIG, text)
    return detect.gather(sandbox.root, "containerd", release, binaries=["/usr/bin/" + b for b in NVIDIA])


def runtimes_of(text, schema):
    data = tomllib.loads(text)
    plugin = "io.containerd.grpc.v1.cri" if schema == 2 else "io.containerd.cri.v1.runtime"
    return data["plugins"][plugin]["containerd"]["runtimes"]


def run(sandbox, text, release="2.1.4", **params):
    plan, file_changes = changes.compute(NodeFacts.from_reading(node(sandbox, text, release)), params)
    return plan, file_changes


HARDENED_V3 = ("version = 3\n" + default_runtime("runc") + runtime(
    "runc", privileged_without_host_devices=True, pod_annotations=["io.site/*"], runtime_root="/run/runc-shared",
    options=[("BinaryName", "/usr/sbin/runc"), ("SystemdCgroup", True), ("Root", "/run/runc-root")])) % {"t": V3}


def test_new_runtimes_inherit_the_default_runtime(sandbox):
    _plan, file_changes = run(sandbox, HARDENED_V3)
    runtimes = runtimes_of(file_changes[0].after, 3)
    for name, binary in zip(("nvidia", "nvidia-cdi", "nvidia-legacy"), NVIDIA):
        table = runtimes[name]
        assert table["privileged_without_host_devices"] is True  # a privileged pod does not get every host device
        assert table["pod_annotations"] == ["io.site/*"]
        assert "runtime_root" not in table  # not shared with runc (containerd 2 does not read it anyway)
        assert table["options"] == {"BinaryName": "/usr/bin/" + binary, "SystemdCgroup": True, "Root": "/run/runc-root"}
    # a second run changes nothing
    sandbox.write(CONFIG, file_changes[0].after)
    assert run(sandbox, None)[1] == []


def test_user_options_win_over_inherited_ones(sandbox):
    _plan, file_changes = run(sandbox, HARDENED_V3, runtimes=[
        {"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime", "systemd_cgroup": False,
         "options": {"Root": "/run/nvidia-root"}}])
    table = runtimes_of(file_changes[0].after, 3)["nvidia"]
    assert table["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": False,
                                "Root": "/run/nvidia-root"}
    assert table["privileged_without_host_devices"] is True


def test_the_named_default_runtime_is_the_source(sandbox):
    text = ("version = 2\n" + default_runtime("hardened") + RUNC_SYSTEMD + runtime(
        "hardened", privileged_without_host_devices=True,
        options=[("BinaryName", "/opt/runc-hardened"), ("SystemdCgroup", False)])) % {"t": V2}
    _plan, file_changes = run(sandbox, text, "1.7.24")
    nvidia = runtimes_of(file_changes[0].after, 2)["nvidia"]
    assert nvidia["privileged_without_host_devices"] is True
    assert nvidia["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": False}


def test_a_default_runtime_that_is_not_runc_gives_way_to_runc(sandbox):
    text = ("version = 2\n" + default_runtime("kata")
            + runtime("kata", "io.containerd.kata.v2", privileged_without_host_devices=True) + RUNC_SYSTEMD) % {"t": V2}
    _plan, file_changes = run(sandbox, text, "1.7.24")
    nvidia = runtimes_of(file_changes[0].after, 2)["nvidia"]
    assert "privileged_without_host_devices" not in nvidia
    assert nvidia["options"]["SystemdCgroup"] is True


def test_nvidia_as_default_does_not_copy_itself_on_the_next_run(sandbox):
    _plan, file_changes = run(sandbox, HARDENED_V3, default_runtime="nvidia", runtimes=[
        {"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime", "options": {"Root": "/run/nvidia-root"}},
        {"name": "nvidia-cdi", "binary": "/usr/bin/nvidia-container-runtime.cdi"}])
    after = file_changes[0].after
    assert runtimes_of(after, 3)["nvidia-cdi"]["options"]["Root"] == "/run/runc-root"
    sandbox.write(CONFIG, after)
    _plan, again = run(sandbox, None, default_runtime="nvidia", runtimes=[
        {"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime", "options": {"Root": "/run/nvidia-root"}},
        {"name": "nvidia-cdi", "binary": "/usr/bin/nvidia-container-runtime.cdi"}])
    assert again == []


def test_an_existing_nvidia_table_gets_the_inherited_keys(sandbox):
    older = HARDENED_V3 + """[%(t)s.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[%(t)s.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
  SystemdCgroup = true
""" % {"t": V3}
    _plan, file_changes = run(sandbox, older, runtimes=[{"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime"}])
    nvidia = runtimes_of(file_changes[0].after, 3)["nvidia"]
    assert nvidia["privileged_without_host_devices"] is True
    assert nvidia["options"]["Root"] == "/run/runc-root"


def test_a_dropin_inherits_from_the_root_config(sandbox):
    root = HARDENED_V3.replace("version = 3\n", 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    plan, file_changes = run(sandbox, root)
    assert plan["target"]["mode"] == planner.MODE_DROPIN
    nvidia = runtimes_of(file_changes[0].after, 3)["nvidia"]
    assert nvidia["privileged_without_host_devices"] is True
    assert nvidia["options"]["Root"] == "/run/runc-root"


@pytest.mark.parametrize("release,version", [("1.6.20", 2), ("1.7.24", 2), ("2.1.4", 3), ("2.3.4", 3)])
@pytest.mark.parametrize("text", ["", "\n", "# written by the image build\n# nothing else\n"])
def test_empty_or_comment_only_file_gets_the_version_line(sandbox, release, version, text):
    _plan, file_changes = run(sandbox, text, release)
    after = file_changes[0].after
    assert after.startswith("version = %d\n" % version)
    assert after.count("# written by the image build") == text.count("# written by the image build")
    assert set(runtimes_of(after, version)) >= {"nvidia", "nvidia-cdi", "nvidia-legacy"}
    sandbox.write(CONFIG, after)
    assert run(sandbox, None, release)[1] == []


DOCKER_CONTAINERD_IO = """#   Copyright 2018-2022 Docker Inc.

#   Licensed under the Apache License, Version 2.0 (the "License");

disabled_plugins = ["cri"]

#root = "/var/lib/containerd"
#state = "/run/containerd"
"""


@pytest.mark.parametrize("listed", ['["cri"]', "['io.containerd.grpc.v1.cri']", '[\n  "io.containerd.cri.v1.runtime",\n]'])
def test_cri_turned_off_is_refused_by_name(sandbox, listed):
    text = DOCKER_CONTAINERD_IO.replace('["cri"]', listed)
    with pytest.raises(K3sGpuError) as raised:
        run(sandbox, text)
    message = str(raised.value)
    assert "[cri_disabled]" in message and "kubelet cannot use this containerd" in message
    assert "line 5" in message and CONFIG in message and "containerd config default" in message
    assert "\n" not in message
    assert sandbox.read(CONFIG) == text.encode()


def test_cri_turned_off_inside_a_table_is_not_the_top_level_key(sandbox):
    text = 'version = 2\n[plugins."x"]\n  disabled_plugins = ["cri"]\n'
    assert planner.cri_disabled(text) is None


def test_version_1_file_refusal_says_which_versions_the_node_reads(sandbox):
    text = '[plugins.cri.containerd]\n  snapshotter = "overlayfs"\n'
    with pytest.raises(K3sGpuError) as raised:
        run(sandbox, text, "2.1.4")
    message = str(raised.value)
    assert "[config_version_1]" in message and "reads config versions 1, 2, 3" in message
    assert "version = 3" in message
    assert sandbox.read(CONFIG) == text.encode()


def test_result_check_refuses_a_runtime_containerd_would_not_read():
    plan = EditPlan(target={}, write=({"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime"},))
    text = ('version = 3\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
            '  BinaryName = "/usr/bin/nvidia-container-runtime"\n')
    with pytest.raises(K3sGpuError, match=r"runtime nvidia is not where version 3 reads runtimes.*\[runtime_not_loaded\]"):
        toml.check_plain_result(text, plan, CONFIG, 3)
    with pytest.raises(K3sGpuError, match=r"its version is None, not 2"):
        toml.check_plain_result(text.replace("version = 3\n", "").replace("io.containerd.grpc.v1.cri", "x"), plan, CONFIG, 2)


# --- the kubelet's cgroup driver against the runtimes' SystemdCgroup --------------------------------------

KUBELET = "/var/lib/kubelet/config.yaml"
KUBEADM_KUBELET = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: %s
clusterDNS:
- 10.96.0.10
"""
RUNC_V3 = """version = 3
[%(t)s]
  default_runtime_name = "runc"
[%(t)s.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[%(t)s.runtimes.runc.options]
  SystemdCgroup = %(systemd)s
"""


@pytest.mark.parametrize("driver,systemd,mismatch", [
    ("systemd", "false", True), ("systemd", "true", False), ("cgroupfs", "true", True), ("cgroupfs", "false", False),
])
def test_cgroup_driver_mismatch_is_a_warning_and_a_result(sandbox, driver, systemd, mismatch):
    sandbox.write(KUBELET, KUBEADM_KUBELET % driver)
    text = RUNC_V3 % {"t": V3, "systemd": systemd}
    plan, file_changes = run(sandbox, text)
    fields = changes.result_fields(NodeFacts.from_reading(node(sandbox, text)), plan)
    warnings = [w for w in plan.get("warnings") or [] if "[cgroup_driver_mismatch]" in w]
    if not mismatch:
        assert fields["cgroup_driver_mismatch"] is None and warnings == []
        return
    found = fields["cgroup_driver_mismatch"]
    assert found["kubelet_cgroup_driver"] == driver and found["kubelet_config"] == KUBELET
    assert found["containerd_config"] == CONFIG
    assert found["runtimes"] == ["runc", "nvidia", "nvidia-cdi", "nvidia-legacy"]  # the NVIDIA ones inherit runc's
    [warning] = warnings
    assert KUBELET in warning and CONFIG in warning and "cgroupDriver is %s" % driver in warning
    assert "SystemdCgroup is %s" % systemd in warning and "\n" not in warning
    assert file_changes and "SystemdCgroup = %s" % systemd in file_changes[0].after  # runc is never rewritten


def test_user_systemd_cgroup_fixes_the_nvidia_runtimes_but_runc_is_still_named(sandbox):
    sandbox.write(KUBELET, KUBEADM_KUBELET % "systemd")
    plan, _file_changes = run(sandbox, RUNC_V3 % {"t": V3, "systemd": "false"}, runtimes=[
        {"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime", "systemd_cgroup": True}])
    assert plan["cgroup_driver_mismatch"]["runtimes"] == ["runc"]
    assert plan["cgroup_driver_mismatch"]["systemd_cgroup"] == {"runc": False, "nvidia": True}


def test_a_users_dropin_that_sets_systemd_cgroup_counts_where_containerd_merges_it(sandbox):
    # the root config has runc on cgroupfs, a drop-in of the user's moves it to systemd: containerd 2.1 loads the
    # drop-in over the root key by key, so the kubelet's systemd driver agrees with what containerd runs
    sandbox.write(KUBELET, KUBEADM_KUBELET % "systemd")
    sandbox.write("/etc/containerd/conf.d/10-site.toml", (
        "version = 3\n[%(t)s.runtimes.runc.options]\n  SystemdCgroup = true\n") % {"t": V3})
    root = (RUNC_V3 % {"t": V3, "systemd": "false"}).replace(
        "version = 3\n", 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    plan, _file_changes = run(sandbox, root)
    assert plan["target"]["mode"] == planner.MODE_DROPIN
    assert plan["cgroup_driver_mismatch"] is None
    sandbox.write("/etc/containerd/conf.d/10-site.toml", "version = 3\n")  # the same node without that setting
    plan, _file_changes = run(sandbox, root)
    assert plan["cgroup_driver_mismatch"]["runtimes"][0] == "runc"


def test_no_kubelet_config_no_warning(sandbox):
    plan, _file_changes = run(sandbox, RUNC_V3 % {"t": V3, "systemd": "false"})
    assert plan["cgroup_driver_mismatch"] is None


def test_k3s_kubelet_dropins_count_on_the_host_containerd(sandbox):
    # k3s on the host's containerd: its kubelet reads k3s's kubelet.conf.d (last file wins)
    sandbox.k3s("k3s", "package")
    sandbox.write("/var/lib/dpkg/status", "Package: containerd\nStatus: install ok installed\nVersion: 2.1.4~ds1-1\n")
    sandbox.write("/etc/rancher/k3s/config.yaml", "container-runtime-endpoint: /run/containerd/containerd.sock\n")
    sandbox.write("/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf", "cgroupDriver: cgroupfs\n")
    sandbox.write("/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-site.conf", "cgroupDriver: systemd\n")
    sandbox.write(CONFIG, RUNC_V3 % {"t": V3, "systemd": "false"})
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    plan, _file_changes = changes.compute(NodeFacts.from_reading(facts), {})
    assert plan["cgroup_driver_mismatch"]["kubelet_config"] == "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-site.conf"


def test_node_containerd_validates_on_a_real_root_only():
    facts = {"distribution": "containerd", "root": "/", "containerd_binary": "/usr/bin/containerd"}
    assert node_write.node_validate(typed(facts), {}) == "/usr/bin/containerd --config %s config dump"
    assert node_write.node_validate(typed(facts), {"validate": "/opt/check %s"}) == "/opt/check %s"
    assert node_write.node_validate(typed(facts), {"validate": ""}) is None
    assert node_write.node_validate(typed(dict(facts, root="/srv/image")), {}) is None  # a sandbox tree: no binary of its own runs
    assert node_write.node_validate(typed(dict(facts, containerd_binary=None)), {}) is None
    assert node_write.node_validate(typed(dict(facts, distribution="k3s")), {}) is None  # k3s renders and loads its own config


def test_gather_names_the_node_containerd_binary(sandbox):
    sandbox.binary("/usr/local/bin/containerd")
    assert detect.gather(sandbox.root, "containerd", "2.1.4")["containerd_binary"] == "/usr/local/bin/containerd"


def test_a_target_release_on_plain_containerd_is_refused_by_name(sandbox):
    # k3s and rke2 change their template with the release; plain containerd has none to render for it
    with pytest.raises(K3sGpuError, match=r"^target_release is for k3s and rke2 nodes .*; leave target_release unset "
                                          r"here; nothing was written$"):
        run(sandbox, HARDENED_V3, target_release="v1.33.10+k3s1")


NVIDIA_V2 = "/usr/bin/nvidia-container-runtime"


@pytest.mark.parametrize("text, params, words", [
    # the runtime as an inline table: its keys cannot be edited in place
    ('version = 2\n[%s.runtimes]\n  nvidia = { runtime_type = "io.containerd.runc.v2" }\n' % V2, {},
     "runtime nvidia is defined with dotted keys or inline tables; define it as [%s.runtimes.nvidia] or remove it, "
     "then rerun" % V2),
    # taken out again: the same, by hand
    ('version = 2\n[%s.runtimes]\n  nvidia = { runtime_type = "io.containerd.runc.v2" }\n' % V2, {"state": "absent"},
     "runtime nvidia is defined with dotted keys or inline tables; remove it by hand"),
    # a key this task sets that spans lines
    ('version = 2\n[%s.runtimes.nvidia]\n  runtime_type = """\nio.containerd.runc.v1"""\n' % V2, {},
     "line 3: runtime_type spans several lines; put it on one line so it can be updated"),
    # the runtime's options as a dotted key of the runtime's table
    ('version = 2\n[%s.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n  options.NoPivotRoot = true\n' % V2, {},
     "[%s.runtimes.nvidia.options] is defined with dotted keys or an inline table; define it as a table or remove it"
     % V2),
])
def test_a_table_in_a_shape_the_edit_cannot_change_is_refused_by_name_and_left_alone(sandbox, text, params, words):
    before_node = node(sandbox, text, "1.7.24")
    before = sandbox.snapshot()
    runtimes = [{"name": "nvidia", "binary": NVIDIA_V2}] if params.get("state") != "absent" else None
    with pytest.raises(K3sGpuError) as raised:
        changes.compute(NodeFacts.from_reading(before_node), dict(params, runtimes=runtimes))
    assert raised.value.text().startswith("%s: %s" % (CONFIG, words)), raised.value.text()
    assert sandbox.snapshot() == before
