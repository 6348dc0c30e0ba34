# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Host mode: NVIDIA's device plugin as a k3s/rke2 HelmChart (pure, controller side, no I/O).

PRIVATE to the collection.

plan_cluster() builds, for one cluster, the helm.cattle.io/v1 HelmChart of the `nvidia-device-plugin`
chart with values that fit what the gpu_node role configured:
- runtimeClassName: an NVIDIA RuntimeClass the cluster has (without one the plugin runs under runc and
  cannot load NVML on k3s/rke2);
- deviceListStrategy: cdi-cri where every GPU node's containerd has CDI on and an NVIDIA CDI spec (and
  the kubelet passes CDI devices), envvar otherwise;
- affinity: only nodes labelled nvidia.com/gpu.present=true (the chart's default also takes NFD's
  NVIDIA PCI labels, i.e. GPU nodes the role did not configure);
- GPU sharing (time-slicing or MPS) as the plugin's config file in config.map, with named per-node
  configs picked by the node label nvidia.com/device-plugin.config.
Every setting is checked before anything is built; a refusal is one sentence naming the role variable
and the fix. render_manifest() gives the manifest text, byte-stable. Chart facts (versions, images,
allowed values) are `_release_rules`' DEVICE_PLUGIN_* table; their sources are in docs/device-plugin.md.
"""

from __future__ import annotations

import difflib
import posixpath
import re

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import line_key, type_name
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _helmchart as helmchart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _manifest_yaml as manifest_yaml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

# Also the Helm release name: it contains the chart name, so the chart names its objects
# nvidia-device-plugin, nvidia-device-plugin-configs, ... (templates/_helpers.tpl fullname).
HELMCHART_NAME = "nvidia-device-plugin"
MANIFEST_FILE = distro.DEVICE_PLUGIN_MANIFEST
DEFAULT_NAMESPACE = "nvidia-device-plugin"

# The label that places the plugin: the role's GPU nodes get it, the chart's affinity matches only it.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_PRESENT_VALUE = "true"
CONFIG_LABEL = release_rules.DEVICE_PLUGIN_CHART["config_label"]
# The chart runs its MPS control daemon only on nodes with this label, which GFD sets from the node's
# plugin config (templates/daemonset-mps-control-daemon.yml nodeSelector; internal/lm/nvml.go): the role
# sets it itself where a node's config shares by MPS, so MPS works without GFD.
MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"
# config.map key of the cluster-wide config (gpu_node_gpu_sharing); also the chart's `named` fallback
DEFAULT_CONFIG_NAME = "default"
RESOURCE_NAME = "nvidia.com/gpu"

AUTO = "auto"
SHARING_NONE = "none"

# setting -> the role variable a message names
VARIABLES = {
    "chart_version": "gpu_node_device_plugin_chart_version",
    "chart_repo": "gpu_node_device_plugin_chart_repo",
    "chart_archive": "gpu_node_device_plugin_chart_archive",
    "namespace": "gpu_node_device_plugin_namespace",
    "runtime_class": "gpu_node_device_plugin_runtime_class",
    "device_list_strategy": "gpu_node_device_plugin_device_list_strategy",
    "device_discovery_strategy": "gpu_node_device_plugin_device_discovery_strategy",
    "mig_strategy": "gpu_node_device_plugin_mig_strategy",
    "gfd": "gpu_node_device_plugin_gfd",
    "image_registry": "gpu_node_device_plugin_image_registry",
    "sharing": "gpu_node_gpu_sharing",
    "configs": "gpu_node_device_plugin_configs",
}
SETTING_KEYS = tuple(VARIABLES)
SHARING_KEYS = ("strategy", "replicas", "rename_by_default", "fail_requests_greater_than_one")
NODE_KEYS = ("host", "cdi_enabled", "cdi_spec", "handlers", "config")

_CHART_ARCHIVE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.tgz\Z")
# host[:port][/path] of an OCI registry, no scheme, no tag
_REGISTRY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*\Z")
# a config name is both a ConfigMap data key and a node label value
_CONFIG_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")


@dataclass(frozen=True)
class PluginNode:
    """What the plan needs to know about one GPU node of the cluster.

    cdi_enabled: containerd's effective `enable_cdi` on the node (configured, or on by default from containerd 2.0).
    cdi_spec: an NVIDIA CDI spec (kind nvidia.com/gpu) that fits the loaded driver is in /etc/cdi or /var/run/cdi.
    handlers: the runtime handlers the node's containerd declares; None when not read (then not checked).
    config: the name of a named plugin config (a key of gpu_node_device_plugin_configs) for this node, or "" for
    the cluster-wide one.
    """

    host: str
    cdi_enabled: bool = False
    cdi_spec: bool = False
    handlers: Optional[Tuple[str, ...]] = None
    config: str = ""


def _closest(name, known):
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return " (did you mean %s?)" % close[0] if close else ""


def _refuse_unknown_keys(mapping, known, where):
    unknown = sorted(str(key) for key in mapping if key not in known)
    if unknown:
        raise K3sGpuError(
            "%s has no key %s%s" % (where, unknown[0], _closest(unknown[0], known)),
            fix="its keys are %s." % (", ".join(known),))


def _check_choice(setting, value, choices, allow_auto=False):
    allowed = ((AUTO,) if allow_auto else ()) + tuple(choices)
    if value not in allowed:
        raise K3sGpuError(
            "%s is %r%s" % (VARIABLES[setting], value, _closest(value, allowed)),
            fix="use one of %s." % (", ".join(allowed),),
            variable=VARIABLES[setting])
    return value


def _check_bool(where, value):
    if not isinstance(value, bool):
        raise K3sGpuError("%s must be true or false, got %r." % (where, value))
    return value


# --- the chart -------------------------------------------------------------------------------------

def chart_facts(version):
    """The known-versions row of a chart version ('0.20.0' or 'v0.20.0'), refused when unknown."""
    plain = version.lstrip("v") if isinstance(version, str) else version
    if plain not in release_rules.DEVICE_PLUGIN_VERSIONS:
        known = ", ".join(sorted(release_rules.DEVICE_PLUGIN_VERSIONS, key=line_key))
        raise K3sGpuError(
            "%s is %r, a chart version this collection does not know (its image and values are checked per "
            "version)" % (VARIABLES["chart_version"], version),
            fix="use one of %s." % (known,),
            variable=VARIABLES["chart_version"])
    return dict(release_rules.DEVICE_PLUGIN_VERSIONS[plain], version=plain)


# --- GPU sharing: the plugin's config file -------------------------------------------------------------

def check_sharing(sharing, chart, mig_strategy="none", variable=VARIABLES["sharing"]):
    """A sharing setting, checked and completed: {strategy, replicas, rename_by_default,
    fail_requests_greater_than_one}, or None for no sharing (None, {} or strategy none)."""
    if sharing is None:
        return None
    if not isinstance(sharing, Mapping):
        raise K3sGpuError("%s must be a dict such as {strategy: time-slicing, replicas: 4}, got %s." % (
            variable, type_name(sharing)))
    if not sharing:
        return None
    _refuse_unknown_keys(sharing, SHARING_KEYS, variable)
    strategies = chart["sharing_strategies"]
    strategy = sharing.get("strategy")
    if strategy == SHARING_NONE:
        extra = sorted(key for key in sharing if key != "strategy")
        if extra:
            raise K3sGpuError(
                "%s: strategy none shares nothing, so %s has no meaning" % (variable, extra[0]),
                fix="drop it or pick %s." % (" or ".join(strategies),))
        return None
    if strategy not in strategies:
        raise K3sGpuError(
            "%s.strategy is %r%s" % (variable, strategy, _closest(strategy, strategies + (SHARING_NONE,))),
            fix="use %s (or none)." % (" or ".join(strategies),))
    replicas = sharing.get("replicas")
    # bool is an int in Python; the plugin reads a JSON number
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        raise K3sGpuError(
            "%s.replicas is %r" % (variable, replicas),
            fix="set a whole number of 2 or more (how many pods share one GPU; the plugin refuses fewer than 2).")
    if strategy == "mps" and replicas > chart["mps_max_replicas"]:
        raise K3sGpuError(
            "%s.replicas is %d, above the %d clients one MPS server takes (16 before compute capability "
            "7.5)" % (variable, replicas, chart["mps_max_replicas"]),
            fix="set %d or fewer." % (chart["mps_max_replicas"],))
    if strategy == "mps" and mig_strategy == "mixed":
        raise K3sGpuError(
            "%s uses MPS, which the plugin refuses with MIG strategy mixed" % (variable,),
            fix="set %s to none or single, or share with time-slicing." % (VARIABLES["mig_strategy"],))
    rename = _check_bool(variable + ".rename_by_default", sharing.get("rename_by_default", False))
    # the plugin's own default: on for MPS (api/config/v1/config.go), off for time-slicing
    fail_default = strategy == "mps"
    fail = _check_bool(variable + ".fail_requests_greater_than_one",
                       sharing.get("fail_requests_greater_than_one", fail_default))
    return {"strategy": strategy, "replicas": replicas, "rename_by_default": rename,
            "fail_requests_greater_than_one": fail}


def plugin_config(sharing, mig_strategy):
    """The plugin's config file (api/config/v1) for a checked sharing setting, as a dict."""
    config = {"version": "v1", "flags": {"migStrategy": mig_strategy}}
    if sharing:
        key = "timeSlicing" if sharing["strategy"] == "time-slicing" else "mps"
        config["sharing"] = {key: {
            "renameByDefault": sharing["rename_by_default"],
            "failRequestsGreaterThanOne": sharing["fail_requests_greater_than_one"],
            "resources": [{"name": RESOURCE_NAME, "replicas": sharing["replicas"]}],
        }}
    return config


