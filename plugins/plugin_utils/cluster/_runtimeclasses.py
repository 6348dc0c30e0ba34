# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which RuntimeClass objects a cluster needs for its NVIDIA runtime handlers (pure, no I/O).

PRIVATE to the collection. Controller side.

One `node.k8s.io/v1` RuntimeClass per NVIDIA handler that at least one node has, except the ones
the cluster's release ships itself (k3s runtimes.yaml manifest, rke2-runtimeclasses chart: which
release ships which names is `_distro`'s feature table, not a rule here) and the ones the GPU
Operator creates: two owners of one object would overwrite each other.

Rendering goes through `_manifest_yaml` (stdlib, byte-stable across controllers), not PyYAML: the
text lands in the server's auto-deploy directory and `copy` must not see a change for nothing.
"""

from __future__ import annotations

import re

from collections.abc import Mapping

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import is_list, type_name
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _manifest_yaml as manifest_yaml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._labels import (
    HANDLER_LABEL_PREFIX, HANDLER_LABEL_VALUE, MANAGED_BY, MANAGED_BY_LABEL, NVIDIA_HANDLERS, check_node_selector)
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

API_VERSION = "node.k8s.io/v1"
KIND = "RuntimeClass"
# Distributions whose servers ship (or not) RuntimeClasses; the cluster's release is one of these.
CLUSTER_DISTRIBUTIONS = (distro.K3S, distro.RKE2)

# The RuntimeClasses NVIDIA's GPU Operator manages on a cluster where it runs: by its mode it creates
# some and deletes the others on every reconcile, whoever made them (_release_rules.GPU_OPERATOR_RUNTIMECLASSES).
# A node reporting the operator layout (gpu_operator: true) in an unknown mode implies all of them.
OPERATOR_RUNTIMECLASSES = tuple(sorted(set(
    name for rule in release_rules.GPU_OPERATOR_RUNTIMECLASSES.values() for name in rule["created"] + rule["deleted"])))

NODE_KEYS = ("host", "handlers", "gpu_operator", "operator_runtimeclasses")
PLAN_KEYS = ("manifests", "shipped", "skipped", "handlers", "owners")

# resource.Quantity grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go), without the sign:
# <number> (digits, digits.digits, digits., .digits) then a binary SI suffix, a decimal SI suffix
# or a decimal exponent. Overhead must not be negative, so a leading '-' is refused on purpose.
_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][-+]?[0-9]+)?\Z")
# Resource names without a domain that a pod's limits (and so overhead.podFixed) accept
# (IsStandardContainerResourceName); names with a domain are extended resources.
_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_HUGEPAGES_PREFIX = "hugepages-"


# --- validation ----------------------------------------------------------------------------------

def refuse_unknown_keys(node: Mapping, keys: tuple, where: str) -> None:
    """Refuse a node entry (of this module's or the GPU Operator's plan) with keys it does not know, naming them."""
    unknown = sorted(str(key) for key in node if key not in keys)
    if unknown:
        raise K3sGpuError("%s has unknown key(s) %s" % (where, ", ".join(unknown)), fix="the keys are %s" % (", ".join(keys),))


def _check_dns_label(where, value, what):
    if not k8s_labels.is_dns_label(value):
        raise K3sGpuError(
            "%s: %r is not a valid %s: a RuntimeClass name and handler must be a lowercase DNS-1123 "
            "label (a-z, 0-9 and '-', starting and ending with a letter or digit, at most 63 "
            "characters), for example 'nvidia-cdi'" % (where, value, what))
    return str(value)


def _check_resource_name(name):
    if not isinstance(name, str) or not name:
        raise K3sGpuError("overhead: resource name %r must be a non-empty string such as cpu or memory" % (name,))
    if "/" in name:
        problem = k8s_labels.label_key_problem(name)
        if problem:
            raise K3sGpuError(
                "overhead: resource name %r is not a valid extended resource name: %s (form domain/name, "
                "e.g. example.com/foo)" % (name, problem))
        return str(name)
    if name in _STANDARD_RESOURCES:
        return str(name)
    if name.startswith(_HUGEPAGES_PREFIX) and _QUANTITY.match(name[len(_HUGEPAGES_PREFIX):]):
        return str(name)
    raise K3sGpuError(
        "overhead: resource name %r is not one Kubernetes accepts in overhead.podFixed" % (name,),
        fix="use cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified extended resource")


def _check_quantity(name, value):
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise K3sGpuError(
            "overhead[%r] must be a Kubernetes quantity string such as '250m' or '64Mi' (or an integer), got "
            "%s %r" % (name, type_name(value), value),
            fix="quote it")
    text = str(value)
    if text.startswith("-"):
        raise K3sGpuError("overhead[%r] = %r is negative" % (name, value), fix="pod overhead must be zero or more")
    if not _QUANTITY.match(text):
        raise K3sGpuError(
            "overhead[%r] = %r is not a Kubernetes quantity: write a number with an optional suffix, for example "
            "'250m' or '0.5' (cpu), '64Mi' or '1G' (memory)" % (name, value),
            fix="suffixes m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent such as 1e3")
    return text


# starts like check_node_selector (None or a dict), each with its own error message (docs/architecture-duplicates.md)
def check_overhead(overhead):
    """overhead.podFixed as a plain dict (empty for none); K3sGpuError naming the bad key."""
    if overhead is None:
        return {}
    if not isinstance(overhead, Mapping):
        raise K3sGpuError(
            "overhead must be a dict of resource -> quantity (overhead.podFixed), such as "
            "{'cpu': '250m', 'memory': '64Mi'}, got %s %r" % (type_name(overhead), overhead))
    if "podFixed" in overhead:
        raise K3sGpuError(
            "overhead is the podFixed map itself", fix="pass {'cpu': '250m', 'memory': '64Mi'}, not {'podFixed': {...}}")
    result = {}
    for name, value in overhead.items():
        name = _check_resource_name(name)
        result[name] = _check_quantity(name, value)
    if result and not any(name in ("cpu", "memory") for name in result) and any(
            name.startswith(_HUGEPAGES_PREFIX) for name in result):
        raise K3sGpuError(
            "overhead: hugepages need cpu or memory too (Kubernetes refuses hugepages alone in podFixed)",
            fix="add for example memory: '64Mi'")
    return result


def _check_distribution(distribution):
    if distribution not in CLUSTER_DISTRIBUTIONS:
        raise K3sGpuError(
            "cluster.distribution must be %s (the distribution of the server whose deploy controller or "
            "chart ships RuntimeClasses), got %r" % (" or ".join(CLUSTER_DISTRIBUTIONS), distribution))
    return str(distribution)


def _check_disabled(disabled, distribution):
    if not isinstance(disabled, bool):
        raise K3sGpuError(
            "cluster.runtimeclasses_disabled must be true or false (true when the servers run with "
            "disable: [%s]), got %r" % (distro.RUNTIMECLASS_SOURCES[distribution]["disable"], disabled))
    return disabled


def _check_cluster(cluster):
    """(distribution, profile, runtimeclasses disabled) of a cluster described by a dict (the runtimeclass_plan
    filter's input)."""
    if not isinstance(cluster, Mapping):
        raise K3sGpuError(
            "cluster must be a dict with distribution (k3s or rke2) and release (e.g. v1.33.10+k3s1) of "
            "the server that applies the manifests, got %s %r" % (type_name(cluster), cluster))
    distribution = _check_distribution(cluster.get("distribution"))
    release = cluster.get("release")
    if not isinstance(release, str) or not release.strip():
        raise K3sGpuError(
            "cluster.release must be the server's release string, such as v1.33.10+%s1, got %r" % (
                "k3s" if distribution == distro.K3S else "rke2r", release))
    disabled = _check_disabled(cluster.get("runtimeclasses_disabled", False), distribution)
    try:
        profile = distro.profile(distribution, release, release_rules.newer_release_of(cluster))
    except K3sGpuError as exc:
        raise exc.within("cluster.release") from exc
    return distribution, profile, disabled


def _server_release(server):
    """(distribution, profile, runtimeclasses disabled) of the server's reading (a _node_facts.NodeFacts): runtime_info
    made its profile with the release and the newer-release policy it read with."""
    distribution = _check_distribution(server.distribution)
    return distribution, server.profile, _check_disabled(server.reading.get("runtimeclasses_disabled", False), distribution)


def _check_names(where, value, what):
    if not is_list(value):
        raise K3sGpuError(
            "%s must be a list of %s names, such as ['nvidia', 'nvidia-cdi'], got %s %r" % (
                where, what, type_name(value), value))
    return [_check_dns_label("%s[%d]" % (where, index), name, what + " name") for index, name in enumerate(value)]


def _collect_nodes(nodes):
    """handler -> hosts, operator-owned RuntimeClass -> hosts (hosts sorted, duplicates dropped)."""
    if not is_list(nodes):
        raise K3sGpuError(
            "nodes must be a list of {host, handlers[, gpu_operator, operator_runtimeclasses]} dicts, got %s %r" % (
                type_name(nodes), nodes))
    handlers, operator = {}, {}
    for index, node in enumerate(nodes):
        where = "nodes[%d]" % index
        if not isinstance(node, Mapping):
            raise K3sGpuError(
                "%s must be a dict with host and handlers, got %s %r" % (where, type_name(node), node))
        refuse_unknown_keys(node, NODE_KEYS, where)
        host = node.get("host")
        if not isinstance(host, str) or not host.strip():
            raise K3sGpuError("%s.host must be the inventory hostname (a non-empty string), got %r" % (where, host))
        where = "nodes[%d] (%s)" % (index, host)
        if "handlers" not in node:
            raise K3sGpuError("%s.handlers is missing: list the runtime handlers the node has, [] for none" % where)
        for name in _check_names(where + ".handlers", node["handlers"], "runtime handler"):
            handlers.setdefault(name, set()).add(str(host))
        gpu_operator = node.get("gpu_operator", False)
        if not isinstance(gpu_operator, bool):
            raise K3sGpuError("%s.gpu_operator must be true or false, got %r" % (where, gpu_operator))
        owned = node.get("operator_runtimeclasses")
        if owned is None:
            owned = list(OPERATOR_RUNTIMECLASSES) if gpu_operator else []
        for name in _check_names(where + ".operator_runtimeclasses", owned, "RuntimeClass"):
            operator.setdefault(name, set()).add(str(host))
    return ({name: sorted(hosts) for name, hosts in handlers.items()},
            {name: sorted(hosts) for name, hosts in operator.items()})


# --- the plan ------------------------------------------------------------------------------------

def runtimeclass_manifest(handler, node_selector=None, pod_fixed=None):
    """One RuntimeClass object for a handler; inputs already checked."""
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": handler, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "handler": handler,
    }
    if pod_fixed:
        manifest["overhead"] = {"podFixed": dict(sorted(pod_fixed.items()))}
    if node_selector:
        manifest["scheduling"] = {"nodeSelector": dict(sorted(node_selector.items()))}
    return manifest


