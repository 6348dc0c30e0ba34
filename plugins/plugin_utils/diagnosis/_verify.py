# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions (pure, controller side): which RuntimeClasses and nodes the GPU pods test, what
is broken before a pod runs (a RuntimeClass missing, a GPU node whose kubelet has no device plugin), the layer a
pod's status and events name when it does not run, the report per node, and, without a cluster, what the manifests
on a server say. Not pure: the kubeconfig's check before verify and the doctor read a cluster, which reads the file
and connects to its API server (a TLS handshake, nothing sent), and names a failed read of the cluster.

PRIVATE to the collection."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import socket
import ssl

from urllib.parse import urlsplit

import yaml

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, clause
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _dra_layers as dra_layers

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
    served = set(key[len(k8s_labels.HANDLER_LABEL_PREFIX):] for key, value in _labels(node).items()
                 if key.startswith(k8s_labels.HANDLER_LABEL_PREFIX) and value == k8s_labels.HANDLER_LABEL_VALUE)
    return served or None


def _device_plugin_problems(nodes, gpu_nodes):
    """A node the role labelled as a GPU node that advertises no nvidia.com/gpu; the cluster when no node does."""
    problems = []
    for node in nodes:
        name = node["metadata"]["name"]
        if name in gpu_nodes or not _labelled_gpu_node(node) or dra_layers.is_dra_node(node):
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
    if not gpu_nodes and not problems and not any(dra_layers.is_dra_node(node) for node in nodes):
        problems.append(broken("cluster", "device-plugin", "no node advertises nvidia.com/gpu and none is labelled %s=%s"
                               % (device_plugin.GPU_PRESENT_LABEL, device_plugin.GPU_PRESENT_VALUE), FIX_DEVICE_PLUGIN))
    return problems


def _dra_choice(nodes, present, handlers, named, dra):
    """The DRA nodes' part of choose(): ({claim_pairs, pairs, problems, notes}). A DRA node whose DRA layers pass gets a
    claim pod per RuntimeClass it serves and one without a RuntimeClass (a claim's devices come through CDI, whatever
    the handler); where its kubelet serves nvidia.com/gpu through DRA (1.36), the seed's pod too."""
    found = {"claim_pairs": [], "pairs": [], "problems": [], "notes": []}
    for node in nodes:
        if not dra_layers.is_dra_node(node):
            continue
        name = node["metadata"]["name"]
        broken_layer = dra_layers.first_broken(node, dra or {})[1]
        if broken_layer is not None:
            found["problems"].append(broken(name, broken_layer[0], broken_layer[1].cause, broken_layer[1].fix))
            continue
        served = _served_handlers(node)
        classes = [c for c in present if named or served is None or handlers[c] in served]
        found["claim_pairs"] += [[name, ""]] + [[name, c] for c in classes]
        if SEED_RUNTIMECLASS in classes:
            seed, why = dra_layers.seed_pod_served(node, dra or {})
            if seed:
                found["pairs"].append([name, SEED_RUNTIMECLASS])
            else:
                found["notes"].append("%s / %s with nvidia.com/gpu: 1: not tested: the node's GPUs are allocated through "
                                      "DRA, and %s" % (name, SEED_RUNTIMECLASS, why))
    return found


