# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions (pure, controller side): which RuntimeClasses and nodes the GPU pods test, what
is broken before a pod runs (a RuntimeClass missing, a GPU node whose kubelet has no device plugin), the layer a
pod's status and events name when it does not run, the report per node, and, without a cluster, what the manifests
on a server say.

PRIVATE to the collection."""

from __future__ import annotations

import hashlib
import re

import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import clause
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _runtimeclasses as runtimeclasses

GPU_RESOURCE = device_plugin.RESOURCE_NAME
SEED_RUNTIMECLASS = "nvidia"  # the class every NVIDIA setup has: verify always wants it
POD_LABELS = {"app.kubernetes.io/managed-by": "k3s_gpu.nvidia", "k3s-gpu.nvidia/verify": "true"}
LABEL_SELECTOR = "k3s-gpu.nvidia/verify=true"

# What the toolkit puts into a pod of an NVIDIA RuntimeClass, one check at a time; each failure has its own exit code
# and line, so that the report names the layer. Never built from input: the image only needs sh and ls.
MARK = "k3s-gpu-verify:"
SMOKE_SCRIPT = (
    # the toolkit mounts nvidia-smi into /usr/bin, which a minimal image may leave out of PATH
    "PATH=$PATH:/usr/bin:/bin; "
    "ls /dev/nvidia[0-9]* >/dev/null 2>&1 || { echo '%(m)s no /dev/nvidia<N> in the container'; exit 11; }; "
    "{ ldconfig -p 2>/dev/null | grep -q libnvidia-ml.so || ls /usr/lib*/libnvidia-ml.so* /usr/lib*/*/libnvidia-ml.so* "
    "2>/dev/null | grep -q .; } || { echo '%(m)s no libnvidia-ml.so in the container'; exit 12; }; "
    "command -v nvidia-smi >/dev/null 2>&1 || { echo '%(m)s no nvidia-smi in the container'; exit 13; }; "
    "ls /dev/nvidia[0-9]*; nvidia-smi -L || { echo '%(m)s nvidia-smi -L failed'; exit 14; }") % {"m": MARK}
SMOKE_COMMAND = ["sh", "-c", SMOKE_SCRIPT]

# The fixes, in the user's words
FIX_RUNTIMECLASSES = ("run k3s_gpu.nvidia.runtimeclasses: it applies the NVIDIA RuntimeClasses the release lacks "
                      "(nvidia-cdi, nvidia-legacy); k3s and rke2 ship nvidia and nvidia-experimental in their own runtimes "
                      "manifest, so one of those that was deleted is re-applied by hand with its handler of the same name")
FIX_DEVICE_PLUGIN = ("run k3s_gpu.nvidia.site: in host mode it deploys NVIDIA's device plugin (gpu_node_device_plugin_state: "
                     "present), in operator mode the GPU Operator's; then look at the plugin's pod on the node (kubectl get "
                     "pods -A -o wide | grep device-plugin) and its log")
FIX_CONTAINERD = ("run k3s_gpu.nvidia.site on the node: it writes the runtime handler where this release reads it "
                  "(gpu_node_runtimes) and restarts k3s/rke2 so that containerd loads it")
FIX_CDI = ("regenerate the CDI spec on the node: gpu_node_cdi_generate: true writes gpu_node_cdi_spec_path "
           "(/var/run/cdi/nvidia.yaml) with nvidia-ctk cdi generate; it must name the devices the plugin hands out")
FIX_TOOLKIT = ("check the handler's BinaryName (NVIDIA's nvidia-container-runtime), the runtime's mode and, for cdi-cri, "
               "enable_cdi (gpu_node_enable_cdi); k3s_gpu.nvidia.site writes all three")
FIX_DRIVER = "check the driver on the node (nvidia-smi on the host; after a driver upgrade the node needs a reboot)"
FIX_ALLOCATABLE = ("free a GPU or add GPU nodes; with GPU sharing, more replicas per GPU (gpu_node_gpu_sharing) give "
                   "more nvidia.com/gpu")
FIX_NODE_SELECTOR = ("run k3s_gpu.nvidia.site on the node: it sets the k3s-gpu.nvidia/handler.<handler> labels "
                     "(gpu_node_handler_labels) that the RuntimeClasses select with runtimeclasses_select_nodes")
FIX_IMAGE = "set k3s_gpu_verify_image to an image the node has or can pull (it needs only sh and ls)"

# The smoke script's exit codes
EXIT_LAYERS = {11: ("toolkit", "the pod was given an nvidia.com/gpu but no /dev/nvidia<N> is in it: the handler's runtime "
                               "did not inject the device", FIX_TOOLKIT),
               12: ("toolkit", "libnvidia-ml.so is not in the pod: the toolkit (its CDI spec or hook) did not mount the "
                               "driver's libraries", FIX_CDI),
               13: ("toolkit", "nvidia-smi is not in the pod: the toolkit (its CDI spec or hook) did not mount the "
                               "driver's tools", FIX_CDI),
               14: ("driver", "nvidia-smi -L failed in the pod", FIX_DRIVER)}
# A container that cannot be created or started, by what its message says (first match)
START_FAILURES = (("device-plugin", re.compile(r"Allocate failed|device plugin", re.I), FIX_DEVICE_PLUGIN),
                  ("cdi", re.compile(r"CDI device|cdi\.k8s\.io|CDI spec", re.I), FIX_CDI),
                  ("toolkit", re.compile(r"nvidia[- ]container|running hook|executable file not found|no such file", re.I),
                   FIX_TOOLKIT),
                  ("pod", re.compile(r"."), FIX_TOOLKIT))
# A pod sandbox that cannot be created: containerd has no such handler, or its binary is not there
SANDBOX_FAILURES = (("containerd-config", re.compile(r"no runtime for \S+ is configured|failed to get sandbox runtime"),
                     FIX_CONTAINERD),
                    ("toolkit", re.compile(r"executable file not found|no such file or directory"), FIX_TOOLKIT))
IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName")
STUCK_REASONS = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError", "StartError") + IMAGE_REASONS


def broken(scope, layer, cause, fix):
    return {"scope": scope, "layer": layer, "cause": clause(cause), "fix": fix}


def broken_line(entry):
    return "%s: BROKEN at %s: %s. Fix: %s" % (entry["scope"], entry["layer"], entry["cause"], entry["fix"])


def _gpus(node, field):
    return str(((node.get("status") or {}).get(field) or {}).get(GPU_RESOURCE, "0"))


def _labels(node):
    return (node.get("metadata") or {}).get("labels") or {}


def _labelled_gpu_node(node):
    return _labels(node).get(device_plugin.GPU_PRESENT_LABEL) == device_plugin.GPU_PRESENT_VALUE


def _served_handlers(node):
    """The handlers the role labelled the node with (gpu_node_handler_labels), or None when it has no such label."""
    served = set(key[len(runtimeclasses.HANDLER_LABEL_PREFIX):] for key, value in _labels(node).items()
                 if key.startswith(runtimeclasses.HANDLER_LABEL_PREFIX) and value == runtimeclasses.HANDLER_LABEL_VALUE)
    return served or None


def _device_plugin_problems(nodes, gpu_nodes):
    """A node the role labelled as a GPU node that advertises no nvidia.com/gpu; the cluster when no node does."""
    problems = []
    for node in nodes:
        name = node["metadata"]["name"]
        if name in gpu_nodes or not _labelled_gpu_node(node):
            continue
        capacity = ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
        if capacity is None:
            why = "no device plugin has registered nvidia.com/gpu with its kubelet"
        elif capacity in ("0", ""):
            why = "its device plugin registered once and is gone (capacity 0)"
        else:
            why = "capacity %s, allocatable 0: its device plugin stopped or reports every device unhealthy" % capacity
        problems.append(broken(name, "device-plugin", "the node is labelled %s=%s but advertises no nvidia.com/gpu: %s" % (
            device_plugin.GPU_PRESENT_LABEL, device_plugin.GPU_PRESENT_VALUE, why), FIX_DEVICE_PLUGIN))
    if not gpu_nodes and not problems:
        problems.append(broken("cluster", "device-plugin", "no node advertises nvidia.com/gpu and none is labelled %s=%s"
                               % (device_plugin.GPU_PRESENT_LABEL, device_plugin.GPU_PRESENT_VALUE), FIX_DEVICE_PLUGIN))
    return problems


def choose(classes, nodes, wanted=()):
    """What to test and what is broken before a pod runs, from the API's RuntimeClasses and Nodes.

    RuntimeClasses: `wanted`, else `nvidia` and every class whose handler starts with nvidia. Nodes: every node that
    advertises nvidia.com/gpu (time-slicing and MPS replicas included in the count). One pod per node and class,
    except, for a class not named in `wanted`, on a node whose handler labels (k3s-gpu.nvidia/handler.<handler>, set
    by the role) leave its handler out: k3s ships nvidia-experimental on every cluster, but the handler exists only
    where that runtime is installed. Broken before a pod runs: a class that does not exist (`runtimeclass`), a node
    labelled as a GPU node that advertises no nvidia.com/gpu (`device-plugin`), a cluster where no node advertises any."""
    nodes = sorted(nodes or [], key=lambda n: n["metadata"]["name"])
    handlers = dict((c["metadata"]["name"], str(c.get("handler", ""))) for c in classes or [])
    named = sorted(set(wanted or ()))
    chosen = named or sorted(set(name for name, handler in handlers.items() if handler.startswith("nvidia"))
                             | {SEED_RUNTIMECLASS})
    allocatable = dict((n["metadata"]["name"], _gpus(n, "allocatable")) for n in nodes)
    gpu_nodes = [name for name, count in sorted(allocatable.items()) if count not in ("0", "")]
    present = [name for name in chosen if name in handlers]
    pairs, notes = [], []
    for node in nodes:
        served = _served_handlers(node)
        for name in present if node["metadata"]["name"] in gpu_nodes else []:
            if named or served is None or handlers[name] in served:
                pairs.append([node["metadata"]["name"], name])
            else:
                notes.append("%s / %s: not tested: the node's labels say it has no %s handler" % (
                    node["metadata"]["name"], name, handlers[name]))
    problems = [broken("cluster", "runtimeclass", "RuntimeClass %s does not exist" % name, FIX_RUNTIMECLASSES)
                for name in chosen if name not in handlers]
    return {"runtimeclasses": present, "gpu_nodes": gpu_nodes, "pairs": pairs, "notes": notes,
            "allocatable": allocatable, "problems": problems + _device_plugin_problems(nodes, gpu_nodes),
            "nodes_without_gpu": [name for name, count in sorted(allocatable.items()) if count in ("0", "")]}


def pod_name(node, runtimeclass):
    """A DNS label: the class, the node's name cut to 30 characters, and a hash that keeps two long node names apart."""
    cut = re.sub("[^a-z0-9-]", "-", node)[:30]
    return "gpu-%s-%s-%s" % (runtimeclass, cut, hashlib.sha1(node.encode("utf-8")).hexdigest()[:6])


