# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""DRA on the lab's real API server, scheduler and kubelet (issue 45): `scripts/cluster-lab.sh up --allocation dra`.

For each Kubernetes line in K3S_GPU_LAB_KUBERNETES (default 1.36) one k3s lab with 2 fake GPUs runs as a DRA node
(the collection's module labels it k3s-gpu.nvidia/gpu-allocation=dra) with no device plugin. Two DRA kubelet plugins
serve it as plain processes: Kubernetes' own DRA test driver (of the lab's Kubernetes module; its CDI edits are env
only) and our DRA TEST DOUBLE of NVIDIA's driver (driver gpu.nvidia.com, NVIDIA's attributes, a claim's CDI spec with
its fake /dev/nvidia<N>). The DeviceClasses are NVIDIA's own, rendered by NVIDIA's chart from the collection's values.

- resource.k8s.io/v1 is served with no flag; each driver publishes a ResourceSlice for the node;
- the objects NVIDIA's chart renders from the collection's HelmChart values are accepted by the API server (server-side
  dry run), its kubelet plugin DaemonSet is scheduled on the DRA node and the device plugin's DaemonSet (the
  collection's values in a cluster with DRA nodes) on none;
- a pod with a ResourceClaimTemplate of class gpu.nvidia.com runs under each handler the release has (nvidia,
  nvidia-cdi) and with no RuntimeClass, and `ls /dev` shows exactly the device its claim was allocated; two containers
  sharing one claim see the same device; a claim for more devices than the node has stays Pending with the
  scheduler's reason; Kubernetes' test driver's claim reaches the container through containerd's CDI;
- the seed's pod, unchanged (runtimeClassName nvidia, nvidia.com/gpu: 1): on 1.36 served through DRA (NVIDIA's
  DeviceClass names nvidia.com/gpu; DRAExtendedResource is on by default), on 1.34 Pending (the gate is off).
Each pod's phase, the devices it saw and its claim's allocation go into tests/output/cluster-lab-dra-<line>.json,
with the lab's start-to-first-claim-pod time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.tests import testbins

from . import clusterlab
from .test_cluster_lab import Lab, host_snapshot, tear_down

ROOT = clusterlab.ROOT
SCRIPT = os.path.join(ROOT, "scripts", "cluster-lab.sh")
LINES = [line.strip() for line in os.environ.get("K3S_GPU_LAB_KUBERNETES", "1.36").split(",") if line.strip()]
GPUS = 2
NVIDIA_CLASS = clusterlab.NVIDIA_DRA_DRIVER
DEVICE_PLUGIN_CHART = "charts/nvidia-device-plugin-0.20.0.tgz"


