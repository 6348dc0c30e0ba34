# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The doctor's and verify's actions on the controller: the doctor's report (lines, JSON file, failure), its pod
layer's choice and merge, a bad argument refused by name; verify's wait on pods read through kubernetes.core.k8s_info
(a recorded sequence of API answers stands in for the API server; the real one runs in tests/cluster)."""

from __future__ import annotations

import json
import os
import stat
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_doctor
from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_verify
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _doctor as doctor
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins import kubeconfig_lab as lab
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import make_action

CLASSES = [{"metadata": {"name": name}, "handler": name} for name in ("nvidia", "nvidia-cdi")]
FOUND_KUBERNETES_CORE = gpu_verify.kubernetes_core_installed  # the tests below stand in for it
NODE = {"metadata": {"name": "gpu1", "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}}


def make(module, args):
    return make_action(module, args)


def node_result(broken=None):
    passed = [{"layer": layer, "detail": "fine"} for layer in doctor.NODE_LAYERS]
    if broken:
        passed = passed[:doctor.NODE_LAYERS.index(broken)]
    return {"doctor": {"host": "gpu1", "gpu_node": True, "passed": passed, "handlers": ["nvidia", "nvidia-cdi"],
                       "labels": ["nvidia.com/gpu.present=true"], "cluster_checked": False,
                       "broken": {"layer": broken, "cause": "it broke", "fix": "mend it"} if broken else None}}


def doctor_run(tmp_path, **args):
    args.setdefault("report_path", str(tmp_path / "report.json"))
    return make(gpu_doctor, args).run(task_vars={})


def test_a_healthy_node_is_ok_and_the_report_is_written_for_its_owner_only(tmp_path):
    result = doctor_run(tmp_path, results={"gpu1": node_result(), "cpu1": {}}, cluster={"classes": CLASSES, "nodes": [NODE]})
    assert result["lines"] == ["gpu1: OK"] and not result.get("failed") and result["broken"] == []
    document = json.loads((tmp_path / "report.json").read_text())
    assert [n["status"] for n in document["nodes"]] == ["OK"] and document["layers"] == list(doctor.LAYERS)
    assert stat.S_IMODE(os.stat(tmp_path / "report.json").st_mode) == 0o600


def test_a_broken_node_fails_the_task_unless_fail_is_false(tmp_path):
    result = doctor_run(tmp_path, results={"gpu1": node_result("cdi")}, cluster_why="doctor_cluster is false")
    assert result["failed"] and result["lines"] == ["gpu1: BROKEN at cdi: it broke. Fix: mend it"]
    assert not doctor_run(tmp_path, results={"gpu1": node_result("cdi")}, fail=False).get("failed")


def test_an_unreachable_host_is_broken_at_its_first_layer(tmp_path):
    result = doctor_run(tmp_path, results={"gpu1": {"unreachable": True, "msg": "ssh: timed out"}}, fail=False)
    assert result["lines"] == ["gpu1: BROKEN at gpu: the node could not be read, nothing was checked: unreachable. Fix: "
                               "mend what the message names (reachability, gpu_node_* variables), then run the doctor again"]


def test_the_pod_layer_is_chosen_then_merged(tmp_path):
    cluster = {"classes": CLASSES, "nodes": [NODE]}
    chosen = doctor_run(tmp_path, phase="choose", results={"gpu1": node_result()}, cluster=cluster, namespace="ns")
    assert chosen["pairs"] == [["gpu1", "nvidia"], ["gpu1", "nvidia-cdi"]]
    assert [p["metadata"]["namespace"] for p in chosen["pods"]] == ["ns", "ns"]
    assert not (tmp_path / "report.json").exists()  # choosing writes nothing
    pods = chosen["pods"]
    for pod, phase, code in ((pods[0], "Succeeded", 0), (pods[1], "Failed", 14)):
        pod["spec"]["nodeName"] = "gpu1"
        pod["status"] = {"phase": phase, "containerStatuses": [{"state": {"terminated": {"exitCode": code}}}]}
    logs = [{"item": pods[0], "log_lines": ["GPU 0: NVIDIA H200 (UUID: GPU-1)"]},
            {"item": pods[1], "log_lines": ["%s nvidia-smi -L failed" % verify.MARK]}]
    result = doctor_run(tmp_path, results={"gpu1": node_result()}, cluster=cluster, pods=pods, logs=logs, fail=False)
    assert result["lines"][0].startswith("gpu1: BROKEN at pod: the pod with RuntimeClass nvidia-cdi and nvidia.com/gpu: 1 "
                                         "did not get its GPU (the driver layer, as the pod shows it): nvidia-smi -L failed")


def test_a_bad_phase_is_refused_by_name(tmp_path):
    with pytest.raises(AnsibleActionFail, match="value of phase must be one of: choose, report, got: bogus"):
        doctor_run(tmp_path, phase="bogus", results={})


def test_a_report_path_that_cannot_be_written_is_named(tmp_path):
    with pytest.raises(AnsibleActionFail, match="doctor_report_path %s: cannot write the report" % (tmp_path / "no" / "r.json")):
        doctor_run(tmp_path, results={"gpu1": node_result()}, report_path=str(tmp_path / "no" / "r.json"))


# ------------------------------------------------------------------ verify's wait
def smoke(phase, state):
    pod = verify.smoke_pods({"pairs": [["gpu1", "nvidia"]]}, "k3s-gpu-verify", "busybox")[0]
    pod["spec"]["nodeName"] = "gpu1"
    pod["status"] = {"phase": phase, "containerStatuses": [{"state": state}]}
    return pod


def wait_on(answers, timeout=60, events=()):
    """Runs the wait phase against `answers`: one list of pods per poll, with `events` in every poll; returns (result,
    reads)."""
    action = make(gpu_verify, {"phase": "wait", "namespace": "k3s-gpu-verify", "expected": 1, "timeout": timeout})
    reads = []

    def execute(module_name, module_args, task_vars):
        reads.append((module_name, module_args["kind"], module_args.get("label_selectors")))
        if module_args["kind"] == "Event":
            return {"resources": list(events)}
        return {"resources": answers[min(len([r for r in reads if r[1] == "Pod"]) - 1, len(answers) - 1)]}

    action._execute_module = execute
    with mock.patch.object(gpu_verify.time, "sleep"):
        return action.run(task_vars={}), reads


def test_the_wait_polls_until_every_pod_has_ended():
    result, reads = wait_on([[smoke("Pending", {"waiting": {"reason": "ContainerCreating"}})],
                             [smoke("Running", {"running": {}})], [smoke("Succeeded", {"terminated": {"exitCode": 0}})]])
    assert [p["status"]["phase"] for p in result["pods"]] == ["Succeeded"]
    assert [r for r in reads if r[1] == "Pod"] == [("kubernetes.core.k8s_info", "Pod", [verify.LABEL_SELECTOR])] * 3


def test_the_wait_ends_at_its_timeout_with_what_it_saw():
    with mock.patch.object(gpu_verify.time, "monotonic", side_effect=[0, 0, 5, 11, 11]):
        result, _reads = wait_on([[smoke("Pending", {"waiting": {"reason": "ContainerCreating"}})]], timeout=10)
    assert [p["status"]["phase"] for p in result["pods"]] == ["Pending"] and result["waited_seconds"] == 11


SANDBOX_FAILED = {"involvedObject": {"kind": "Pod", "name": "gpu-nvidia-gpu1"}, "reason": "FailedCreatePodSandBox",
                  "message": "failed to create containerd task: ... no such file or directory"}


def test_a_pod_whose_sandbox_failed_once_is_polled_until_kubelets_retry_brings_it_up():
    """kubelet retries a failed sandbox 10 to 15 s later; its FailedCreatePodSandBox event stays behind."""
    creating = smoke("Pending", {"waiting": {"reason": "ContainerCreating"}})
    creating["metadata"]["name"] = "gpu-nvidia-gpu1"
    creating["status"]["conditions"] = [{"type": "PodReadyToStartContainers", "status": "False"}]
    done = smoke("Succeeded", {"terminated": {"exitCode": 0}})
    done["metadata"]["name"] = "gpu-nvidia-gpu1"
    # polls at 0, 7 and 14 s see the failure; the retry at 15 s brings the sandbox up
    with mock.patch.object(gpu_verify.time, "monotonic", side_effect=[0, 0, 7, 14, 16, 17]):
        result, _reads = wait_on([[creating]] * 3 + [[smoke("Running", {"running": {}})], [done]], events=[SANDBOX_FAILED])
    assert [p["status"]["phase"] for p in result["pods"]] == ["Succeeded"] and result["waited_seconds"] == 17


def test_a_pod_whose_sandbox_fails_for_stuck_seconds_ends_the_wait_before_its_timeout():
    creating = smoke("Pending", {"waiting": {"reason": "ContainerCreating"}})
    creating["metadata"]["name"] = "gpu-nvidia-gpu1"
    with mock.patch.object(gpu_verify.time, "monotonic", side_effect=[0, 0, 10, gpu_verify.STUCK_SECONDS]):
        result, _reads = wait_on([[creating]], timeout=300, events=[SANDBOX_FAILED])
    assert result["waited_seconds"] == gpu_verify.STUCK_SECONDS
    assert verify.diagnose(result["pods"][0], result["events"])["broken"]["layer"] == "toolkit"


def test_a_failed_read_is_the_tasks_failure_in_one_line():
    action = make(gpu_verify, {"phase": "wait", "namespace": "k3s-gpu-verify", "expected": 1})
    action._execute_module = lambda module_name, module_args, task_vars: {"failed": True, "msg": "Unauthorized"}
    result = action.run(task_vars={})
    assert result["failed"] and result["msg"] == (
        "reading the Pods failed: the API server refuses the kubeconfig's credentials (401 Unauthorized). Fix: %s"
        % verify.FIX_CREDENTIALS)


# ------------------------------------------------------------------ the kubeconfig (issue 41)
@pytest.fixture(name="core_installed", autouse=True)
def fixture_core_installed(monkeypatch):
    """kubernetes.core is installed, unless a test says otherwise (the unit tests run without it)."""
    installed = mock.Mock(return_value=True)
    monkeypatch.setattr(gpu_verify, "kubernetes_core_installed", installed)
    return installed


def with_kubeconfig(args, answers=None):
    """The action for a task with a kubeconfig; k8s_info answers from `answers` ({kind: result}); returns (action,
    reads)."""
    action = make(gpu_verify, args)
    reads = []

    def execute(module_name, module_args, task_vars):
        reads.append(dict(module_args, module=module_name))
        return (answers or {}).get(module_args["kind"], {"resources": []})

    action._execute_module = execute
    return action, reads


def one_line(result, path):
    assert result["failed"] and result["msg"], result
    assert "\n" not in result["msg"] and result["msg"].startswith("kubeconfig %s: " % path), result["msg"]
    assert result["msg"].count(". Fix: ") == 1 and lab.SECRET_TOKEN not in result["msg"]
    return result["msg"]


@pytest.mark.parametrize("phase", ["connect", "choose", "wait"])
def test_a_kubeconfig_that_does_not_exist_fails_before_any_read(tmp_path, phase):
    path = str(tmp_path / "k3s.yaml")
    action, reads = with_kubeconfig({"phase": phase, "kubeconfig": path})
    assert ": no such file. Fix: set k3s_gpu_kubeconfig" in one_line(action.run(task_vars={}), path) and reads == []


@pytest.mark.parametrize("phase", ["connect", "choose"])
def test_a_kubeconfig_whose_server_is_down_fails_before_any_read(tmp_path, phase):
    path = lab.kubeconfig(tmp_path, lab.closed_port_url())
    action, reads = with_kubeconfig({"phase": phase, "kubeconfig": path})
    assert "refuses connections" in one_line(action.run(task_vars={}), path) and reads == []


@pytest.fixture(name="api_server")
def fixture_api_server(tmp_path):
    authority = lab.Authority()
    with lab.TlsServer(authority.server(tmp_path)) as server:
        yield lab.kubeconfig(tmp_path, server.url, authority.pem)


def test_without_kubernetes_core_the_failure_says_what_to_install(api_server, core_installed):
    core_installed.return_value = False
    action, reads = with_kubeconfig({"phase": "choose", "kubeconfig": api_server})
    result = action.run(task_vars={})
    assert result["failed"] and reads == [] and result["msg"] == (
        "the kubernetes.core collection, whose modules read the cluster, is not installed on the controller. Fix: "
        "ansible-galaxy collection install kubernetes.core, and pip install kubernetes into the Python that runs "
        "localhost's modules (ansible_python_interpreter)")


def test_connect_checks_a_working_kubeconfig_and_reads_nothing(api_server, core_installed):
    # the doctor's check before it reads the cluster: a trusted server passes quietly, kubernetes.core missing does not
    action, reads = with_kubeconfig({"phase": "connect", "kubeconfig": api_server})
    result = action.run(task_vars={})
    assert not result.get("failed") and "msg" not in result and reads == []
    core_installed.return_value = False
    action, reads = with_kubeconfig({"phase": "connect", "kubeconfig": api_server})
    result = action.run(task_vars={})
    assert result["failed"] and "ansible-galaxy collection install kubernetes.core" in result["msg"] and reads == []


def test_choose_with_a_kubeconfig_reads_the_runtimeclasses_and_nodes_itself(api_server):
    action, reads = with_kubeconfig({"phase": "choose", "kubeconfig": api_server},
                                    answers={"RuntimeClass": {"resources": CLASSES}, "Node": {"resources": [NODE]}})
    result = action.run(task_vars={})
    assert not result.get("failed") and result["pairs"] == [["gpu1", "nvidia"], ["gpu1", "nvidia-cdi"]]
    assert reads == [{"module": "kubernetes.core.k8s_info", "kind": "RuntimeClass", "api_version": "node.k8s.io/v1",
                      "kubeconfig": api_server},
                     {"module": "kubernetes.core.k8s_info", "kind": "Node", "kubeconfig": api_server}]


def test_a_read_that_fails_after_the_check_is_one_line_not_the_clients_text(api_server):
    missing = {"failed": True, "msg": "Failed to import the required Python library (kubernetes) on ctl's Python "
                                      "/usr/bin/python3. Please read the module documentation and install it"}
    action, _reads = with_kubeconfig({"phase": "choose", "kubeconfig": api_server}, answers={"RuntimeClass": missing})
    line = one_line(action.run(task_vars={}), api_server)
    assert line == ("kubeconfig %s: reading the RuntimeClasses failed: the Python kubernetes client that kubernetes.core "
                    "needs is not installed in /usr/bin/python3. Fix: pip install kubernetes into that Python (localhost's "
                    "ansible_python_interpreter)" % api_server)
    assert "Failed to import" not in line


# ------------------------------------------------------------------ verify's failures
def test_verify_with_nothing_to_test_fails_with_what_it_found():
    result = make(gpu_verify, {"phase": "choose", "classes": CLASSES, "nodes": []}).run(task_vars={})
    assert result["failed"] and result["pods"] == []
    assert result["msg"][-1] == ("Nothing to test: 2 NVIDIA RuntimeClasses (nvidia, nvidia-cdi) and 0 nodes with "
                                 "allocatable nvidia.com/gpu (none).")
    assert result["msg"][:-1] == result["lines"]


def test_a_smoke_pod_that_did_not_see_its_gpu_fails_the_report_by_node_and_class():
    pod = smoke("Failed", {"terminated": {"exitCode": 127, "reason": "Error"}})
    logs = [{"item": {"metadata": {"name": pod["metadata"]["name"]}}, "log_lines": ["sh: nvidia-smi: not found"]}]
    result = make(gpu_verify, {"phase": "report", "pods": [pod], "logs": logs, "expected": 1,
                               "allocatable": {"gpu1": 2}}).run(task_vars={})
    assert result["failed"] and result["failed_pods"] == ["gpu1 / nvidia (pod)"]
    assert result["msg"][0].startswith("gpu1 / nvidia: BROKEN at pod: the container did not start: exit code 127. Fix: ")
    assert result["msg"][-1] == "GPU smoke test failed: gpu1 / nvidia (pod)"


def test_a_read_whose_failure_ansible_keeps_as_its_exception_is_read_from_there(api_server):
    """ansible-core 2.19 hands a module's exception over without a msg: its message is in the captured error."""
    captured = mock.Mock(event=mock.Mock(msg="HTTPSConnectionPool(host='127.0.0.1', port=6443): Max retries exceeded with "
                                             "url: /version (Caused by ProtocolError('Connection aborted.'))"))
    action, _reads = with_kubeconfig({"phase": "choose", "kubeconfig": api_server},
                                     answers={"RuntimeClass": {"failed": True, "exception": captured}})
    line = one_line(action.run(task_vars={}), api_server)
    assert line == "kubeconfig %s: reading the RuntimeClasses failed: the API server is unreachable. Fix: %s" % (
        api_server, verify.FIX_SERVER)


@pytest.mark.parametrize("find_spec,installed", [
    (mock.Mock(side_effect=ModuleNotFoundError("No module named 'ansible_collections.kubernetes'")), False),
    (mock.Mock(return_value=None), False), (mock.Mock(return_value=mock.Mock()), True)],
    ids=["no kubernetes namespace", "no core in it", "installed"])
def test_kubernetes_core_is_looked_for_quietly_where_ansible_loads_collections(find_spec, installed):
    with mock.patch.object(gpu_verify.importlib.util, "find_spec", find_spec):
        assert FOUND_KUBERNETES_CORE() is installed
    find_spec.assert_called_once_with("ansible_collections.kubernetes.core")
