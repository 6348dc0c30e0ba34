# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The layers of a node whose GPUs NVIDIA's DRA driver serves (gpu_node_allocation=dra), shared by the doctor and
verify (pure, controller side): dra-api (resource.k8s.io/v1 served), dra-conflict (a device plugin and the DRA driver
on one node), dra-driver (a ResourceSlice of gpu.nvidia.com with devices for the node), deviceclass; the claim that
the claim pods ask for (a ResourceClaimTemplate of that DeviceClass), and whether the node serves the seed's
`nvidia.com/gpu: 1` through DRA (Kubernetes 1.36's extended-resource bridge).

`cluster` is what the doctor and verify read: {"dra_api": bool, "resourceslices": [...], "deviceclasses": [...]}.

PRIVATE to the collection."""

from __future__ import annotations

import re

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra_driver
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _claims_cdi as claims_cdi

DRIVER = release_rules.DRA_DRIVER_CHART["driver"]
DEVICE_CLASS = release_rules.DRA_DRIVER_CHART["device_class"]
GPU_RESOURCE = device_plugin.RESOURCE_NAME
RESOURCE_API = "resource.k8s.io/v1"
# the claim pods' one request, and the template it comes from (in the pods' own namespace)
CLAIM_REQUEST = "gpu"
CLAIM_TEMPLATE = "k3s-gpu-nvidia-gpu"
# where NVIDIA's DRA driver writes the transient CDI spec of each claim it prepares
CLAIM_CDI_DIR = claims_cdi.CLAIM_CDI_DIR


class Broken(K3sGpuError):
    """A layer that is broken: what is wrong on the node, and what to run or set (the role's variable where one does).
    Its own type: the doctor and verify catch it to name the layer, and let every other error through."""


def is_dra_node(node):
    """The role labelled the node for NVIDIA's DRA driver (gpu_node_allocation=dra)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(k8s_labels.ALLOCATION_LABEL) == k8s_labels.ALLOCATION_DRA


def devices(cluster, node_name, driver=DRIVER):
    """The devices the driver's ResourceSlices publish for the node."""
    found = []
    for item in cluster.get("resourceslices") or []:
        spec = item.get("spec") or {}
        if spec.get("driver") == driver and spec.get("nodeName") == node_name:
            found += spec.get("devices") or []
    return found


def _capacity(node):
    return ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)


def check_api(_node, cluster):
    if not cluster.get("dra_api"):
        raise Broken("the API server does not serve %s (ResourceSlices, DeviceClasses): DRA is off" % RESOURCE_API,
                     "k3s/rke2 v1.34.2 or newer serve it by default; on an older release keep "
                     "gpu_node_allocation=device_plugin")
    return "%s served" % RESOURCE_API


def check_driver(node, cluster):
    name = node["metadata"]["name"]
    found = devices(cluster, name)
    if not found:
        raise Broken("no ResourceSlice of the driver %s publishes a device of this node: NVIDIA's DRA driver does not "
                     "run on it, or has not registered with its kubelet" % DRIVER,
                     "k3s_gpu.nvidia.site deploys it (gpu_node_dra_driver_state: present) on nodes labelled "
                     "%s=%s; kubectl -n %s logs of its kubelet plugin pod on %s (the namespace of "
                     "gpu_node_dra_driver_namespace); its kubelet dirs must be below kubelet's --root-dir" % (
                         k8s_labels.ALLOCATION_LABEL, k8s_labels.ALLOCATION_DRA, dra_driver.DEFAULT_NAMESPACE, name))
    return "%d device(s) of %s" % (len(found), DRIVER)


def device_class(cluster, name=DEVICE_CLASS):
    return next((c for c in cluster.get("deviceclasses") or [] if (c.get("metadata") or {}).get("name") == name), None)


def check_deviceclass(_node, cluster):
    if device_class(cluster) is None:
        raise Broken("there is no DeviceClass %s: a claim of that class stays Pending" % DEVICE_CLASS,
                     "NVIDIA's chart creates it: run k3s_gpu.nvidia.site (the DRA driver's HelmChart) or let "
                     "helm-controller reinstall the chart (kubectl -n kube-system delete job helm-install-%s)"
                     % dra_driver.HELMCHART_NAME)
    return "DeviceClass %s" % DEVICE_CLASS


def check_conflict(node, cluster):
    """Both a device plugin and NVIDIA's DRA driver serve the node: the scheduler may hand one GPU out twice."""
    capacity = _capacity(node)
    found = devices(cluster, node["metadata"]["name"])
    if capacity not in (None, "", "0") and found:
        raise Broken("a device plugin advertises nvidia.com/gpu (capacity %s) and NVIDIA's DRA driver publishes %d "
                     "device(s) of %s on the same node: both hand out the same GPUs" % (capacity, len(found), DRIVER),
                     "keep one per node: gpu_node_allocation decides which (the device plugin's DaemonSet keeps off "
                     "nodes labelled %s=%s); a device plugin of your own must select the same way"
                     % (k8s_labels.ALLOCATION_LABEL, k8s_labels.ALLOCATION_DRA))
    return "one allocator (%s)" % ("DRA" if found else "device plugin" if capacity not in (None, "", "0") else "none yet")


# in the order a claim needs them: the API, one allocator on the node, the driver's devices, the class a claim names
LAYERS = (("dra-api", check_api), ("dra-conflict", check_conflict), ("dra-driver", check_driver),
          ("deviceclass", check_deviceclass))


def first_broken(node, cluster):
    """(passed [(layer, detail)], broken (layer, Broken) or None) of the node's DRA layers, in order."""
    passed = []
    for layer, check in LAYERS:
        try:
            passed.append((layer, check(node, cluster)))
        except Broken as exc:
            return passed, (layer, exc)
    return passed, None


def kubelet_release(node):
    """The node's kubelet version (v1.36.3+k3s1, v1.34.6+rke2r1, or a plain v1.36.3) as a Release of its line, for the
    feature table's rows, which are the same for k3s and rke2 here; or None when it cannot be read."""
    version = str((((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")) or "")
    found = re.match(r"v?\d+\.\d+\.\d+", version)
    return distro.Release(distro.K3S, found.group(0)) if found else None


def seed_pod_served(node, cluster):
    """(served, why not): whether a pod asking nvidia.com/gpu: 1 (the seed's pod) is served through DRA on the node:
    its kubelet's release has the extended-resource bridge (the feature table's dra_extended_resource, 1.36) and the
    DeviceClass names nvidia.com/gpu as its extendedResourceName."""
    release = kubelet_release(node)
    if release is None or not distro.has_feature(release, "dra_extended_resource"):
        return False, ("its kubelet is %s: Kubernetes serves nvidia.com/gpu through DRA from 1.36 (DRAExtendedResource; "
                       "before, only with that feature gate on every component), so such a pod stays Pending there; ask "
                       "for a ResourceClaim of DeviceClass %s instead" % (
                           (((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")) or "unknown",
                           DEVICE_CLASS))
    named = ((device_class(cluster) or {}).get("spec") or {}).get("extendedResourceName")
    if named != GPU_RESOURCE:
        return False, ("DeviceClass %s names %s as its extended resource, not %s" % (
            DEVICE_CLASS, named or "none", GPU_RESOURCE))
    return True, ""


def claim_template(namespace):
    """The ResourceClaimTemplate of the claim pods: one device of NVIDIA's DeviceClass."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": CLAIM_TEMPLATE, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "k3s_gpu.nvidia"}},
            "spec": {"spec": {"devices": {"requests": [
                {"name": CLAIM_REQUEST, "exactly": {"deviceClassName": DEVICE_CLASS}}]}}}}


def is_claim_pod(pod):
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def served_by_dra(pod):
    """A claim pod, or a pod whose nvidia.com/gpu the scheduler turned into a claim (1.36's extended-resource bridge)."""
    return is_claim_pod(pod) or bool((pod.get("status") or {}).get("extendedResourceClaimStatus"))


def allocation(claim):
    """The devices a ResourceClaim was allocated: ["<driver> <pool>/<device>"]."""
    results = ((((claim or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return ["%s %s/%s" % (r.get("driver"), r.get("pool"), r.get("device")) for r in results]


def claim_of(pod, claims):
    """The ResourceClaim the pod's claim became (its status names it), or None."""
    names = [s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []]
    return next((c for c in claims or [] if (c.get("metadata") or {}).get("name") in names), None)


FIX_CLAIM = ("look at the claim (kubectl describe resourceclaim -n <namespace>) and the node's slices (kubectl get "
             "resourceslices --field-selector spec.nodeName=<node> -o yaml): the node needs a free device of DeviceClass "
             "%s, and NVIDIA's DRA driver's kubelet plugin on the node must prepare it" % DEVICE_CLASS)
FIX_CLAIM_CDI = ("containerd must scan %s, where NVIDIA's DRA driver writes each claim's CDI spec: enable_cdi on and "
                 "cdi_spec_dirs with /etc/cdi and /var/run/cdi in the node's containerd config (k3s/rke2 set both; a "
                 "config template that narrows them is a finding of k3s_gpu.nvidia.containerd_runtimes)" % CLAIM_CDI_DIR)