class DraLab(Lab):
    def __init__(self, line):
        super().__init__("k3s", line, "dra")
        self.name = "dra-%s" % line
        self.report.update(allocation="dra", strategy=None)

    def up(self):
        started = time.monotonic()
        proc = subprocess.run([SCRIPT, "up", "--kubernetes", self.line, "--release", self.release, "--gpus", str(GPUS),
                               "--allocation", "dra"], capture_output=True, text=True, timeout=3600, check=False)
        if proc.returncode != 0:
            pytest.fail("cluster-lab.sh up --allocation dra failed (%d):\n%s\n%s" % (
                proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:]), pytrace=False)
        lines = proc.stdout.strip().splitlines()
        self.busybox = lines[-2].split("=", 1)[1]
        self.kubeconfig = lines[-1].split("=", 1)[1]
        self.state = clusterlab.read_state()
        self.kubectl_bin = self.state["binaries"]["kubectl"]
        self.report["up_seconds"] = round(time.monotonic() - started, 1)
        self.report["up_output"] = lines
        pod = self.claim_pod("first-claim", "ls /dev")
        first = self.wait_phase(pod, ("Succeeded", "Failed"))
        assert first["status"]["phase"] == "Succeeded", first["status"]
        self.report["first_claim_pod_seconds"] = round(time.monotonic() - started, 1)
        print("\ncluster lab %s: up in %.1f s, first claim pod Succeeded %.1f s after the start"
              % (self.name, self.report["up_seconds"], self.report["first_claim_pod_seconds"]))
        self.kubectl("delete", "pod", pod, "-n", "default", "--wait=true", "--timeout=60s")
        return self

    def claim_pod(self, name, command, runtime_class=None, device_class=NVIDIA_CLASS, count=1, containers=1):
        """A pod whose containers use one claim from a ResourceClaimTemplate of device_class (count devices)."""
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"spec": {"devices": {"requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": count}}]}}}}
        spec = {"restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                "containers": [{"name": "c%d" % index, "image": self.busybox, "imagePullPolicy": "Never",
                                "command": ["/bin/sh", "-c", command], "resources": {"claims": [{"name": "gpu"}]}}
                               for index in range(containers)]}
        if runtime_class:
            spec["runtimeClassName"] = runtime_class
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [template, pod]}))
        return name

    def allocation_of(self, pod):
        """The devices the pod's claim was allocated: [(driver, device)], read while the pod runs (the claim a template
        made is deleted once its pod is done)."""
        claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        results = self.get("resourceclaim", claim, "-n", "default")["status"]["allocation"]["devices"]["results"]
        return [(r["driver"], r["device"]) for r in results]

    def run_claim_pod(self, name, command, **options):
        """(the pod when it ended, its claim's allocation, read while it ran): the command runs, then sleeps 3 s."""
        self.claim_pod(name, command + "; sleep 3", **options)
        running = self.wait_phase(name, ("Running", "Succeeded", "Failed"))
        allocated = self.allocation_of(running) if running["status"]["phase"] == "Running" else None
        return self.wait_phase(name, ("Succeeded", "Failed")), allocated

    def record(self, name, pod, **more):
        entry = {"pod": name, "phase": pod["status"]["phase"], **more}
        self.report["pods"].append(entry)
        return entry


def nvidia_devices(output):
    return sorted(word for word in output.split() if word.startswith("nvidia") and word[6:].isdigit())


@pytest.fixture(scope="module", params=LINES, ids=lambda line: "k8s%s" % line)
def dra_lab(request):
    before = host_snapshot()
    assert not before["processes"] and not before["lab_dir"], "a lab is already running: %s" % before
    lab = DraLab(request.param)
    try:
        yield lab.up()
    finally:
        tear_down(lab, before)


def test_the_api_is_served_and_each_driver_publishes_the_nodes_devices(dra_lab):
    resources = dra_lab.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name").stdout.split()
    assert {"deviceclasses.resource.k8s.io", "resourceclaims.resource.k8s.io", "resourceclaimtemplates.resource.k8s.io",
            "resourceslices.resource.k8s.io"} <= set(resources), resources
    slices = [s["spec"] for s in dra_lab.get("resourceslices")["items"] if s["spec"].get("nodeName") == clusterlab.NODE_NAME]
    by_driver = {spec["driver"]: spec for spec in slices}
    assert sorted(by_driver) == sorted(clusterlab.DRA_DRIVERS), slices
    ours = by_driver[NVIDIA_CLASS]["devices"]
    assert [d["name"] for d in ours] == ["gpu-%d" % i for i in range(GPUS)]
    assert all(d["attributes"]["type"] == {"string": "gpu"} for d in ours), ours
    node = dra_lab.get("node", clusterlab.NODE_NAME)
    assert node["metadata"]["labels"].get("k3s-gpu.nvidia/gpu-allocation") == "dra"
    assert "nvidia.com/gpu" not in node["status"].get("allocatable", {})  # no device plugin on a DRA node
    nvidia_class = dra_lab.get("deviceclass", NVIDIA_CLASS)
    assert "device.attributes['gpu.nvidia.com'].type == 'gpu'" in nvidia_class["spec"]["selectors"][0]["cel"]["expression"]
    dra_lab.report["resourceslices"] = {driver: len(spec.get("devices") or []) for driver, spec in by_driver.items()}


