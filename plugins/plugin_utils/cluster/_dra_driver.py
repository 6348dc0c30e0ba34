# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVIDIA's DRA driver for GPUs (chart dra-driver-nvidia-gpu) as a k3s/rke2 HelmChart, for the nodes whose
gpu_node_allocation is dra (pure: the cluster step writes what this decides).

The values fit k3s/rke2 and keep the driver apart from the device plugin:
- gpuResourcesEnabledOverride: true - the chart refuses to render GPU resources without it, because the driver must never
  share a node with a device plugin; here the kubelet plugin runs only on nodes labelled
  k3s-gpu.nvidia/gpu-allocation=dra, and the collection's device plugin only on the others;
- resources.computeDomains.enabled: off unless asked (IMEX channels, multi-node NVLink hardware only);
- nvidiaDriverRoot: / for a host-installed driver, /run/nvidia/driver under the GPU Operator's driver container (#792);
- resourceApiVersion: resource.k8s.io/v1 (served from 1.34; the gpu.nvidia.com DeviceClass then names
  extendedResourceName nvidia.com/gpu, which 1.36 serves to pods asking nvidia.com/gpu);
- kubeletPlugin.kubeletRegistrarDirectoryPath / kubeletPluginsDirectoryPath: below the nodes' kubelet root dir, which
  kubelet's plugin watcher follows (a custom root-dir otherwise leaves the driver unregistered).
The chart and version are pinned; the registry's chart by default, or a chart archive served by the server (air-gapped).

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import dataclasses
import posixpath
import re

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import type_name
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _k3s_config as k3s_config
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _helmchart as helmchart

HELMCHART_NAME = "nvidia-dra-driver-gpu"
MANIFEST_FILE = distro.DRA_DRIVER_MANIFEST
DEFAULT_NAMESPACE = "nvidia-dra-driver-gpu"
KUBELET_ROOT_DIR = k3s_config.KUBELET_ROOT_DIR

# the role variable of each setting (for the messages)
VARIABLES = {
    "chart_version": "gpu_node_dra_driver_chart_version", "chart_repo": "gpu_node_dra_driver_chart_repo",
    "chart_archive": "gpu_node_dra_driver_chart_archive", "namespace": "gpu_node_dra_driver_namespace",
    "compute_domains": "gpu_node_dra_driver_compute_domains", "image_registry": "gpu_node_dra_driver_image_registry",
}
_CHART_ARCHIVE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.tgz\Z")
_REGISTRY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*\Z")
_REPO = re.compile(r"(oci|https?)://[^\s]+\Z")


@dataclasses.dataclass(frozen=True)
class DraNode:
    """A GPU node whose gpu_node_allocation is dra: its kubelet root dir and whose driver it runs."""
    host: str
    kubelet_root_dir: str = KUBELET_ROOT_DIR
    operator_driver: bool = False  # the GPU Operator's driver container owns the driver (files under /run/nvidia/driver)

    @classmethod
    def of(cls, value):
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict) or not isinstance(value.get("host"), str) or not value.get("host"):
            raise K3sGpuError("a DRA node must be a dict with a host name, got %s %r" % (type_name(value), value))
        root = value.get("kubelet_root_dir") or KUBELET_ROOT_DIR
        if not isinstance(root, str) or not root.startswith("/"):
            raise K3sGpuError("%s: kubelet's root dir %r is not an absolute path" % (value["host"], root),
                              fix="correct `kubelet-arg: root-dir=` in the node's config.yaml")
        return cls(host=value["host"], kubelet_root_dir=posixpath.normpath(root),
                   operator_driver=bool(value.get("operator_driver")))


