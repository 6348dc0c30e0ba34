# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's first decision about a host, from its first reading (a _host_state.NodeFacts): whether the role
touches it at all, and what it does there in host or operator mode (pure, no I/O). It refuses, with the fix, every
state where two owners would manage one thing: two toolkits on a node, the operator's driver and the role's, a
default runtime k3s cannot validate yet.

PRIVATE to the collection. Controller side.
"""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra_driver
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars


def _check_flags(flags):
    for name, value in flags:
        if not isinstance(value, bool):
            raise K3sGpuError("%s must be true or false, got %r" % (name, value))


def plan_node(facts, mode, operator_toolkit=True, operator_driver=False, toolkit_install=True, driver_install=False,
              default_runtime="", live=True, remove_operator_leftovers=False, host=""):
    """What the gpu_node role does on one node, from its reading (a _host_state.NodeFacts).

    mode: host | operator. operator_toolkit / operator_driver: whether the cluster's GPU Operator
    installs its toolkit / driver (its values toolkit.enabled / driver.enabled). toolkit_install /
    driver_install: the role's gpu_node_toolkit_install / gpu_node_driver_install. live: the role
    works on the real root (packages and services can be touched). remove_operator_leftovers: in
    host mode, the operator's toolkit dir is what an uninstalled operator left behind (its toolkit
    container reverts the containerd config on exit but leaves the binaries until the next install),
    so the role removes it instead of refusing the node.

    Returns {"mode", "install_toolkit", "remove_host_toolkit", "remove_operator_leftovers", "install_driver", "generate_cdi",
    "default_runtime", "pending": [str], "owners": {runtime: owner}, "operator_handlers": [str]}.
    Raises K3sGpuError when two owners would manage one thing.
    """
    who = host or "this node"
    if mode not in gpu_operator.MODES:
        raise K3sGpuError(
            "gpu_node_mode is %r" % (mode,),
            fix="use host (the role installs the toolkit) or operator (NVIDIA's GPU Operator does)",
            variable="gpu_node_mode")
    _check_flags((("operator_toolkit", operator_toolkit), ("operator_driver", operator_driver),
                  ("toolkit_install", toolkit_install), ("driver_install", driver_install), ("live", live),
                  ("remove_operator_leftovers", remove_operator_leftovers)))
    operator_layout = facts.gpu_operator
    host_toolkit = facts.reading["host_toolkit"]
    owners = dict((r["name"], r["owner"]) for r in facts.runtimes)
    result = {"mode": mode, "install_toolkit": False, "remove_host_toolkit": False, "remove_operator_leftovers": False,
              "install_driver": driver_install,
              "generate_cdi": True, "default_runtime": default_runtime or "", "pending": [], "owners": owners,
              "operator_handlers": list(operator_layout["runtimes"])}
    operator_files = "%s (%s)" % (operator_layout["toolkit_dir"], ", ".join(operator_layout["runtime_binaries"]))
    host_files = ", ".join(host_toolkit["runtime_binaries"])

    if mode == gpu_operator.MODE_HOST:
        return _plan_host_mode(result, operator_layout, host_toolkit, toolkit_install, remove_operator_leftovers,
                               who, operator_files, host_files)
    return _plan_operator_mode(facts, result, operator_layout, host_toolkit, operator_toolkit, operator_driver,
                               toolkit_install, driver_install, live, who, operator_files, host_files)


def _plan_host_mode(result, operator_layout, host_toolkit, toolkit_install, remove_operator_leftovers,
                    who, operator_files, host_files):
    """plan_node in host mode: the role installs the toolkit, unless the operator's is there."""
    if operator_layout["present"] and remove_operator_leftovers:
        result["remove_operator_leftovers"] = True
        result["operator_handlers"] = []
        result["install_toolkit"] = toolkit_install
        return result
    if operator_layout["present"] and host_toolkit["present"]:
        raise K3sGpuError(
            "%s has two NVIDIA toolkits: the GPU Operator's in %s and the host's (%s). k3s/rke2 use the operator's "
            "first and the two fight over the runtimes" % (who, operator_files, host_files),
            fix="keep one: gpu_node_mode=operator hands the node to the operator (the role removes the host toolkit "
                "packages), or uninstall the GPU Operator (its toolkit container reverts the containerd config but "
                "leaves %s behind: then run again with gpu_node_remove_operator_leftovers=true); nothing was "
                "changed" % (operator_layout["toolkit_dir"],))
    if operator_layout["present"] and toolkit_install:
        raise K3sGpuError(
            "%s has the GPU Operator's toolkit in %s, and gpu_node_mode=host with gpu_node_toolkit_install=true "
            "would install a second one on the host" % (who, operator_files),
            fix="set gpu_node_mode=operator if the operator manages this node, or gpu_node_toolkit_install=false to "
                "keep the operator's toolkit and only add the runtime blocks k3s/rke2 do not render. If the operator "
                "was uninstalled, these are its leftovers: gpu_node_remove_operator_leftovers=true removes them; "
                "nothing was changed")
    result["install_toolkit"] = toolkit_install
    return result