def choose(classes, nodes, wanted=(), dra=None):
    """What to test and what is broken before a pod runs, from the API's RuntimeClasses and Nodes.

    RuntimeClasses: `wanted`, else `nvidia` and every class whose handler starts with nvidia. Nodes: every node that
    advertises nvidia.com/gpu (time-slicing and MPS replicas included in the count). One pod per node and class,
    except, for a class not named in `wanted`, on a node whose handler labels (k3s-gpu.nvidia/handler.<handler>, set
    by the role) leave its handler out: k3s ships nvidia-experimental on every cluster, but the handler exists only
    where that runtime is installed. Broken before a pod runs: a class that does not exist (`runtimeclass`), a node
    labelled as a GPU node that advertises no nvidia.com/gpu (`device-plugin`), a cluster where no node advertises any.
    A node labelled for DRA (gpu_node_allocation=dra) is checked at its DRA layers (dra: {dra_api, resourceslices,
    deviceclasses}) and gets claim pods (claim_pairs, [node, class or ""]) instead: _dra_choice."""
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
        # a DRA node gets claim pods (_dra_choice), also where a device plugin advertises GPUs there (dra-conflict)
        for name in present if node["metadata"]["name"] in gpu_nodes and not dra_layers.is_dra_node(node) else []:
            if named or served is None or handlers[name] in served:
                pairs.append([node["metadata"]["name"], name])
            else:
                notes.append("%s / %s: not tested: the node's labels say it has no %s handler" % (
                    node["metadata"]["name"], name, handlers[name]))
    problems = [broken("cluster", "runtimeclass", "RuntimeClass %s does not exist" % name, FIX_RUNTIMECLASSES)
                for name in chosen if name not in handlers]
    drawn = _dra_choice(nodes, present, handlers, named, dra)
    dra_nodes = [n["metadata"]["name"] for n in nodes if dra_layers.is_dra_node(n)]
    # the report's "allocatable nvidia.com/gpu" of a DRA node: none advertised, its GPUs come through claims
    allocatable.update((name, "0 (GPUs through DRA)") for name in dra_nodes if allocatable[name] in ("0", ""))
    return {"runtimeclasses": present, "gpu_nodes": gpu_nodes, "pairs": pairs + drawn["pairs"],
            "claim_pairs": drawn["claim_pairs"], "dra_nodes": dra_nodes, "notes": notes + drawn["notes"],
            "allocatable": allocatable,
            "problems": problems + _device_plugin_problems(nodes, gpu_nodes) + drawn["problems"],
            "nodes_without_gpu": [name for name, count in sorted(allocatable.items())
                                  if count in ("0", "") and name not in dra_nodes]}


def pod_name(node, runtimeclass):
    """A DNS label: the class, the node's name cut to 30 characters, and a hash that keeps two long node names apart."""
    cut = re.sub("[^a-z0-9-]", "-", node)[:30]
    return "gpu-%s-%s-%s" % (runtimeclass, cut, hashlib.sha1(node.encode("utf-8")).hexdigest()[:6])