def config_text(config):
    """A plugin config as YAML text, byte-stable (one config.map entry)."""
    lines = []
    manifest_yaml.mapping_lines(config, 0, ("version", "flags", "sharing", "name", "replicas"), lines)
    return "\n".join(lines) + "\n"


def _check_configs(configs, chart, mig_strategy):
    """gpu_node_device_plugin_configs: {name: sharing setting or None} -> {name: checked sharing or None}."""
    variable = VARIABLES["configs"]
    if configs is None:
        return {}
    if not isinstance(configs, Mapping):
        raise K3sGpuError("%s must be a dict of config name -> sharing setting, got %s." % (
            variable, type_name(configs)))
    checked = {}
    for name in sorted(configs, key=str):
        if not isinstance(name, str) or not _CONFIG_NAME.match(name):
            raise K3sGpuError(
                "%s has the config name %r" % (variable, name),
                fix="use letters, digits, '-', '_' or '.', up to 63 characters (it is a node label value).",
                variable=variable)
        if name == DEFAULT_CONFIG_NAME:
            raise K3sGpuError(
                "%s names a config %r, the name of the cluster-wide config (set that one with "
                "%s)" % (variable, name, VARIABLES["sharing"]),
                fix="rename it.",
                variable=variable)
        checked[name] = check_sharing(configs[name], chart, mig_strategy, variable="%s.%s" % (variable, name))
    return checked


