# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions (pure, controller side): which RuntimeClasses and nodes the GPU pods test, the
report per node from the pods' phases and logs, and, without a cluster, what the manifests on a server say.

PRIVATE to the collection."""

from __future__ import annotations

import hashlib
import re

import yaml

GPU_RESOURCE = "nvidia.com/gpu"
# /dev/nvidia*, the driver's libraries and nvidia-smi: what the toolkit puts into a pod of an NVIDIA RuntimeClass
SMOKE_COMMAND = ["sh", "-c", "ls /dev/nvidia* && (ldconfig -p | grep -q libnvidia-ml.so || ls /usr/lib*/*/libnvidia-ml.so*) "
                 "&& nvidia-smi -L"]
POD_LABELS = {"app.kubernetes.io/managed-by": "k3s_gpu.nvidia", "k3s-gpu.nvidia/verify": "true"}


def _allocatable(node):
    return str(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0"))


def choose(classes, nodes, wanted=()):
    """{runtimeclasses, gpu_nodes, allocatable: {node: count}, nodes_without_gpu} from the API's RuntimeClasses and Nodes:
    every RuntimeClass whose handler starts with nvidia (or `wanted`), every node that advertises nvidia.com/gpu
    (time-slicing and MPS replicas included in the count)."""
    names = sorted(c["metadata"]["name"] for c in classes or [] if str(c.get("handler", "")).startswith("nvidia"))
    allocatable = dict((n["metadata"]["name"], _allocatable(n)) for n in nodes or [])
    return {"runtimeclasses": sorted(wanted) if wanted else names,
            "gpu_nodes": sorted(name for name, count in allocatable.items() if count not in ("0", "")),
            "allocatable": allocatable,
            "nodes_without_gpu": sorted(name for name, count in allocatable.items() if count in ("0", ""))}


def pod_name(node, runtimeclass):
    """A DNS label: the class, the node's name cut to 30 characters, and a hash that keeps two long node names apart."""
    cut = re.sub("[^a-z0-9-]", "-", node)[:30]
    return "gpu-%s-%s-%s" % (runtimeclass, cut, hashlib.sha1(node.encode("utf-8")).hexdigest()[:6])


def smoke_pods(chosen, namespace, image):
    """One pod per GPU node and RuntimeClass, pinned to the node, asking for the class and one nvidia.com/gpu."""
    return [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": pod_name(node, runtimeclass), "namespace": namespace, "labels": dict(POD_LABELS)},
             "spec": {"nodeName": node, "runtimeClassName": runtimeclass, "restartPolicy": "Never",
                      "containers": [{"name": "smoke", "image": image, "command": list(SMOKE_COMMAND),
                                      "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                              {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}],
                                      "resources": {"limits": {GPU_RESOURCE: 1}}}]}}
            for node in chosen["gpu_nodes"] for runtimeclass in chosen["runtimeclasses"]]


def refusal(chosen):
    """The message when there is nothing to test, else None."""
    if chosen["runtimeclasses"] and chosen["gpu_nodes"]:
        return None
    return ("Nothing to test: %d NVIDIA RuntimeClasses (%s) and %d nodes with allocatable nvidia.com/gpu (%s). Run "
            "k3s_gpu.nvidia.site: it writes the RuntimeClasses and, in host mode, NVIDIA's device plugin, which makes the "
            "nodes advertise nvidia.com/gpu once its pods run (operator mode: the GPU Operator's)." % (
                len(chosen["runtimeclasses"]), ", ".join(chosen["runtimeclasses"]) or "none",
                len(chosen["gpu_nodes"]), ", ".join(chosen["gpu_nodes"]) or "none"))


def _gpu_line(lines):
    found = [line for line in lines if "GPU " in line]
    return found[0] if found else (lines[-1] if lines else "no output")


def report(pods, logs, expected, allocatable):
    """{lines, failed}: one line per pod (node / RuntimeClass: phase | allocatable | nvidia-smi -L line); failed lists
    the pods that did not succeed, and says so when fewer pods ran than were started."""
    log_of = dict((entry.get("name"), entry.get("lines") or []) for entry in logs or [])
    lines, failed = [], []
    for pod in sorted(pods or [], key=lambda p: (p["spec"].get("nodeName", ""), p["spec"].get("runtimeClassName", ""))):
        name = pod["metadata"]["name"]
        node = pod["spec"].get("nodeName", "")
        phase = (pod.get("status") or {}).get("phase", "Unknown")
        lines.append("%s / %s: %s | allocatable nvidia.com/gpu %s | %s" % (
            node, pod["spec"].get("runtimeClassName", ""), phase, allocatable.get(node, "?"), _gpu_line(log_of.get(name, []))))
        if phase != "Succeeded":
            failed.append(name)
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