def _on_node(node):
    """Placed on the node by the scheduler (not nodeName): pods of one node wait for a free GPU instead of kubelet
    refusing them, and the RuntimeClass's node selector is checked as for any pod."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}


def smoke_pod(node, runtimeclass, namespace, image, claim=False):
    """A pod placed on the node, asking for the class (none where runtimeclass is empty) and one nvidia.com/gpu, or
    with claim one device of NVIDIA's DeviceClass through a claim of dra_layers.claim_template, and tolerating the usual
    GPU-node taint. NVIDIA_VISIBLE_DEVICES is the device plugin's to set: a pod's own value (`all`) would override the
    allocation."""
    container = {"name": "smoke", "image": image, "command": list(SMOKE_COMMAND),
                 "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
                 "resources": {"limits": {GPU_RESOURCE: 1}}}
    spec = {"affinity": _on_node(node), "restartPolicy": "Never",
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1, "containers": [container]}
    if runtimeclass:
        spec["runtimeClassName"] = runtimeclass
    name = pod_name(node, runtimeclass)
    if claim:
        name = pod_name(node, "claim-" + runtimeclass if runtimeclass else "claim")
        spec["resourceClaims"] = [{"name": dra_layers.CLAIM_REQUEST, "resourceClaimTemplateName": dra_layers.CLAIM_TEMPLATE}]
        container["resources"] = {"claims": [{"name": dra_layers.CLAIM_REQUEST}]}
        # it holds its claim CLAIM_HOLD_SECONDS more, so that the wait, which starts after every pod was created, reads
        # the claim's allocation (released once the pod ends: 3 s were too short for the first of 4 pods on the lab);
        # every failure of the script exits before
        container["command"] = ["sh", "-c", SMOKE_SCRIPT + "; sleep %d" % CLAIM_HOLD_SECONDS]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(POD_LABELS)}, "spec": spec}


CLAIM_HOLD_SECONDS = 10


def claim_pod(node, runtimeclass, namespace, image):
    """The smoke pod of a DRA node: its GPU from a claim, with the RuntimeClass, or none where runtimeclass is empty."""
    return smoke_pod(node, runtimeclass, namespace, image, claim=True)


def smoke_pods(chosen, namespace, image):
    """One pod per GPU node and RuntimeClass (smoke_pod), and per DRA node and RuntimeClass, or none (claim_pod)."""
    return [smoke_pod(node, runtimeclass, namespace, image) for node, runtimeclass in chosen["pairs"]] + [
        claim_pod(node, runtimeclass, namespace, image) for node, runtimeclass in chosen.get("claim_pairs") or []]


def claim_templates(chosen, namespace):
    """The ResourceClaimTemplate the claim pods ask for, where there is any claim pod."""
    return [dra_layers.claim_template(namespace)] if chosen.get("claim_pairs") else []


def scope_of(pod):
    """`<node> / <class>` of a pod's report line; a claim pod's says `(claim)`, and `no RuntimeClass` where it has none."""
    spec = pod.get("spec") or {}
    label = spec.get("runtimeClassName") or "no RuntimeClass"
    return "%s / %s%s" % (node_of(pod), label, " (claim)" if dra_layers.is_claim_pod(pod) else "")


def refusal(chosen):
    """The message when there is nothing to test, else None."""
    if chosen["pairs"] or chosen.get("claim_pairs"):
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


# a claim pod the scheduler cannot place for its claim, or whose claim kubelet cannot prepare
CLAIM_SCHEDULING = re.compile(r"claim|DeviceClass|resourceslice", re.I)
CLAIM_PREPARE_EVENTS = ("FailedPrepareDynamicResources",)


def _claim_stuck(pod, events, scope):
    """A claim pod that kubelet cannot prepare (its DRA driver's kubelet plugin refused or is gone), else None."""
    for event in _events_of(pod, events):
        if event.get("reason") in CLAIM_PREPARE_EVENTS:
            return broken(scope, "claim", "kubelet cannot prepare the pod's claim: %s" % event.get("message", ""),
                          dra_layers.FIX_CLAIM)
    return None


def diagnose(pod, events=(), lines=()):
    """{"done": bool, "broken": entry or None} for one smoke pod from its status, its events and (once it ended) its
    log. done: Succeeded or Failed. A pod that is not done may still be broken, when it is stuck where kubelet
    retries without end (its sandbox, its container's creation, its image, the scheduler's verdict); a claim pod also
    where kubelet cannot prepare its claim, and its CDI device that containerd cannot resolve is named with the dirs
    NVIDIA's DRA driver writes to."""
    found = _diagnose(pod, events, lines)
    entry = found["broken"]
    if entry is not None and dra_layers.served_by_dra(pod) and entry["layer"] == "cdi":
        found["broken"] = dict(entry, fix=dra_layers.FIX_CLAIM_CDI)
    return found


def _diagnose(pod, events, lines):
    status = pod.get("status") or {}
    scope = scope_of(pod)
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
    if dra_layers.is_claim_pod(pod) and phase == "Pending":
        stuck = _claim_stuck(pod, events, scope)
        if stuck:
            return {"done": False, "broken": stuck}
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
            if dra_layers.is_claim_pod(pod) and CLAIM_SCHEDULING.search(message):
                layer, fix = "claim", dra_layers.FIX_CLAIM
            elif "Insufficient %s" % GPU_RESOURCE in message:
                layer, fix = "allocatable", FIX_ALLOCATABLE
            elif "node affinity/selector" in message:
                layer, fix = "runtimeclass", FIX_NODE_SELECTOR
            else:
                layer, fix = "pod", "let the smoke pods onto the node (its taints, its resources) or leave it out of the test"
            return {"done": False, "broken": broken(scope, layer, "the pod is not scheduled: %s" % message, fix)}
    return {"done": False, "broken": None}


def settle(pods, events=(), logs=None):
    """[(pod, diagnose(pod))], sorted by node and class. A pod that waits for a GPU of its node (nvidia.com/gpu, or a
    device for its claim) while another smoke pod there still runs is waiting its turn, not broken."""
    logs = logs or {}
    found = [(pod, diagnose(pod, events, logs.get(pod["metadata"]["name"], []))) for pod in sorted(pods or [], key=scope_of)]
    running = [pod for pod, state in found if not state["done"] and state["broken"] is None]
    settled = []
    for pod, state in found:
        entry = state["broken"] or {}
        waits = entry.get("layer") == "allocatable" or (
            entry.get("layer") == "claim" and entry.get("cause", "").startswith("the pod is not scheduled"))
        queued = waits and any(node_of(other) == node_of(pod) for other in running if other is not pod)
        settled.append((pod, {"done": False, "broken": None} if queued else state))
    return settled


def gpu_line(lines):
    found = [line for line in lines if line.startswith("GPU ")]
    return "; ".join(found) if found else (lines[-1] if lines else "no output")


DEVICE_LINE = re.compile(r"^/dev/nvidia[0-9]+$")
FIX_CLAIM_DEVICES = ("a claim pod must see only its claim's devices: the handler's runtime must take them from the "
                     "claim's CDI devices (NVIDIA's DRA driver sets NVIDIA_VISIBLE_DEVICES=void), and neither the image "
                     "nor the pod may set NVIDIA_VISIBLE_DEVICES=all")


def claim_seen(pod, lines, claims):
    """(OK detail, broken entry or None) of a claim pod that ran: the devices its claim was allocated and the
    /dev/nvidia<N> it saw, which must be as many (one request, one device)."""
    seen = [line.strip() for line in lines if DEVICE_LINE.match(line.strip())]
    allocated = dra_layers.allocation(dra_layers.claim_of(pod, claims))
    wanted = len(allocated) if allocated else 1
    if len(seen) != wanted:
        return "", broken(scope_of(pod), "claim", "the pod sees %d GPU device(s) (%s) while its claim was allocated %s" % (
            len(seen), " ".join(seen) or "none", ", ".join(allocated) or "one device"), FIX_CLAIM_DEVICES)
    return "claim %s | %s" % (", ".join(allocated) or "(allocation not read)", " ".join(seen)), None


def report(pods, logs, expected, allocatable, events=(), problems=(), notes=(), claims=()):
    """{lines, failed}: the problems found before the pods ran, then one line per pod: `<node> / <class>: OK |
    allocatable nvidia.com/gpu N | <nvidia-smi -L lines>` (a claim pod: `<node> / <class> (claim): OK | claim <driver>
    <pool>/<device> | /dev/nvidia<N> | ...`) or `<node> / <class>: BROKEN at <layer>: <cause>. Fix: <fix>`; notes (what
    was not tested, and why) do not fail; failed lists what did not pass, and says so when fewer pods ran than were
    started. claims: the namespace's ResourceClaims, for the claim pods' allocations."""
    log_of = dict((entry.get("name"), entry.get("lines") or []) for entry in logs or [])
    lines = [broken_line(entry) for entry in problems or []] + list(notes or [])
    failed = ["%s (%s)" % (entry["scope"], entry["layer"]) for entry in problems or []]
    for pod, state in settle(pods, events, log_of):
        scope = scope_of(pod)
        entry = state["broken"]
        detail = "allocatable nvidia.com/gpu %s" % allocatable.get(node_of(pod), "?")
        if entry is None and state["done"] and dra_layers.is_claim_pod(pod):
            detail, entry = claim_seen(pod, log_of.get(pod["metadata"]["name"], []), claims)
        if entry is None and not state["done"]:
            waiting = _container_state(pod).get("waiting") or {}
            entry = broken(scope, "pod", "still %s%s when the wait ended" % (
                (pod.get("status") or {}).get("phase", "Unknown"), " (%s)" % waiting["reason"] if waiting.get("reason") else ""),
                "raise k3s_gpu_verify_timeout_seconds, or look at the pod's events (kubectl describe pod)")
        if entry is None:
            lines.append("%s: OK | %s | %s" % (scope, detail, gpu_line(log_of.get(pod["metadata"]["name"], []))))
            continue
        lines.append(broken_line(entry))
        failed.append("%s (%s)" % (entry["scope"], entry["layer"]))
    if len(pods or []) != expected:
        failed.append("%d of %d pods found" % (len(pods or []), expected))
    return {"lines": lines, "failed": failed}


# ------------------------------------------------------------------ the kubeconfig
# Checked on the controller before the first kubernetes.core task, so that one that does not work is one line naming
# it, what is wrong and the fix, instead of the Python client's exception text (issue 41). Nothing of the file's
# content is quoted: its names only (context, cluster, server), never a token, a key or a line of it.
CONNECT_SECONDS = 5
MAX_KUBECONFIG_BYTES = 1024 * 1024
KUBERNETES_CORE_MODULE = "kubernetes.core.k8s_info"  # what reads the cluster
FIX_KUBECONFIG = ("set k3s_gpu_kubeconfig (or K8S_AUTH_KUBECONFIG) to the cluster's kubeconfig: /etc/rancher/k3s/k3s.yaml "
                  "(rke2: /etc/rancher/rke2/rke2.yaml) copied from a server, its server: address set to the server's")
FIX_SERVER = ("start k3s/rke2 on the server (systemctl start k3s), or set server: in the kubeconfig to the server's address "
              "(a k3s.yaml copied from a server names https://127.0.0.1:6443)")
FIX_TRUST = ("copy the kubeconfig again from a server of this cluster: its certificate-authority-data must be the CA that "
             "signed the API server's certificate")
FIX_EXPIRED = ("k3s and rke2 renew certificates that expire within 90 days when they start: restart k3s/rke2 on the servers "
               "(or k3s certificate rotate), then copy the kubeconfig again")
FIX_CLOCK = "set the clocks of the controller and the servers right (timedatectl; NTP)"
FIX_HOSTNAME = ("set server: to a name or address the certificate names (k3s/rke2 add one with --tls-san), or set "
                "tls-server-name: in the kubeconfig's cluster")
FIX_CREDENTIALS = ("copy the kubeconfig again from a server of this cluster: its client certificate or token is not this "
                   "cluster's, or has expired")
FIX_RIGHTS = "use a kubeconfig whose user may read the cluster (k3s.yaml's default user is cluster-admin)"
FIX_KUBERNETES_CORE = ("ansible-galaxy collection install kubernetes.core, and pip install kubernetes into the Python that "
                       "runs localhost's modules (ansible_python_interpreter)")
FIX_PYTHON_CLIENT = "pip install kubernetes into that Python (localhost's ansible_python_interpreter)"
# verify codes of OpenSSL (X509_V_ERR_*) that have their own cause and fix
CERT_NOT_YET_VALID, CERT_HAS_EXPIRED = 9, 10
NAME_MISMATCH = (62, 64)  # HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH


def error_line(error):
    """A K3sGpuError as one line: its cause, then its fix."""
    return "%s. Fix: %s" % (error.cause, error.fix) if error.fix else error.cause


def _kubeconfig_error(path, what, fix=FIX_KUBECONFIG):
    return K3sGpuError("kubeconfig %s: %s" % (path, what), fix)


def _kubeconfig_text(path):
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_KUBECONFIG_BYTES + 1)
    except FileNotFoundError:
        raise _kubeconfig_error(path, "no such file")
    except IsADirectoryError:
        raise _kubeconfig_error(path, "a directory, not a file")
    except PermissionError:
        raise _kubeconfig_error(path, "this user may not read it (permission denied)",
                                "make it readable by the user that runs ansible-playbook (chown, chmod 600)")
    except OSError as exc:
        raise _kubeconfig_error(path, "cannot be read (%s)" % exc.strerror)
    if len(data) > MAX_KUBECONFIG_BYTES:
        raise _kubeconfig_error(path, "not a kubeconfig: larger than 1 MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _kubeconfig_error(path, "not a kubeconfig: not UTF-8 text (byte %d is not)" % exc.start)


def _kubeconfig_document(path, text):
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # the line only: the parser's message quotes the file
        raise _kubeconfig_error(path, "not a kubeconfig: not YAML%s" % (" (line %d)" % (mark.line + 1) if mark else ""))
    if not isinstance(document, dict) or not any(key in document for key in ("clusters", "contexts", "current-context")):
        raise _kubeconfig_error(path, "not a kubeconfig: no clusters, contexts or current-context in it")
    return document


def _named(document, key, name):
    """The entry `name` of a kubeconfig list (clusters, contexts), e.g. clusters[].cluster; None when there is none."""
    for entry in document.get(key) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(key[:-1]) if isinstance(entry.get(key[:-1]), dict) else {}
    return None


def kubeconfig_cluster(path, context=None):
    """The cluster the kubeconfig's current-context (or `context`, K8S_AUTH_CONTEXT) names, with a server address
    that parses. Raises K3sGpuError."""
    document = _kubeconfig_document(path, _kubeconfig_text(path))
    name = context or document.get("current-context")
    if not name:
        raise _kubeconfig_error(path, "it sets no current-context, so it names no cluster",
                                "kubectl config use-context <context> --kubeconfig %s (kubectl config get-contexts "
                                "lists them)" % path)
    found = _named(document, "contexts", name)
    if found is None:
        raise _kubeconfig_error(path, "its context %s is not in the file" % name,
                                "kubectl config use-context <context> --kubeconfig %s, with a context the file has" % path)
    cluster = _named(document, "clusters", found.get("cluster"))
    if cluster is None:
        raise _kubeconfig_error(path, "its context %s names the cluster %s, which the file does not have"
                                % (name, found.get("cluster")))
    try:
        parts = urlsplit(str(cluster.get("server") or ""))
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("https", "http") or not parts.hostname:
        raise _kubeconfig_error(path, "the cluster %s has no https:// server address" % found.get("cluster"))
    return dict(cluster, host=parts.hostname, port=port or (443 if parts.scheme == "https" else 80), scheme=parts.scheme)


def _address(cluster):
    """The server without what a URL may carry besides its address (a user and password, a path)."""
    host = "[%s]" % cluster["host"] if ":" in cluster["host"] else cluster["host"]
    return "%s://%s:%d" % (cluster["scheme"], host, cluster["port"])


def _tls_context(path, cluster):
    """What the Python client trusts: nothing checked with insecure-skip-tls-verify, else the kubeconfig's CA (a
    certificate-authority file is relative to the kubeconfig, as for kubectl), else the system's CAs."""
    if cluster.get("insecure-skip-tls-verify") is True:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    data, authority = cluster.get("certificate-authority-data"), cluster.get("certificate-authority")
    try:
        if data:
            return ssl.create_default_context(cadata=base64.b64decode(str(data), validate=True).decode("ascii"))
        if authority:
            return ssl.create_default_context(cafile=os.path.join(os.path.dirname(path), str(authority)))
    except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError):
        raise _kubeconfig_error(path, "its certificate-authority%s is not a PEM certificate" % ("-data" if data else ""),
                                FIX_TRUST)
    except OSError as exc:
        raise _kubeconfig_error(path, "its certificate-authority %s cannot be read (%s)" % (authority, exc.strerror),
                                FIX_TRUST)
    return ssl.create_default_context()