# --- plugin nodes -------------------------------------------------------------------------------------

def plugin_node(value):
    """A PluginNode from a PluginNode or a dict with the same keys, checked."""
    if isinstance(value, PluginNode):
        value = {"host": value.host, "cdi_enabled": value.cdi_enabled, "cdi_spec": value.cdi_spec,
                 "handlers": value.handlers, "config": value.config}
    if not isinstance(value, Mapping):
        raise K3sGpuError("each node must be a dict with the keys %s, got %s." % (
            ", ".join(NODE_KEYS), type_name(value)))
    host = value.get("host")
    if not isinstance(host, str) or not host:
        raise K3sGpuError("a node's host must be its inventory hostname, got %r." % (host,))
    _refuse_unknown_keys(value, NODE_KEYS, "the facts of node %s" % host)
    where = "the facts of node %s" % host
    handlers = value.get("handlers")
    if handlers is not None:
        if not isinstance(handlers, (list, tuple)) or not all(isinstance(h, str) for h in handlers):
            raise K3sGpuError("%s: handlers must be a list of runtime handler names, got %r." % (where, handlers))
        handlers = tuple(sorted(set(handlers)))
    config = value.get("config") or ""
    if not isinstance(config, str):
        raise K3sGpuError("%s: config must be a config name, got %r." % (where, config))
    return PluginNode(host=host, cdi_enabled=_check_bool(where + ": cdi_enabled", value.get("cdi_enabled", False)),
                      cdi_spec=_check_bool(where + ": cdi_spec", value.get("cdi_spec", False)),
                      handlers=handlers, config=config)