def _on_node(node):
    """Placed on the node by the scheduler (not nodeName): pods of one node wait for a free GPU instead of kubelet
    refusing them, and the RuntimeClass's node selector is checked as for any pod."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}


def smoke_pods(chosen, namespace, image):
    """One pod per GPU node and RuntimeClass, placed on the node, asking for the class and one nvidia.com/gpu, and
    tolerating the usual GPU-node taint. NVIDIA_VISIBLE_DEVICES is the device plugin's to set: a pod's own value
    (`all`) would override the allocation."""
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": pod_name(node, runtimeclass), "namespace": namespace, "labels": dict(POD_LABELS)},
             "spec": {"affinity": _on_node(node), "runtimeClassName": runtimeclass, "restartPolicy": "Never",
                      "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                      "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                      "containers": [{"name": "smoke", "image": image, "command": list(SMOKE_COMMAND),
                                      "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
                                      "resources": {"limits": {GPU_RESOURCE: 1}}}]}}
            for node, runtimeclass in chosen["pairs"]]


def refusal(chosen):
    """The message when there is nothing to test, else None."""
    if chosen["pairs"]:
        return None
    return ("Nothing to test: %d NVIDIA RuntimeClasses (%s) and %d nodes with allocatable nvidia.com/gpu (%s)." % (
        len(chosen["runtimeclasses"]), ", ".join(chosen["runtimeclasses"]) or "none",
        len(chosen["gpu_nodes"]), ", ".join(chosen["gpu_nodes"]) or "none"))


def _container_state(pod):
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return (statuses[0].get("state") or {}) if statuses else {}


def _sandbox_up(pod, state):
    """kubelet has made the pod's sandbox: its container started, or waits on a later step (the image, its creation),
    or the pod's PodReadyToStartContainers condition (PodHasNetwork before Kubernetes 1.29) is True. A sandbox that
    failed once and came up on kubelet's retry leaves its FailedCreatePodSandBox event behind."""
    if "running" in state or "terminated" in state:
        return True
    if (state.get("waiting") or {}).get("reason") not in (None, "ContainerCreating"):
        return True
    return any(c.get("type") in ("PodReadyToStartContainers", "PodHasNetwork") and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _events_of(pod, events):
    name = pod["metadata"]["name"]
    return [e for e in events or [] if (e.get("involvedObject") or {}).get("name") == name]


def _first_match(table, message):
    for layer, pattern, fix in table:
        if pattern.search(message or ""):
            return layer, fix
    return None


def node_of(pod):
    """The node a smoke pod is for: where it runs, else the one its affinity names."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [{}]
    fields = terms[0].get("matchFields") or [{}]
    return (fields[0].get("values") or ["?"])[0]


def diagnose(pod, events=(), lines=()):
    """{"done": bool, "broken": entry or None} for one smoke pod from its status, its events and (once it ended) its
    log. done: Succeeded or Failed. A pod that is not done may still be broken, when it is stuck where kubelet
    retries without end (its sandbox, its container's creation, its image, the scheduler's verdict)."""
    status = pod.get("status") or {}
    scope = "%s / %s" % (node_of(pod), pod["spec"].get("runtimeClassName", "?"))
    phase = status.get("phase", "Unknown")
    state = _container_state(pod)
    if phase == "Succeeded":
        return {"done": True, "broken": None}
    if phase == "Failed":
        terminated = state.get("terminated") or {}
        code = terminated.get("exitCode")
        if code in EXIT_LAYERS:
            layer, cause, fix = EXIT_LAYERS[code]
            said = [line for line in lines if MARK not in line and line.strip()]
            return {"done": True, "broken": broken(scope, layer, cause + (" (%s)" % said[-1] if said else ""), fix)}
        if status.get("reason") == "NodeAffinity":
            return {"done": True, "broken": broken(scope, "runtimeclass", "kubelet refused the pod: the RuntimeClass selects "
                                                   "nodes by label and this node lacks it (%s)" % status.get("message", ""),
                                                   FIX_NODE_SELECTOR)}
        message = terminated.get("message") or status.get("message") or "exit code %s" % code
        layer, fix = _first_match(START_FAILURES, message)
        return {"done": True, "broken": broken(scope, layer, "the container did not start: %s" % message, fix)}
    for event in [] if _sandbox_up(pod, state) else _events_of(pod, events):
        if event.get("reason") == "FailedCreatePodSandBox":
            found = _first_match(SANDBOX_FAILURES, event.get("message"))
            if found:
                return {"done": False, "broken": broken(scope, found[0], "kubelet cannot create the pod's sandbox: %s"
                                                        % event.get("message"), found[1])}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in IMAGE_REASONS:
        return {"done": False, "broken": broken(scope, "pod", "the image: %s %s" % (waiting["reason"], waiting.get("message", "")),
                                                FIX_IMAGE)}
    if waiting.get("reason") in STUCK_REASONS:
        layer, fix = _first_match(START_FAILURES, waiting.get("message"))
        return {"done": False, "broken": broken(scope, layer, "the container cannot be created: %s" % waiting.get("message", ""),
                                                fix)}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = condition.get("message", "")
            if "Insufficient %s" % GPU_RESOURCE in message:
                layer, fix = "allocatable", FIX_ALLOCATABLE
            elif "node affinity/selector" in message:
                layer, fix = "runtimeclass", FIX_NODE_SELECTOR
            else:
                layer, fix = "pod", "let the smoke pods onto the node (its taints, its resources) or leave it out of the test"
            return {"done": False, "broken": broken(scope, layer, "the pod is not scheduled: %s" % message, fix)}
    return {"done": False, "broken": None}


def settle(pods, events=(), logs=None):
    """[(pod, diagnose(pod))], sorted by node and class. A pod that waits for a GPU of its node while another smoke
    pod there still runs is waiting its turn, not broken."""
    logs = logs or {}
    found = [(pod, diagnose(pod, events, logs.get(pod["metadata"]["name"], [])))
             for pod in sorted(pods or [], key=lambda p: (node_of(p), p["spec"].get("runtimeClassName", "")))]
    running = [pod for pod, state in found if not state["done"] and state["broken"] is None]
    settled = []
    for pod, state in found:
        queued = (state["broken"] or {}).get("layer") == "allocatable" and any(
            node_of(other) == node_of(pod) for other in running if other is not pod)
        settled.append((pod, {"done": False, "broken": None} if queued else state))
    return settled


def gpu_line(lines):
    found = [line for line in lines if line.startswith("GPU ")]
    return "; ".join(found) if found else (lines[-1] if lines else "no output")


def report(pods, logs, expected, allocatable, events=(), problems=(), notes=()):
    """{lines, failed}: the problems found before the pods ran, then one line per pod: `<node> / <class>: OK |
    allocatable nvidia.com/gpu N | <nvidia-smi -L lines>` or `<node> / <class>: BROKEN at <layer>: <cause>. Fix: <fix>`;
    notes (what was not tested, and why) do not fail; failed lists what did not pass, and says so when fewer pods ran
    than were started."""
    log_of = dict((entry.get("name"), entry.get("lines") or []) for entry in logs or [])
    lines = [broken_line(entry) for entry in problems or []] + list(notes or [])
    failed = ["%s (%s)" % (entry["scope"], entry["layer"]) for entry in problems or []]
    for pod, state in settle(pods, events, log_of):
        scope = "%s / %s" % (node_of(pod), pod["spec"].get("runtimeClassName", ""))
        entry = state["broken"]
        if entry is None and not state["done"]:
            waiting = _container_state(pod).get("waiting") or {}
            entry = broken(scope, "pod", "still %s%s when the wait ended" % (
                (pod.get("status") or {}).get("phase", "Unknown"), " (%s)" % waiting["reason"] if waiting.get("reason") else ""),
                "raise k3s_gpu_verify_timeout_seconds, or look at the pod's events (kubectl describe pod)")
        if entry is None:
            lines.append("%s: OK | allocatable nvidia.com/gpu %s | %s" % (
                scope, allocatable.get(node_of(pod), "?"), gpu_line(log_of.get(pod["metadata"]["name"], []))))
            continue
        lines.append(broken_line(entry))
        failed.append("%s (%s)" % (entry["scope"], entry["layer"]))
    if len(pods or []) != expected:
        failed.append("%d of %d pods found" % (len(pods or []), expected))
    return {"lines": lines, "failed": failed}


def inspect_manifests(texts):
    """Without a cluster: what the manifests this collection wrote on a server say. texts: {file name: text or None}."""
    found = {}
    for name, text in sorted(texts.items()):
        if text is None:
            found[name] = None
            continue
        documents = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        kinds = sorted(set(d.get("kind", "?") for d in documents))
        entry = {"kinds": kinds, "names": sorted((d.get("metadata") or {}).get("name", "?") for d in documents)}
        for document in documents:
            if document.get("kind") == "HelmChart":
                values = yaml.safe_load((document.get("spec") or {}).get("valuesContent") or "") or {}
                entry["chart"] = (document.get("spec") or {}).get("chart")
                entry["version"] = (document.get("spec") or {}).get("version")
                entry["runtimeClassName"] = values.get("runtimeClassName")
        found[name] = entry
    return found