def _plan_operator_mode(facts, result, operator_layout, host_toolkit, operator_toolkit, operator_driver,
                        toolkit_install, driver_install, live, who, operator_files, host_files):
    """plan_node in operator mode: the GPU Operator installs the toolkit (and maybe the driver)."""
    if driver_install and operator_driver:
        raise K3sGpuError(
            "%s: gpu_node_driver_install=true and the GPU Operator's driver is on (gpu_node_operator_driver=true): two "
            "owners for the kernel module" % who,
            fix="set gpu_node_operator_driver=false (the operator uses the host driver) or "
                "gpu_node_driver_install=false; nothing was changed")
    if operator_toolkit:
        result["generate_cdi"] = False  # the operator's toolkit writes its CDI specs itself
        if host_toolkit["present"]:
            if not (toolkit_install and live):
                raise K3sGpuError(
                    "%s is in operator mode, where the GPU Operator installs the toolkit, but a host toolkit is there "
                    "(%s)" % (who, host_files),
                    fix="remove its packages (gpu_node_toolkit_install=true lets the role remove them on a real "
                        "root), or keep it and set gpu_node_operator_toolkit=false so the operator does not install a "
                        "second one; nothing was changed")
            result["remove_host_toolkit"] = True
        return _default_runtime_now(facts, result, who)
    if operator_layout["present"]:
        raise K3sGpuError(
            "%s: the GPU Operator's toolkit is off (gpu_node_operator_toolkit=false), yet %s holds its runtimes, and "
            "k3s/rke2 search that directory first, so they would win over the host toolkit" % (who, operator_files),
            fix="remove the directory (left by an earlier operator install), or set gpu_node_operator_toolkit=true; "
                "nothing was changed")
    result["install_toolkit"] = toolkit_install
    return result


def _default_runtime_now(facts, result, who):
    """With the operator's toolkit, keep the default runtime only once its runtime is on the node.

    k3s checks default-runtime against the runtimes it detects and does not start otherwise, and the
    operator lays its toolkit down some time after the HelmChart is applied.
    """
    name = result["default_runtime"]
    operator_owned = [r["name"] for r in facts.runtimes if r["owner"] == distro.OWNER_GPU_OPERATOR]
    if not name or name in operator_owned:
        return result
    result["default_runtime"] = ""
    result["pending"].append(
        "%s: default runtime %s waits for the GPU Operator's toolkit (not on the node yet); run the role again once "
        "%s holds it" % (who, name, facts.gpu_operator["toolkit_dir"]))
    return result


# --- how the node's GPUs are allocated (gpu_node_allocation) ------------------------------------

def check_allocation(facts, settings, who):
    """Refuse gpu_node_allocation=dra where NVIDIA's DRA driver cannot serve the node (K3sGpuError with the fix): the
    GPU Operator's device plugin would serve it too, its pods run on Docker, gpu_node_enable_cdi turns CDI off, its release
    is before v1.34.2 (the feature table's `dra`), or its plain containerd has no CDI."""
    if settings.get("allocation", k8s_labels.ALLOCATION_DEVICE_PLUGIN) != k8s_labels.ALLOCATION_DRA:
        return
    variable = "gpu_node_allocation"
    if settings["mode"] == gpu_operator.MODE_OPERATOR:
        raise K3sGpuError(
            "%s: gpu_node_allocation=dra with gpu_node_mode=operator: the GPU Operator deploys its own device plugin on "
            "its nodes, which would hand out the GPUs that NVIDIA's DRA driver also publishes (twice, NVIDIA/aicr #332)" % who,
            fix="keep gpu_node_allocation=device_plugin on the operator's nodes, or use gpu_node_mode=host on the DRA "
                "nodes; nothing was changed", variable=variable)
    if (facts.reading.get("runtime_in_use") or {}).get("runtime") == distro.RUNTIME_DOCKER:
        raise K3sGpuError(
            "%s: gpu_node_allocation=dra on a node whose pods run on Docker (k3s --docker): cri-dockerd does not pass the "
            "CDI devices of a claim to Docker (Mirantis/cri-dockerd #558), so a pod would get no GPU" % who,
            fix="run the node on k3s's containerd (remove `docker: true`), or keep gpu_node_allocation=device_plugin; "
                "nothing was changed", variable=variable)
    # every node: containerd applies a claim's devices only with CDI on (its enable_cdi), whatever the distribution
    if settings.get("enable_cdi") is False:
        raise K3sGpuError(
            "%s: gpu_node_allocation=dra with gpu_node_enable_cdi=false: containerd would start the claim's containers "
            "without their devices" % who,
            fix="remove gpu_node_enable_cdi (the role turns CDI on where the containerd line needs it) or set it to "
                "true; nothing was changed", variable="gpu_node_enable_cdi")
    if facts.distribution in (distro.K3S, distro.RKE2):
        refusal = dra_driver.release_refusal(distro.Release(facts.distribution, facts.release))
        if refusal:
            raise K3sGpuError("%s: this node runs %s" % (who, refusal[0]), fix=refusal[1] + "; nothing was changed",
                              variable=variable)
        return
    profile = facts.profile or {}
    if not profile.get("cdi_supported"):
        raise K3sGpuError(
            "%s: gpu_node_allocation=dra on containerd %s, which has no CDI: the kubelet hands a claim's devices to "
            "containerd as CDI devices (containerd 1.7.2 or newer reads them)" % (who, facts.release),
            fix="upgrade containerd to 1.7.2 or newer (2.x has CDI on by default), or keep "
                "gpu_node_allocation=device_plugin; nothing was changed", variable=variable)


