# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Operator mode: NVIDIA's GPU Operator as a k3s/rke2 HelmChart, and the rules that keep it and the
host toolkit from fighting over one node (pure, no I/O).

PRIVATE to the collection. Controller side.

The cluster's decision lives here (what the role does on each node in either mode is _host_plan's):
- plan_cluster(): the HelmChart (and Namespace) objects for one cluster, with values that fit
  k3s/rke2: k3s's containerd socket and nothing that points the operator at the config k3s
  regenerates or at its template; components the role manages on the host turned off; the user's
  extra values merged, except the keys this collection owns.
Which chart line creates which RuntimeClass, and which HelmChart fields each release's
helm-controller knows, is data in `_release_rules`, not a rule here.
"""

from __future__ import annotations

import re

from collections.abc import Mapping

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import line_key, type_name
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _helmchart as helmchart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _merge as merge
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

MODE_HOST = "host"
MODE_OPERATOR = "operator"
MODES = (MODE_HOST, MODE_OPERATOR)

# Label on every object this collection writes (the same as on its RuntimeClasses).
MANAGED_BY_LABEL = k8s_labels.MANAGED_BY_LABEL
MANAGED_BY = k8s_labels.MANAGED_BY

HELMCHART_NAME = "gpu-operator"
MANIFEST_FILE = distro.OPERATOR_MANIFEST

# k3s and rke2 both run containerd at this socket; the operator's toolkit signals containerd there.
K3S_CONTAINERD_SOCKET = "/run/k3s/containerd/containerd.sock"

# toolkit env names (nvidia-ctk-installer aliases, k3s-facts §8.3) this collection owns or refuses
_SOCKET_ENV = ("CONTAINERD_SOCKET", "RUNTIME_SOCKET")
_CONFIG_ENV = ("CONTAINERD_CONFIG", "RUNTIME_CONFIG", "RUNTIME_DROP_IN_CONFIG")
_SET_AS_DEFAULT_ENV = ("CONTAINERD_SET_AS_DEFAULT", "NVIDIA_RUNTIME_SET_AS_DEFAULT")

SETTING_KEYS = ("chart_version", "chart_repo", "chart_archive", "namespace", "cdi", "driver", "toolkit", "values",
                "helmchart_spec")
NODE_KEYS = ("host", "mode", "driver_install")

_CHART_VERSION = re.compile(r"v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?\Z")
_CHART_ARCHIVE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.tgz\Z")


# --- one cluster -----------------------------------------------------------------------------------

def chart_line(version):
    """'v26.3.3' -> '26.3', refused when this collection does not know the line."""
    if not isinstance(version, str) or not _CHART_VERSION.match(version):
        raise K3sGpuError("chart_version %r is not a chart version like %s" % (
            version, release_rules.GPU_OPERATOR_CHART["default_version"]))
    major, minor = version.lstrip("v").split(".")[:2]
    line = "%s.%s" % (int(major), int(minor))
    if line not in release_rules.GPU_OPERATOR_LINES:
        known = ", ".join(sorted(release_rules.GPU_OPERATOR_LINES, key=line_key))
        raise K3sGpuError(
            "chart_version %s: this collection knows the GPU Operator lines %s (what each creates and deletes, its "
            "values)" % (version, known),
            fix="use one of those, for example %s" % (release_rules.GPU_OPERATOR_CHART["default_version"],))
    return line


def operator_runtimeclasses(mode):
    """Every RuntimeClass name the operator manages in a mode (creates or deletes), and the reason."""
    rule = release_rules.GPU_OPERATOR_RUNTIMECLASSES[mode]
    names = sorted(rule["created"] + rule["deleted"])
    return names, rule


def _dotted(mapping, prefix=""):
    for key, value in mapping.items():
        path = prefix + str(key)
        yield path, value
        if isinstance(value, Mapping):
            yield from _dotted(value, path + ".")


def _get(mapping, path, default=None):
    value = mapping
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default
        value = value[part]
    return value


def _check_settings(settings):
    if not isinstance(settings, Mapping):
        raise K3sGpuError("settings must be a dict, got %s" % type_name(settings))
    unknown = sorted(str(key) for key in settings if key not in SETTING_KEYS)
    if unknown:
        raise K3sGpuError(
            "unknown setting(s) %s" % (", ".join(unknown),),
            fix="the settings are %s" % (", ".join(SETTING_KEYS),))
    checked = {
        "chart_version": settings.get("chart_version") or release_rules.GPU_OPERATOR_CHART["default_version"],
        "chart_repo": settings.get("chart_repo") or release_rules.GPU_OPERATOR_CHART["repo"],
        "chart_archive": settings.get("chart_archive") or "",
        "namespace": settings.get("namespace") or "gpu-operator",
        "cdi": settings.get("cdi", None),
        "driver": settings.get("driver", "auto"),
        "toolkit": settings.get("toolkit", True),
        "values": {} if settings.get("values") is None else settings["values"],
        "helmchart_spec": {} if settings.get("helmchart_spec") is None else settings["helmchart_spec"],
    }
    checked["line"] = chart_line(checked["chart_version"])
    if not re.match(r"(https|http|oci)://[^\s]+\Z", str(checked["chart_repo"])):
        raise K3sGpuError("gpu_node_operator_chart_repo %r is not an https://, http:// or oci:// URL" % (
            checked["chart_repo"],))
    archive = checked["chart_archive"]
    if archive and not (isinstance(archive, str) and _CHART_ARCHIVE.match(archive)):
        raise K3sGpuError("gpu_node_operator_chart_archive %r must be a file name ending in .tgz (the archive is "
                          "copied to the server's static/charts directory)" % (archive,))
    namespace = checked["namespace"]
    if not k8s_labels.is_dns_label(namespace):
        raise K3sGpuError("gpu_node_operator_namespace %r is not a namespace name (lowercase letters, digits, "
                          "'-')" % (checked["namespace"],))
    if checked["cdi"] is not None and not isinstance(checked["cdi"], bool):
        raise K3sGpuError("gpu_node_operator_cdi must be true, false or null (the chart's default), got %r" % (
            checked["cdi"],))
    if checked["driver"] != "auto" and not isinstance(checked["driver"], bool):
        raise K3sGpuError("gpu_node_operator_driver must be auto, true or false, got %r" % (checked["driver"],))
    if not isinstance(checked["toolkit"], bool):
        raise K3sGpuError("gpu_node_operator_toolkit must be true or false, got %r" % (checked["toolkit"],))
    for name in ("values", "helmchart_spec"):
        if not isinstance(checked[name], Mapping):
            raise K3sGpuError("gpu_node_operator_%s must be a dict, got %s" % (name, type_name(checked[name])))
    return checked


def _check_nodes(nodes):
    if not isinstance(nodes, (list, tuple)):
        raise K3sGpuError("nodes must be a list of {host, mode, driver_install} dicts, got %s" % type_name(nodes))
    checked = []
    for index, node in enumerate(nodes):
        where = "nodes[%d]" % index
        if not isinstance(node, Mapping):
            raise K3sGpuError("%s must be a dict, got %s" % (where, type_name(node)))
        runtimeclasses.refuse_unknown_keys(node, NODE_KEYS, where)
        host = node.get("host")
        if not isinstance(host, str) or not host:
            raise K3sGpuError("%s.host must be the inventory hostname, got %r" % (where, host))
        mode = node.get("mode", MODE_HOST)
        if mode not in MODES:
            raise K3sGpuError(
                "%s (%s): gpu_node_mode is %r" % (where, host, mode),
                fix="use host or operator",
                variable="gpu_node_mode")
        driver_install = node.get("driver_install", False)
        if not isinstance(driver_install, bool):
            raise K3sGpuError("%s (%s).driver_install must be true or false, got %r" % (where, host, driver_install))
        checked.append({"host": host, "mode": mode, "driver_install": driver_install})
    return checked


def _cluster_profile(server):
    return release_rules.cluster_profile(server, "operator mode")


def _operator_mode(settings, line, profile, check=True):
    """cdi | legacy | nri, from gpu_node_operator_cdi and the user's cdi.nriPluginEnabled; checked against containerd
    when the operator is wanted (a cluster without operator-mode nodes is never refused for it)."""
    facts = release_rules.GPU_OPERATOR_LINES[line]
    cdi = facts["cdi_default"] if settings["cdi"] is None else settings["cdi"]
    nri = _get(settings["values"], "cdi.nriPluginEnabled", False) is True
    if not check:
        return "nri" if nri and cdi else "cdi" if cdi else "legacy"
    if nri and not facts["nri"]:
        raise K3sGpuError("values cdi.nriPluginEnabled: the GPU Operator %s has no NRI plugin mode (it came with "
                          "v26.3)" % settings["chart_version"])
    if nri and not cdi:
        raise K3sGpuError("values cdi.nriPluginEnabled needs CDI",
                          fix="set gpu_node_operator_cdi=true (the chart refuses NRI without it)")
    if nri and facts["nri_needs_toolkit"] and not settings["toolkit"]:
        raise K3sGpuError("values cdi.nriPluginEnabled: the GPU Operator %s refuses its NRI plugin mode without its "
                          "container toolkit" % settings["chart_version"],
                          fix="set gpu_node_operator_toolkit=true, or drop cdi.nriPluginEnabled")
    mode = "nri" if nri else "cdi" if cdi else "legacy"
    needed = release_rules.GPU_OPERATOR_MODE_CONTAINERD[mode]
    if needed and line_key(profile["containerd"]) < line_key(needed):
        raise K3sGpuError(
            "the GPU Operator's %s mode needs containerd %s or newer, and %s %s ships containerd %s" % (
                "NRI plugin" if mode == "nri" else "CDI", needed, profile["distribution"], profile["release"],
                profile["containerd"]),
            fix=("set gpu_node_operator_cdi=false (the operator's runtimes then inject devices themselves), or upgrade "
                 "to a release with containerd 2 (v1.31.6+, v1.32.2+)" if mode == "cdi" else
                 "drop cdi.nriPluginEnabled, or upgrade to a release with containerd 2.1"))
    return mode


def _resolve_driver(settings, operator_nodes):
    """driver.enabled: the setting, or (auto) off when the role installs the host driver on these nodes."""
    installing = sorted(node["host"] for node in operator_nodes if node["driver_install"])
    if settings["driver"] != "auto":
        if settings["driver"] and installing:
            raise K3sGpuError(
                "gpu_node_operator_driver=true, but the role installs the host driver on %s (gpu_node_driver_install): two "
                "owners for the kernel module" % ", ".join(installing),
                fix="turn one of them off")
        return settings["driver"]
    if installing and len(installing) != len(operator_nodes):
        others = sorted(node["host"] for node in operator_nodes if not node["driver_install"])
        raise K3sGpuError(
            "the GPU Operator's driver.enabled is one setting for the whole cluster, but the role installs the host driver "
            "on %s and not on %s" % (", ".join(installing), ", ".join(others)),
            fix="set gpu_node_driver_install the same on every operator-mode node, or set gpu_node_operator_driver "
                "explicitly")
    return not installing


# values this collection decides; the user's values may repeat them only with the same value
_OWNED_VALUES = {
    "driver.enabled": "gpu_node_operator_driver",
    "toolkit.enabled": "gpu_node_operator_toolkit",
    "cdi.enabled": "gpu_node_operator_cdi",
}


def _check_user_values(values, cluster_paths, ours):
    for path, setting in _OWNED_VALUES.items():
        given = _get(values, path)
        if given is not None and given != _get(ours, path):
            raise K3sGpuError(
                "gpu_node_operator_values sets %s=%r" % (path, given),
                fix="set %s instead (the role reads it too, to keep the host and the operator apart)" % (setting,),
                variable="gpu_node_operator_values")
    install_dir = _get(values, "toolkit.installDir")
    if install_dir is not None and install_dir.rstrip("/") != release_rules.GPU_OPERATOR_CHART["install_dir"]:
        raise K3sGpuError(
            "gpu_node_operator_values sets toolkit.installDir=%r: k3s and rke2 look for the operator's runtimes only in "
            "%s, so they would never see them" % (install_dir, distro.GPU_OPERATOR_TOOLKIT_DIR),
            fix="leave it at %s" % (release_rules.GPU_OPERATOR_CHART["install_dir"],))
    runtime_class = _get(values, "operator.runtimeClass")
    if runtime_class is not None and runtime_class != release_rules.GPU_OPERATOR_CHART["runtime_class"]:
        raise K3sGpuError(
            "gpu_node_operator_values sets operator.runtimeClass=%r: the operator uses it as the runtime handler too, and "
            "k3s/rke2 configure the handler %s only" % (runtime_class, release_rules.GPU_OPERATOR_CHART["runtime_class"]),
            fix="leave it at %s" % (release_rules.GPU_OPERATOR_CHART["runtime_class"],))
    env = _get(values, "toolkit.env")
    if env is None:
        return
    if not isinstance(env, (list, tuple)) or not all(isinstance(item, Mapping) and "name" in item for item in env):
        raise K3sGpuError("gpu_node_operator_values toolkit.env must be a list of {name, value} dicts")
    containerd_dir = cluster_paths["containerd_dir"]
    for item in env:
        name, value = str(item["name"]), str(item.get("value", ""))
        where = "gpu_node_operator_values toolkit.env %s=%s" % (name, value)
        if name in _SOCKET_ENV and value != K3S_CONTAINERD_SOCKET:
            raise K3sGpuError(
                "%s: k3s and rke2 run containerd at %s" % (where, K3S_CONTAINERD_SOCKET),
                fix="the collection sets it")
        if name in _CONFIG_ENV and (value == containerd_dir or value.startswith(containerd_dir + "/")):
            raise K3sGpuError(
                "%s points the operator at the containerd config that %s regenerates at every start (or at its template "
                "or drop-in directory): the operator's edits are lost or break the template (NVIDIA/gpu-operator #473, "
                "rancher/rke2 #8752)" % (where, "k3s/rke2"),
                fix="drop it: k3s/rke2 detect the operator's runtimes in %s themselves" % (
                    distro.GPU_OPERATOR_TOOLKIT_DIR,))
        if name in _SET_AS_DEFAULT_ENV and value.strip().lower() in ("true", "1"):
            raise K3sGpuError(
                "%s: the operator would write the default runtime into a containerd config k3s/rke2 do not read (or "
                "regenerate), so it is lost" % where,
                fix="set gpu_node_default_runtime instead: the role writes default-runtime into config.yaml.d, which "
                    "survives regeneration")


def _values(settings, driver_enabled, cluster_paths):
    ours = {"driver": {"enabled": driver_enabled}, "toolkit": {"enabled": settings["toolkit"]},
            "cdi": {"enabled": settings["cdi"] if settings["cdi"] is not None
                    else release_rules.GPU_OPERATOR_LINES[settings["line"]]["cdi_default"]}}
    if settings["toolkit"]:
        # the operator signals k3s's containerd there (k3s then restarts and detects the new runtimes)
        ours["toolkit"]["env"] = [{"name": "CONTAINERD_SOCKET", "value": K3S_CONTAINERD_SOCKET}]
    user = settings["values"]
    _check_user_values(user, cluster_paths, ours)
    merged = merge.deep_merge(ours, dict((k, v) for k, v in user.items() if k != "toolkit"))
    user_toolkit = dict(user.get("toolkit") or {})
    user_env = list(user_toolkit.pop("env", None) or [])
    merged["toolkit"] = merge.deep_merge(merged["toolkit"], user_toolkit)
    if user_env or "env" in merged["toolkit"]:
        names = set(str(item["name"]) for item in user_env)
        merged["toolkit"]["env"] = [item for item in merged["toolkit"].get("env", []) if item["name"] not in names] + [
            dict(item) for item in user_env]
    return merged


def _check_spec(extra, profile):
    fields = release_rules.helmchart_spec_fields(profile)
    for key in extra:
        if key in _SPEC_OWNED:
            raise K3sGpuError("gpu_node_operator_helmchart_spec sets %s, which the collection writes (%s)" % (
                key, _SPEC_OWNED[key]))
        if key not in fields:
            raise K3sGpuError(
                "gpu_node_operator_helmchart_spec.%s: the HelmChart of %s %s (helm-controller %s) has no such "
                "field" % (key, profile["distribution"], profile["release"], release_rules.helm_controller_version(profile)),
                fix="the API server would drop it silently. Its fields: %s" % (", ".join(sorted(fields)),))


_SPEC_OWNED = {
    "chart": "gpu_node_operator_chart_repo / gpu_node_operator_chart_archive",
    "repo": "gpu_node_operator_chart_repo",
    "version": "gpu_node_operator_chart_version",
    "targetNamespace": "gpu_node_operator_namespace",
    "createNamespace": "gpu_node_operator_namespace",
    "valuesContent": "gpu_node_operator_values",
}


def plan_cluster(server, settings, nodes):
    """The GPU Operator objects of one cluster.

    server: the reading of the server that writes (a _node_facts.NodeFacts: its distribution, profile, paths).
    settings: chart_version, chart_repo, chart_archive (a .tgz file name served from the server's
    static/charts), namespace, cdi (bool or None = the chart's default), driver (auto | bool),
    toolkit (bool), values (extra chart values), helmchart_spec (extra HelmChart spec fields).
    nodes: [{host, mode, driver_install}] of the cluster's GPU nodes.

    Returns {"wanted": bool (some node is in operator mode), "objects": [the HelmChart],
    "values": dict, "operator_mode": cdi|legacy|nri, "runtimeclasses": [names the operator manages],
    "runtimeclasses_created", "runtimeclasses_deleted", "operator_nodes": [hosts], "chart_archive_path": str|None}.
    """
    profile = _cluster_profile(server)
    checked = _check_settings(settings)
    checked_nodes = _check_nodes(nodes)
    operator_nodes = [node for node in checked_nodes if node["mode"] == MODE_OPERATOR]
    host_nodes = [node["host"] for node in checked_nodes if node["mode"] == MODE_HOST]
    if operator_nodes and host_nodes:
        raise K3sGpuError(
            "one cluster, two modes: %s in operator mode, %s in host mode. The GPU Operator runs its toolkit on every GPU "
            "node of the cluster, so host-mode nodes would get a second toolkit" % (
                ", ".join(sorted(node["host"] for node in operator_nodes)), ", ".join(sorted(host_nodes))),
            fix="set gpu_node_mode the same for the whole cluster (k3s_gpu_cluster separates clusters in one inventory)")
    mode = _operator_mode(checked, checked["line"], profile, check=bool(operator_nodes))
    names, rule = operator_runtimeclasses(mode)
    result = {"wanted": bool(operator_nodes), "objects": [], "values": {}, "operator_mode": mode,
              "runtimeclasses": names, "runtimeclasses_created": sorted(rule["created"]),
              "runtimeclasses_deleted": sorted(rule["deleted"]), "operator_nodes": sorted(n["host"] for n in operator_nodes),
              "chart_archive_path": None, "chart_version": checked["chart_version"]}
    if not operator_nodes:
        return result
    _check_spec(checked["helmchart_spec"], profile)
    values = _values(checked, _resolve_driver(checked, operator_nodes), server.paths)
    chart_object, result["chart_archive_path"] = helmchart.helmchart(
        HELMCHART_NAME, {"name": release_rules.GPU_OPERATOR_CHART["name"], "repo": checked["chart_repo"],
                         "version": checked["chart_version"], "archive": checked["chart_archive"]},
        values, checked["namespace"], server.paths["static_charts_dir"], extra_spec=checked["helmchart_spec"])
    result["objects"] = [chart_object]
    result["values"] = values
    return result


def render_manifest(plan):
    """The manifest text for the auto-deploy directory (a comment, then one document per object)."""
    return helmchart.render_plan(plan, "GPU Operator objects (no node of the cluster is in operator mode)",
                                 "Managed by %s; edits are overwritten. NVIDIA GPU Operator %s (%s mode) for k3s/rke2." % (
                                     MANAGED_BY, plan["chart_version"], plan["operator_mode"]))
