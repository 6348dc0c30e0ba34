# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The seed's pod against a real API server and a real kubelet (scripts/cluster-lab.sh).

For each Kubernetes line in K3S_GPU_LAB_KUBERNETES (default: 1.36) and each device-list strategy
(envvar, cdi-cri), one lab with 2 fake GPUs is started through the script, as a user starts it:

- every handler the node's containerd config has for the release (nvidia, nvidia-cdi, nvidia-legacy, and
  nvidia-experimental where it is there) runs a pod to Succeeded, and NVIDIA's runtime log shows that
  handler's binary creating that pod's container;
- the seed's pod (runtimeClassName nvidia, nvidia.com/gpu: 1) runs, and `ls /dev` inside it shows
  exactly the allocated device;
- the node's allocatable nvidia.com/gpu is the lab's GPU count, and a pod asking for one more stays
  Pending with the scheduler's `Insufficient nvidia.com/gpu`;
- after `down` nothing of the lab is left: processes, mounts, cgroups, log links, /run entries.

Each pod's phase, handler binary and the devices it saw are printed (-s) and written to the lab
report (tests/output/cluster-lab-<line>-<strategy>.json).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from . import clusterlab

ROOT = clusterlab.ROOT
SCRIPT = os.path.join(ROOT, "scripts", "cluster-lab.sh")
LINES = [line.strip() for line in os.environ.get("K3S_GPU_LAB_KUBERNETES", "1.36").split(",") if line.strip()]
STRATEGIES = ("envvar", "cdi-cri")
GPUS = 2
NVIDIA_HANDLERS = ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental")
POD_TIMEOUT = 120


def host_snapshot():
    """What of a lab could be on the host (the marker's processes, mounts, cgroups, links, the lab dir)."""
    mounts = clusterlab._mounts_under(clusterlab.LAB_DIR)  # pylint: disable=protected-access
    links = sorted(os.listdir(clusterlab.CONTAINER_LOG_LINKS)) if os.path.isdir(clusterlab.CONTAINER_LOG_LINKS) else []
    return {"processes": clusterlab.marked_pids(), "mounts": mounts,
            "cgroups": clusterlab._cgroup_dirs(),  # pylint: disable=protected-access
            "log_links": links, "lab_dir": os.path.exists(clusterlab.LAB_DIR),
            "run": clusterlab._run_entries()}  # pylint: disable=protected-access


class Lab:
    def __init__(self, line, strategy):
        self.line, self.strategy = line, strategy
        self.env = None
        self.kubectl_bin = None
        self.report = {"kubernetes": line, "strategy": strategy, "gpus": GPUS, "pods": []}

    def up(self):
        started = time.monotonic()
        proc = subprocess.run([SCRIPT, "up", "--kubernetes", self.line, "--gpus", str(GPUS), "--strategy", self.strategy],
                              capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            pytest.fail("cluster-lab.sh up failed (%d):\n%s\n%s" % (proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:]),
                        pytrace=False)
        lines = proc.stdout.strip().splitlines()
        assert lines[-2].startswith("BUSYBOX_IMAGE=") and lines[-1].startswith("KUBECONFIG="), lines[-2:]
        self.busybox = lines[-2].split("=", 1)[1]
        self.kubeconfig = lines[-1].split("=", 1)[1]
        self.state = clusterlab.read_state()
        self.kubectl_bin = self.state["binaries"]["kubectl"]
        self.report["up_seconds"] = round(time.monotonic() - started, 1)
        self.report["up_output"] = lines
        return self

    def kubectl(self, *args, stdin=None, check=True):
        proc = subprocess.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig] + list(args), input=stdin,
                              capture_output=True, text=True, timeout=180, check=False)
        if check:
            assert proc.returncode == 0, "kubectl %s: %s" % (" ".join(args), proc.stderr)
        return proc

    def get(self, *args):
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def pod(self, name, runtime_class, command, gpus=0, restart="Never"):
        container = {"name": "c", "image": self.busybox, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", command]}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        spec = {"restartPolicy": restart, "containers": [container], "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1}
        if runtime_class:
            spec["runtimeClassName"] = runtime_class
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        return name

    def wait_phase(self, name, phases, timeout=POD_TIMEOUT):
        deadline = time.monotonic() + timeout
        pod = None
        while time.monotonic() < deadline:
            pod = self.get("pod", name, "-n", "default")
            if pod["status"].get("phase") in phases:
                return pod
            time.sleep(0.5)
        events = self.kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name=" + name,
                              check=False).stdout
        pytest.fail("pod %s not %s in %d s: %s\nevents:\n%s" % (name, "/".join(phases), timeout,
                                                                 json.dumps(pod and pod["status"])[:2000], events),
                    pytrace=False)
        return None

    def logs(self, name):
        return self.kubectl("logs", "-n", "default", name).stdout

    def runtime_log(self):
        with open(os.path.join(clusterlab.LAB_DIR, "logs", "nvidia-container-runtime.log"), encoding="utf-8",
                  errors="replace") as handle:
            return handle.read()

    def down(self):
        proc = subprocess.run([SCRIPT, "down"], capture_output=True, text=True, timeout=300, check=False)
        return proc


@pytest.fixture(scope="module", params=[(line, strategy) for line in LINES for strategy in STRATEGIES],
                ids=lambda p: "k8s%s-%s" % p)