def _certificate_error(path, server, exc):
    """A certificate the kubeconfig does not accept, by OpenSSL's verify code (its short verify message once)."""
    code = getattr(exc, "verify_code", None)
    if code == CERT_HAS_EXPIRED:
        return _kubeconfig_error(path, "the API server %s presents a certificate that has expired" % server, FIX_EXPIRED)
    if code == CERT_NOT_YET_VALID:
        return _kubeconfig_error(path, "the API server %s presents a certificate that is not valid yet: a clock is wrong"
                                 % server, FIX_CLOCK)
    if code in NAME_MISMATCH:
        return _kubeconfig_error(path, "the API server's certificate is not valid for %s" % server, FIX_HOSTNAME)
    return _kubeconfig_error(path, "the API server %s presents a certificate that the kubeconfig does not trust (%s)" % (
        server, getattr(exc, "verify_message", None) or "not verified"), FIX_TRUST)


def _connect(path, cluster, timeout):
    server = _address(cluster)
    try:
        return socket.create_connection((cluster["host"], cluster["port"]), timeout=timeout)
    except socket.gaierror:
        raise _kubeconfig_error(path, "the host name of its API server %s does not resolve" % server, FIX_SERVER)
    except ConnectionRefusedError:
        raise _kubeconfig_error(path, "the API server %s is unreachable: it refuses connections (nothing listens there)"
                                % server, FIX_SERVER)
    except socket.timeout:
        raise _kubeconfig_error(path, "the API server %s is unreachable: no answer within %d s" % (server, timeout),
                                FIX_SERVER)
    except OSError as exc:
        raise _kubeconfig_error(path, "the API server %s is unreachable (%s)" % (server, exc.strerror or "no route"),
                                FIX_SERVER)


