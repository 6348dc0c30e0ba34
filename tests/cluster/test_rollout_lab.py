# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The safe rollout (issue 43) against the cluster lab's real API server, scheduler, kubelet and Eviction API.

The role runs against the lab's node as the cluster_lab scenario does (its sandbox tree, the lab's kubeconfig), through
its drain entry point and k3s_gpu.nvidia.site. Faked, because it cannot run here: the GPU and the driver (the lab's),
the disruptive change itself (a TEST DOUBLE command between the drain and the proof: a driver upgrade cannot run
here), and the k3s restart (the lab restarts its containerd with the node's new drop-in, as k3s does at its start).
The GPU workloads hold the node's device files open (through a hostPath of the node tree's /dev), as a CUDA process
holds /dev/nvidia*, so that the drain's wait for free devices has processes to wait for.

a. a budget (minAvailable 1) holds the drain until its timeout: the bare GPU pod is evicted, the node is uncordoned
   and nothing is changed; with the budget satisfied the drain proceeds;
b. the happy path: cordoned during the change (read from the API by the change), proved by a GPU pod, uncordoned; a
   second pass of site cordons nothing;
c. a change that breaks the nvidia handler: the canary stays cordoned with the layer on its annotation, the run stops,
   the next node is untouched, the summary and doctor name the same layer; the next run finishes it;
d. kill -9 while the node is cordoned: the next site run finds it by its annotation, proves it, uncordons it;
e. a non-disruptive change (the containerd config): no cordon, no eviction, the GPU pods' containers survive the
   restart (their IDs unchanged).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from . import clusterlab
from .test_cluster_lab import LINES, Lab, host_snapshot

ROOT = clusterlab.ROOT
CHANGE_PLAYBOOK = os.path.join(ROOT, "tests", "cluster", "playbooks", "rollout_change.yml")
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
NAMESPACE = "gpu-work"
ANNOTATION = "k3s-gpu.nvidia/rollout"


@pytest.fixture(scope="module")
def lab():
    before = host_snapshot()
    assert not before["processes"] and not before["lab_dir"], "a lab is already running: %s" % before
    lab = Lab("k3s", LINES[0], "envvar")
    lab.up()
    lab.node_root = lab.state["node"]["root"]
    try:
        yield lab
    finally:
        proc = lab.down()
        assert proc.returncode == 0, proc.stdout + proc.stderr


def settings(lab, **extra):
    """The rollout's settings for the lab: its image for the GPU pod, short timeouts."""
    found = {"gpu_node_prove_image": lab.busybox, "gpu_node_drain_timeout_seconds": 60,
             "gpu_node_prove_timeout_seconds": 120}
    found.update(extra)
    return found


def playbook(lab, target, extra, inventory=None, background=False):
    argv = [PLAYBOOK_BIN, "-i", inventory or clusterlab.path("inventory.yml"), target, "-e", json.dumps(extra)]
    env = clusterlab.ansible_env()
    if background:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def change(lab, argv, **extra):
    """The role's drain entry point, the TEST DOUBLE change (argv), the proof and the uncordon."""
    return playbook(lab, CHANGE_PLAYBOOK, dict(settings(lab, **extra), rollout_change_argv=argv))


def node(lab):
    found = lab.get("node", clusterlab.NODE_NAME)
    text = (found["metadata"].get("annotations") or {}).get(ANNOTATION)
    return {"unschedulable": bool(found["spec"].get("unschedulable")), "record": json.loads(text) if text else None}


def workload(lab, min_available):
    """A GPU Deployment (one replica) under a PodDisruptionBudget and a bare GPU pod, each holding a GPU's device file
    open; returns {name: uid} once both run."""
    dev = lab.node_root + "/dev"

    def spec(index):
        return {"runtimeClassName": "nvidia", "terminationGracePeriodSeconds": 2, "automountServiceAccountToken": False,
                "containers": [{"name": "work", "image": lab.busybox, "imagePullPolicy": "Never",
                                "command": ["sh", "-c", "exec 3</node-dev/nvidia%d; exec sleep 3600" % index],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                "volumeMounts": [{"name": "dev", "mountPath": "/node-dev"}]}],
                "volumes": [{"name": "dev", "hostPath": {"path": dev}}]}
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer", "namespace": NAMESPACE},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "trainer"}},
                  "template": {"metadata": {"labels": {"app": "trainer"}}, "spec": spec(0)}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer", "namespace": NAMESPACE},
         "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "trainer"}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": NAMESPACE}, "spec": spec(1)}]
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return running(lab, 2)