def handler_label(handler):
    """The node label key that says a node serves this handler."""
    return HANDLER_LABEL_PREFIX + handler


def plan_runtimeclasses(server, nodes, node_selector=None, overhead=None, select_by_handler_label=False):
    """Decide the RuntimeClasses of one cluster.

    server: the reading of the server that applies manifests (a _node_facts.NodeFacts: its distribution, profile and
    runtimeclasses_disabled). nodes: [{"host": str, "handlers": [str], "operator_runtimeclasses": [str]}].
    node_selector: {label: value} for scheduling.nodeSelector; overhead: {resource: quantity} for
    overhead.podFixed (None or {} for neither). select_by_handler_label: each RuntimeClass also
    selects the nodes labelled with its handler (handler_label(name): "true").

    Returns {"manifests": [RuntimeClass dict, sorted by name], "shipped": [names the release ships,
    sorted], "skipped": [{"name", "reason"}, sorted by name], "handlers": {handler: [hosts]} (every
    handler a node reported), "owners": {NVIDIA handler: who makes its RuntimeClass: the distribution
    (k3s | rke2), gpu-operator, or k3s_gpu.nvidia}}. Raises K3sGpuError (a ValueError) on bad input.
    """
    return _plan(_server_release, server, nodes, node_selector, overhead, select_by_handler_label)


