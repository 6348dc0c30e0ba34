# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The seed's pod against a real API server and a real kubelet (scripts/cluster-lab.sh).

For each distribution in K3S_GPU_LAB_DISTRIBUTIONS (default: k3s,rke2: the line's k3s or rke2 release, its node
paths, base template and shipped RuntimeClasses; the rke2 lab's inventory is rke2-ansible's), each Kubernetes line
in K3S_GPU_LAB_KUBERNETES (default: 1.36) and each device-list strategy (envvar, cdi-cri), one lab with 2 fake
GPUs is started through the script, as a user starts it:

- the seed's check: the config.toml the distribution composes on the node holds `nvidia` and `nvidia-cdi` with
  NVIDIA's real binaries as BinaryName, and imports the drop-in the collection wrote (`nvidia-legacy`);

- every handler the node's containerd config has for the release (nvidia, nvidia-cdi, nvidia-legacy, and
  nvidia-experimental where it is there) runs a pod to Succeeded, and NVIDIA's runtime log shows that
  handler's binary creating that pod's container;
- the seed's pod (runtimeClassName nvidia, nvidia.com/gpu: 1), the same pod with nvidia-cdi, and the same pod
  without a RuntimeClass each run; `ls /dev` inside shows exactly the allocated device (none without a class under
  envvar), and what each container got (devices, mounts, NVIDIA_VISIBLE_DEVICES, and who injected the device:
  NVIDIA's runtime or containerd's CDI) goes into the report: the evidence docs/gpu-pods.md cites;
- the node's allocatable nvidia.com/gpu is the lab's GPU count, and a pod asking for one more stays
  Pending with the scheduler's `Insufficient nvidia.com/gpu`;
- after `down` nothing of the lab is left: processes, mounts, cgroups, log links, /run entries.

Each pod's phase, handler binary and the devices it saw are printed (-s) and written to the lab
report (tests/output/cluster-lab-<distribution>-<line>-<strategy>.json).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import tomllib

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.tests import testbins

from . import clusterlab

ROOT = clusterlab.ROOT
SCRIPT = os.path.join(ROOT, "scripts", "cluster-lab.sh")
LINES = [line.strip() for line in os.environ.get("K3S_GPU_LAB_KUBERNETES", "1.36").split(",") if line.strip()]
DISTRIBUTIONS = [name.strip() for name in os.environ.get("K3S_GPU_LAB_DISTRIBUTIONS", "k3s,rke2").split(",") if name.strip()]
STRATEGIES = ("envvar", "cdi-cri")
GPUS = 2
NVIDIA_HANDLERS = ("nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental")
POD_TIMEOUT = 120


def host_snapshot():
    """What of a lab could be on the host (the marker's processes, mounts, cgroups, links, the lab dir)."""
    mounts = clusterlab.mounts_under(clusterlab.LAB_DIR)
    links = sorted(os.listdir(clusterlab.CONTAINER_LOG_LINKS)) if os.path.isdir(clusterlab.CONTAINER_LOG_LINKS) else []
    return {"processes": clusterlab.marked_pids(), "mounts": mounts,
            "cgroups": clusterlab._cgroup_dirs(),  # pylint: disable=protected-access
            "log_links": links, "lab_dir": os.path.exists(clusterlab.LAB_DIR),
            "run": clusterlab._run_entries()}  # pylint: disable=protected-access