def probe_server(path, cluster, timeout=CONNECT_SECONDS):
    """Connects to the kubeconfig's API server and, over https, makes the TLS handshake the Python client would make;
    sends nothing. Raises K3sGpuError: unreachable, a certificate not trusted, expired, or for another name."""
    server = _address(cluster)
    context = _tls_context(path, cluster) if cluster["scheme"] == "https" else None
    with _connect(path, cluster, timeout) as sock:
        if context is None:
            return
        try:
            with context.wrap_socket(sock, server_hostname=cluster.get("tls-server-name") or cluster["host"]):
                return
        except ssl.SSLCertVerificationError as exc:
            raise _certificate_error(path, server, exc)
        except (ssl.SSLError, OSError) as exc:
            raise _kubeconfig_error(path, "the TLS handshake with the API server %s failed (%s): is it an API server, "
                                    "and over https?" % (server, getattr(exc, "reason", None) or exc.strerror or
                                                         "connection closed"), FIX_SERVER)


def check_kubeconfig(path, context=None, proxied=False, timeout=CONNECT_SECONDS):
    """The kubeconfig reaches its API server: the file is a kubeconfig whose current context names a cluster, and,
    unless a proxy stands between (proxied, or the cluster's proxy-url), its server answers with a certificate it
    trusts. Returns the server's address; raises K3sGpuError."""
    cluster = kubeconfig_cluster(path, context)
    if not (proxied or cluster.get("proxy-url")):
        probe_server(path, cluster, timeout)
    return _address(cluster)


