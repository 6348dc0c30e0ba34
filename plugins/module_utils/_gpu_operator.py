# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Operator mode: NVIDIA's GPU Operator as a k3s/rke2 HelmChart, and the rules that keep it and the
host toolkit from fighting over one node (pure, no I/O).

PRIVATE to the collection. Stdlib only, Python 3.8+ syntax.

Two decisions live here:
- plan_node(): what the gpu_node role does on one node in host or operator mode, from its
  runtime_info facts. It refuses, with the fix, every state where two owners would manage one
  thing: two toolkits on a node, the operator's driver and the role's, a default runtime k3s
  cannot validate yet.
- plan_cluster(): the HelmChart (and Namespace) objects for one cluster, with values that fit
  k3s/rke2: k3s's containerd socket and nothing that points the operator at the config k3s
  regenerates or at its template; components the role manages on the host turned off; the user's
  extra values merged, except the keys this collection owns.
Which chart line creates which RuntimeClass, and which HelmChart fields each release's
helm-controller knows, is `_distro`'s feature table, not a rule here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import posixpath
import re

from collections.abc import Mapping

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _manifest_yaml as manifest_yaml

MODE_HOST = "host"
MODE_OPERATOR = "operator"
MODES = (MODE_HOST, MODE_OPERATOR)

# Label on every object this collection writes (the same as on its RuntimeClasses).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "k3s_gpu.nvidia"

HELMCHART_API_VERSION = "helm.cattle.io/v1"
HELMCHART_KIND = "HelmChart"
# HelmChart objects live in kube-system by k3s convention; the chart installs into target_namespace.
HELMCHART_NAMESPACE = "kube-system"
HELMCHART_NAME = "gpu-operator"
MANIFEST_FILE = "k3s-gpu-nvidia-gpu-operator.yaml"
# Where a k3s/rke2 server serves chart archives to helm-controller (air-gapped sites), below its data dir.
STATIC_CHARTS_URL = "https://%{KUBERNETES_API}%/static/charts/"

# k3s and rke2 both run containerd at this socket; the operator's toolkit signals containerd there.
K3S_CONTAINERD_SOCKET = "/run/k3s/containerd/containerd.sock"

# toolkit env names (nvidia-ctk-installer aliases, k3s-facts §8.3) this collection owns or refuses
_SOCKET_ENV = ("CONTAINERD_SOCKET", "RUNTIME_SOCKET")
_CONFIG_ENV = ("CONTAINERD_CONFIG", "RUNTIME_CONFIG", "RUNTIME_DROP_IN_CONFIG")
_SET_AS_DEFAULT_ENV = ("CONTAINERD_SET_AS_DEFAULT", "NVIDIA_RUNTIME_SET_AS_DEFAULT")

SETTING_KEYS = ("chart_version", "chart_repo", "chart_archive", "namespace", "cdi", "driver", "toolkit", "values",
                "helmchart_spec")
NODE_KEYS = ("host", "mode", "driver_install")

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_CHART_VERSION = re.compile(r"v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?\Z")
_CHART_ARCHIVE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.tgz\Z")


class GpuOperatorPlanError(ValueError):
    """Settings or a node state that operator mode cannot apply safely; the message says the fix."""


def _type_name(value):
    return type(value).__name__


# --- one node ------------------------------------------------------------------------------------