def _check_nodes(nodes):
    if not isinstance(nodes, (list, tuple)):
        raise K3sGpuError("nodes must be a list of node facts, got %s." % type_name(nodes))
    checked = [plugin_node(node) for node in nodes]
    hosts = [node.host for node in checked]
    twice = sorted(set(host for host in hosts if hosts.count(host) > 1))
    if twice:
        raise K3sGpuError("node %s is listed twice in the cluster's nodes." % twice[0])
    return sorted(checked, key=lambda node: node.host)


# --- runtimeClassName ---------------------------------------------------------------------------------

def _runtimeclass_pairs(available):
    """[(name, handler)] from RuntimeClass names (handler = name) or {name, handler} dicts."""
    if not isinstance(available, (list, tuple)):
        raise K3sGpuError("runtimeclasses must be a list of RuntimeClass names or {name, handler} dicts, got "
                          "%s." % type_name(available))
    pairs = []
    for item in available:
        if isinstance(item, str):
            pairs.append((item, item))
        elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
            pairs.append((item["name"], item.get("handler") or item["name"]))
        else:
            raise K3sGpuError("runtimeclasses has %r" % (item,), fix="give a RuntimeClass name or {name, handler}.")
    return sorted(set(pairs))


def choose_runtime_class(available, nodes, wanted=""):
    """The RuntimeClass the plugin's pods run under: `wanted` when given (it must exist), else the first NVIDIA
    one by handler preference (nvidia, nvidia-cdi, nvidia-legacy, nvidia-experimental) whose handler every node
    declares; nvidia-cdi only where every node has a CDI spec (its runtime resolves the plugin's devices there).
    """
    pairs = _runtimeclass_pairs(available)
    nodes = [plugin_node(node) for node in nodes]
    variable = VARIABLES["runtime_class"]
    if wanted:
        handlers = [handler for name, handler in pairs if name == wanted]
        if not handlers:
            raise K3sGpuError(
                "%s is %r, but the cluster has no RuntimeClass of that name (it has "
                "%s)" % (variable, wanted, ", ".join(name for name, _h in pairs) or "none"),
                fix="create it with the k3s_gpu.nvidia.runtimeclasses playbook or pick an existing one.",
                variable=variable)
        missing = [node.host for node in nodes if node.handlers is not None and handlers[0] not in node.handlers]
        if missing:
            raise K3sGpuError(
                "%s is %s, whose handler %s is not configured in containerd on "
                "%s" % (variable, wanted, handlers[0], ", ".join(missing)),
                fix="the plugin pod would not start there, so pick a RuntimeClass whose handler every GPU node has.",
                variable=variable)
        return wanted
    all_specs = bool(nodes) and all(node.cdi_spec for node in nodes)
    for preferred in k8s_labels.NVIDIA_HANDLERS:
        if preferred == "nvidia-cdi" and not all_specs:
            continue
        for name, handler in pairs:
            if handler == preferred and all(node.handlers is None or handler in node.handlers for node in nodes):
                return name
    raise K3sGpuError(
        "the cluster has no NVIDIA RuntimeClass whose handler every GPU node has (RuntimeClasses: "
        "%s)" % (", ".join("%s (handler %s)" % pair for pair in pairs) or "none",),
        fix="without one the plugin runs under runc and cannot load NVML, so create them with the "
            "k3s_gpu.nvidia.runtimeclasses playbook, or set %s." % (variable,),
        variable=variable)