def plan_runtimeclasses_described(cluster, nodes, node_selector=None, overhead=None, select_by_handler_label=False):
    """plan_runtimeclasses for a cluster described by a dict, as the runtimeclass_plan filter takes it:
    {"distribution": "k3s"|"rke2", "release": "v1.33.10+k3s1"[, "runtimeclasses_disabled": bool]} of the server that
    applies manifests (other keys are ignored, so a runtime_info result of that server fits)."""
    return _plan(_check_cluster, cluster, nodes, node_selector, overhead, select_by_handler_label)


def _plan(release_of, cluster, nodes, node_selector, overhead, select_by_handler_label):
    """plan_runtimeclasses, the cluster's (distribution, profile, disabled) read by release_of(cluster)."""
    if not isinstance(select_by_handler_label, bool):
        raise K3sGpuError("select_by_handler_label is %r" % (select_by_handler_label,), fix="use true or false")
    distribution, profile, disabled = release_of(cluster)
    handler_hosts, operator_hosts = _collect_nodes(nodes)
    selector = check_node_selector(node_selector)
    pod_fixed = check_overhead(overhead)

    source = distro.RUNTIMECLASS_SOURCES[distribution]
    shipped = [] if disabled else sorted(profile["runtimeclasses"])
    manifests, skipped, owners = [], [], {}
    for name in sorted(handler_hosts):
        if name not in NVIDIA_HANDLERS:
            continue
        reasons = []
        if name in shipped:
            reasons.append(
                "%s %s ships the RuntimeClass %s in its %s" % (distribution, profile["release"], name, source["mechanism"]))
        if name in operator_hosts:
            reasons.append(
                "the NVIDIA GPU Operator manages it (it creates or deletes the RuntimeClass %s; for %s)" % (
                    name, ", ".join(operator_hosts[name])))
        if reasons:
            skipped.append({"name": name, "reason": "; ".join(reasons)})
            # k3s re-applies its manifest at every start: the release wins the object over the operator
            owners[name] = distribution if name in shipped else distro.OWNER_GPU_OPERATOR
        else:
            owners[name] = MANAGED_BY
            own_selector = dict(selector or {})
            if select_by_handler_label:
                own_selector[handler_label(name)] = HANDLER_LABEL_VALUE
            manifests.append(runtimeclass_manifest(name, own_selector, pod_fixed))
    return {"manifests": manifests, "shipped": shipped, "skipped": skipped, "handlers": handler_hosts, "owners": owners}