class Lab:
    def __init__(self, distribution, line, strategy):
        self.distribution, self.line, self.strategy = distribution, line, strategy
        self.release = clusterlab.KUBERNETES[line][1][distribution]
        self.name = "%s-%s-%s" % (distribution, line, strategy)
        self.env = None
        self.kubectl_bin = None
        self.report = {"distribution": distribution, "release": self.release, "kubernetes": line, "strategy": strategy,
                       "gpus": GPUS, "pods": []}

    def up(self):
        started = time.monotonic()
        proc = subprocess.run([SCRIPT, "up", "--kubernetes", self.line, "--release", self.release, "--gpus", str(GPUS),
                               "--strategy", self.strategy],
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
        # start to first pod: the seed's kind of pod, from `up` on to Succeeded
        name = self.pod("first-pod", "nvidia", "ls /dev", gpus=1)
        first = self.wait_phase(name, ("Succeeded", "Failed"))
        assert first["status"]["phase"] == "Succeeded", first["status"]
        self.report["first_pod_seconds"] = round(time.monotonic() - started, 1)
        print("\ncluster lab %s: up in %.1f s, first GPU pod Succeeded %.1f s after the start"
              % (self.name, self.report["up_seconds"], self.report["first_pod_seconds"]))
        self.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")
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
        status = json.dumps(pod and pod["status"])[:2000]
        pytest.fail("pod %s not %s in %d s: %s\nevents:\n%s" % (name, "/".join(phases), timeout, status, events),
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


@pytest.fixture(scope="module", params=[(distribution, line, strategy) for distribution in DISTRIBUTIONS for line in LINES
                                        for strategy in STRATEGIES],
                ids=lambda p: "%s-k8s%s-%s" % p)
def cluster(request):
    before = host_snapshot()
    assert not before["processes"] and not before["lab_dir"], "a lab is already running: %s" % before
    lab = Lab(*request.param)
    try:
        yield lab.up()
    finally:
        tear_down(lab, before)


def tear_down(lab, before):
    """`down`, the lab's report into tests/output/cluster-lab-<name>.json, and nothing of the lab left on the host."""
    proc = lab.down()
    after = host_snapshot()
    os.makedirs(os.path.join(ROOT, "tests", "output"), exist_ok=True)
    lab.report["down"] = proc.stdout.strip()
    report = os.path.join(ROOT, "tests", "output", "cluster-lab-%s.json" % lab.name)
    with open(report, "w", encoding="utf-8") as handle:
        json.dump(lab.report, handle, indent=2)
    print("\ncluster lab %s report: %s" % (lab.name, json.dumps(lab.report["pods"], indent=1)))
    leftovers = {key: sorted(set(after[key]) - set(before[key])) if isinstance(after[key], list) else after[key]
                 for key in after}
    assert proc.returncode == 0 and not any(leftovers.values()), (proc.stdout, proc.stderr, leftovers)


def handlers_of(lab):
    return [name for name in lab.state["node"]["runtimes"] if name in NVIDIA_HANDLERS]


def test_the_runtimeclasses_playbook_applies_ours_through_the_kubeconfig(cluster):
    """The task users run, through KUBECONFIG (no `k3s kubectl`): what the release lacks, then nothing. The
    release's own classes stay as the release left them (on rke2: owned by the rke2-runtimeclasses Helm release,
    which would fight over any change)."""
    managed = "app.kubernetes.io/managed-by=k3s_gpu.nvidia"
    shipped_before = {item["metadata"]["name"]: item["metadata"] for item in cluster.get("runtimeclass")["items"]
                      if item["metadata"]["name"] in cluster.state["shipped_runtimeclasses"]}
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
    shipped_after = {item["metadata"]["name"]: item["metadata"] for item in cluster.get("runtimeclass")["items"]
                     if item["metadata"]["name"] in shipped}
    assert {name: meta["resourceVersion"] for name, meta in shipped_after.items()} == \
        {name: meta["resourceVersion"] for name, meta in shipped_before.items()}, (shipped_before, shipped_after)
    if cluster.distribution == "rke2":
        assert shipped == {"nvidia", "nvidia-experimental", "crun"}, shipped  # the chart's three, no nvidia-cdi
        assert all(meta["labels"].get("app.kubernetes.io/managed-by") == "Helm"
                   and meta["annotations"].get("meta.helm.sh/release-name") == clusterlab.RKE2_RUNTIMECLASS_CHART
                   for meta in shipped_after.values()), shipped_after
    cluster.report["runtimeclasses"] = {"shipped": sorted(shipped), "ours": sorted(ours)}


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


def test_the_seed_check_the_composed_config_toml_holds_nvidia_and_nvidia_cdi(cluster):
    """The seed's own check (k3s PR #11065, done on rke2): the node's generated config.toml holds the nvidia runtimes
    at the bottom, `nvidia` and `nvidia-cdi`, each with NVIDIA's binary as BinaryName; the drop-in it imports holds
    only what the release does not render (nvidia-legacy), never a duplicate."""
    node = cluster.state["node"]
    data_dir = distro.distribution_paths(cluster.distribution)["data_dir"]
    assert node["config"] == data_dir + "/agent/etc/containerd/config.toml", node
    with open(node["root"] + node["config"], encoding="utf-8") as handle:
        text = handle.read()
    assert text.startswith("# File generated by %s. DO NOT EDIT. Use config-v3.toml.tmpl instead." % cluster.distribution), \
        text[:200]
    config = tomllib.loads(text)
    runtimes = _table(config, distro.containerd_table(node["schema"]))["runtimes"]
    toolkit = os.path.dirname(testbins.path_of("nvidia-container-toolkit", "nvidia-container-runtime"))
    found = {}
    for handler, binary in (("nvidia", "nvidia-container-runtime"), ("nvidia-cdi", "nvidia-container-runtime.cdi")):
        assert runtimes[handler]["runtime_type"] == "io.containerd.runc.v2", runtimes[handler]
        assert runtimes[handler]["options"]["BinaryName"] == "/usr/bin/" + binary, runtimes[handler]
        # NVIDIA's own binary (built from the Go module proxy), installed on the node as the package does
        assert _sha256(node["root"] + "/usr/bin/" + binary) == _sha256(os.path.join(toolkit, binary)), binary
        found[handler] = runtimes[handler]["options"]["BinaryName"]
    # "at the bottom": after the release's own runc, as k3s/rke2 append the runtimes they detect
    assert list(runtimes).index("runc") < list(runtimes).index("nvidia") < list(runtimes).index("nvidia-cdi"), list(runtimes)
    dropin_dir = data_dir + "/agent/etc/containerd/config-v3.toml.d"
    assert config["imports"] == [dropin_dir + "/*.toml"], config.get("imports")
    assert node["dropin"] == node["root"] + dropin_dir + "/50-k3s-gpu-nvidia.toml", node["dropin"]
    with open(node["dropin"], encoding="utf-8") as handle:
        dropin = tomllib.loads(handle.read())
    assert set(_table(dropin, distro.containerd_table(node["schema"]))["runtimes"]) == {"nvidia-legacy"}, dropin
    cluster.report["composed_config"] = {"path": node["config"], "header": text.splitlines()[0], "runtimes": list(runtimes),
                                         "nvidia_binaries": found, "imports": config["imports"], "dropin": ["nvidia-legacy"]}


def _table(document, keys):
    for key in keys:
        document = document[key]
    return document


def _sha256(file_path):
    with open(file_path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


SEEN = "ls /dev; echo ---; grep nvidia /proc/self/mountinfo | awk '{print $5}'; echo ---; env | grep -E '^(NVIDIA_|K3S_GPU_)' | sort"


def injected_by(cluster, container_id, seen):
    """Who put the device into the container: NVIDIA's runtime (its log: `Injecting devices using CDI: [...]` after
    this container's create, in the mode it names) or, when the runtime injected nothing or did not run, containerd's
    CRI from the CDI device names the plugin returned; nobody when the container got no device."""
    lines = cluster.runtime_log().splitlines()
    starts = [i for i, line in enumerate(lines) if container_id in line and " create " in line]
    mode, injected = "unknown", None
    for line in lines[starts[0] + 1:] if starts else []:
        if "Command line arguments" in line:
            break
        found = re.search(r"[Mm]ode '([a-z-]+)'", line)
        mode = found.group(1) if found else mode
        found = re.search(r"Injecting devices using CDI: \[([^\]]*)\]", line)
        injected = found.group(1) if found else injected
    if injected:
        return "NVIDIA's runtime (%s mode: CDI devices %s from NVIDIA_VISIBLE_DEVICES)" % (mode, injected)
    if not seen:
        return "nobody (%s)" % ("runc ignores NVIDIA_VISIBLE_DEVICES" if not starts else "NVIDIA's runtime added nothing")
    if not starts:
        return "containerd (the CDI devices the device plugin returned; NVIDIA's runtime did not run)"
    return "containerd (the CDI devices the device plugin returned; NVIDIA's runtime, %s mode, added nothing)" % mode


@pytest.mark.parametrize("handler", ("nvidia", "nvidia-cdi", None), ids=("nvidia", "nvidia-cdi", "no-runtimeclass"))
def test_the_seed_pod_gets_exactly_its_gpu_through_each_handler(cluster, handler):
    """The seed's pod (runtimeClassName nvidia, nvidia.com/gpu: 1), the reviewer's nvidia-cdi, and the same pod without
    a RuntimeClass (runc): what each container got is the evidence of docs/gpu-pods.md. With the envvar strategy the
    device reaches the container only through an NVIDIA handler; with cdi-cri containerd injects it whatever the
    handler."""
    name = "seed-gpu-%s" % (handler or "runc")
    pod = cluster.pod(name, handler, SEEN + "; sleep 3600", gpus=1, restart="Never")
    pod = cluster.wait_phase(name, ("Running",))
    deadline = time.monotonic() + 30
    listing = ""
    while time.monotonic() < deadline and listing.count("---") < 2:
        time.sleep(0.5)
        listing = cluster.logs(name)
    time.sleep(0.5)  # the env lines follow the second separator in the same run of the script
    listing = cluster.logs(name)
    devices_part, mounts_part, env_part = (listing.split("---", 2) + ["", ""])[:3]
    seen = sorted(entry for entry in devices_part.split() if entry.startswith("nvidia"))
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    evidence = {"pod": name, "runtimeClassName": handler, "phase": pod["status"]["phase"],
                "handler_binary": {"nvidia": "nvidia-container-runtime", "nvidia-cdi": "nvidia-container-runtime.cdi",
                                   None: "runc"}[handler],
                "devices": seen, "mounts": sorted(mounts_part.split()), "env": sorted(env_part.split()),
                "injected_by": injected_by(cluster, container_id, seen), "node": pod["spec"].get("nodeName")}
    cluster.report["pods"].append(evidence)
    print("\n%s: %s" % (name, json.dumps(evidence)))
    cluster.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")
    if handler is None and cluster.strategy == "envvar":
        # runc ignores NVIDIA_VISIBLE_DEVICES: the pod is scheduled on its GPU and sees none of it
        assert not seen and "/usr/bin/nvidia-smi" not in evidence["mounts"] and evidence["injected_by"].startswith("nobody"), \
            evidence
        assert any(line.startswith("NVIDIA_VISIBLE_DEVICES=") for line in evidence["env"]), evidence
        return
    assert len(seen) == 1 and re.fullmatch(r"nvidia[0-9]+", seen[0]), listing
    assert "/usr/bin/nvidia-smi" in evidence["mounts"], evidence
    if cluster.strategy == "envvar":
        assert evidence["injected_by"] == "NVIDIA's runtime (cdi mode: CDI devices nvidia.com/gpu=%s from " \
            "NVIDIA_VISIBLE_DEVICES)" % seen[0][len("nvidia"):], evidence
    else:
        assert evidence["injected_by"].startswith("containerd"), evidence


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


def _chart_objects(cluster, tmp_path, settings):
    """Our device-plugin HelmChart for the lab node, rendered with NVIDIA's chart as helm-controller would."""
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as dp  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.tests import testbins  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.tests.conformance import test_device_plugin_chart as chart_checks  # pylint: disable=import-outside-toplevel

    node = {"host": clusterlab.NODE_NAME, "handlers": handlers_of(cluster),
            "cdi_enabled": cluster.strategy == "cdi-cri", "cdi_spec": cluster.strategy == "cdi-cri"}
    release = cluster.state["release"]
    plan = dp.plan_cluster(NodeFacts.from_reading(server_reading(cluster.distribution, release)), settings, [node],
                           cluster.state["shipped_runtimeclasses"])
    chart = chart_checks.shared_file(*chart_checks.CHART_ARCHIVE)
    spec = plan["objects"][0]["spec"]
    values = tmp_path / "values.yaml"
    values.write_text(spec["valuesContent"], encoding="utf-8")
    proc = subprocess.run([testbins.require("helm-render", "helm-render"), plan["objects"][0]["metadata"]["name"], chart,
                           "-n", spec["targetNamespace"], "-f", str(values), "--kube-version", release.split("+")[0]],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return plan, proc.stdout


def _daemonset_pods(cluster, namespace, name):
    pods = cluster.get("pods", "-n", namespace)["items"]
    return [pod for pod in pods if any(ref.get("kind") == "DaemonSet" and ref.get("name") == name
                                       for ref in pod["metadata"].get("ownerReferences", []))]


def test_the_device_plugin_chart_places_its_daemonset_by_our_labels(cluster, tmp_path):
    """NVIDIA's chart with our values (time-slicing) in the API server: the DaemonSet's pod lands on the node
    while it has the role's GPU label, with runtimeClassName nvidia, and leaves once the label is gone. The
    image is absent: placement is checked, not the plugin."""
    plan, manifests = _chart_objects(cluster, tmp_path, {"sharing": {"strategy": "time-slicing", "replicas": 2}})
    namespace = plan["objects"][0]["spec"]["targetNamespace"]
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifests)
    created = {(item["kind"], item["metadata"]["name"]) for item in cluster.get("daemonset,configmap", "-n", namespace)["items"]}
    assert ("ConfigMap", "nvidia-device-plugin-configs") in created, created
    daemonset = next(name for kind, name in created if kind == "DaemonSet" and name.endswith("nvidia-device-plugin"))
    label = next(iter(plan["node_labels"][clusterlab.NODE_NAME]))  # nvidia.com/gpu.present
    node_labels = cluster.get("node", clusterlab.NODE_NAME)["metadata"]["labels"]
    assert node_labels.get(label) == plan["node_labels"][clusterlab.NODE_NAME][label], node_labels
    deadline = time.monotonic() + 60
    pods = []
    while time.monotonic() < deadline and not pods:
        pods = _daemonset_pods(cluster, namespace, daemonset)
        time.sleep(0.5)
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == clusterlab.NODE_NAME, pods
    assert pods[0]["spec"]["runtimeClassName"] == "nvidia"
    cluster.report["pods"].append({"pod": pods[0]["metadata"]["name"], "runtimeClassName": "nvidia",
                                   "phase": pods[0]["status"].get("phase"), "handler_binary": None, "devices": None,
                                   "node": pods[0]["spec"]["nodeName"], "why": "NVIDIA's DaemonSet, placed (image absent)"})
    cluster.kubectl("label", "node", clusterlab.NODE_NAME, label + "-")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _daemonset_pods(cluster, namespace, daemonset):
            time.sleep(0.5)
        assert not _daemonset_pods(cluster, namespace, daemonset)
        assert cluster.get("daemonset", daemonset, "-n", namespace)["status"]["desiredNumberScheduled"] == 0
    finally:
        cluster.kubectl("label", "node", clusterlab.NODE_NAME, "%s=%s" % (label, plan["node_labels"][clusterlab.NODE_NAME][label]))
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_every_helmchart_the_collection_writes_is_created_with_k3s_crds(cluster, tmp_path):
    """k3s's helm-controller CRDs (../shared/reference/crds) in the API server, then each HelmChart and
    HelmChartConfig object the collection writes: device plugin (default, sharing, cdi-cri) and GPU Operator."""
    crds = os.path.join(os.environ.get("K3S_GPU_SHARED") or os.path.join(os.path.dirname(ROOT), "shared"), "reference", "crds")
    if not os.path.isdir(crds):
        pytest.fail("%s missing: k3s's helm-controller CRDs come from the shared material (K3S_GPU_SHARED)" % crds, pytrace=False)
    cluster.kubectl("apply", "-f", crds)
    cluster.kubectl("wait", "--for=condition=Established", "crd/helmcharts.helm.cattle.io", "crd/helmchartconfigs.helm.cattle.io",
                    "--timeout=60s")
    objects = []
    for settings in ({}, {"sharing": {"strategy": "mps", "replicas": 4}}, {"gfd": True}):
        plan, _manifests = _chart_objects(cluster, tmp_path, settings)
        objects += plan["objects"]
    operator_objects = _operator_objects(cluster)
    # the operator's toolkit talks to the embedded containerd's socket (k3s and rke2 share it: the rke2 docs' one
    # setting for the GPU Operator) and is never pointed at the config.toml the release regenerates (rke2 #8752)
    for obj in (o for o in operator_objects if o["kind"] == "HelmChart"):
        toolkit_env = {e["name"]: e["value"] for e in yaml.safe_load(obj["spec"]["valuesContent"])["toolkit"]["env"]}
        assert toolkit_env == {"CONTAINERD_SOCKET": "/run/k3s/containerd/containerd.sock"}, toolkit_env
    objects += operator_objects
    kinds = sorted({obj["kind"] for obj in objects})
    assert "HelmChart" in kinds, kinds
    for index, obj in enumerate(objects):
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["name"] = "%s-%d" % (obj["metadata"]["name"], index)  # each one created, side by side
        obj["metadata"].setdefault("namespace", "kube-system")
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(obj))
        created = cluster.get(obj["kind"].lower() + ".helm.cattle.io", obj["metadata"]["name"], "-n", obj["metadata"]["namespace"])
        # the server keeps every field we wrote (and adds the CRD's defaults, such as failurePolicy)
        assert {key: created["spec"].get(key) for key in obj["spec"]} == obj["spec"], (created["spec"], obj["spec"])
    cluster.report["helmcharts_created"] = [(obj["kind"], obj["metadata"].get("name")) for obj in objects]


def _operator_objects(cluster):
    """The GPU Operator HelmCharts the collection writes for the lab's release: from the repository, air-gapped."""
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as operator  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts  # pylint: disable=import-outside-toplevel
    from ansible_collections.k3s_gpu.nvidia.tests.server_reading import server_reading  # pylint: disable=import-outside-toplevel

    server = NodeFacts.from_reading(server_reading(cluster.distribution, cluster.state["release"]))
    nodes = [{"host": clusterlab.NODE_NAME, "mode": "operator", "driver_install": False}]
    objects = []
    version = release_rules.GPU_OPERATOR_CHART["default_version"]
    for settings in ({}, {"chart_archive": "gpu-operator-%s.tgz" % version}):
        objects += operator.plan_cluster(server, settings, nodes)["objects"]
    return objects


# ------------------------------------------------------------------ k3s_gpu.nvidia.verify against the lab
# nvidia and nvidia-cdi: the lab's NVIDIA runtime injects from its CDI spec. nvidia-legacy runs NVIDIA's hook, which
# needs libnvidia-container and a driver: the lab has neither, so its GPU path is not tested here.
VERIFY_CLASSES = ("nvidia", "nvidia-cdi")


def run_verify(cluster, case, classes=VERIFY_CLASSES):
    """The verify playbook as users run it (the lab's inventory: k3s_gpu_kubeconfig); (rc, the report's lines)."""
    extra = {"k3s_gpu_verify_image": cluster.busybox, "k3s_gpu_verify_timeout_seconds": 120,
             "k3s_gpu_verify_runtimeclasses": list(classes)}
    started = time.monotonic()
    rc, output = clusterlab.run_playbook("verify", "-e", json.dumps(extra), check=False)
    lines = re.findall(r"(?:lab-node|cluster)(?: / [a-z-]+)?: (?:OK|BROKEN at|not tested)[^\"'\n]*", output)
    cluster.report.setdefault("verify", []).append({"case": case, "rc": rc, "seconds": round(time.monotonic() - started, 1),
                                                   "lines": sorted(set(lines))})
    print("\nverify, %s: rc %d\n  %s" % (case, rc, "\n  ".join(sorted(set(lines)))))
    return rc, output


def node_gpus(cluster):
    return cluster.get("node", clusterlab.NODE_NAME)["status"].get("allocatable", {}).get("nvidia.com/gpu")


def wait_for_gpus(cluster, count, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and node_gpus(cluster) != count:
        time.sleep(0.5)
    assert node_gpus(cluster) == count


def test_verify_passes_on_the_good_cluster(cluster):
    rc, output = run_verify(cluster, "good cluster")
    assert rc == 0, output[-4000:]
    for name in VERIFY_CLASSES:
        assert re.search(r"lab-node / %s: OK \| allocatable nvidia.com/gpu %d \| GPU [0-9]: NVIDIA Lab Test Double"
                         % (name, GPUS), output), output[-4000:]
    assert not cluster.get("pods", "-n", "k3s-gpu-verify")["items"]  # it cleaned up before it returned


def _without_runtime(handler):
    """containerd config text -> the same without the handler's runtime table and its options."""
    table = re.compile(r"\.runtimes\.['\"]?%s['\"]?(\.options)?$" % re.escape(handler))

    def edit(text):
        kept, skipping = [], False
        for line in text.splitlines(keepends=True):
            header = re.match(r"\s*\[+\s*([^\]]+?)\s*\]+\s*$", line)
            if header:
                skipping = table.search(header.group(1)) is not None
            if not skipping:
                kept.append(line)
        return "".join(kept)
    return edit


def test_verify_names_containerd_config_when_the_handler_is_missing(cluster):
    state = clusterlab.read_state()
    config = os.path.join(clusterlab.LAB_DIR, "containerd", "config.toml")
    with open(config, encoding="utf-8") as handle:
        original = handle.read()
    assert _without_runtime("nvidia")(original) != original and ".runtimes.nvidia-cdi" in _without_runtime("nvidia")(original)
    clusterlab.restart_containerd(state, _without_runtime("nvidia"))
    try:
        rc, output = run_verify(cluster, "nvidia handler missing from containerd's config")
        assert rc != 0
        assert re.search(r'lab-node / nvidia: BROKEN at containerd-config: .*no runtime for \\?"nvidia\\?" is configured', output), \
            output[-4000:]
        assert re.search(r"lab-node / nvidia-cdi: OK", output), output[-4000:]
    finally:
        clusterlab.restart_containerd(state, lambda _text: original)


def test_verify_names_runtimeclass_when_it_is_missing(cluster):
    saved = cluster.get("runtimeclass", "nvidia")
    cluster.kubectl("delete", "runtimeclass", "nvidia")
    try:
        rc, output = run_verify(cluster, "RuntimeClass nvidia missing")
        assert rc != 0
        assert "cluster: BROKEN at runtimeclass: RuntimeClass nvidia does not exist. Fix: run k3s_gpu.nvidia.runtimeclasses" \
            in output, output[-4000:]
        assert re.search(r"lab-node / nvidia-cdi: OK", output), output[-4000:]
    finally:
        restored = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": saved["handler"],
                    "metadata": {"name": "nvidia", "labels": saved["metadata"].get("labels") or {}}}
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(restored))


def test_verify_names_the_device_plugin_when_none_is_registered(cluster):
    state = clusterlab.read_state()
    clusterlab.stop_process(state, "device-plugin")
    try:
        wait_for_gpus(cluster, "0")
        rc, output = run_verify(cluster, "no device plugin registered")
        assert rc != 0
        assert re.search(r"lab-node: BROKEN at device-plugin: the node is labelled nvidia.com/gpu.present=true but "
                         r"advertises no nvidia.com/gpu", output), output[-4000:]
    finally:
        clusterlab.start_again(state, "device-plugin")
        wait_for_gpus(cluster, str(GPUS))


def test_verify_names_cdi_when_the_spec_is_missing(cluster):
    """cdi-cri: containerd resolves the plugin's CDI device names; envvar: NVIDIA's runtime (cdi mode) resolves
    NVIDIA_VISIBLE_DEVICES through the same spec. Either way a missing spec is the cdi layer."""
    spec = os.path.join(clusterlab.LAB_DIR, "cdi", clusterlab.CDI_SPEC_NAME)
    # renamed within the spec dir: containerd's CDI cache (container-device-interface v1.1) refreshes on a Rename or a
    # Write there, not on the Create that a spec moved in from another directory makes, so the spec comes back seen
    away = spec + ".away"
    os.replace(spec, away)
    try:
        rc, output = run_verify(cluster, "CDI spec missing", classes=("nvidia",))
        assert rc != 0
        assert re.search(r"lab-node / nvidia: BROKEN at cdi: .*unresolvable CDI devices nvidia.com/gpu=[0-9]", output), \
            output[-4000:]
    finally:
        os.replace(away, spec)


def test_a_sandbox_that_kubelets_retry_brings_up_is_not_broken(cluster):
    """A sandbox that fails once (the handler's binary is away) comes up on kubelet's retry, and its
    FailedCreatePodSandBox event stays behind: verify's diagnosis goes by the pod, not by that event. kubelet retries
    after its back-off (10 s, capped at its syncFrequency: the lab's 5 s), plus up to 50% jitter."""
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify  # pylint: disable=import-outside-toplevel
    binary = os.path.join(clusterlab.LAB_DIR, "node", "usr", "bin", "nvidia-container-runtime")
    with open(os.path.join(clusterlab.LAB_DIR, "containerd", "config.toml"), encoding="utf-8") as handle:
        assert 'BinaryName = "%s"' % binary in handle.read()  # the nvidia handler runs this copy, the lab's own
    name = "sandbox-retry"
    os.replace(binary, binary + ".away")
    try:
        cluster.pod(name, "nvidia", "sleep 60")
        deadline, failed = time.monotonic() + 60, []
        while time.monotonic() < deadline and not failed:
            failed = [e for e in cluster.get("events", "-n", "default", "--field-selector", "involvedObject.name=" + name)["items"]
                      if e["reason"] == "FailedCreatePodSandBox"]
            time.sleep(0.2)
    finally:
        os.replace(binary + ".away", binary)
    restored = time.monotonic()
    try:
        assert failed and "no such file or directory" in failed[0]["message"], failed
        pod = cluster.wait_phase(name, ("Running",))
        retry_seconds = round(time.monotonic() - restored, 1)
        events = cluster.get("events", "-n", "default")["items"]
        assert any(e["involvedObject"]["name"] == name and e["reason"] == "FailedCreatePodSandBox" for e in events)
        assert verify.diagnose(pod, events) == {"done": False, "broken": None}, (pod["status"], failed)
        cluster.report["sandbox_retry_seconds"] = retry_seconds
        print("\nsandbox failed once, running %.1f s after the binary came back" % retry_seconds)
    finally:
        cluster.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")


# ------------------------------------------------------------------ k3s_gpu.nvidia.doctor against the lab
def run_doctor(cluster, case, tmp_path, **extra):
    """The doctor playbook on the lab's inventory (its node tree and kubeconfig); (rc, the node's report)."""
    report_path = str(tmp_path / "doctor.json")
    extra = dict(extra, doctor_report_path=report_path)
    rc, output = clusterlab.run_playbook("doctor", "-e", json.dumps(extra), check=False)
    with open(report_path, encoding="utf-8") as handle:
        node = json.load(handle)["nodes"][0]
    line = next((text for text in re.findall(r'"(lab-node: [^"]*)"', output)), "")
    cluster.report.setdefault("doctor", []).append({"case": case, "rc": rc, "status": node["status"],
                                                   "broken": node.get("broken"), "line": line})
    print("\ndoctor, %s: rc %d\n  %s" % (case, rc, line))
    return rc, node, output


def test_doctor_passes_every_layer_on_the_good_lab(cluster, tmp_path):
    rc, node, output = run_doctor(cluster, "good lab", tmp_path)
    assert rc == 0 and node["status"] == "OK", output[-4000:]
    every = ["gpu", "driver", "toolkit", "cdi", "containerd-config", "runtime-service", "runtimeclass", "dra-conflict",
             "device-plugin",
             "allocatable"]
    assert [p["layer"] for p in node["passed"]] == every
    assert node["passed"][-1]["detail"].startswith("allocatable nvidia.com/gpu %d" % GPUS)


def pod_layer(cluster):
    """The variables of the doctor's pod layer in the lab: its pods run the lab's busybox image, with the classes verify
    tests here (the legacy runtime needs a real driver's libnvidia-container)."""
    return {"doctor_run_pod": True, "k3s_gpu_verify_image": cluster.busybox, "k3s_gpu_verify_timeout_seconds": 120,
            "k3s_gpu_verify_runtimeclasses": list(VERIFY_CLASSES)}


def test_doctor_runs_a_gpu_pod_per_handler_on_the_good_lab(cluster, tmp_path):
    rc, node, output = run_doctor(cluster, "good lab, pod layer", tmp_path, **pod_layer(cluster))
    assert rc == 0 and node["status"] == "OK", output[-4000:]
    assert [p["layer"] for p in node["passed"]][-2:] == ["allocatable", "pod"], node["passed"]
    detail = node["passed"][-1]["detail"]
    for handler in VERIFY_CLASSES:
        assert re.search(r"(^|; )%s: GPU [0-9]: NVIDIA Lab Test Double" % re.escape(handler), detail), detail
    assert "k3s-gpu-doctor" not in cluster.kubectl("get", "namespaces", "-o", "name").stdout  # deleted again


def test_doctor_names_the_pod_layer_when_only_a_pod_shows_the_break(cluster, tmp_path):
    """The node's tree still holds its CDI spec (the node layers pass), but the spec containerd and the runtime read
    is gone: only a pod shows it, and the doctor says which layer the pod saw."""
    spec = os.path.join(clusterlab.LAB_DIR, "cdi", clusterlab.CDI_SPEC_NAME)
    # renamed within the spec dir: containerd's CDI cache (container-device-interface v1.1) refreshes on a Rename or a
    # Write there, not on the Create that a spec moved in from another directory makes, so the spec comes back seen
    away = spec + ".away"
    os.replace(spec, away)
    try:
        rc, node, output = run_doctor(cluster, "CDI spec gone from the containers' view, pod layer", tmp_path,
                                      **pod_layer(cluster))
        assert rc != 0 and node["broken_layer"] == "pod", output[-4000:]
        assert re.search(r"the pod with RuntimeClass nvidia(-[a-z]+)? and nvidia.com/gpu: 1 did not get its GPU \(the cdi layer",
                         node["broken"]["cause"]), node["broken"]
        assert [p["layer"] for p in node["passed"]][-1] == "allocatable"
    finally:
        os.replace(away, spec)


def test_doctor_names_the_runtimeclass_when_one_is_missing(cluster, tmp_path):
    saved = cluster.get("runtimeclass", "nvidia-legacy")
    cluster.kubectl("delete", "runtimeclass", "nvidia-legacy")
    try:
        rc, node, output = run_doctor(cluster, "RuntimeClass nvidia-legacy missing", tmp_path)
        assert rc != 0 and node["broken_layer"] == "runtimeclass", output[-4000:]
        assert "no RuntimeClass has the handler(s) nvidia-legacy" in node["broken"]["cause"]
        assert [p["layer"] for p in node["passed"]][-1] == "runtime-service"
    finally:
        restored = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": saved["handler"],
                    "metadata": {"name": "nvidia-legacy", "labels": saved["metadata"].get("labels") or {}}}
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(restored))