# --- deviceListStrategy -----------------------------------------------------------------------------

def _kubelet_passes_cdi(profile):
    return line_key(profile["line"]) >= line_key(release_rules.DEVICE_PLUGIN_CDI_CRI_KUBERNETES)


def choose_device_list_strategy(nodes, profile, wanted=AUTO, chart=None):
    """(strategy, reason): cdi-cri where every node's containerd has CDI on and an NVIDIA CDI spec and the
    kubelet passes CDI devices (Kubernetes 1.29+), envvar otherwise; an explicit CDI strategy is checked the same."""
    chart = chart or chart_facts(release_rules.DEVICE_PLUGIN_CHART["default_version"])
    _check_choice("device_list_strategy", wanted, chart["device_list_strategies"], allow_auto=True)
    nodes = [plugin_node(node) for node in nodes]
    no_cdi = [node.host for node in nodes if not node.cdi_enabled]
    no_spec = [node.host for node in nodes if not node.cdi_spec]
    kubelet = _kubelet_passes_cdi(profile)
    if wanted in (AUTO, "cdi-cri", "cdi-annotations"):
        problems = []
        if no_cdi:
            problems.append("CDI is off in containerd on %s" % ", ".join(no_cdi))
        if no_spec:
            problems.append("no NVIDIA CDI spec on %s" % ", ".join(no_spec))
        if wanted != "cdi-annotations" and not kubelet:
            problems.append("the kubelet of %s %s does not pass CDI devices (Kubernetes %s+)" % (
                profile["distribution"], profile["release"], release_rules.DEVICE_PLUGIN_CDI_CRI_KUBERNETES))
        if not nodes:
            problems.append("no GPU node")
        if wanted == AUTO:
            if problems:
                return "envvar", "envvar: " + "; ".join(problems)
            return "cdi-cri", "cdi-cri: every GPU node's containerd has CDI on and an NVIDIA CDI spec"
        if problems:
            raise K3sGpuError(
                "%s is %s, but %s" % (VARIABLES["device_list_strategy"], wanted, "; ".join(problems)),
                fix="enable CDI and generate the specs on those nodes (the gpu_node role does so in host mode), or set "
                    "it to auto.",
                variable=VARIABLES["device_list_strategy"])
        return wanted, "%s: set by %s" % (wanted, VARIABLES["device_list_strategy"])
    return wanted, "%s: set by %s" % (wanted, VARIABLES["device_list_strategy"])


# --- settings and cluster -----------------------------------------------------------------------------

