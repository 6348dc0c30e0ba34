# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The doctor's layers on sandbox nodes: a healthy k3s v1.34.6 node (a GPU, the driver loaded with its device nodes and
/dev/char links, NVIDIA's toolkit at the pinned version, a current CDI spec, the collection's drop-in, config.toml as
k3s wrote it at its start), then one layer broken per case: the doctor names that layer and no earlier one."""

from __future__ import annotations

import os
import time

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils import engine_view as changes
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _doctor as doctor
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.tests.conformance import cases

RELEASE = "v1.34.6+k3s1"
DRIVER = "580.95.05"
BINARIES = ["/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
            "/usr/bin/nvidia-container-runtime.legacy"]
CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
DROPIN = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"
TEMPLATE = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
CDI_SPEC = "/var/run/cdi/nvidia.yaml"
REFRESH_UNIT = "/lib/systemd/system/nvidia-cdi-refresh.path"
REFRESH_WANTS = "/etc/systemd/system/multi-user.target.wants/nvidia-cdi-refresh.path"


def cdi_spec(version, gpus=1):
    devices = "".join('- name: "%d"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia%d\n' % (i, i)
                      for i in range(gpus))
    return ("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n%s- name: all\ncontainerEdits:\n  mounts:\n"
            "  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.%s\n" % (devices, version))


def healthy(sandbox):
    """The node after k3s_gpu.nvidia.site and a k3s start."""
    sandbox.k3s("k3s", "package")
    sandbox.write("/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  "
                                                 "Release Build\n" % DRIVER)
    for dev, minor in (("nvidia0", 0), ("nvidiactl", 255)):
        sandbox.write("/dev/" + dev)
        sandbox.symlink("/dev/char/195:%d" % minor, "../" + dev)
    sandbox.write("/sys/bus/pci/devices/0000:17:00.0/vendor", "0x10de\n")
    sandbox.write("/sys/bus/pci/devices/0000:17:00.0/class", "0x030200\n")
    sandbox.write("/var/lib/dpkg/status", "Package: nvidia-container-toolkit-base\nStatus: install ok installed\n"
                                          "Version: 1.20.0-1\n")
    sandbox.write(CDI_SPEC, cdi_spec(DRIVER))
    # the toolkit's nvidia-cdi-refresh path unit, enabled (gpu_node_cdi_refresh), and the /dev/char udev rule
    sandbox.write(REFRESH_UNIT, "[Path]\nPathChanged=/usr/bin/nvidia-ctk\n")
    sandbox.symlink(REFRESH_WANTS, REFRESH_UNIT)
    sandbox.write("/etc/udev/rules.d/71-nvidia-dev-char.rules", "# the rule\n")
    facts = detect.gather(sandbox.root, "k3s", RELEASE)
    _plan, written = changes.compute(NodeFacts.from_reading(facts), {"state": "present", "root": sandbox.root,
                                                                     "distribution": "k3s", "release": RELEASE})
    for change in written:
        sandbox.write(change.node_path, change.after)
    cases.start_node(sandbox.root, "k3s", RELEASE, BINARIES)
    past = time.time() - 600  # the role wrote its files before k3s started
    for path in (DROPIN,):
        os.utime(sandbox.path(path), (past, past))
    return sandbox


def node_settings(**overrides):
    settings = {"mode": "host", "operator_namespace": "gpu-operator", "toolkit_version": "1.20.0-1", "toolkit_install": True,
                "enable_cdi": None, "device_list_strategy": "auto", "unit": "k3s-agent",
                "handlers": ["nvidia", "nvidia-cdi", "nvidia-legacy"], "labels": ["nvidia.com/gpu.present=true"],
                "changes": [], "services": {}, "existing_binaries": BINARIES}
    settings.update(overrides)
    return settings


def diagnose(sandbox, **overrides):
    info = detect.gather(sandbox.root, "k3s", RELEASE)
    if sandbox.exists(CONFIG):  # the doctor phase reads its text besides the reading (gpu_node_host)
        info["files"]["generated_config"]["content"] = sandbox.read(CONFIG).decode("utf-8")
    node = node_settings(**overrides)
    if "existing_binaries" not in overrides:
        node["existing_binaries"] = [b for b in BINARIES if sandbox.exists(b)]
    return doctor.check_node("gpu1", NodeFacts.from_reading(info), node)


def layers(report):
    return [p["layer"] for p in report["passed"]], (report["broken"] or {}).get("layer")


def test_a_healthy_node_passes_every_node_layer(sandbox):
    report = diagnose(healthy(sandbox))
    assert layers(report) == (list(doctor.NODE_LAYERS), None), report
    assert doctor.line(report).startswith("gpu1: OK (node layers; the cluster layers were not checked")


def _remove(sandbox, *paths):
    for path in paths:
        os.remove(sandbox.path(path))


def _later(sandbox, path):
    later = time.time() + 60
    os.utime(sandbox.path(path), (later, later))


def _cdi_off(sandbox):
    text = sandbox.read(CONFIG).decode("utf-8")
    header = '[plugins."io.containerd.cri.v1.runtime"]\n'
    assert header in text
    sandbox.write(CONFIG, text.replace(header, header + "  enable_cdi = false\n"))


def _cdi_dirs(*dirs):
    def narrow(sandbox):
        text = sandbox.read(CONFIG).decode("utf-8")
        header = '[plugins."io.containerd.cri.v1.runtime"]\n'
        assert header in text
        sandbox.write(CONFIG, text.replace(header, header + "  cdi_spec_dirs = %s\n" % list(dirs)).replace("'", '"'))
    return narrow


# (case, how the healthy node is broken, node settings, the layer the doctor must name, words of its cause)
BROKEN = [
    # a DRA node (issue 45): each claim's CDI spec is in /var/run/cdi, which containerd must scan with CDI on
    ("a DRA node whose template turns CDI off", _cdi_off, {"allocation": "dra"}, "containerd-config",
     "enable_cdi is off in /var/lib/rancher/k3s/agent/etc/containerd/config.toml, but NVIDIA's DRA driver"),
    ("a DRA node whose template narrows cdi_spec_dirs", _cdi_dirs("/etc/cdi"), {"allocation": "dra"}, "containerd-config",
     "cdi_spec_dirs in /var/lib/rancher/k3s/agent/etc/containerd/config.toml is ['/etc/cdi'], without /var/run/cdi"),
    ("gpu fell off the bus", lambda s: _remove(s, "/sys/bus/pci/devices/0000:17:00.0/vendor", "/dev/nvidia0"), {},
     "gpu", "no NVIDIA GPU on the PCI bus"),
    ("no module loaded", lambda s: _remove(s, "/proc/driver/nvidia/version"), {}, "driver", "not loaded"),
    ("device nodes missing", lambda s: _remove(s, "/dev/nvidiactl"), {}, "driver", "device nodes missing: /dev/nvidiactl"),
    ("/dev/char links missing", lambda s: _remove(s, "/dev/char/195:0"), {}, "driver", "no /dev/char link for /dev/nvidia0"),
    ("toolkit missing", lambda s: _remove(s, "/var/lib/dpkg/status", *BINARIES), {}, "toolkit", "not installed"),
    # the package is installed, its runtime binary is gone: containerd's nvidia runtime then names a missing BinaryName,
    # but the first broken link is the toolkit (issue 41, item 15)
    ("toolkit package installed, its nvidia-container-runtime gone", lambda s: _remove(s, BINARIES[0]), {}, "toolkit",
     "toolkit 1.20.0-1 is installed (dpkg lists it), but its nvidia-container-runtime is not on the node"),
    ("toolkit package installed, every runtime binary gone", lambda s: _remove(s, *BINARIES), {}, "toolkit",
     "toolkit 1.20.0-1 is installed (dpkg lists it), but its nvidia-container-runtime is not on the node"),
    ("toolkit at another version", lambda s: None, {"toolkit_version": "1.18.1-1"}, "toolkit",
     "1.20.0-1 is installed, gpu_node_toolkit_version pins 1.18.1-1"),
    ("stale toolkit in /usr/local/nvidia/toolkit", lambda s: s.binary("/usr/local/nvidia/toolkit/nvidia-container-runtime"), {},
     "toolkit", "GPU Operator toolkit is in /usr/local/nvidia/toolkit"),
    ("CDI spec missing", lambda s: _remove(s, CDI_SPEC), {}, "cdi", "no NVIDIA CDI spec"),
    ("CDI spec older than the driver", lambda s: s.write(CDI_SPEC, cdi_spec("570.86.15")), {}, "cdi",
     "made for another driver"),
    ("nvidia-cdi-refresh.path not enabled", lambda s: _remove(s, REFRESH_WANTS), {}, "cdi",
     "nvidia-cdi-refresh.path is not enabled"),
    ("nvidia-cdi-refresh missing from a toolkit that ships it", lambda s: _remove(s, REFRESH_WANTS, REFRESH_UNIT), {}, "cdi",
     "ships nvidia-cdi-refresh, but nvidia-cdi-refresh.path is not on the node"),
    ("a BinaryName that does not exist", lambda s: _remove(s, BINARIES[2]), {"existing_binaries": BINARIES[:2]},
     "containerd-config", "BinaryName /usr/bin/nvidia-container-runtime.legacy does not exist"),
    ("enable_cdi off in cdi-cri", _cdi_off, {"device_list_strategy": "cdi-cri"}, "containerd-config", "enable_cdi is off"),
    # the next two take the planned outcome as the action hands it over (the engine's own runs: molecule sandbox_doctor)
    ("the files differ from what the site writes (as planned)", lambda s: None,
     {"changes": [{"path": DROPIN, "action": "updated"}]}, "containerd-config", DROPIN + " would be updated"),
    ("an engine refusal with its own fix (as planned)", lambda s: None,
     {"refusal": {"cause": "%s: line 3: the table nvidia is emitted twice [duplicate_table]" % TEMPLATE,
                  "fix": "remove your table"}},
     "containerd-config", "emitted twice [duplicate_table]"),
    ("drift: the drop-in changed after k3s's last start", lambda s: _later(s, DROPIN), {}, "runtime-service",
     "drift: %s changed" % DROPIN),
    ("k3s not active", lambda s: None, {"services": {"k3s-agent": "failed"}}, "runtime-service", "k3s-agent is failed"),
    ("a driver whose version line cannot be read", lambda s: s.write("/proc/driver/nvidia/version", "NVRM version: \n"),
     {}, "driver", "the driver's version cannot be read from /proc/driver/nvidia/version"),
    ("nvidia-persistenced installed and failed", lambda s: None, {"services": {"nvidia-persistenced": "failed"}},
     "driver", "nvidia-persistenced is installed and failed"),
    ("operator mode without the operator's toolkit on the node", lambda s: None, {"mode": "operator"}, "toolkit",
     "the GPU Operator's toolkit is not on the node (/usr/local/nvidia/toolkit has no nvidia-container-runtime)"),
    ("k3s never started: no config.toml", lambda s: _remove(s, CONFIG), {}, "containerd-config",
     "%s does not exist: k3s/rke2 has not started on this node since it was installed" % CONFIG),
    ("a RuntimeClass handler containerd does not load", lambda s: None,
     {"handlers": ["nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental"]}, "containerd-config",
     "containerd's config lacks the handler(s) nvidia-experimental that the RuntimeClasses name"),
    ("fabric manager stopped on an NVSwitch board",
     lambda s: (s.write("/sys/bus/pci/devices/0000:05:00.0/vendor", "0x10de\n"),
                s.write("/sys/bus/pci/devices/0000:05:00.0/class", "0x068000\n")),
     {"services": {"nvidia-fabricmanager": "inactive"}}, "driver", "NVSwitch"),
]


@pytest.mark.parametrize("breaks,settings,layer,words", [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN])
def test_one_broken_layer_is_named_and_no_earlier_one(sandbox, breaks, settings, layer, words):
    healthy(sandbox)
    breaks(sandbox)
    report = diagnose(sandbox, **settings)
    passed, broken = layers(report)
    assert broken == layer, report
    assert passed == list(doctor.NODE_LAYERS[:doctor.NODE_LAYERS.index(layer)]), report
    assert words in report["broken"]["cause"], report["broken"]
    text = doctor.line(report)
    assert text.startswith("gpu1: BROKEN at %s: " % layer) and ". Fix: " in text and report["broken"]["fix"], text


def test_a_toolkit_package_without_its_runtime_binary_is_broken_at_toolkit_with_the_reinstall(sandbox):
    """Issue 41, item 15: containerd's nvidia runtime still names the binary the package lost; the fix is the package's
    reinstall (the role's install leaves an installed package alone), then the restart that makes containerd load it."""
    healthy(sandbox)
    _remove(sandbox, BINARIES[0])
    report = diagnose(sandbox)
    assert layers(report) == (["gpu", "driver"], "toolkit"), report
    assert "containerd's nvidia runtime still names /usr/bin/nvidia-container-runtime" in report["broken"]["cause"]
    assert report["broken"]["fix"].startswith("reinstall the toolkit's packages (apt-get install --reinstall "
                                              "nvidia-container-toolkit-base nvidia-container-toolkit")
    assert report["broken"]["fix"].endswith("then restart k3s-agent so that containerd loads the runtime again")


def test_an_extension_binary_that_is_gone_stays_a_containerd_config_finding(sandbox):
    """.cdi and .legacy come from nvidia-container-toolkit-operator-extensions, a package the reading does not name:
    the toolkit's own runtime is there, so the toolkit layer passes (the missing BinaryName case above)."""
    healthy(sandbox)
    _remove(sandbox, BINARIES[1])
    assert layers(diagnose(sandbox))[1] == "containerd-config"


def test_the_refresh_unit_is_not_asked_of_a_toolkit_before_1_18_nor_with_gpu_node_cdi_refresh_off(sandbox):
    healthy(sandbox)
    _remove(sandbox, REFRESH_WANTS)
    report = diagnose(sandbox, cdi_refresh=False)
    assert report["broken"] is None and "nvidia-cdi-refresh.path not enabled (gpu_node_cdi_refresh: false)" in \
        report["passed"][3]["detail"], report
    _remove(sandbox, REFRESH_UNIT)
    sandbox.write("/var/lib/dpkg/status", "Package: nvidia-container-toolkit-base\nStatus: install ok installed\n"
                                          "Version: 1.17.8-1\n")
    report = diagnose(sandbox, toolkit_version="1.17.8-1")
    assert report["broken"] is None and "no nvidia-cdi-refresh (toolkit 1.17.8-1)" in report["passed"][3]["detail"], report


def test_the_driver_layer_says_whether_the_dev_char_rule_keeps_the_links(sandbox):
    healthy(sandbox)
    assert "udev rule /etc/udev/rules.d/71-nvidia-dev-char.rules" in diagnose(sandbox)["passed"][1]["detail"]
    _remove(sandbox, "/etc/udev/rules.d/71-nvidia-dev-char.rules")
    assert "no udev rule: they go at the next reboot" in diagnose(sandbox)["passed"][1]["detail"]


def test_a_node_without_anything_of_a_gpu_is_not_a_gpu_node(sandbox):
    sandbox.k3s("k3s", "nothing")
    report = diagnose(sandbox)
    assert report["gpu_node"] is False and report["broken"] is None
    assert doctor.line(report) == "gpu1: no GPU (no NVIDIA device on the PCI bus, no driver, no NVIDIA runtime): not a GPU node"


def test_the_check_leaves_the_node_as_it_was(sandbox):
    healthy(sandbox)
    before = sandbox.snapshot()
    diagnose(sandbox)
    assert sandbox.snapshot() == before


def cluster_node(labels=None, capacity="1", allocatable="1"):
    status = {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}
    if capacity is not None:
        status["capacity"]["nvidia.com/gpu"] = capacity
        status["allocatable"]["nvidia.com/gpu"] = allocatable
    return {"metadata": {"name": "gpu1", "labels": {"nvidia.com/gpu.present": "true"} if labels is None else labels},
            "status": status}


CLASSES = [{"metadata": {"name": name}, "handler": name} for name in ("nvidia", "nvidia-cdi", "nvidia-legacy")]
PLUGIN_POD = {"metadata": {"name": "nvidia-device-plugin-x1", "namespace": "nvidia-device-plugin",
                           "labels": {"app.kubernetes.io/name": "nvidia-device-plugin"}},
              "spec": {"nodeName": "gpu1", "containers": [{"name": "plugin"}]},
              "status": {"phase": "Running", "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
RUNNING_PLUGIN = dict(PLUGIN_POD, status={"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]})
GPU_POD = {"metadata": {"name": "train"}, "spec": {"nodeName": "gpu1", "containers": [
    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}}


def node_report():
    return {"host": "gpu1", "gpu_node": True, "passed": [{"layer": layer, "detail": ""} for layer in doctor.NODE_LAYERS],
            "broken": None, "handlers": ["nvidia", "nvidia-cdi", "nvidia-legacy"], "labels": ["nvidia.com/gpu.present=true"]}


@pytest.mark.parametrize("cluster,layer,words", [
    ({"classes": CLASSES[:2], "nodes": [cluster_node()]}, "runtimeclass", "no RuntimeClass has the handler(s) nvidia-legacy"),
    ({"classes": [dict(CLASSES[0], scheduling={"nodeSelector": {"k3s-gpu.nvidia/handler.nvidia": "true"}})] + CLASSES[1:],
      "nodes": [cluster_node()]}, "runtimeclass", "RuntimeClass nvidia selects nodes labelled k3s-gpu.nvidia/handler.nvidia=true"),
    ({"classes": CLASSES, "nodes": [cluster_node(labels={})]}, "runtimeclass", "lacks the label(s) nvidia.com/gpu.present=true"),
    ({"classes": CLASSES, "nodes": [cluster_node(capacity=None)]}, "device-plugin", "no device plugin has registered"),
    ({"classes": CLASSES, "nodes": [cluster_node(capacity=None)], "pods": [PLUGIN_POD]}, "device-plugin",
     "nvidia-device-plugin-x1 on the node is Running (CrashLoopBackOff)"),
    ({"classes": CLASSES, "nodes": [cluster_node(capacity="2", allocatable="0")]}, "device-plugin",
     "capacity 2, allocatable 0 and no device plugin pod running"),
    ({"classes": CLASSES, "nodes": [cluster_node(capacity="0", allocatable="0")]}, "device-plugin", "registered nvidia.com/gpu once"),
    ({"classes": CLASSES, "nodes": [cluster_node(capacity="2", allocatable="0")], "pods": [RUNNING_PLUGIN]}, "allocatable",
     "allocatable nvidia.com/gpu is 0 (capacity 2) while the device plugin runs"),
    ({"classes": CLASSES, "nodes": []}, "runtime-service", "the node gpu1 is not in the cluster"),
    ({"classes": CLASSES, "nodes": [cluster_node()], "pods": [GPU_POD]}, None, None),
])
def test_the_cluster_layers_of_a_node(cluster, layer, words):
    report = doctor.check_cluster(node_report(), "gpu1", cluster)
    assert report["cluster_checked"] and (report["broken"] or {}).get("layer") == layer, report
    if layer:
        assert words in report["broken"]["cause"], report["broken"]
    else:
        assert report["passed"][-1] == {"layer": "allocatable", "detail": "allocatable nvidia.com/gpu 1, 1 in use"}
        assert doctor.line(report) == "gpu1: OK"


def test_a_node_broken_on_the_node_is_not_checked_in_the_cluster():
    report = dict(node_report(), broken={"layer": "driver", "cause": "x", "fix": "y"})
    assert doctor.check_cluster(report, "gpu1", {"classes": [], "nodes": []}).get("cluster_checked") is not True


def test_an_engine_refusal_keeps_its_own_fix_once(sandbox):
    healthy(sandbox)
    report = diagnose(sandbox, refusal={"cause": "%s: line 3: the table nvidia is emitted twice [duplicate_table]" % TEMPLATE,
                                        "fix": "remove your table"})
    assert report["broken"]["fix"] == "remove your table"
    assert doctor.line(report).count("Fix: ") == 1


def test_a_node_that_could_not_be_read_fails_at_the_first_layer_and_says_so():
    report = doctor.unread("gpu9", "unreachable")
    assert report["broken"]["layer"] == "gpu" and report["passed"] == []
    assert doctor.line(report).startswith("gpu9: BROKEN at gpu: the node could not be read, nothing was checked: unreachable")


# ------------------------------------------------------------------ the pod layer (doctor_run_pod)
def checked_report():
    return doctor.check_cluster(node_report(), "gpu1", {"classes": CLASSES, "nodes": [cluster_node()]})


def smoke_pod(runtimeclass, phase, exit_code=None):
    pod = verify.smoke_pods({"pairs": [["gpu1", runtimeclass]]}, "k3s-gpu-doctor", "busybox")[0]
    pod["spec"]["nodeName"] = "gpu1"
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
    pod["status"] = {"phase": phase, "containerStatuses": [{"state": state}]}
    return pod


def test_the_pod_layer_runs_one_pod_per_handler_on_nodes_whose_layers_passed():
    broken = dict(node_report(), host="gpu2", broken={"layer": "driver", "cause": "x", "fix": "y"})
    legacy_elsewhere = [{"metadata": {"name": "legacy"}, "handler": "nvidia-legacy"}]
    pairs = doctor.pod_pairs([checked_report(), broken], {"gpu1": "node-1"}, {"classes": legacy_elsewhere + CLASSES})
    assert pairs == [["node-1", "nvidia"], ["node-1", "nvidia-cdi"], ["node-1", "nvidia-legacy"]]
    assert doctor.pod_pairs([node_report()], {}, {"classes": CLASSES}) == []  # the cluster was not checked


def test_the_pod_layer_passes_with_what_each_pod_saw():
    pods = [smoke_pod("nvidia", "Succeeded", 0), smoke_pod("nvidia-cdi", "Succeeded", 0)]
    logs = {pods[0]["metadata"]["name"]: ["/dev/nvidia0", "GPU 0: NVIDIA H200 (UUID: GPU-1)"],
            pods[1]["metadata"]["name"]: ["/dev/nvidia1", "GPU 1: NVIDIA H200 (UUID: GPU-2)"]}
    report = doctor.check_pods(checked_report(), "gpu1", pods, [], logs)
    assert report["broken"] is None and report["passed"][-1] == {
        "layer": "pod", "detail": "nvidia: GPU 0: NVIDIA H200 (UUID: GPU-1); nvidia-cdi: GPU 1: NVIDIA H200 (UUID: GPU-2)"}
    assert doctor.line(report) == "gpu1: OK"


@pytest.mark.parametrize("pods,words", [
    ([smoke_pod("nvidia", "Succeeded", 0), smoke_pod("nvidia-cdi", "Failed", 12)],
     "RuntimeClass nvidia-cdi and nvidia.com/gpu: 1 did not get its GPU (the toolkit layer, as the pod shows it): "
     "libnvidia-ml.so is not in the pod"),
    ([smoke_pod("nvidia", "Pending")], "still Pending when the wait ended"),
    ([], "no smoke pod was found for the node"),
])
def test_a_pod_that_does_not_get_its_gpu_breaks_the_pod_layer(pods, words):
    report = doctor.check_pods(checked_report(), "gpu1", pods, [], {})
    assert report["broken"]["layer"] == "pod" and words in report["broken"]["cause"], report["broken"]
    assert [p["layer"] for p in report["passed"]] == list(doctor.NODE_LAYERS + doctor.CLUSTER_LAYERS[:-1])


def test_the_pod_layer_leaves_a_node_broken_earlier_as_it_was():
    report = dict(node_report(), broken={"layer": "cdi", "cause": "x", "fix": "y"})
    assert doctor.check_pods(report, "gpu1", [], [], {})["broken"]["layer"] == "cdi"


# ------------------------------------------------------------------ operator mode: the GPU Operator's own objects
POLICY = {"metadata": {"name": "cluster-policy"}, "status": {"state": "ready"}}


def operator_pod(app, phase="Running", state=None, init=None):
    status = {"phase": phase, "containerStatuses": [{"state": state or {"running": {}}}]}
    if init is not None:
        status["initContainerStatuses"] = [{"name": name, "state": st} for name, st in init]
    return {"metadata": {"name": app + "-x1", "namespace": "gpu-operator", "labels": {"app": app}},
            "spec": {"nodeName": "gpu1"}, "status": status}


PASSED = {"terminated": {"exitCode": 0}}
VALIDATOR_OK = operator_pod("nvidia-operator-validator", init=[(n, PASSED) for n, _l in doctor.OPERATOR_VALIDATIONS])
OPERATOR_PLUGIN = operator_pod("nvidia-device-plugin-daemonset")


def operator_report(broken=None):
    report = dict(node_report(), mode="operator", operator_namespace="gpu-operator", handlers=["nvidia"], labels=[])
    if broken:
        report["passed"] = report["passed"][:doctor.NODE_LAYERS.index(broken)]
        report["broken"] = {"layer": broken, "cause": "the GPU Operator's toolkit is not on the node", "fix": "look"}
    return report


def operator_cluster(policies=(POLICY,), pods=(VALIDATOR_OK, OPERATOR_PLUGIN)):
    return {"classes": CLASSES, "nodes": [cluster_node(labels={})], "policies": list(policies), "pods": list(pods)}


@pytest.mark.parametrize("cluster,layer,words", [
    (operator_cluster(policies=()), "toolkit", "no ClusterPolicy in the cluster"),
    (operator_cluster(pods=(operator_pod("nvidia-container-toolkit-daemonset", "Pending",
                                         {"waiting": {"reason": "ImagePullBackOff"}}),)),
     "toolkit", "nvidia-container-toolkit-daemonset pod nvidia-container-toolkit-daemonset-x1 on the node is Pending "
                "(ImagePullBackOff)"),
    (operator_cluster(pods=(operator_pod("nvidia-operator-validator", "Pending", init=[
        ("driver-validation", PASSED), ("toolkit-validation", PASSED),
        ("cuda-validation", {"terminated": {"exitCode": 1, "reason": "Error"}})]),)),
     "pod", "has not passed cuda-validation: Error (exit code 1)"),
    (operator_cluster(policies=(dict(POLICY, status={"state": "notReady"}),)), "toolkit", "ClusterPolicy cluster-policy is notReady"),
    (operator_cluster(), None, None),
])
def test_operator_mode_checks_the_operators_own_objects(cluster, layer, words):
    report = doctor.check_cluster(operator_report(), "gpu1", cluster)
    assert (report["broken"] or {}).get("layer") == layer, report
    if layer:
        assert words in report["broken"]["cause"] and report["broken"]["fix"].startswith(("kubectl", "k3s_gpu")), report
    else:
        assert "the GPU Operator: ClusterPolicy cluster-policy ready" in report["passed"][2]["detail"]
        assert report["passed"][-1]["layer"] == "allocatable"


def test_operator_mode_explains_a_node_layer_the_operator_owns_with_its_objects():
    cluster = operator_cluster(pods=(operator_pod("nvidia-container-toolkit-daemonset", "Running",
                                                  {"waiting": {"reason": "CrashLoopBackOff"}}),))
    report = doctor.check_cluster(operator_report(broken="toolkit"), "gpu1", cluster)
    assert report["broken"]["layer"] == "toolkit" and report["broken"]["cause"] == (
        "the GPU Operator's toolkit is not on the node; the GPU Operator's objects say: the GPU Operator's "
        "nvidia-container-toolkit-daemonset pod nvidia-container-toolkit-daemonset-x1 on the node is Running (CrashLoopBackOff)")
    assert report["broken"]["fix"] == "kubectl -n gpu-operator logs nvidia-container-toolkit-daemonset-x1 --all-containers"


def test_the_operators_device_plugin_serves_the_device_plugin_layer_but_its_validator_does_not():
    cluster = {"classes": CLASSES, "nodes": [cluster_node(capacity="2", allocatable="0")], "policies": [POLICY],
               "pods": [VALIDATOR_OK, OPERATOR_PLUGIN]}
    assert doctor.check_cluster(operator_report(), "gpu1", cluster)["broken"]["layer"] == "allocatable"
    cluster["pods"] = [VALIDATOR_OK, operator_pod("nvidia-device-plugin-validator")]
    assert doctor.check_cluster(operator_report(), "gpu1", cluster)["broken"]["layer"] == "device-plugin"


def test_the_pod_layer_keeps_to_the_runtimeclasses_named():
    assert doctor.pod_pairs([checked_report()], {}, {"classes": CLASSES}, ["nvidia-cdi"]) == [["gpu1", "nvidia-cdi"]]


# ------------------------------------------------------------------ DRA (gpu_node_allocation=dra, issue 45)
DRA_LABELS = {"k3s-gpu.nvidia/gpu-allocation": "dra", "nvidia.com/gpu.present": "true"}
GPU_SLICE = {"spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu1", "pool": {"name": "gpu1"},
                      "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}
OTHER_NODES_SLICE = {"spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu2", "devices": [{"name": "gpu-0"}]}}
GPU_CLASS = {"metadata": {"name": "gpu.nvidia.com"}}


def dra_report():
    return dict(node_report(), allocation="dra", labels=["k3s-gpu.nvidia/gpu-allocation=dra", "nvidia.com/gpu.present=true"])


def dra_cluster(**changes):
    cluster = {"classes": CLASSES, "nodes": [cluster_node(capacity=None, labels=DRA_LABELS)], "dra_api": True,
               "resourceslices": [GPU_SLICE], "deviceclasses": [GPU_CLASS]}
    cluster.update(changes)
    return cluster


@pytest.mark.parametrize("changes,layer,words", [
    ({"dra_api": False}, "dra-api", "does not serve resource.k8s.io/v1"),
    ({"resourceslices": [OTHER_NODES_SLICE]}, "dra-driver",
     "no ResourceSlice of the driver gpu.nvidia.com publishes a device of this node"),
    ({"deviceclasses": []}, "deviceclass", "there is no DeviceClass gpu.nvidia.com"),
    ({"nodes": [cluster_node(capacity="2", labels=DRA_LABELS)]}, "dra-conflict",
     "a device plugin advertises nvidia.com/gpu (capacity 2) and NVIDIA's DRA driver publishes 2 device(s)"),
    ({"nodes": [cluster_node(capacity=None, labels={"nvidia.com/gpu.present": "true"})]}, "runtimeclass",
     "lacks the label(s) k3s-gpu.nvidia/gpu-allocation=dra that the DRA driver's HelmChart selects"),
    ({}, None, None),
])
def test_the_dra_layers_of_a_dra_node(changes, layer, words):
    report = doctor.check_cluster(dra_report(), "gpu1", dra_cluster(**changes))
    assert (report["broken"] or {}).get("layer") == layer, report
    if layer:
        assert words in report["broken"]["cause"], report["broken"]
    else:
        assert [p["layer"] for p in report["passed"]][-5:] == ["runtimeclass", "dra-api", "dra-conflict", "dra-driver",
                                                               "deviceclass"]
        assert report["passed"][-1]["detail"].startswith("DeviceClass gpu.nvidia.com; a pod asking nvidia.com/gpu: 1 "
                                                         "stays Pending: its kubelet is unknown")
        assert doctor.line(report) == "gpu1: OK"


def with_kubelet(node, version):
    return dict(node, status=dict(node["status"], nodeInfo={"kubeletVersion": version}))


@pytest.mark.parametrize("version,device_class,words", [
    ("v1.36.3+k3s1", dict(GPU_CLASS, spec={"extendedResourceName": "nvidia.com/gpu"}), "is served through DRA"),
    ("v1.34.2+k3s1", dict(GPU_CLASS, spec={"extendedResourceName": "nvidia.com/gpu"}),
     "stays Pending: its kubelet is v1.34.2+k3s1: Kubernetes serves nvidia.com/gpu through DRA from 1.36"),
    ("v1.36.3", GPU_CLASS, "stays Pending: DeviceClass gpu.nvidia.com names none as its extended resource"),
])
def test_the_deviceclass_layer_says_whether_the_seeds_pod_is_served_through_dra(version, device_class, words):
    """Issue 45 c: on 1.36 a pod asking nvidia.com/gpu: 1 is served through DRA where the DeviceClass names it; on
    1.34 it stays Pending, and the doctor says why."""
    cluster = dra_cluster(nodes=[with_kubelet(cluster_node(capacity=None, labels=DRA_LABELS), version)],
                          deviceclasses=[device_class])
    report = doctor.check_cluster(dra_report(), "gpu1", cluster)
    assert not report.get("broken") and words in report["passed"][-1]["detail"], report


CLAIM_POD_CLAIMS = [{"metadata": {"name": "claim-1"}, "status": {"allocation": {"devices": {"results": [
    {"driver": "gpu.nvidia.com", "pool": "gpu1", "device": "gpu-1", "request": "gpu"}]}}}}]


def ended_claim_pod(runtimeclass, log_name):
    pod = verify.claim_pod("gpu1", runtimeclass, "k3s-gpu-doctor", "busybox")
    pod["metadata"]["name"] = log_name
    pod["spec"]["nodeName"] = "gpu1"
    pod["status"] = {"phase": "Succeeded", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "claim-1"}]}
    return pod


@pytest.mark.parametrize("seen,layer", [(["/dev/nvidia1", "GPU 1: NVIDIA A100"], None),
                                        (["/dev/nvidia0", "/dev/nvidia1", "GPU 0: x", "GPU 1: y"], "claim")])
def test_the_claim_layer_of_a_dra_node_wants_exactly_its_claims_device(seen, layer):
    """Issue 45 item 5: the claim pods (a RuntimeClass, and none) ran; each must see exactly the device its claim was
    allocated, or the node is broken at claim (a runtime that gives the pod every GPU hands one out twice)."""
    report = doctor.check_cluster(dra_report(), "gpu1", dra_cluster())
    pods = [ended_claim_pod("nvidia", "a"), ended_claim_pod("", "b")]
    doctor.check_pods(report, "gpu1", pods, [], {"a": seen, "b": seen}, CLAIM_POD_CLAIMS)
    assert (report.get("broken") or {}).get("layer") == layer, report
    if layer:
        assert "sees 2 GPU device(s) (/dev/nvidia0 /dev/nvidia1) while its claim was allocated gpu.nvidia.com " \
               "gpu1/gpu-1" in report["broken"]["cause"], report["broken"]
    else:
        detail = report["passed"][-1]
        assert detail["layer"] == "claim" and detail["detail"] == (
            "no RuntimeClass: claim gpu.nvidia.com gpu1/gpu-1 | /dev/nvidia1 | GPU 1: NVIDIA A100; "
            "nvidia: claim gpu.nvidia.com gpu1/gpu-1 | /dev/nvidia1 | GPU 1: NVIDIA A100"), detail


def test_the_claim_pods_of_a_dra_node_are_one_per_class_it_serves_and_one_without():
    report = doctor.check_cluster(dra_report(), "gpu1", dra_cluster())
    report["handlers"] = ["nvidia", "nvidia-cdi"]
    assert doctor.claim_pairs([report], {}, dra_cluster()) == [["gpu1", ""], ["gpu1", "nvidia"], ["gpu1", "nvidia-cdi"]]
    assert doctor.pod_pairs([report], {}, dra_cluster()) == []


def test_a_device_plugin_node_that_the_dra_driver_also_serves_is_a_conflict():
    cluster = {"classes": CLASSES, "nodes": [cluster_node()], "resourceslices": [GPU_SLICE], "dra_api": True}
    report = doctor.check_cluster(node_report(), "gpu1", cluster)
    assert report["broken"]["layer"] == "dra-conflict" and "both hand out the same GPUs" in report["broken"]["cause"]