def cluster(request):
    before = host_snapshot()
    assert not before["processes"] and not before["lab_dir"], "a lab is already running: %s" % before
    lab = Lab(*request.param)
    try:
        yield lab.up()
    finally:
        proc = lab.down()
        after = host_snapshot()
        os.makedirs(os.path.join(ROOT, "tests", "output"), exist_ok=True)
        lab.report["down"] = proc.stdout.strip()
        report = os.path.join(ROOT, "tests", "output", "cluster-lab-%s-%s.json" % (lab.line, lab.strategy))
        with open(report, "w", encoding="utf-8") as handle:
            json.dump(lab.report, handle, indent=2)
        print("\ncluster lab %s/%s report: %s" % (lab.line, lab.strategy, json.dumps(lab.report["pods"], indent=1)))
        leftovers = {key: sorted(set(after[key]) - set(before[key])) if isinstance(after[key], list) else after[key]
                     for key in after}
        assert proc.returncode == 0 and not any(leftovers.values()), (proc.stdout, proc.stderr, leftovers)


def handlers_of(lab):
    return [name for name in lab.state["node"]["runtimes"] if name in NVIDIA_HANDLERS]


def test_the_runtimeclasses_playbook_applies_ours_through_the_kubeconfig(cluster):
    """The task users run, through KUBECONFIG (no `k3s kubectl`): what the release lacks, then nothing."""
    managed = "app.kubernetes.io/managed-by=k3s_gpu.nvidia"
    cluster.kubectl("delete", "runtimeclass", "-l", managed)  # `up` applied them: start from the release's own
    assert not cluster.get("runtimeclass", "-l", managed)["items"]
    first_rc, first = clusterlab.run_playbook("runtimeclasses", check=False)
    second_rc, second = clusterlab.run_playbook("runtimeclasses", check=False)
    assert first_rc == 0 and re.search(r"lab-node\s*:.*changed=[1-9]", first), first[-3000:]
    assert second_rc == 0 and re.search(r"lab-node\s*:.*changed=0\s", second), second[-3000:]
    ours = {item["metadata"]["name"]: item["handler"] for item in cluster.get("runtimeclass", "-l", managed)["items"]}
    shipped = set(cluster.state["shipped_runtimeclasses"])
    wanted = {name for name in handlers_of(cluster) if name not in shipped}
    assert ours == {name: name for name in wanted} and "nvidia-cdi" in ours, (ours, shipped)
    classes = {item["metadata"]["name"] for item in cluster.get("runtimeclass")["items"]}
    assert set(handlers_of(cluster)) <= classes, classes


def test_every_nvidia_handler_runs_a_pod_through_its_own_binary(cluster):
    handlers = handlers_of(cluster)
    assert {"nvidia", "nvidia-cdi", "nvidia-legacy"} <= set(handlers), cluster.state["node"]
    classes = {item["metadata"]["name"]: item["handler"] for item in cluster.get("runtimeclass")["items"]}
    for handler in handlers:
        assert classes.get(handler) == handler, "no RuntimeClass for handler %s: %s" % (handler, classes)
        name = cluster.pod("handler-" + handler.replace(".", "-"), handler, "echo ran-through-%s" % handler)
        pod = cluster.wait_phase(name, ("Succeeded", "Failed"))
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        assert cluster.logs(name).strip() == "ran-through-%s" % handler
        container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        binary = "nvidia-container-runtime" + {"nvidia": "", "nvidia-cdi": ".cdi", "nvidia-legacy": ".legacy",
                                               "nvidia-experimental": ""}[handler]
        argv = [line for line in cluster.runtime_log().splitlines() if container_id in line and "create" in line]
        assert any(re.search(r"/%s\b" % re.escape(binary), line) for line in argv), (handler, argv[:5])
        cluster.report["pods"].append({"pod": name, "runtimeClassName": handler, "phase": pod["status"]["phase"],
                                       "handler_binary": binary, "devices": None})


def test_the_seed_pod_gets_exactly_its_gpu(cluster):
    handler = "nvidia"
    name = cluster.pod("seed-gpu", handler, "ls /dev; sleep 3600", gpus=1, restart="Never")
    pod = cluster.wait_phase(name, ("Running",))
    deadline = time.monotonic() + 30
    listing = ""
    while time.monotonic() < deadline and "nvidia" not in listing:
        listing = cluster.logs(name)
        time.sleep(0.5)
    seen = sorted(entry for entry in listing.split() if entry.startswith("nvidia"))
    allocated = cluster.get("pod", name, "-n", "default")
    assert len(seen) == 1 and re.fullmatch(r"nvidia[0-9]+", seen[0]), listing
    cluster.report["pods"].append({"pod": name, "runtimeClassName": handler, "phase": pod["status"]["phase"],
                                   "handler_binary": "nvidia-container-runtime", "devices": seen,
                                   "node": allocated["spec"].get("nodeName")})
    cluster.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")


def test_allocatable_is_the_gpu_count_and_one_more_stays_pending(cluster):
    node = cluster.get("node", clusterlab.NODE_NAME)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(GPUS)
    name = cluster.pod("too-many-gpus", "nvidia", "true", gpus=GPUS + 1)
    deadline = time.monotonic() + 60
    message = ""
    while time.monotonic() < deadline and "Insufficient nvidia.com/gpu" not in message:
        pod = cluster.get("pod", name, "-n", "default")
        message = " ".join(c.get("message", "") for c in pod["status"].get("conditions", []))
        time.sleep(0.5)
    assert pod["status"]["phase"] == "Pending" and "Insufficient nvidia.com/gpu" in message, pod["status"]
    cluster.report["pods"].append({"pod": name, "runtimeClassName": "nvidia", "phase": "Pending", "handler_binary": None,
                                   "devices": None, "why": message})
    cluster.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")