def plan_node(info, mode, operator_toolkit=True, operator_driver=False, toolkit_install=True, driver_install=False,
              default_runtime="", live=True, host=""):
    """What the gpu_node role does on one node, from its runtime_info result.

    mode: host | operator. operator_toolkit / operator_driver: whether the cluster's GPU Operator
    installs its toolkit / driver (its values toolkit.enabled / driver.enabled). toolkit_install /
    driver_install: the role's gpu_node_toolkit_install / gpu_node_driver_install. live: the role
    works on the real root (packages and services can be touched).

    Returns {"mode", "install_toolkit", "remove_host_toolkit", "install_driver", "generate_cdi",
    "default_runtime", "pending": [str], "owners": {runtime: owner}, "operator_handlers": [str]}.
    Raises GpuOperatorPlanError when two owners would manage one thing.
    """
    who = host or "this node"
    if mode not in MODES:
        raise GpuOperatorPlanError("gpu_node_mode is %r; use host (the role installs the toolkit) or operator (NVIDIA's "
                                   "GPU Operator does)" % (mode,))
    for name, value in (("operator_toolkit", operator_toolkit), ("operator_driver", operator_driver),
                        ("toolkit_install", toolkit_install), ("driver_install", driver_install), ("live", live)):
        if not isinstance(value, bool):
            raise GpuOperatorPlanError("%s must be true or false, got %r" % (name, value))
    operator_layout = info["gpu_operator"]
    host_toolkit = info["host_toolkit"]
    owners = dict((r["name"], r["owner"]) for r in info["runtimes"])
    result = {"mode": mode, "install_toolkit": False, "remove_host_toolkit": False, "install_driver": driver_install,
              "generate_cdi": True, "default_runtime": default_runtime or "", "pending": [], "owners": owners,
              "operator_handlers": list(operator_layout["runtimes"])}
    operator_files = "%s (%s)" % (operator_layout["toolkit_dir"], ", ".join(operator_layout["runtime_binaries"]))
    host_files = ", ".join(host_toolkit["runtime_binaries"])

    if mode == MODE_HOST:
        if operator_layout["present"] and host_toolkit["present"]:
            raise GpuOperatorPlanError(
                "%s has two NVIDIA toolkits: the GPU Operator's in %s and the host's (%s). k3s/rke2 use the operator's "
                "first and the two fight over the runtimes. Keep one: gpu_node_mode=operator hands the node to the "
                "operator (the role removes the host toolkit packages), or uninstall the GPU Operator (its toolkit "
                "container removes %s) and run again. Nothing was changed." % (
                    who, operator_files, host_files, operator_layout["toolkit_dir"]))
        if operator_layout["present"] and toolkit_install:
            raise GpuOperatorPlanError(
                "%s has the GPU Operator's toolkit in %s, and gpu_node_mode=host with gpu_node_toolkit_install=true "
                "would install a second one on the host. Set gpu_node_mode=operator if the operator manages this node, "
                "or gpu_node_toolkit_install=false to keep the operator's toolkit and only add the runtime blocks "
                "k3s/rke2 do not render. Nothing was changed." % (who, operator_files))
        result["install_toolkit"] = toolkit_install
        return result

    # operator mode
    if driver_install and operator_driver:
        raise GpuOperatorPlanError(
            "%s: gpu_node_driver_install=true and the GPU Operator's driver is on (gpu_node_operator_driver=true): two "
            "owners for the kernel module. Set gpu_node_operator_driver=false (the operator uses the host driver) or "
            "gpu_node_driver_install=false. Nothing was changed." % who)
    if operator_toolkit:
        result["generate_cdi"] = False  # the operator's toolkit writes its CDI specs itself
        if host_toolkit["present"]:
            if not (toolkit_install and live):
                raise GpuOperatorPlanError(
                    "%s is in operator mode, where the GPU Operator installs the toolkit, but a host toolkit is there "
                    "(%s). Remove its packages (gpu_node_toolkit_install=true lets the role remove them on a real "
                    "root), or keep it and set gpu_node_operator_toolkit=false so the operator does not install a "
                    "second one. Nothing was changed." % (who, host_files))
            result["remove_host_toolkit"] = True
        return _default_runtime_now(info, result, who)
    if operator_layout["present"]:
        raise GpuOperatorPlanError(
            "%s: the GPU Operator's toolkit is off (gpu_node_operator_toolkit=false), yet %s holds its runtimes; "
            "k3s/rke2 search that directory first, so they would win over the host toolkit. Remove the directory "
            "(left by an earlier operator install), or set gpu_node_operator_toolkit=true. Nothing was changed." % (
                who, operator_files))
    result["install_toolkit"] = toolkit_install
    return result


def _default_runtime_now(info, result, who):
    """With the operator's toolkit, keep the default runtime only once its runtime is on the node.

    k3s checks default-runtime against the runtimes it detects and does not start otherwise, and the
    operator lays its toolkit down some time after the HelmChart is applied.
    """
    name = result["default_runtime"]
    operator_owned = [r["name"] for r in info["runtimes"] if r["owner"] == distro.OWNER_GPU_OPERATOR]
    if not name or name in operator_owned:
        return result
    result["default_runtime"] = ""
    result["pending"].append(
        "%s: default runtime %s waits for the GPU Operator's toolkit (not on the node yet); run the role again once "
        "%s holds it" % (who, name, info["gpu_operator"]["toolkit_dir"]))
    return result