# --- rendering -----------------------------------------------------------------------------------

# Field order in the text: Kubernetes' own order for the known fields, then alphabetical.
_KEY_ORDER = ("apiVersion", "kind", "metadata", "name", "labels", "annotations", "handler",
              "overhead", "podFixed", "scheduling", "nodeSelector", "tolerations")


def render_manifest_yaml(manifests):
    """Multi-document YAML for the manifests: a comment line, then '---' + one object each, sorted by name."""
    if not is_list(manifests):
        raise K3sGpuError(
            "manifests must be a list of RuntimeClass dicts (the plan's manifests), got %s" % type_name(manifests))
    checked = []
    for index, manifest in enumerate(manifests):
        if not isinstance(manifest, Mapping):
            raise K3sGpuError("manifests[%d] must be a dict, got %s %r" % (index, type_name(manifest), manifest))
        handler = _check_dns_label("manifests[%d].handler" % index, manifest.get("handler"), "RuntimeClass handler")
        metadata = manifest.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        _check_dns_label("manifests[%d].metadata.name" % index, name, "RuntimeClass name")
        checked.append((name, handler, manifest))
    checked.sort(key=lambda item: item[0])
    handlers = ", ".join(handler for _name, handler, _manifest in checked) or "none"
    return manifest_yaml.render_documents(
        "Managed by %s; edits are overwritten. RuntimeClasses for the handlers: %s" % (MANAGED_BY, handlers),
        [manifest for _name, _handler, manifest in checked], _KEY_ORDER)
