# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Detection rules of each k3s era, service PATH, config.yaml, driver/CDI/operator facts."""

from __future__ import annotations

import os
import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

RUNTIME = "/usr/bin/nvidia-container-runtime"


def nvidia_binary(sandbox, release, distribution="k3s"):
    facts = detect.gather(sandbox.root, distribution, release)
    return dict((r["name"], r["binary"]) for r in facts["release_runtimes"]).get("nvidia")


# stat era (<= v1.28.6, v1.29.0-1): fs.Stat, exec bit ignored; LookPath era: exec bit required
@pytest.mark.parametrize("release,found", [
    ("v1.28.6+k3s2", True), ("v1.29.1+k3s2", True),
    ("v1.28.7+k3s1", False), ("v1.29.2+k3s1", False), ("v1.33.10+k3s1", False),
])
def test_non_executable_binary(sandbox, release, found):
    sandbox.k3s().binary(RUNTIME, mode=0o644)
    assert (nvidia_binary(sandbox, release) == RUNTIME) is found


@pytest.mark.parametrize("release", ["v1.28.6+k3s2", "v1.31.6+k3s1"])
def test_directory_is_skipped_and_next_dir_wins(sandbox, release):
    sandbox.k3s().mkdir("/usr/local/nvidia/toolkit/nvidia-container-runtime")
    sandbox.binary(RUNTIME)
    assert nvidia_binary(sandbox, release) == RUNTIME


@pytest.mark.parametrize("release", ["v1.28.6+k3s2", "v1.28.7+k3s1", "v1.31.6+k3s1"])
def test_operator_dir_beats_usr_bin(sandbox, release):
    sandbox.k3s("k3s", "package").binary("/usr/local/nvidia/toolkit/nvidia-container-runtime")
    assert nvidia_binary(sandbox, release) == "/usr/local/nvidia/toolkit/nvidia-container-runtime"


@pytest.mark.parametrize("release", ["v1.28.6+k3s2", "v1.31.6+k3s1"])
def test_symlink_counts_with_unresolved_path_and_dangling_does_not(sandbox, release):
    sandbox.k3s().binary("/opt/nvidia/real-runtime")
    sandbox.symlink(RUNTIME, "/opt/nvidia/real-runtime")  # absolute target: resolved inside the sandbox
    assert nvidia_binary(sandbox, release) == RUNTIME
    sandbox.symlink("/usr/local/nvidia/toolkit/nvidia-container-runtime", "/opt/nvidia/missing")
    assert nvidia_binary(sandbox, release) == RUNTIME


def test_absolute_symlink_does_not_escape_root(sandbox):
    # /bin/sh exists on the host, not in the sandbox: the link must be dangling here
    sandbox.k3s().symlink(RUNTIME, "/bin/sh")
    assert nvidia_binary(sandbox, "v1.31.6+k3s1") is None


def test_fixed_path_era_ignores_service_path(sandbox):
    sandbox.k3s("k3s", "custom_on_path")
    assert nvidia_binary(sandbox, "v1.31.1+k3s1") is None
    assert nvidia_binary(sandbox, "v1.31.2+k3s1") == "/opt/nvidia/bin/nvidia-container-runtime"


def test_fixed_path_era_searches_usr_local_bin(sandbox):
    sandbox.k3s().binary("/usr/local/bin/nvidia-container-runtime")
    assert nvidia_binary(sandbox, "v1.28.6+k3s2") is None  # stat era: toolkit dir and /usr/bin only
    assert nvidia_binary(sandbox, "v1.28.7+k3s1") == "/usr/local/bin/nvidia-container-runtime"


def test_service_path_from_unit_dropin_and_env_files(sandbox):
    sandbox.k3s().binary("/opt/a/nvidia-container-runtime")
    sandbox.binary("/opt/b/nvidia-container-runtime")
    sandbox.write("/etc/systemd/system/k3s-agent.service",
                  "[Unit]\nDescription=k3s agent\n[Service]\nEnvironmentFile=-/etc/default/%N\n"
                  "EnvironmentFile=-/etc/systemd/system/k3s-agent.service.env\nExecStart=/usr/local/bin/k3s agent\n")
    sandbox.write("/etc/default/k3s-agent", "# comment\nPATH=/opt/b:/usr/bin\n")
    assert nvidia_binary(sandbox, "v1.33.10+k3s1") == "/opt/b/nvidia-container-runtime"
    sandbox.write("/etc/systemd/system/k3s-agent.service.env", "PATH='/opt/a:/usr/bin'\n")
    assert nvidia_binary(sandbox, "v1.33.10+k3s1") == "/opt/a/nvidia-container-runtime"
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["units"] == ["k3s-agent"]
    assert facts["service"]["env_files"] == ["/etc/default/k3s-agent", "/etc/systemd/system/k3s-agent.service.env"]