def test_doctor_names_the_device_plugin_when_it_stopped(cluster, tmp_path):
    state = clusterlab.read_state()
    clusterlab.stop_process(state, "device-plugin")
    try:
        wait_for_gpus(cluster, "0")
        rc, node, output = run_doctor(cluster, "device plugin stopped", tmp_path)
        assert rc != 0 and node["broken_layer"] == "device-plugin", output[-4000:]
        assert "allocatable 0 and no device plugin pod running" in node["broken"]["cause"]
    finally:
        clusterlab.start_again(state, "device-plugin")
        wait_for_gpus(cluster, str(GPUS))


def gpu_counts(cluster):
    """(capacity, allocatable) nvidia.com/gpu of the lab node."""
    status = cluster.get("node", clusterlab.NODE_NAME)["status"]
    return (status.get("capacity", {}).get("nvidia.com/gpu"), status.get("allocatable", {}).get("nvidia.com/gpu"))


def test_doctor_names_allocatable_when_the_plugin_reports_every_device_unhealthy(cluster, tmp_path):
    """The plugin's pod runs on the node and reports every device Unhealthy (SIGUSR1 to the test double): capacity
    stays, allocatable is 0. The doctor passes the device-plugin layer (its pod runs) and names allocatable."""
    state = clusterlab.read_state()
    plugin_pod = clusterlab.device_plugin_to_pod(state)
    try:
        wait_for_gpus(cluster, str(GPUS))
        clusterlab.signal_device_plugin_pod(state, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and gpu_counts(cluster) != (str(GPUS), "0"):
            time.sleep(0.5)
        assert gpu_counts(cluster) == (str(GPUS), "0")
        rc, node, output = run_doctor(cluster, "device plugin pod, every device unhealthy", tmp_path)
        assert rc != 0 and node["status"] == "BROKEN" and node["broken_layer"] == "allocatable", output[-4000:]
        assert "allocatable nvidia.com/gpu is 0 (capacity %d)" % GPUS in node["broken"]["cause"], node["broken"]
        every = ["gpu", "driver", "toolkit", "cdi", "containerd-config", "runtime-service", "runtimeclass", "dra-conflict",
                 "device-plugin"]
        assert [p["layer"] for p in node["passed"]] == every, node["passed"]
        assert plugin_pod["metadata"]["name"] in node["passed"][-1]["detail"], node["passed"][-1]
        lines = [line for line in re.findall(r'"(lab-node: [^"]*)"', output) if not line.startswith("lab-node: passed ")]
        assert lines and all(line.startswith("lab-node: BROKEN at allocatable: ") for line in lines), lines
    finally:
        with contextlib.suppress(clusterlab.LabError):
            clusterlab.signal_device_plugin_pod(state, signal.SIGUSR2)
        clusterlab.device_plugin_to_host(state)
        wait_for_gpus(cluster, str(GPUS))
        assert gpu_counts(cluster) == (str(GPUS), str(GPUS))