def running(lab, count, timeout=120):
    deadline = time.monotonic() + timeout
    pods = []
    while time.monotonic() < deadline:
        pods = lab.get("pods", "-n", NAMESPACE)["items"]
        up = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        if len(up) >= count:
            return dict((p["metadata"]["name"], p["metadata"]["uid"]) for p in up)
        time.sleep(1)
    pytest.fail("the GPU workload is not running: %s" % json.dumps([p["status"] for p in pods])[:3000], pytrace=False)
    return {}


def remove_workload(lab):
    lab.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s")


def container_ids(lab):
    return dict((p["metadata"]["name"], [s.get("containerID") for s in p["status"].get("containerStatuses") or []])
                for p in lab.get("pods", "-n", NAMESPACE)["items"])


def tree_digest(root):
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(folder, name)
            digest.update(full[len(root):].encode())
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


class NodeWatch:
    """Reads the lab's Node every half second in a thread: whether it was ever cordoned while watched."""

    def __init__(self, lab):
        self.lab, self.seen, self._stop = lab, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.seen.append(node(self.lab)["unschedulable"])
            time.sleep(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(10)


# ---- a ---------------------------------------------------------------------------------------------------------------

def test_a_budget_holds_the_drain_until_its_timeout_then_it_proceeds_once_satisfied(lab, tmp_path):
    pods = workload(lab, min_available=1)
    marker = str(tmp_path / "changed")
    started = time.monotonic()
    rc, output = change(lab, ["touch", marker], gpu_node_drain_timeout_seconds=20)
    took = time.monotonic() - started
    print("\na: budget held: rc %d in %.1f s" % (rc, took))
    assert rc != 0, output[-3000:]
    assert re.search(r"node lab-node was not drained: gpu-work/trainer-[a-z0-9-]+: .*429.*disruption budget", output), \
        output[-3000:]
    assert "The node is uncordoned as it was; nothing was changed" in output
    assert not os.path.exists(marker), "the change ran although the drain failed"
    assert node(lab) == {"unschedulable": False, "record": None}
    left = running(lab, 1)
    assert "bare" not in left, "the bare GPU pod was not evicted: %s" % left
    assert [name for name in left if name.startswith("trainer-")] == [n for n in pods if n.startswith("trainer-")], \
        "the budget's pod moved: %s -> %s" % (pods, left)

    lab.kubectl("-n", NAMESPACE, "patch", "pdb", "trainer", "--type", "merge", "-p", '{"spec":{"minAvailable":0}}')
    rc, output = change(lab, ["touch", marker])
    print("a: budget satisfied: rc %d" % rc)
    assert rc == 0, output[-4000:]
    assert os.path.exists(marker)
    assert re.search(r"lab-node / nvidia: OK \| GPU [0-9]: NVIDIA Lab Test Double", output), output[-3000:]
    assert node(lab) == {"unschedulable": False, "record": None}
    after = running(lab, 1)  # the Deployment's new pod, scheduled once the node is uncordoned
    assert not set(after) & set(pods), "the trainer pod was not evicted: %s" % after
    remove_workload(lab)


def test_a_process_that_keeps_a_gpu_device_holds_the_drain_and_is_named(lab, tmp_path):
    """A process outside the pods the drain evicts (here one on the host, as a CUDA job started by hand would be) holds
    /dev/nvidia0: the drain waits for it, then fails naming it, and the node is uncordoned as it was."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1])\ntime.sleep(600)",
                               lab.node_root + "/dev/nvidia0"])
    marker = str(tmp_path / "changed")
    try:
        rc, output = change(lab, ["touch", marker], gpu_node_drain_timeout_seconds=10)
    finally:
        holder.kill()
        holder.wait(10)
    print("\na: a host process holding /dev/nvidia0: rc %d" % rc)
    assert rc != 0, output[-3000:]
    assert re.search(r"processes still hold its GPUs: a host process \(pid %d, python[0-9.]*\) holds .*/dev/nvidia0"
                     % holder.pid, output), output[-3000:]
    assert not os.path.exists(marker) and node(lab) == {"unschedulable": False, "record": None}


# ---- b ---------------------------------------------------------------------------------------------------------------

def test_b_the_node_is_cordoned_during_the_change_proved_and_uncordoned_and_a_second_pass_cordons_nothing(lab, tmp_path):
    seen = str(tmp_path / "seen.json")
    read = ("import json, sys\nfrom kubernetes import client, config\nconfig.load_kube_config(sys.argv[1])\n"
            "n = client.CoreV1Api().read_node('lab-node')\n"
            "json.dump({'unschedulable': bool(n.spec.unschedulable), 'record': (n.metadata.annotations or {}).get(sys.argv[3])},"
            " open(sys.argv[2], 'w'))\n")
    rc, output = change(lab, [sys.executable, "-c", read, lab.kubeconfig, seen, ANNOTATION])
    assert rc == 0, output[-4000:]
    with open(seen, encoding="utf-8") as handle:
        during = json.load(handle)
    print("\nb: during the change: %s" % during)
    assert during["unschedulable"] is True
    record = json.loads(during["record"])
    assert record["by"] == "k3s_gpu.nvidia" and record["state"] == "changing" and record["was_cordoned"] is False
    assert record["reason"] == "TEST DOUBLE of a driver upgrade"
    assert re.search(r"lab-node / nvidia: OK \| GPU [0-9]: NVIDIA Lab Test Double", output), output[-3000:]
    assert node(lab) == {"unschedulable": False, "record": None}
    assert "k3s-gpu-rollout" in lab.kubectl("get", "namespaces", "-o", "name").stdout
    assert not lab.get("pods", "-n", "k3s-gpu-rollout")["items"], "the proving pod was left behind"

    for attempt in ("first", "second"):
        with NodeWatch(lab) as watch:
            rc, output = playbook(lab, "k3s_gpu.nvidia.site", settings(lab))
        assert rc == 0, output[-4000:]
        print("b: site, %s pass: %s" % (attempt, re.findall(r"lab-node : ok=\d+\s+changed=\d+", output)))
        assert "no node needs a disruptive change" in output
        assert not any(watch.seen) and watch.seen, "cordoned during a pass with no disruptive change"
    lines = output.splitlines()
    changed = [next(before for before in reversed(lines[:number]) if before.startswith("TASK ["))
               for number, line in enumerate(lines) if line.startswith("changed:")]
    assert re.search(r"lab-node\s+: ok=\d+\s+changed=0 ", output), (changed, output[-3000:])


# ---- c ---------------------------------------------------------------------------------------------------------------

def two_node_inventory(lab, tmp_path):
    """The lab's node and a second node of the same cluster, converged already (its tree a copy of the first's after
    site ran): the rollout's second wave. The cluster has no Node of that name: touching it would fail."""
    second = str(tmp_path / "lab-node-b")

    def sockets(folder, names):  # the lab's containerd sockets under the node's /run
        return [name for name in names if stat.S_ISSOCK(os.lstat(os.path.join(folder, name)).st_mode)]
    shutil.copytree(lab.node_root, second, symlinks=True, ignore=sockets)
    with open(clusterlab.path("inventory.yml"), encoding="utf-8") as handle:
        inventory = json.load(handle)
    inventory["all"]["children"]["server"]["hosts"] = {clusterlab.NODE_NAME: {}, "lab-node-b": {"gpu_node_root": second}}
    path = str(tmp_path / "inventory.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(inventory, handle)
    return path, second


def test_c_a_change_that_breaks_the_gpu_pod_leaves_the_node_cordoned_with_the_layer_that_doctor_names(lab, tmp_path):
    binary = lab.node_root + "/usr/bin/nvidia-container-runtime"
    try:
        # the change breaks the nvidia handler (TEST DOUBLE of an upgrade that went wrong)
        rc, output = change(lab, ["mv", binary, binary + ".broken"])
        print("\nc: a change that breaks the handler: rc %d" % rc)
        assert rc != 0, output[-4000:]
        assert re.search(r"node lab-node stays cordoned: BROKEN at toolkit: kubelet cannot create the pod's sandbox: .*"
                         r"nvidia-container-runtime: no such file or directory", output), output[-4000:]
        state = node(lab)
        assert state["unschedulable"] and state["record"]["state"] == "failed" and state["record"]["layer"] == "toolkit"
        report = str(tmp_path / "doctor.json")
        rc, doctor_output = playbook(lab, "k3s_gpu.nvidia.doctor", {"doctor_report_path": report})
        with open(report, encoding="utf-8") as handle:
            found = json.load(handle)["nodes"][0]
        print("c: doctor: %s at %s" % (found["status"], found.get("broken_layer")))
        assert rc != 0 and found["broken_layer"] == "toolkit", doctor_output[-3000:]
    finally:
        if os.path.exists(binary + ".broken"):
            os.replace(binary + ".broken", binary)
    rc, output = playbook(lab, "k3s_gpu.nvidia.site", settings(lab))
    print("c: the next run, handler mended: rc %d" % rc)
    assert rc == 0, output[-4000:]
    assert "finishing a stopped run" in output and node(lab) == {"unschedulable": False, "record": None}


def test_c_site_stops_at_the_canary_that_fails_and_leaves_the_next_wave_untouched(lab, tmp_path):
    inventory, second = two_node_inventory(lab, tmp_path)
    before = tree_digest(second)
    binary = lab.node_root + "/usr/bin/nvidia-container-runtime"
    os.replace(binary, binary + ".broken")  # the canary's nvidia handler is broken: its GPU pod fails after its change
    try:
        # no device plugin HelmChart from this run: the canary's reading lacks the nvidia handler the chart runs under
        extra = settings(lab, gpu_node_disruptive_change="TEST DOUBLE of a driver upgrade", gpu_node_max_unavailable="1",
                         gpu_node_device_plugin_state="absent")
        rc, output = playbook(lab, "k3s_gpu.nvidia.site", extra, inventory=inventory)
        print("\nc: site, the canary broken: rc %d" % rc)
        assert rc != 0, output[-4000:]
        assert re.search(r"wave 1: lab-node \(default, canary\)", output), output[-4000:]
        assert re.search(r"wave 2: lab-node-b \(default\)", output), output[-4000:]
        row = re.search(r'"(lab-node: failed \([^"]*)"', output)
        assert row and "stays cordoned: BROKEN at toolkit" in row.group(1), output[-4000:]
        print("c: %s" % row.group(1)[:300])
        assert "The rollout stopped at the first node that failed" in output
        state = node(lab)
        assert state["unschedulable"] and state["record"]["layer"] == "toolkit"
        assert tree_digest(second) == before, "the node of the next wave was touched"
        assert "no Node named lab-node-b" not in output  # never drained: the cluster has no such Node
    finally:
        os.replace(binary + ".broken", binary)
    rc, output = playbook(lab, "k3s_gpu.nvidia.site", settings(lab))
    assert rc == 0 and node(lab) == {"unschedulable": False, "record": None}, output[-4000:]


# ---- d ---------------------------------------------------------------------------------------------------------------

def test_d_a_run_killed_while_the_node_is_cordoned_is_finished_by_the_next_run(lab):
    proc = playbook(lab, CHANGE_PLAYBOOK, dict(settings(lab), rollout_change_argv=["sleep", "600"]), background=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            state = node(lab)
            if state["unschedulable"] and (state["record"] or {}).get("state") == "changing":
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail("the node was not cordoned in 120 s", pytrace=False)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    print("\nd: killed with the node cordoned: %s" % node(lab))
    assert node(lab)["unschedulable"]
    rc, output = playbook(lab, "k3s_gpu.nvidia.site", settings(lab))
    assert rc == 0, output[-4000:]
    assert re.search(r"wave 1: lab-node \(default, finishing a stopped run\)", output), output[-4000:]
    assert re.search(r"lab-node / nvidia: OK \| GPU [0-9]: NVIDIA Lab Test Double", output), output[-3000:]
    assert node(lab) == {"unschedulable": False, "record": None}


# ---- e ---------------------------------------------------------------------------------------------------------------

def reload_containerd(lab):
    """k3s's restart (TEST DOUBLE: there is no k3s binary): the node's drop-in as the role left it, with the lab's keys,
    imported by the lab's containerd, which restarts; the pods' shims keep running."""
    node_dropin = lab.node_root + lab.state["node"]["dropin"][len(lab.node_root):] if lab.state["node"]["dropin"] else None
    assert node_dropin and os.path.exists(node_dropin), lab.state["node"]
    with open(node_dropin, encoding="utf-8") as handle:
        text, _applied = clusterlab.lab.apply_lab_overrides(handle.read(), "2.x", run_pods=True, only_runtimes=True)
    # the handlers' binaries where the lab has them: under the node's tree, as in the lab's first copy of the drop-in
    text = text.replace('BinaryName = "/', 'BinaryName = "%s/' % lab.node_root)
    with open(clusterlab.path("containerd", "config.d", os.path.basename(node_dropin)), "w", encoding="utf-8") as handle:
        handle.write(text)
    clusterlab.restart_containerd(clusterlab.read_state())


def test_e_a_containerd_config_change_drains_nothing_and_the_gpu_pods_survive_the_restart(lab):
    pods = workload(lab, min_available=1)
    ids = container_ids(lab)
    extra = settings(lab, gpu_node_runtimes=[
        {"name": "nvidia-legacy", "binary": "/usr/bin/nvidia-container-runtime.legacy"},
        {"name": "nvidia-extra", "binary": "/usr/bin/nvidia-container-runtime"}])
    with NodeWatch(lab) as watch:
        rc, output = playbook(lab, "k3s_gpu.nvidia.site", extra)
    assert rc == 0, output[-4000:]
    row = re.search(r'"(lab-node: configured [^"]*)"', output)
    print("\ne: %s" % (row.group(1) if row else output[-2000:]))
    assert row and "not disruptive (" in row.group(1) and "containerd config" in row.group(1), output[-3000:]
    assert "no node needs a disruptive change" in output
    assert watch.seen and not any(watch.seen), "cordoned for a non-disruptive change"
    reload_containerd(lab)
    assert running(lab, 2) == pods, "a GPU pod was evicted or restarted"
    assert container_ids(lab) == ids, "a container did not survive the restart: %s -> %s" % (ids, container_ids(lab))
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                      "metadata": {"name": "nvidia-extra"}, "handler": "nvidia-extra"}))
    name = lab.pod("through-the-new-handler", "nvidia-extra", "true")
    assert lab.wait_phase(name, ("Succeeded", "Failed"))["status"]["phase"] == "Succeeded"
    print("e: %d GPU pods kept their containers %s through the restart; a pod ran through the new handler"
          % (len(ids), sorted(ids)))
    remove_workload(lab)