def check_settings(settings):
    """The settings with their defaults, each checked; K3sGpuError naming the role variable and the fix."""
    settings = dict(settings or {})
    version = settings.get("chart_version") or release_rules.DRA_DRIVER_CHART["default_version"]
    if version not in release_rules.DRA_DRIVER_VERSIONS:
        raise K3sGpuError("%s is %r, which this collection does not know" % (VARIABLES["chart_version"], version),
                          fix="use one of %s, or leave it empty for %s" % (
                              ", ".join(sorted(release_rules.DRA_DRIVER_VERSIONS)),
                              release_rules.DRA_DRIVER_CHART["default_version"]),
                          variable=VARIABLES["chart_version"])
    repo = settings.get("chart_repo") or release_rules.DRA_DRIVER_CHART["repo"]
    if not isinstance(repo, str) or not _REPO.match(repo):
        raise K3sGpuError("%s is %r, not a chart repository URL" % (VARIABLES["chart_repo"], repo),
                          fix="give an oci://, https:// or http:// URL, or leave it empty for %s" % (
                              release_rules.DRA_DRIVER_CHART["repo"]), variable=VARIABLES["chart_repo"])
    archive = settings.get("chart_archive") or ""
    if archive and not _CHART_ARCHIVE.match(archive):
        raise K3sGpuError("%s is %r, not a chart archive's file name (<name>.tgz)" % (VARIABLES["chart_archive"], archive),
                          fix="give the path of the .tgz on the controller", variable=VARIABLES["chart_archive"])
    namespace = settings.get("namespace") or DEFAULT_NAMESPACE
    if not k8s_labels.is_dns_label(namespace) or namespace == "default":
        raise K3sGpuError("%s is %r: the chart needs a namespace of its own (a DNS label, not default)" % (
            VARIABLES["namespace"], namespace), fix="leave it empty for %s" % DEFAULT_NAMESPACE,
            variable=VARIABLES["namespace"])
    compute_domains = settings.get("compute_domains", False)
    if not isinstance(compute_domains, bool):
        raise K3sGpuError("%s must be a boolean, got %s %r" % (VARIABLES["compute_domains"], type_name(compute_domains),
                                                               compute_domains), variable=VARIABLES["compute_domains"])
    registry = settings.get("image_registry") or ""
    if registry and not _REGISTRY.match(registry):
        raise K3sGpuError("%s is %r, not a registry host[:port][/path]" % (VARIABLES["image_registry"], registry),
                          fix="for example registry.example.com:5000", variable=VARIABLES["image_registry"])
    return {"chart_version": version, "chart_repo": repo, "chart_archive": archive, "namespace": namespace,
            "compute_domains": compute_domains, "image_registry": registry,
            "chart": release_rules.DRA_DRIVER_VERSIONS[version]}


def _one(nodes, what, of, fix):
    """The one value of `of(node)` the nodes share; K3sGpuError naming the nodes when they differ (the chart's values
    are one per cluster)."""
    found = {}
    for node in nodes:
        found.setdefault(of(node), []).append(node.host)
    if len(found) > 1:
        each = "; ".join("%s on %s" % (value, ", ".join(hosts)) for value, hosts in sorted(found.items()))
        raise K3sGpuError("the DRA nodes of one cluster disagree on %s (%s); NVIDIA's chart takes one value per "
                          "cluster" % (what, each), fix=fix)
    return next(iter(found))


def chart_values(checked, nodes):
    """valuesContent of the HelmChart for checked settings and the cluster's DRA nodes (DraNode)."""
    root = _one(nodes, "kubelet's root dir", lambda node: node.kubelet_root_dir,
                "give every DRA node of the cluster the same `kubelet-arg: root-dir=` (or none)")
    operator = _one(nodes, "who owns the NVIDIA driver", lambda node: node.operator_driver,
                    "run the driver the same way on every DRA node of the cluster (host packages, or the GPU Operator's "
                    "driver container)")
    values = {
        "nvidiaDriverRoot": release_rules.DRA_DRIVER_ROOTS["operator" if operator else "host"],
        # the chart's own guard: true only because the kubelet plugin and the device plugin select disjoint nodes
        "gpuResourcesEnabledOverride": True,
        "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": checked["compute_domains"]}},
        "resourceApiVersion": "resource.k8s.io/v1",
        "kubeletPlugin": {
            "kubeletRegistrarDirectoryPath": posixpath.join(root, "plugins_registry"),
            "kubeletPluginsDirectoryPath": posixpath.join(root, "plugins"),
            # replaces the chart's default (NFD's NVIDIA labels OR nvidia.com/gpu.present): exactly the DRA nodes
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": k8s_labels.ALLOCATION_LABEL, "operator": "In",
                                       "values": [k8s_labels.ALLOCATION_DRA]}]}]}}},
        },
    }
    if checked["image_registry"]:
        path = checked["chart"]["image"].split("/", 1)[1].split(":", 1)[0]
        values["image"] = {"repository": checked["image_registry"].rstrip("/") + "/" + path}
    return values