def enable_cdi(facts, settings):
    """gpu_node_enable_cdi as containerd_runtimes gets it: turned on for a DRA node whose containerd has CDI off by
    default (plain containerd 1.7); otherwise the user's value (None leaves containerd's default)."""
    if (settings.get("allocation") == k8s_labels.ALLOCATION_DRA and settings.get("enable_cdi") is None
            and settings.get("state") != "absent" and not (facts.profile or {}).get("cdi_default_on")):
        return True
    return settings.get("enable_cdi")


# --- the first decision, in one call -------------------------------------------------------------

def first_decision(facts, settings, host=""):
    """Everything the gpu_node role decides from its first reading of a host (a _host_state.NodeFacts), in one call.

    settings: force, root, mode, operator_toolkit, operator_driver (auto | bool), toolkit_install,
    driver_install, driver_reboot, default_runtime, remove_operator_leftovers, local_connection.
    Returns {"selected", "live", "mode": plan_node() or {}, "messages": [str], "result": the
    gpu_node_result skeleton}. Raises K3sGpuError for a host the role must not touch
    (a release known to break, a reboot policy that could reboot the controller, two owners).
    """
    driver = facts.driver
    selected = bool(settings["force"]) or driver["gpu_count"] > 0 or len(driver["pci_gpus"]) > 0
    live = role_vars.live(settings["root"])
    who = host or "this host"
    result = {
        "status": "configured" if selected else "skipped",
        "reason": "" if selected else "no NVIDIA GPU on the PCI bus and no driver loaded",
        "distribution": facts.distribution, "release": facts.release, "runtimes_detected": facts.handlers,
        "gpu_operator": facts.gpu_operator["present"], "mode": settings["mode"],
        "operator_runtimes": list(facts.gpu_operator["runtimes"]), "pending": [], "handlers": [], "written": [],
        "rendered_by_release": [], "runtimes_skipped": [], "restarted": False, "verified": None, "reboot_required": False,
    }
    if not selected:
        message = ("%s: no NVIDIA GPU on the PCI bus and no NVIDIA driver loaded; nothing is changed on this host. Set "
                   "gpu_node_force=true to configure it anyway (image builds, GPUs added later)." % who)
        return {"selected": False, "live": live, "mode": {}, "messages": [message], "result": result}
    known_bad = facts.reading.get("known_bad_release")
    if known_bad:
        raise K3sGpuError("%s: %s %s: %s. Nothing was changed." % (who, facts.distribution, facts.release, known_bad))
    if settings["driver_install"] and settings["driver_reboot"] != "never" and settings["local_connection"]:
        raise K3sGpuError(
            "%s: gpu_node_driver_install is true with gpu_node_driver_reboot=%s, and this host is reached with the local "
            "connection: a new driver may need a reboot, and the role does not reboot the machine that runs Ansible" % (
                who, settings["driver_reboot"]),
            fix="set gpu_node_driver_reboot=never (you reboot when the role says so), or run the role against this host "
                "over ssh from another machine; nothing was changed")
    check_allocation(facts, settings, who)
    operator_driver = settings["operator_driver"]
    if operator_driver == "auto":
        operator_driver = not settings["driver_install"]
    mode = plan_node(facts, settings["mode"], operator_toolkit=settings["operator_toolkit"],
                     operator_driver=operator_driver, toolkit_install=settings["toolkit_install"],
                     driver_install=settings["driver_install"], default_runtime=settings["default_runtime"] or "",
                     live=live, remove_operator_leftovers=settings["remove_operator_leftovers"], host=host)
    result["pending"] = list(mode["pending"])
    return {"selected": True, "live": live, "mode": mode, "messages": list(mode["pending"]), "result": result}