def chart_objects(dra_lab, chart, values, name, namespace):
    """NVIDIA's chart rendered with these values (helm-render), as helm-controller's job would install them."""
    values_file = os.path.join(clusterlab.LAB_DIR, "%s-values.yaml" % name)
    with open(values_file, "w", encoding="utf-8") as handle:
        handle.write(values)
    proc = subprocess.run([testbins.path_of("helm-render", "helm-render"), name, chart, "-n", namespace, "-f", values_file,
                           "--kube-version", dra_lab.release.split("+")[0]], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def test_the_charts_objects_are_accepted_and_each_daemonset_goes_where_it_belongs(dra_lab):
    shared = os.environ.get("K3S_GPU_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
    dra_values = open(os.path.join(clusterlab.LAB_DIR, "dra-values.yaml"), encoding="utf-8").read()
    dra_objects = chart_objects(dra_lab, clusterlab.dra_chart(), dra_values, "nvidia-dra-driver-gpu", "dra-test")
    plugin_values = device_plugin.chart_values(dict(device_plugin._check_settings({}), sharing=None, configs={}),  # pylint: disable=protected-access
                                               "nvidia", "envvar", [], dra_nodes=True)
    plugin_objects = chart_objects(dra_lab, os.path.join(shared, DEVICE_PLUGIN_CHART), yaml.safe_dump(plugin_values),
                                   "nvidia-device-plugin", "dp-test")
    for namespace in ("dra-test", "dp-test"):
        dra_lab.kubectl("create", "namespace", namespace)
    try:
        listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": dra_objects})
        dry = dra_lab.kubectl("apply", "--dry-run=server", "-n", "dra-test", "-f", "-", stdin=listing)
        assert dry.stdout.count("(server dry run)") == len(dra_objects), dry.stdout
        placed = {}
        for objects, namespace in ((dra_objects, "dra-test"), (plugin_objects, "dp-test")):
            for daemonset in (o for o in objects if o["kind"] == "DaemonSet"):
                daemonset = dict(daemonset, metadata=dict(daemonset["metadata"], namespace=namespace))
                dra_lab.kubectl("apply", "-f", "-", stdin=json.dumps(daemonset))
                name = daemonset["metadata"]["name"]
                deadline = time.monotonic() + 60
                status = {}
                while time.monotonic() < deadline and "desiredNumberScheduled" not in status:
                    status = dra_lab.get("daemonset", name, "-n", namespace).get("status") or {}
                    time.sleep(0.5)
                placed[name] = status.get("desiredNumberScheduled")
        assert placed["dra-driver-nvidia-gpu-kubelet-plugin"] == 1, placed
        assert placed["nvidia-device-plugin"] == 0, placed
        dra_lab.report["daemonsets_on_the_dra_node"] = placed
    finally:
        for namespace in ("dra-test", "dp-test"):
            dra_lab.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.mark.parametrize("handler", ["nvidia", "nvidia-cdi", None], ids=["nvidia", "nvidia-cdi", "no-runtimeclass"])
def test_a_claim_pod_sees_exactly_its_device_under_each_handler(dra_lab, handler):
    name = "claim-%s" % (handler or "none")
    # the lab's busybox has PATH=/bin: the claim's CDI spec mounts the nvidia-smi test double into /usr/bin
    pod, allocated = dra_lab.run_claim_pod(
        name, "ls /dev; /usr/bin/nvidia-smi -L; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES", runtime_class=handler)
    output = dra_lab.logs(name)
    assert pod["status"]["phase"] == "Succeeded", (pod["status"], output)
    assert allocated and len(allocated) == 1 and allocated[0][0] == NVIDIA_CLASS, allocated
    index = allocated[0][1].rsplit("-", 1)[1]
    assert nvidia_devices(output) == ["nvidia%s" % index], output
    assert "NVIDIA_VISIBLE_DEVICES=void" in output, output
    assert "GPU %s: NVIDIA Lab Test Double" % index in output, output
    dra_lab.record(name, pod, runtimeClassName=handler, devices=nvidia_devices(output), allocation=allocated)
    dra_lab.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")


def test_two_containers_sharing_a_claim_see_the_same_device(dra_lab):
    pod, allocated = dra_lab.run_claim_pod("shared-claim", "ls /dev", containers=2)
    assert pod["status"]["phase"] == "Succeeded" and allocated, pod["status"]
    seen = [nvidia_devices(dra_lab.kubectl("logs", "-n", "default", "shared-claim", "-c", c).stdout) for c in ("c0", "c1")]
    assert seen[0] == seen[1] == ["nvidia%s" % allocated[0][1].rsplit("-", 1)[1]], (seen, allocated)
    dra_lab.record("shared-claim", pod, devices=seen, allocation=allocated)
    dra_lab.kubectl("delete", "pod", "shared-claim", "-n", "default", "--wait=true", "--timeout=60s")


def test_a_claim_for_more_devices_than_the_node_has_stays_pending_with_the_schedulers_reason(dra_lab):
    dra_lab.claim_pod("too-many", "ls /dev", count=GPUS + 1)
    deadline = time.monotonic() + 60
    message = ""
    while time.monotonic() < deadline and "cannot allocate all claims" not in message:
        pod = dra_lab.get("pod", "too-many", "-n", "default")
        message = " ".join(c.get("message", "") for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled")
        time.sleep(1)
    assert pod["status"]["phase"] == "Pending" and "cannot allocate all claims" in message, pod["status"]
    dra_lab.record("too-many", pod, reason=message)
    dra_lab.kubectl("delete", "pod", "too-many", "-n", "default", "--wait=true", "--timeout=60s")


def test_kubernetes_own_test_driver_reaches_the_container_through_cdi(dra_lab):
    pod, allocated = dra_lab.run_claim_pod("test-driver", "env", device_class=clusterlab.TEST_DRA_DRIVER)
    assert pod["status"]["phase"] == "Succeeded" and allocated[0][0] == clusterlab.TEST_DRA_DRIVER, (pod["status"], allocated)
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    env = dra_lab.logs("test-driver")
    assert "claim_%s_gpu=true" % claim.replace("-", "_") in env or "claim_%s_gpu=true" % claim in env, env
    dra_lab.record("test-driver", pod, allocation=allocated)
    dra_lab.kubectl("delete", "pod", "test-driver", "-n", "default", "--wait=true", "--timeout=60s")


def test_the_seed_pod_is_served_through_dra_on_1_36_and_pending_on_1_34(dra_lab):
    name = dra_lab.pod("seed", "nvidia", "ls /dev", gpus=1)
    served = distro.has_feature(distro.Release("k3s", dra_lab.release), "dra_extended_resource")
    if served:
        pod = dra_lab.wait_phase(name, ("Succeeded", "Failed"))
        output = dra_lab.logs(name)
        assert pod["status"]["phase"] == "Succeeded" and len(nvidia_devices(output)) == 1, (pod["status"], output)
        dra_lab.record(name, pod, runtimeClassName="nvidia", devices=nvidia_devices(output),
                       extended_resource_claim=pod["status"].get("extendedResourceClaimStatus"))
    else:
        time.sleep(10)
        pod = dra_lab.get("pod", name, "-n", "default")
        message = " ".join(c.get("message", "") for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled")
        assert pod["status"]["phase"] == "Pending" and "Insufficient nvidia.com/gpu" in message, pod["status"]
        dra_lab.record(name, pod, runtimeClassName="nvidia", reason=message)
    dra_lab.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=60s")


# ------------------------------------------------------------------ k3s_gpu.nvidia.verify and doctor on the DRA node
# nvidia and nvidia-cdi: the lab's NVIDIA runtime injects from CDI; nvidia-legacy runs NVIDIA's hook, which needs a
# driver the lab does not have (as in test_cluster_lab)
VERIFY_CLASSES = ("nvidia", "nvidia-cdi")


def run_verify(dra_lab, case):
    """The verify playbook as users run it; (rc, its report's lines, output)."""
    extra = {"k3s_gpu_verify_image": dra_lab.busybox, "k3s_gpu_verify_timeout_seconds": 120,
             "k3s_gpu_verify_runtimeclasses": list(VERIFY_CLASSES)}
    rc, output = clusterlab.run_playbook("verify", "-e", json.dumps(extra), check=False)
    lines = sorted(set(re.findall(r"lab-node(?: / [^\n\"]*?)?: (?:OK|BROKEN at|not tested)[^\"\n]*", output)))
    dra_lab.report.setdefault("verify", []).append({"case": case, "rc": rc, "lines": lines})
    print("\nverify, %s: rc %d\n  %s" % (case, rc, "\n  ".join(lines)))
    return rc, lines, output


def run_doctor(dra_lab, case, tmp_path, run_pod=False):
    report_path = str(tmp_path / "doctor.json")
    extra = {"doctor_report_path": report_path, "doctor_run_pod": run_pod, "k3s_gpu_verify_image": dra_lab.busybox,
             "k3s_gpu_verify_timeout_seconds": 120, "k3s_gpu_verify_runtimeclasses": list(VERIFY_CLASSES)}
    rc, output = clusterlab.run_playbook("doctor", "-e", json.dumps(extra), check=False)
    with open(report_path, encoding="utf-8") as handle:
        node = json.load(handle)["nodes"][0]
    dra_lab.report.setdefault("doctor", []).append({"case": case, "rc": rc, "status": node["status"],
                                                    "broken": node.get("broken"), "passed": node.get("passed")})
    print("\ndoctor, %s: rc %d, %s %s" % (case, rc, node["status"], node.get("broken_layer") or ""))
    return rc, node, output


def test_verify_runs_a_claim_pod_per_handler_and_without_one_and_the_seed_pod_where_dra_serves_it(dra_lab):
    """Issue 45 item 5 and c, e, f: each claim pod is OK with the device its claim was allocated, the one /dev/nvidia<N>
    it saw and nvidia-smi's line; on 1.36 the seed's pod (nvidia, nvidia.com/gpu: 1) is OK too, on 1.34 a note says
    why it is not tested."""
    rc, lines, output = run_verify(dra_lab, "good DRA node")
    assert rc == 0, output[-4000:]
    for label in ("no RuntimeClass",) + VERIFY_CLASSES:
        pattern = (r"lab-node / %s \(claim\): OK \| claim gpu\.nvidia\.com lab-node/gpu-([01]) \| /dev/nvidia\1 \| "
                   r"GPU \1: NVIDIA Lab Test Double" % re.escape(label))
        assert [line for line in lines if re.match(pattern, line)], (label, lines)
    if distro.has_feature(distro.Release("k3s", dra_lab.release), "dra_extended_resource"):
        assert [line for line in lines if re.match(r"lab-node / nvidia: OK \| allocatable nvidia.com/gpu 0 \(GPUs through "
                                                   r"DRA\) \| GPU [01]: NVIDIA Lab Test Double", line)], lines
    else:
        assert [line for line in lines if line.startswith("lab-node / nvidia with nvidia.com/gpu: 1: not tested: the "
                                                          "node's GPUs are allocated through DRA, and its kubelet is v1.34")
                and "from 1.36 (DRAExtendedResource" in line], lines
    assert not dra_lab.get("pods", "-n", "k3s-gpu-verify")["items"]  # it cleaned up before it returned


def test_doctor_passes_the_dra_layers_and_the_claim_layer_on_the_good_dra_node(dra_lab, tmp_path):
    rc, node, output = run_doctor(dra_lab, "good DRA node", tmp_path, run_pod=True)
    assert rc == 0 and node["status"] == "OK", output[-4000:]
    assert [p["layer"] for p in node["passed"]][-6:] == ["runtimeclass", "dra-api", "dra-conflict", "dra-driver",
                                                         "deviceclass", "claim"], node["passed"]
    assert node["passed"][-3]["detail"] == "%d device(s) of gpu.nvidia.com" % GPUS
    served = distro.has_feature(distro.Release("k3s", dra_lab.release), "dra_extended_resource")
    assert ("a pod asking nvidia.com/gpu: 1 is served through DRA" if served else
            "a pod asking nvidia.com/gpu: 1 stays Pending") in node["passed"][-2]["detail"], node["passed"][-2]
    claim = node["passed"][-1]["detail"]
    for label in ("no RuntimeClass",) + VERIFY_CLASSES:
        assert re.search(r"(^|; )%s: claim gpu\.nvidia\.com lab-node/gpu-[01] \| /dev/nvidia[01] \| GPU [01]: "
                         % re.escape(label), claim), claim


def test_verify_and_doctor_name_the_deviceclass_when_it_is_gone(dra_lab, tmp_path):
    saved = dra_lab.get("deviceclass", NVIDIA_CLASS)
    dra_lab.kubectl("delete", "deviceclass", NVIDIA_CLASS)
    try:
        rc, node, output = run_doctor(dra_lab, "DeviceClass deleted", tmp_path)
        assert rc != 0 and node["broken_layer"] == "deviceclass", output[-4000:]
        rc, lines, output = run_verify(dra_lab, "DeviceClass deleted")
        assert rc != 0 and "lab-node: BROKEN at deviceclass: there is no DeviceClass gpu.nvidia.com" in "\n".join(lines), lines
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            saved["metadata"].pop(key, None)
        dra_lab.kubectl("apply", "-f", "-", stdin=json.dumps(saved))


def test_verify_and_doctor_name_a_cdi_dir_that_containerd_does_not_scan(dra_lab, tmp_path):
    """containerd's cdi_spec_dirs narrowed to leave out the dir the DRA driver writes its claims' specs to (the lab's
    stand-in for /var/run/cdi): the claim is allocated and prepared, and containerd cannot resolve its CDI device."""
    state = clusterlab.read_state()
    config = clusterlab.path("containerd", "config.toml")
    with open(config, encoding="utf-8") as handle:
        original = handle.read()
    cdi_dir = clusterlab.path("cdi")
    assert cdi_dir in original, "the lab's containerd config does not name %s" % cdi_dir
    clusterlab.restart_containerd(state, lambda text: text.replace(cdi_dir, cdi_dir + "-not-scanned"))
    try:
        rc, lines, output = run_verify(dra_lab, "containerd does not scan the DRA driver's CDI dir")
        assert rc != 0, output[-4000:]
        # the claims the pods stuck at their CDI devices hold may leave the node no device for the others (2 GPUs)
        broken = [line for line in lines if re.match(r"lab-node / [^:]+ \(claim\): BROKEN at cdi: ", line)]
        assert broken and all("unresolvable CDI devices k8s.gpu.nvidia.com/claim=" in line
                              and "Fix: containerd must scan /var/run/cdi" in line for line in broken), lines
        rc, node, output = run_doctor(dra_lab, "containerd does not scan the DRA driver's CDI dir", tmp_path, run_pod=True)
        assert rc != 0 and node["broken_layer"] == "claim", output[-4000:]
        assert "(the cdi layer, as the pod shows it)" in node["broken"]["cause"], node["broken"]
    finally:
        clusterlab.restart_containerd(state, lambda _text: original)


def test_verify_and_doctor_name_the_driver_when_it_stopped(dra_lab, tmp_path):
    state = clusterlab.read_state()
    clusterlab.stop_process(state, "dra-plugin-testdouble")
    try:
        deadline = time.monotonic() + 120  # kubelet removes a driver's slices once the plugin stays away
        while time.monotonic() < deadline and clusterlab.dra_devices(state).get(NVIDIA_CLASS):
            time.sleep(1)
        assert not clusterlab.dra_devices(state).get(NVIDIA_CLASS), clusterlab.dra_devices(state)
        dra_lab.report["slices_gone_seconds"] = round(120 - (deadline - time.monotonic()), 1)
        rc, node, output = run_doctor(dra_lab, "DRA driver stopped", tmp_path)
        assert rc != 0 and node["broken_layer"] == "dra-driver", output[-4000:]
        rc, lines, output = run_verify(dra_lab, "DRA driver stopped")
        assert rc != 0 and [line for line in lines if line.startswith("lab-node: BROKEN at dra-driver: ")], lines
    finally:
        clusterlab.start_dra_testdouble(state)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and clusterlab.dra_devices(state).get(NVIDIA_CLASS) != GPUS:
            time.sleep(0.5)
    assert clusterlab.dra_devices(state).get(NVIDIA_CLASS) == GPUS


def test_verify_and_doctor_name_the_conflict_when_a_device_plugin_also_serves_the_dra_node(dra_lab, tmp_path):
    """Last in the module: kubelet keeps the device plugin's capacity a while after it stops."""
    state = clusterlab.read_state()
    clusterlab.start_device_plugin_beside_dra(state)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "nvidia.com/gpu" not in dra_lab.get(
                "node", clusterlab.NODE_NAME)["status"].get("capacity", {}):
            time.sleep(0.5)
        rc, node, output = run_doctor(dra_lab, "device plugin and DRA on one node", tmp_path)
        assert rc != 0 and node["broken_layer"] == "dra-conflict", output[-4000:]
        assert "both hand out the same GPUs" in node["broken"]["cause"], node["broken"]
        rc, lines, output = run_verify(dra_lab, "device plugin and DRA on one node")
        assert rc != 0 and [line for line in lines if line.startswith("lab-node: BROKEN at dra-conflict: ")], lines
    finally:
        clusterlab.stop_process(state, "device-plugin")
