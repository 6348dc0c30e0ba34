# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The labels every wing reads: the one on every object the collection writes, the handler labels the role gives a
node, and Kubernetes' rules for a label's key and value (pure, no I/O).

PRIVATE to the collection. Controller side.
"""

from __future__ import annotations

import re

from collections.abc import Mapping

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._values import type_name
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

# Label on every object this collection writes (import these rather than spelling them out).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "k3s_gpu.nvidia"

# The handlers this collection creates RuntimeClasses for: the NVIDIA runtimes it manages.
NVIDIA_HANDLERS = tuple(name for name, _binary in distro.NVIDIA_RUNTIMES)

# The gpu_node role labels each node with the handlers it serves (node-label in config.yaml.d, which
# k3s and rke2 apply at every start); a RuntimeClass can then select exactly those nodes.
HANDLER_LABEL_PREFIX = "k3s-gpu.nvidia/handler."
HANDLER_LABEL_VALUE = "true"

# The gpu_node role labels each GPU node with how its GPUs are allocated (gpu_node_allocation): NVIDIA's device plugin
# and NVIDIA's DRA driver select disjoint nodes by it, so that the two never hand out one GPU twice.
ALLOCATION_LABEL = "k3s-gpu.nvidia/gpu-allocation"
ALLOCATION_DEVICE_PLUGIN = "device_plugin"
ALLOCATION_DRA = "dra"
ALLOCATIONS = (ALLOCATION_DEVICE_PLUGIN, ALLOCATION_DRA)

# Kubernetes validation rules (k8s.io/apimachinery/pkg/util/validation): DNS-1123 label and
# subdomain, qualified name (label key), label value.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # also namespace names
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def is_dns_label(value):
    """Whether value is a DNS-1123 label: a namespace's name, a RuntimeClass's name and handler."""
    return isinstance(value, str) and len(value) <= 63 and bool(DNS1123_LABEL.match(value))


def label_key_problem(key):
    """Kubernetes IsQualifiedName: [prefix/]name, prefix a DNS-1123 subdomain (<= 253); None when valid."""
    parts = key.split("/")
    if len(parts) > 2:
        return "it has more than one '/'"
    prefix, name = (None, parts[0]) if len(parts) == 1 else parts
    if prefix is not None and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return "the prefix before '/' must be a lowercase DNS subdomain such as nvidia.com"
    if not name or len(name) > 63 or not _QUALIFIED_NAME_PART.match(name):
        return ("the name must be at most 63 characters of letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit")
    return None


def check_label_key(where, key):
    if not isinstance(key, str) or not key:
        raise K3sGpuError("%s: label key %r must be a non-empty string" % (where, key))
    problem = label_key_problem(key)
    if problem:
        raise K3sGpuError(
            "%s: label key %r is not valid: %s (form [prefix/]name, e.g. nvidia.com/gpu.present)" % (
                where, key, problem))
    return str(key)


def check_label_value(where, key, value):
    if not isinstance(value, str):
        raise K3sGpuError(
            "%s[%r] must be a string, got %s %r" % (where, key, type_name(value), value),
            fix="quote it in YAML (for example 'true' rather than true), since Kubernetes label values are strings")
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise K3sGpuError(
            "%s[%r]: label value %r is not valid: at most 63 characters of letters, digits, '-', '_' "
            "and '.', starting and ending with a letter or digit (or empty)" % (where, key, value))
    return str(value)


def check_node_selector(node_selector, what="node_selector"):
    """The nodeSelector as a plain dict (empty for none); K3sGpuError naming `what` (the caller's option) and the bad
    key."""
    if node_selector is None:
        return {}
    if not isinstance(node_selector, Mapping):
        raise K3sGpuError(
            "%s must be a dict of node label -> value, such as "
            "{'nvidia.com/gpu.present': 'true'}, got %s %r" % (what, type_name(node_selector), node_selector))
    result = {}
    for key, value in node_selector.items():
        key = check_label_key(what, key)
        result[key] = check_label_value(what, key, value)
    return result