def kubernetes_core_missing():
    return K3sGpuError("the kubernetes.core collection, whose modules read the cluster, is not installed on the "
                       "controller", FIX_KUBERNETES_CORE)


# A kubernetes.core read that failed after the kubeconfig's check, by what its message says (first match); the message
# itself is not repeated: it is the Python client's exception text
READ_FAILURES = (
    (re.compile(r"required Python library \(kubernetes\)"),
     "the Python kubernetes client that kubernetes.core needs is not installed in %(python)s", FIX_PYTHON_CLIENT),
    (re.compile(r"\b401\b|Unauthorized"),
     "the API server refuses the kubeconfig's credentials (401 Unauthorized)", FIX_CREDENTIALS),
    (re.compile(r"\b403\b|Forbidden"), "the kubeconfig's user may not list %(kinds)s (403 Forbidden)", FIX_RIGHTS),
    (re.compile(r"CERTIFICATE_VERIFY_FAILED|SSLError"), "the API server's certificate is not trusted", FIX_TRUST),
    (re.compile(r"Connection refused|NewConnectionError|Max retries exceeded|timed out"),
     "the API server is unreachable", FIX_SERVER),
    (re.compile(r"kube-?config|codec can't decode|current-context"), "not a kubeconfig kubernetes.core can read",
     FIX_KUBECONFIG),
)


def _plural(kind):
    return kind + ("es" if kind.endswith("s") else "s")


def read_error(kind, message, kubeconfig=None):
    """The K3sGpuError of a failed kubernetes.core.k8s_info read of `kind`: one cause and fix from READ_FAILURES, else
    the first line of its message, cut."""
    message = str(message or "")
    where = "kubeconfig %s: " % kubeconfig if kubeconfig else ""
    python = re.search(r"Python (/\S+?)\.?(?:\s|$)", message)
    names = {"kinds": _plural(kind), "python": python.group(1) if python else "the Python that runs localhost's modules"}
    for pattern, cause, fix in READ_FAILURES:
        if pattern.search(message):
            return K3sGpuError("%sreading the %s failed: %s" % (where, _plural(kind), cause % names), fix)
    first = (message.strip().splitlines() or ["no message"])[0]
    return K3sGpuError("%sreading the %s through kubernetes.core failed: %s" % (
        where, _plural(kind), first if len(first) <= 200 else first[:200] + "..."),
        "kubectl --kubeconfig <the kubeconfig> get %s says more" % _plural(kind).lower())