def _check_settings(settings):
    if settings is None:
        settings = {}
    if not isinstance(settings, Mapping):
        raise K3sGpuError("settings must be a dict, got %s." % type_name(settings))
    _refuse_unknown_keys(settings, SETTING_KEYS, "the device plugin settings")
    chart = chart_facts(settings.get("chart_version") or release_rules.DEVICE_PLUGIN_CHART["default_version"])
    checked = {
        "chart": chart,
        "chart_repo": settings.get("chart_repo") or release_rules.DEVICE_PLUGIN_CHART["repo"],
        "chart_archive": settings.get("chart_archive") or "",
        "namespace": settings.get("namespace") or DEFAULT_NAMESPACE,
        "runtime_class": settings.get("runtime_class") or "",
        "device_list_strategy": settings.get("device_list_strategy") or AUTO,
        "device_discovery_strategy": settings.get("device_discovery_strategy") or None,
        "mig_strategy": settings.get("mig_strategy") or "none",
        "gfd": settings.get("gfd", False),
        "image_registry": settings.get("image_registry") or "",
    }
    if not isinstance(checked["chart_repo"], str) or not re.match(r"(https|http|oci)://[^\s]+\Z", checked["chart_repo"]):
        raise K3sGpuError(
            "%s is %r" % (VARIABLES["chart_repo"], checked["chart_repo"]),
            fix="give the chart repository as an https://, http:// or oci:// URL.",
            variable=VARIABLES["chart_repo"])
    archive = checked["chart_archive"]
    if archive and not (isinstance(archive, str) and _CHART_ARCHIVE.match(archive)):
        raise K3sGpuError(
            "%s is %r" % (VARIABLES["chart_archive"], archive),
            fix="give a file name ending in .tgz (the archive is served from the server's static/charts directory).",
            variable=VARIABLES["chart_archive"])
    namespace = checked["namespace"]
    if not k8s_labels.is_dns_label(namespace):
        raise K3sGpuError(
            "%s is %r" % (VARIABLES["namespace"], namespace),
            fix="give a namespace name (lowercase letters, digits and '-').",
            variable=VARIABLES["namespace"])
    if namespace == "default":
        raise K3sGpuError(
            "%s is default, which the chart refuses" % (VARIABLES["namespace"],),
            fix="use a namespace of its own such as %s." % (DEFAULT_NAMESPACE,),
            variable=VARIABLES["namespace"])
    if not isinstance(checked["runtime_class"], str):
        raise K3sGpuError("%s must be a RuntimeClass name, got %r." % (
            VARIABLES["runtime_class"], checked["runtime_class"]))
    _check_choice("mig_strategy", checked["mig_strategy"], chart["mig_strategies"])
    if checked["device_discovery_strategy"] is not None:
        _check_choice("device_discovery_strategy", checked["device_discovery_strategy"],
                      chart["device_discovery_strategies"])
    _check_bool(VARIABLES["gfd"], checked["gfd"])
    registry = checked["image_registry"]
    if registry and not (isinstance(registry, str) and _REGISTRY.match(registry)):
        raise K3sGpuError(
            "%s is %r" % (VARIABLES["image_registry"], registry),
            fix="give the registry that mirrors the images as host[:port][/path], without a scheme or tag (for example "
                "registry.example.com:5000/mirror).",
            variable=VARIABLES["image_registry"])
    checked["sharing"] = check_sharing(settings.get("sharing"), chart, checked["mig_strategy"])
    checked["configs"] = _check_configs(settings.get("configs"), chart, checked["mig_strategy"])
    return checked


def _cluster_profile(server):
    return release_rules.cluster_profile(server, "host mode")


def _mirrored(registry, image):
    """The image repository moved to a mirror registry: nvcr.io/nvidia/x -> <registry>/nvidia/x."""
    path = image.split("/", 1)[1]
    return registry.rstrip("/") + "/" + path.split(":", 1)[0]


def node_labels(nodes, sharing=None, configs=None):
    """host -> the labels its node needs: nvidia.com/gpu.present=true; the config label where a node has a
    named config; nvidia.com/mps.capable=true where the node's config shares by MPS. sharing and configs are
    checked settings (check_sharing, and {name: checked sharing})."""
    configs = configs or {}
    labels = {}
    for node in nodes:
        labels[node.host] = {GPU_PRESENT_LABEL: GPU_PRESENT_VALUE}
        if node.config:
            labels[node.host][CONFIG_LABEL] = node.config
        effective = configs.get(node.config) if node.config else sharing
        if effective and effective["strategy"] == "mps":
            labels[node.host][MPS_CAPABLE_LABEL] = "true"
    return labels


