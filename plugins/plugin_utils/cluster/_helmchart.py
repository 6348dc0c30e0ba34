# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The helm.cattle.io/v1 HelmChart objects the collection writes into a server's auto-deploy directory (the GPU Operator
in operator mode, NVIDIA's device plugin in host mode): one builder, so that both charts are deployed alike.

PRIVATE to the collection."""

from __future__ import annotations

import posixpath

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _manifest_yaml as manifest_yaml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels

API_VERSION = "helm.cattle.io/v1"
KIND = "HelmChart"
# HelmChart objects live in kube-system by k3s convention; the chart installs into its target namespace.
NAMESPACE = "kube-system"
# Where a k3s/rke2 server serves chart archives to helm-controller (air-gapped sites), below its data dir.
STATIC_CHARTS_URL = "https://%{KUBERNETES_API}%/static/charts/"
KEY_ORDER = ("apiVersion", "kind", "metadata", "name", "namespace", "labels", "spec", "chart", "repo", "version",
             "targetNamespace", "createNamespace")


def values_text(values):
    """The chart values as YAML text (HelmChart valuesContent), byte-stable."""
    lines = []
    manifest_yaml.mapping_lines(values, 0, (), lines)
    return "\n".join(lines) + "\n"


def helmchart(name, chart, values, target_namespace, static_charts_dir, extra_spec=None):
    """(the HelmChart object, the node path where the server serves the chart archive, or None).

    chart: {"name", "repo", "version", "archive"}; with an archive (its file name) the chart comes from the server's
    static/charts, else from the repository. extra_spec: more HelmChart spec fields (checked by the caller)."""
    spec = dict(extra_spec or {})
    archive_path = None
    if chart.get("archive"):
        spec["chart"] = STATIC_CHARTS_URL + chart["archive"]
        archive_path = posixpath.join(static_charts_dir, chart["archive"])
    elif chart["repo"].startswith("oci://"):
        # an OCI registry: the chart's reference in spec.chart, no repo (helm-controller pulls it as `helm pull oci://`)
        spec.update({"chart": "%s/%s" % (chart["repo"].rstrip("/"), chart["name"]), "version": chart["version"]})
    else:
        spec.update({"chart": chart["name"], "repo": chart["repo"], "version": chart["version"]})
    spec["targetNamespace"] = target_namespace
    # in the base field set of every helm-controller this collection knows
    spec["createNamespace"] = True
    spec["valuesContent"] = values_text(values)
    return ({"apiVersion": API_VERSION, "kind": KIND,
             "metadata": {"name": name, "namespace": NAMESPACE,
                          "labels": {k8s_labels.MANAGED_BY_LABEL: k8s_labels.MANAGED_BY}},
             "spec": spec}, archive_path)


def render(comment, objects):
    """The manifest text for the auto-deploy directory (a comment, then one document per object)."""
    return manifest_yaml.render_documents(comment, objects, KEY_ORDER)


def render_plan(plan, objects_of, comment):
    """The manifest of a cluster plan's objects (the device plugin's, the GPU Operator's); a plan without objects is
    refused: its manifest is removed instead."""
    if not plan.get("objects"):
        raise K3sGpuError("no %s to render" % objects_of, "remove the manifest instead")
    return render(comment, plan["objects"])