def test_env_file_path_is_not_expanded(sandbox):
    # systemd keeps `$PATH` literally: /usr/bin is then NOT on the service PATH
    sandbox.k3s().binary("/usr/local/bin/nvidia-container-runtime")
    sandbox.write("/etc/default/k3s", "PATH=$PATH:/opt/x\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["service"]["path"] == "$PATH:/opt/x"
    assert not [r for r in facts["release_runtimes"] if r["name"] == "nvidia"]


def test_relative_path_entry_stops_the_search(sandbox):
    # Go's LookPath returns ErrDot for a match in "." (cwd "/" under systemd); k3s treats it as not found
    sandbox.k3s().binary("/nvidia-container-runtime")
    sandbox.binary(RUNTIME)
    sandbox.write("/etc/default/k3s", "PATH=:/usr/bin\n")
    assert nvidia_binary(sandbox, "v1.33.10+k3s1") is None
    sandbox.write("/etc/default/k3s", "PATH=/usr/bin:\n")
    assert nvidia_binary(sandbox, "v1.33.10+k3s1") == RUNTIME


def test_rke2_env_file_location(sandbox):
    sandbox.k3s("rke2").binary("/opt/gpu/nvidia-container-runtime")
    sandbox.write("/usr/local/lib/systemd/system/rke2-agent.service",
                  "[Service]\nEnvironmentFile=-/etc/default/%N\nEnvironmentFile=-/usr/local/lib/systemd/system/%N.env\n")
    sandbox.write("/usr/local/lib/systemd/system/rke2-agent.env", "HOME=/root\nPATH=/opt/gpu:/usr/bin\n")
    assert nvidia_binary(sandbox, "v1.31.6+rke2r1", "rke2") == "/opt/gpu/nvidia-container-runtime"


def test_environment_directive_in_unit_dropin(sandbox):
    sandbox.k3s().binary("/opt/c/nvidia-container-runtime")
    sandbox.write("/etc/systemd/system/k3s.service", "[Service]\nExecStart=/usr/local/bin/k3s server\n")
    sandbox.write("/etc/systemd/system/k3s.service.d/10-path.conf", '[Service]\nEnvironment="PATH=/opt/c:/usr/bin"\n')
    assert nvidia_binary(sandbox, "v1.31.6+k3s1") == "/opt/c/nvidia-container-runtime"


def test_default_runtime_sources_in_order(sandbox):
    sandbox.k3s()
    sandbox.write("/etc/rancher/k3s/config.yaml", "node-label:\n  - gpu=true\ndefault-runtime: crun\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    assert facts["default_runtime"] == {"value": "crun", "source": "/etc/rancher/k3s/config.yaml"}
    sandbox.write("/etc/rancher/k3s/config.yaml.d/10-x.yaml", 'default-runtime: "nvidia"  # gpu\n')
    assert detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")["default_runtime"]["value"] == "nvidia"
    sandbox.write("/etc/systemd/system/k3s.service", "[Service]\nExecStart=/usr/local/bin/k3s \\\n    server --default-runtime=runc\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    assert facts["default_runtime"] == {"value": "runc", "source": "/etc/systemd/system/k3s.service"}


@pytest.mark.parametrize("text,expected", [
    ("disable: [traefik, 'runtimes']\n", [("=", ["traefik", "runtimes"])]),
    ("disable:\n  - traefik\n  - \"runtimes\"  # no classes\nnode-name: x\n- stray\n", [("=", ["traefik", "runtimes"])]),
    ("disable: traefik,runtimes\n", [("=", ["traefik", "runtimes"])]),
    ("disable+:\n- runtimes\n", [("+", ["runtimes"])]),
    ("disable:\n", [("=", [])]),
    ("disable-cloud-controller: true\n", []),
], ids=["flow", "block", "comma-scalar", "append-zero-indent", "empty", "other-key"])
def test_yaml_top_level_list(text, expected):
    assert detect.yaml_top_level_list(text, "disable") == expected


@pytest.mark.parametrize("distribution,release,component", [
    ("k3s", "v1.33.10+k3s1", "runtimes"), ("rke2", "v1.33.10+rke2r1", "rke2-runtimeclasses")])
def test_runtimeclasses_disabled_merges_like_k3s(sandbox, distribution, release, component):
    """config.yaml then config.yaml.d in order: `disable:` replaces, `disable+:` appends."""
    sandbox.k3s(distribution)
    config = "/etc/rancher/%s/config.yaml" % distribution
    sandbox.write(config, "disable:\n  - traefik\n")
    facts = detect.gather(sandbox.root, distribution, release)
    assert facts["disabled_components"] == ["traefik"] and facts["runtimeclasses_disabled"] is False
    sandbox.write(config + ".d/10-a.yaml", "disable+: [%s]\n" % component)
    facts = detect.gather(sandbox.root, distribution, release)
    assert facts["disabled_components"] == ["traefik", component] and facts["runtimeclasses_disabled"] is True
    sandbox.write(config + ".d/20-b.yaml", "disable: servicelb\n")
    facts = detect.gather(sandbox.root, distribution, release)
    assert facts["disabled_components"] == ["servicelb"] and facts["runtimeclasses_disabled"] is False


def test_data_dir_from_config_yaml(sandbox):
    sandbox.write("/etc/rancher/k3s/config.yaml", "data-dir: /data/k3s\n")
    sandbox.mkdir("/data/k3s/agent/etc/containerd")
    facts = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")
    assert facts["paths"]["template_v3"] == "/data/k3s/agent/etc/containerd/config-v3.toml.tmpl"


def test_auto_distribution(sandbox):
    with pytest.raises(K3sGpuError, match="neither k3s, rke2 nor containerd"):
        detect.gather(sandbox.root, "auto", "v1.31.6+k3s1")
    sandbox.k3s("rke2")
    assert detect.gather(sandbox.root, "auto", "v1.31.6+rke2r1")["distribution"] == "rke2"
    sandbox.k3s("k3s")
    with pytest.raises(K3sGpuError, match="set distribution"):
        detect.gather(sandbox.root, "auto", "v1.31.6+k3s1")


def test_release_from_binary_needs_host_root(sandbox):
    sandbox.k3s().binary("/usr/local/bin/k3s")
    with pytest.raises(K3sGpuError, match="set release"):
        detect.gather(sandbox.root, "k3s")


def test_release_from_binary_output():
    assert detect.parse_version_output("k3s", "k3s version v1.31.2+k3s1 (6da20424)\ngo version go1.22.8\n") == "v1.31.2+k3s1"
    assert detect.parse_version_output("rke2", "rke2 version v1.33.10+rke2r1 (0123456789abcdef)\n") == "v1.33.10+rke2r1"
    assert detect.parse_version_output("containerd", "containerd github.com/containerd/containerd v1.6.20~ds1 1.6.20~ds1-1\n") == "1.6.20~ds1"
    assert detect.parse_version_output("containerd", "containerd containerd.io 1.7.24 88bf19b\n") == "1.7.24"
    assert detect.parse_version_output("k3s", "garbage") is None


def test_run_command_used_for_release_on_host_root(monkeypatch, sandbox):
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, "k3s version v1.33.10+k3s1 (abcdef12)\n", ""
    fs = detect.NodeFS("/")
    monkeypatch.setattr(detect, "find_binary", lambda fs, d: "/usr/local/bin/k3s")
    assert detect._release_of(fs, "k3s", None, run, True) == ("v1.33.10+k3s1", "/usr/local/bin/k3s")
    assert calls == [["/usr/local/bin/k3s", "--version"]]


def test_driver_devices_cdi_toolkit_operator(sandbox):
    sandbox.k3s("k3s", "operator")
    sandbox.write("/proc/driver/nvidia/version",
                  "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22)\n"
                  "GCC version:  gcc version 12.3.0\n")
    for dev in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        sandbox.write("/dev/" + dev)
    sandbox.write("/etc/cdi/nvidia.yaml", "---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n"
                  "  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n- name: all\n"
                  "containerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n")
    sandbox.write("/var/run/cdi/other.json", '{"cdiVersion": "0.6.0", "kind": "vendor.com/x", "devices": [{"name": "a"}]}')
    sandbox.write("/var/lib/dpkg/status", "Package: nvidia-container-toolkit-base\nStatus: install ok installed\n"
                  "Version: 1.18.1-1\n\nPackage: other\nStatus: install ok installed\nVersion: 1\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["driver"] == {"loaded": True, "version": "580.95.05", "open_kernel_module": True,
                               "devices": ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"], "gpu_count": 2,
                               "pci_gpus": [], "char_links": [], "nvswitches": 0,
                               "dev_char_rule": {"path": "/etc/udev/rules.d/71-nvidia-dev-char.rules", "state": "absent",
                                                 "parent_exists": False},
                               "device_nodes_dropins": []}  # no k3s unit file in this tree
    assert facts["toolkit"]["cdi_refresh"] == {"unit": None, "enabled": False}
    assert facts["cdi"]["nvidia_devices"] == ["0", "all"]
    assert [s["kind"] for s in facts["cdi"]["specs"]] == ["nvidia.com/gpu", "vendor.com/x"]
    assert facts["toolkit"]["version"] == "1.18.1-1"
    assert facts["gpu_operator"]["present"] is True
    assert [r["source"] for r in facts["runtimes"]] == ["k3s", "k3s", "gpu-operator"]


def test_driver_devices_are_device_nodes_and_the_caps_directory_is_listed_by_its_nodes(sandbox):
    # /dev as the H200 host of tests/device/RESULTS.md had it, with the MIG capability nodes of a MIG-enabled GPU
    sandbox.k3s()
    for dev in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1",
                "nvidia-caps/nvidia-cap2"):
        sandbox.write("/dev/" + dev)
    os.makedirs(sandbox.root + "/dev/nvidia-empty-dir")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["driver"]["devices"] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
                                          "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]
    assert facts["driver"]["gpu_count"] == 1


def test_the_cdi_refresh_unit_and_the_dev_char_rule_are_read(sandbox):
    sandbox.k3s()
    sandbox.write("/lib/systemd/system/nvidia-cdi-refresh.path", "[Path]\n")
    sandbox.write("/etc/udev/rules.d/71-nvidia-dev-char.rules", "# a rule\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["toolkit"]["cdi_refresh"] == {"unit": "/lib/systemd/system/nvidia-cdi-refresh.path", "enabled": False}
    assert facts["driver"]["dev_char_rule"]["content"] == "# a rule\n"
    os.makedirs(sandbox.root + "/etc/systemd/system/multi-user.target.wants")
    os.symlink("/lib/systemd/system/nvidia-cdi-refresh.path",
               sandbox.root + "/etc/systemd/system/multi-user.target.wants/nvidia-cdi-refresh.path")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["toolkit"]["cdi_refresh"]["enabled"] is True


def test_the_device_nodes_drop_in_is_read_for_each_unit(sandbox):
    sandbox.k3s()
    sandbox.write("/etc/systemd/system/k3s.service", "[Service]\n")
    sandbox.write("/usr/lib/systemd/system/k3s-agent.service", "[Service]\n")
    sandbox.write("/etc/systemd/system/k3s-agent.service.d/50-k3s-gpu-nvidia-device-nodes.conf", "# ours\n")
    dropins = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")["driver"]["device_nodes_dropins"]
    assert [(d["path"], d["state"], d.get("content")) for d in dropins] == [
        ("/etc/systemd/system/k3s.service.d/50-k3s-gpu-nvidia-device-nodes.conf", "absent", None),
        ("/etc/systemd/system/k3s-agent.service.d/50-k3s-gpu-nvidia-device-nodes.conf", "file", "# ours\n")]


def test_no_driver(sandbox):
    sandbox.k3s()
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["driver"]["loaded"] is False and facts["driver"]["gpu_count"] == 0
    assert facts["gpu_operator"]["present"] is False


def test_plain_containerd(sandbox):
    sandbox.binary("/usr/bin/containerd")
    sandbox.write("/etc/containerd/config.toml", "version = 2\n")
    sandbox.binary(RUNTIME)
    facts = detect.gather(sandbox.root, "auto", "1.7.24")
    assert facts["distribution"] == "containerd"
    assert facts["release_runtimes"] == []
    assert facts["runtimes"][0]["binary"] == RUNTIME
    assert facts["files"]["config"]["version_line"] == 2


def test_nodefs_reads_are_bounded(sandbox):
    sandbox.write("/big", b"x" * (detect.MAX_CONFIG_BYTES + 10))
    info = detect.file_facts(detect.NodeFS(sandbox.root), "/big", True)
    assert info["error"] == "too_large" and "content" not in info


def test_pci_gpus_before_the_driver(sandbox):
    sandbox.k3s()
    sandbox.write("/sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de\n")
    sandbox.write("/sys/bus/pci/devices/0000:17:00.0/class", "0x030200\n")
    sandbox.write("/sys/bus/pci/devices/0000:18:00.0/vendor", "0x10de\n")
    sandbox.write("/sys/bus/pci/devices/0000:18:00.0/class", "0x040300\n")  # its audio function
    sandbox.write("/sys/bus/pci/devices/0000:00:02.0/vendor", "0x8086\n")
    sandbox.write("/sys/bus/pci/devices/0000:00:02.0/class", "0x030000\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["driver"]["pci_gpus"] == ["0000:17:00.0"] and facts["driver"]["loaded"] is False


def test_dev_char_links_and_nvswitches(sandbox):
    """/dev/char/<major>:<minor> links that point at NVIDIA device nodes (relative, as udev and nvidia-ctk make them, or
    absolute), and the NVSwitches on the PCI bus."""
    sandbox.k3s()
    for dev in ("nvidia0", "nvidia1", "nvidiactl"):
        sandbox.write("/dev/" + dev)
    sandbox.symlink("/dev/char/195:0", "../nvidia0")
    sandbox.symlink("/dev/char/195:255", "/dev/nvidiactl")
    sandbox.symlink("/dev/char/1:3", "../null")
    sandbox.write("/sys/bus/pci/devices/0000:05:00.0/vendor", "0x10de\n")
    sandbox.write("/sys/bus/pci/devices/0000:05:00.0/class", "0x068000\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["driver"]["char_links"] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert facts["driver"]["nvswitches"] == 1 and facts["driver"]["pci_gpus"] == []


def test_loaded_config_runtimes_follow_imports(sandbox):
    sandbox.k3s()
    base = "/var/lib/rancher/k3s/agent/etc/containerd"
    sandbox.write(base + "/config.toml", 'version = 3\nimports = ["%s/config-v3.toml.d/*.toml"]\n'
                  "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
                  "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia'.options]\n"
                  "  # [plugins.x.runtimes.commented]\n" % base)
    sandbox.write(base + "/config-v3.toml.d/50-x.toml",
                  '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy]\n')
    sandbox.write(base + "/config-v3.toml.d/README", "[plugins.a.containerd.runtimes.ignored]\n")
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["loaded_config"]["runtimes"] == ["nvidia", "nvidia-legacy", "runc"]
    assert len(facts["loaded_config"]["files"]) == 2


def test_cdi_spec_current_for_the_loaded_driver(sandbox):
    """A spec naming the loaded driver's libraries and one device per GPU needs no regeneration."""
    sandbox.k3s("k3s", "package")
    sandbox.write("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n")
    for dev in ("nvidia0", "nvidia1", "nvidiactl"):
        sandbox.write("/dev/" + dev)
    spec = ("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n- name: \"1\"\n- name: all\n"
            "containerEdits:\n  mounts:\n  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n")
    sandbox.write("/var/run/cdi/nvidia.yaml", spec)
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["cdi"]["specs"][0]["current"] is True
    # another driver version, or a GPU more than the spec lists: generate again
    sandbox.write("/var/run/cdi/nvidia.yaml", spec.replace("580.95.05", "580.82.07"))
    assert detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")["cdi"]["specs"][0]["current"] is False
    sandbox.write("/var/run/cdi/nvidia.yaml", spec)
    sandbox.write("/dev/nvidia2")
    assert detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")["cdi"]["specs"][0]["current"] is False


def test_cdi_spec_in_nvidia_ctk_layout_seen_on_a_real_gpu(sandbox):
    """The layout nvidia-ctk 1.20 wrote on an H200 with driver 580.159.04 (tests/device/RESULTS.md): lists indented
    by four, each device with its own containerEdits, one device named by index and one by UUID, the driver's
    libraries under /usr/local/nvidia/lib64. The UUID name is not a GPU of its own, so the spec is current."""
    sandbox.k3s("k3s", "package")
    sandbox.write("/proc/driver/nvidia/version",
                  "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n")
    for dev in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        sandbox.write("/dev/" + dev)
    uuid = "GPU-be916789-ff51-0579-52ef-4de87879dcc4"
    device = ('    - name: %s\n      containerEdits:\n        deviceNodes:\n            - path: /dev/nvidia0\n'
              '              major: 195\n              fileMode: 438\n              permissions: rwm\n')
    spec = ("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n" + device % '"0"' + device % uuid + device % "all"
            + "containerEdits:\n    mounts:\n        - hostPath: /usr/local/nvidia/lib64/libcuda.so.580.159.04\n"
            "          containerPath: /usr/local/nvidia/lib64/libcuda.so.580.159.04\n")
    sandbox.write("/var/run/cdi/nvidia.yaml", spec)
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["driver"]["version"] == "580.159.04" and facts["driver"]["open_kernel_module"] is True
    assert facts["cdi"]["specs"][0]["devices"] == ["0", uuid, "all"]
    assert facts["cdi"]["specs"][0]["current"] is True
    assert facts["cdi"]["nvidia_devices"] == ["0", uuid, "all"]


@pytest.mark.parametrize("asked,present", [("rke2", "k3s"), ("k3s", "rke2")])
def test_asked_distribution_the_node_contradicts_is_refused(sandbox, asked, present):
    sandbox.k3s(present)
    release = "v1.33.10+k3s1" if asked == "k3s" else "v1.33.10+rke2r1"
    with pytest.raises(K3sGpuError, match="%s was asked for, but the node under .* has %s .*set distribution to %s" % (
            asked, present, present)):
        detect.gather(sandbox.root, asked, release)
    assert not sandbox.exists("/var/lib/rancher/%s" % asked)


def test_asked_distribution_on_an_empty_tree_is_planned_for(sandbox):
    # nothing installed yet (an inventory that says k3s_version): the tree is k3s's from the first run
    facts = detect.gather(sandbox.root, "k3s", "v1.33.10+k3s1")
    assert facts["distribution"] == "k3s" and facts["release_source"] == "option"


def test_the_collections_manifests_are_read_as_digests_never_as_text(sandbox):
    sandbox.k3s("k3s", "package")
    manifests = "/var/lib/rancher/k3s/server/manifests"
    sandbox.write(manifests + "/k3s-gpu-nvidia-runtimeclasses.yaml", "kind: RuntimeClass\n", mode=0o600)
    sandbox.mkdir(manifests + "/k3s-gpu-nvidia-device-plugin.yaml")
    found = detect.gather(sandbox.root, "k3s", "v1.31.6+k3s1")["manifests"]
    assert sorted((name, entry["path"], entry["state"]) for name, entry in found.items()) == [
        ("k3s-gpu-nvidia-device-plugin.yaml", manifests + "/k3s-gpu-nvidia-device-plugin.yaml", "directory"),
        ("k3s-gpu-nvidia-dra-driver.yaml", manifests + "/k3s-gpu-nvidia-dra-driver.yaml", "absent"),
        ("k3s-gpu-nvidia-gpu-operator.yaml", manifests + "/k3s-gpu-nvidia-gpu-operator.yaml", "absent"),
        ("k3s-gpu-nvidia-runtimeclasses.yaml", manifests + "/k3s-gpu-nvidia-runtimeclasses.yaml", "file")]
    written = found["k3s-gpu-nvidia-runtimeclasses.yaml"]
    assert written["mode"] == "0600" and "content" not in written
    assert written["sha256"] == "e11a6b7a9d5f779c31baec0eb5a099ff912fb0bdc865699e949403ba88b8adf7"


def test_an_agent_has_none_of_the_manifests_and_plain_containerd_no_list(sandbox):
    sandbox.k3s("rke2", "package")
    found = detect.gather(sandbox.root, "rke2", "v1.31.6+rke2r1")["manifests"]
    assert sorted(found) == sorted(["k3s-gpu-nvidia-gpu-operator.yaml", "k3s-gpu-nvidia-runtimeclasses.yaml",
                                    "k3s-gpu-nvidia-device-plugin.yaml", "k3s-gpu-nvidia-dra-driver.yaml"])
    assert set(entry["state"] for entry in found.values()) == {"absent"}
    assert all(entry["path"].startswith("/var/lib/rancher/rke2/server/manifests/") for entry in found.values())
    sandbox.binary("/usr/local/bin/containerd")
    assert detect.gather(sandbox.root, "containerd", "2.1.4")["manifests"] == {}