def labels_of_node(settings, host, config=""):
    """The node labels ("key=value") one GPU node needs for the plugin (what the gpu_node role writes through
    config.yaml.d), from the same settings as plan_cluster; a config name must be one of settings' configs."""
    checked = _check_settings(settings)
    if config and config not in checked["configs"]:
        raise K3sGpuError(
            "gpu_node_device_plugin_config is %r, which is not a key of "
            "%s%s" % (config, VARIABLES["configs"], _closest(config, tuple(checked["configs"]))),
            fix="add it there, or leave it empty for the cluster-wide config.",
            variable="gpu_node_device_plugin_config")
    labels = node_labels([PluginNode(host=host, config=config)], checked["sharing"], checked["configs"])[host]
    return ["%s=%s" % (key, labels[key]) for key in sorted(labels)]


def chart_values(settings, runtime_class, device_list_strategy, nodes, dra_nodes=False):
    """The chart values for checked settings (what goes into valuesContent); dra_nodes: the cluster also has nodes with
    gpu_node_allocation=dra, which the plugin must keep off."""
    chart = settings["chart"]
    values = {
        "runtimeClassName": runtime_class,
        "deviceListStrategy": device_list_strategy,
        # set even when none: with a config map and no migStrategy value the chart assumes MIG and adds
        # CAP_SYS_ADMIN and NVIDIA_MIG_MONITOR_DEVICES (templates/_helpers.tpl allPossibleMigStrategiesAreNone)
        "migStrategy": settings["mig_strategy"],
        # replaces the chart's default (NFD's NVIDIA PCI label OR this one): exactly the role's nodes
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_PRESENT_LABEL, "operator": "In", "values": [GPU_PRESENT_VALUE]}]}]}}},
        "gfd": {"enabled": settings["gfd"]},
    }
    if dra_nodes:
        # never where NVIDIA's DRA driver serves the GPUs (gpu_node_allocation=dra). Only in a cluster that has such
        # nodes: a cluster without them keeps the manifest it had, and its plugin is not rolled again
        values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
            "matchExpressions"].append({"key": k8s_labels.ALLOCATION_LABEL, "operator": "NotIn",
                                        "values": [k8s_labels.ALLOCATION_DRA]})
    if settings["device_discovery_strategy"]:
        values["deviceDiscoveryStrategy"] = settings["device_discovery_strategy"]
    if settings["image_registry"]:
        values["image"] = {"repository": _mirrored(settings["image_registry"], chart["image"])}
        if settings["gfd"]:
            values["nfd"] = {"image": {"repository": _mirrored(settings["image_registry"], chart["nfd_image_repository"])}}
    unknown = sorted(set(node.config for node in nodes if node.config) - set(settings["configs"]))
    if unknown:
        raise K3sGpuError(
            "a node asks for the plugin config %s, which %s does not define (it defines "
            "%s)" % (unknown[0], VARIABLES["configs"], ", ".join(settings["configs"]) or "none"),
            fix="add it there or clear the node's config.")
    if settings["sharing"] is not None or settings["configs"]:
        config_map = {DEFAULT_CONFIG_NAME: config_text(plugin_config(settings["sharing"], settings["mig_strategy"]))}
        for name, sharing in settings["configs"].items():
            config_map[name] = config_text(plugin_config(sharing, settings["mig_strategy"]))
        values["config"] = {"map": config_map, "default": DEFAULT_CONFIG_NAME}
    return values