def plan_cluster(server, settings, nodes):
    """The DRA driver's objects of one cluster.

    server: the reading of the server that writes (a _node_facts.NodeFacts); its release must serve DRA (1.34.2+).
    settings: chart_version, chart_repo, chart_archive (a .tgz file name served from the server's static/charts),
    namespace, compute_domains, image_registry. nodes: DraNode (or dicts with its keys) of the cluster's DRA nodes.

    Returns {"wanted": bool (some DRA node), "objects": [the HelmChart], "values", "chart_version", "nodes": [host],
    "chart_archive_path": str|None}."""
    profile = release_rules.cluster_profile(server, "gpu_node_allocation=dra")
    checked = check_settings(settings)
    dra_nodes = [DraNode.of(node) for node in nodes or []]
    result = {"wanted": bool(dra_nodes), "objects": [], "values": {}, "chart_version": checked["chart_version"],
              "nodes": sorted(node.host for node in dra_nodes), "chart_archive_path": None}
    if not dra_nodes:
        return result
    refusal = release_refusal(distro.Release(profile["distribution"], profile["release"]))
    if refusal:
        raise K3sGpuError("the cluster's server runs %s" % refusal[0], fix=refusal[1])
    values = chart_values(checked, dra_nodes)
    chart_object, result["chart_archive_path"] = helmchart.helmchart(
        HELMCHART_NAME, {"name": release_rules.DRA_DRIVER_CHART["name"], "repo": checked["chart_repo"],
                         "version": checked["chart_version"], "archive": checked["chart_archive"]},
        values, checked["namespace"], server.paths["static_charts_dir"])
    result.update(objects=[chart_object], values=values)
    return result


def release_refusal(release):
    """(what, fix) when a k3s/rke2 release cannot serve NVIDIA's DRA driver, else None (the feature table's `dra`)."""
    if release.distribution in (distro.K3S, distro.RKE2) and not distro.has_feature(release, "dra"):
        return ("%s %s, which NVIDIA's DRA driver does not support: it needs Kubernetes 1.34.2 or newer, where "
                "resource.k8s.io/v1 is served by default" % (release.distribution, release),
                "upgrade the cluster to v1.34.2 or newer, or keep gpu_node_allocation=device_plugin")
    return None


def render_manifest(plan):
    """The manifest text for the auto-deploy directory (a comment, then the HelmChart)."""
    return helmchart.render_plan(plan, "DRA driver objects (the cluster has no node with gpu_node_allocation=dra)",
                                 "Managed by %s; edits are overwritten. NVIDIA DRA driver %s for k3s/rke2 (nodes labelled "
                                 "%s=%s)." % (k8s_labels.MANAGED_BY, plan["chart_version"], k8s_labels.ALLOCATION_LABEL,
                                              k8s_labels.ALLOCATION_DRA))


# --- the gpu_node role's variables -------------------------------------------------------------------

# the gpu_node role's DRA driver variables (read without the gpu_node_ prefix) -> the settings of this module
ROLE_SETTINGS = tuple(("dra_driver_" + name, name) for name in (
    "chart_version", "chart_repo", "chart_archive", "namespace", "compute_domains", "image_registry"))
ROLE_VARS = ("gpu_node_dra_driver_state",) + tuple("gpu_node_" + name for name, _ours in ROLE_SETTINGS)


def settings_of_role(settings):
    """The settings of this module from the role's variables (the chart archive by its file name, as it is served)."""
    converted = dict((ours, settings[name]) for name, ours in ROLE_SETTINGS if name in settings)
    converted["chart_archive"] = posixpath.basename(converted.get("chart_archive") or "")
    return converted