# ---- check mode ------------------------------------------------------------------------------------------------------

def test_check_mode_lists_the_node_and_the_pods_it_would_evict_and_changes_nothing(lab):
    pods = workload(lab, min_available=1)
    extra = settings(lab, gpu_node_disruptive_change="TEST DOUBLE of a driver upgrade")
    with NodeWatch(lab) as watch:
        rc, output = site_check(lab, extra)
    assert rc == 0, output[-4000:]
    would = re.search(r"lab-node: would cordon node lab-node \(TEST DOUBLE of a driver upgrade\) and evict ([^\n\"]*)", output)
    print("\ncheck mode: %s" % (would.group(0) if would else output[-2000:]))
    assert would and sorted(would.group(1).split(", ")) == sorted("%s/%s" % (NAMESPACE, name) for name in pods), output[-3000:]
    assert "lab-node: would prove the node with a GPU pod and uncordon it" in output
    assert watch.seen and not any(watch.seen), "check mode cordoned the node"
    assert running(lab, 2) == pods and node(lab) == {"unschedulable": False, "record": None}
    remove_workload(lab)


def site_check(lab, extra):
    """k3s_gpu.nvidia.site --check on the lab."""
    argv = [PLAYBOOK_BIN, "-i", clusterlab.path("inventory.yml"), "k3s_gpu.nvidia.site", "--check", "-e", json.dumps(extra)]
    proc = subprocess.run(argv, env=clusterlab.ansible_env(), capture_output=True, text=True, timeout=900, check=False)
    return proc.returncode, proc.stdout + proc.stderr