def plan_cluster(server, settings, nodes, runtimeclasses_available, dra_nodes=False):
    """The device-plugin objects of one cluster in host mode.

    server: the reading of the server that writes (a _node_facts.NodeFacts: its distribution, profile, paths).
    settings: chart_version, chart_repo, chart_archive (a .tgz file name served from the server's static/charts),
    namespace, runtime_class, device_list_strategy (auto or a chart value), device_discovery_strategy, mig_strategy,
    gfd (bool), image_registry (a mirror registry), sharing ({strategy, replicas, rename_by_default,
    fail_requests_greater_than_one} or None), configs ({name: sharing} for the per-node config label).
    nodes: PluginNode (or dicts with its keys) of the cluster's host-mode GPU nodes.
    runtimeclasses_available: the cluster's RuntimeClasses, as names or {name, handler}.
    dra_nodes: the cluster also has nodes with gpu_node_allocation=dra (the plugin's affinity keeps off them).

    Returns {"wanted": bool (some GPU node), "objects": [the HelmChart], "values": dict, "chart_version",
    "runtime_class", "device_list_strategy", "device_list_reason", "node_labels": {host: {label: value}},
    "configs": [config.map names], "chart_archive_path": str|None}.
    """
    profile = _cluster_profile(server)
    checked = _check_settings(settings)
    checked_nodes = _check_nodes(nodes)
    chart = checked["chart"]
    result = {"wanted": bool(checked_nodes), "objects": [], "values": {}, "chart_version": chart["version"],
              "runtime_class": None, "device_list_strategy": None, "device_list_reason": "",
              "node_labels": node_labels(checked_nodes, checked["sharing"], checked["configs"]), "configs": [],
              "chart_archive_path": None}
    if not checked_nodes:
        return result
    runtime_class = choose_runtime_class(runtimeclasses_available, checked_nodes, checked["runtime_class"])
    strategy, reason = choose_device_list_strategy(checked_nodes, profile, checked["device_list_strategy"], chart)
    values = chart_values(checked, runtime_class, strategy, checked_nodes, dra_nodes)
    chart_object, result["chart_archive_path"] = helmchart.helmchart(
        HELMCHART_NAME, {"name": release_rules.DEVICE_PLUGIN_CHART["name"], "repo": checked["chart_repo"],
                         "version": chart["version"], "archive": checked["chart_archive"]},
        values, checked["namespace"], server.paths["static_charts_dir"])
    result.update({
        "objects": [chart_object],
        "values": values, "runtime_class": runtime_class, "device_list_strategy": strategy,
        "device_list_reason": reason, "configs": sorted(values.get("config", {}).get("map", {})),
    })
    return result


def render_manifest(plan):
    """The manifest text for the auto-deploy directory (a comment, then the HelmChart)."""
    return helmchart.render_plan(plan, "device-plugin objects (the cluster has no host-mode GPU node)",
                                 "Managed by %s; edits are overwritten. NVIDIA device plugin %s for k3s/rke2 (host mode)." % (
                                     k8s_labels.MANAGED_BY, plan["chart_version"]))


# --- the gpu_node role's variables -------------------------------------------------------------------

# the gpu_node role's device plugin variables (read without the gpu_node_ prefix) -> the settings of this module
ROLE_SETTINGS = (("device_plugin_chart_version", "chart_version"), ("device_plugin_chart_repo", "chart_repo"),
                 ("device_plugin_chart_archive", "chart_archive"), ("device_plugin_namespace", "namespace"),
                 ("device_plugin_runtime_class", "runtime_class"),
                 ("device_plugin_device_list_strategy", "device_list_strategy"),
                 ("device_plugin_device_discovery_strategy", "device_discovery_strategy"),
                 ("device_plugin_mig_strategy", "mig_strategy"), ("device_plugin_gfd", "gfd"),
                 ("device_plugin_image_registry", "image_registry"), ("gpu_sharing", "sharing"),
                 ("device_plugin_configs", "configs"))


# the role variables of the device plugin, as the host step (node labels) and the cluster step (HelmChart) read them
ROLE_VARS = ("gpu_node_device_plugin_state", "gpu_node_device_plugin_config") + tuple(
    "gpu_node_" + name for name, _ours in ROLE_SETTINGS)


def chart_archive_name(path):
    """A chart archive on the controller as the server serves it: by its file name (static/charts/<name>)."""
    return posixpath.basename(path or "")


def settings_of_role(settings):
    """The settings of this module from the role's variables (the chart archive by its file name, as it is served)."""
    converted = dict((ours, settings[name]) for name, ours in ROLE_SETTINGS if name in settings)
    converted["chart_archive"] = chart_archive_name(converted.get("chart_archive"))
    converted["sharing"] = converted.get("sharing") or None
    return converted
