# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The doctor playbook's rules (pure, controller side): the layers between a GPU and a pod, checked in order on one
node from what the gpu_node role reads and plans there (nothing is written), and the first broken one named with its
fix. The cluster's layers (RuntimeClass, device plugin, allocatable, the pod) come from the verify rules.

PRIVATE to the collection."""

from __future__ import annotations

import posixpath
import re
import time

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import clause
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _claims_cdi as claims_cdi
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _dra_layers as dra_layers
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading

NODE_LAYERS = ("gpu", "driver", "toolkit", "cdi", "containerd-config", "runtime-service")
# dra-conflict: a device plugin and NVIDIA's DRA driver both serve the node
CLUSTER_LAYERS = ("runtimeclass", "dra-conflict", "device-plugin", "allocatable", "pod")
# a node with gpu_node_allocation=dra instead of device-plugin and allocatable: NVIDIA's DRA driver serves it
DRA_LAYERS = ("dra-api", "dra-driver", "deviceclass", "claim")
LAYERS = NODE_LAYERS + CLUSTER_LAYERS + DRA_LAYERS

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
PERSISTENCED_UNIT = "nvidia-persistenced"


Broken = dra_layers.Broken  # a broken layer: its cause and fix (the DRA layers raise it too)


def _gpu_count(driver):
    return len(driver.get("pci_gpus") or []) or int(driver.get("gpu_count") or 0)


def is_gpu_node(facts, settings):
    """A GPU node: an NVIDIA GPU on the PCI bus, or something of a GPU node (the driver loaded, NVIDIA's runtimes)."""
    driver = facts.driver
    return bool(_gpu_count(driver) or driver.get("loaded") or facts.runtimes or settings.get("force"))


def check_gpu(facts, _node):
    driver = facts.driver
    count = _gpu_count(driver)
    if not count:
        had = "the NVIDIA driver loaded" if driver.get("loaded") else "NVIDIA's container runtimes"
        raise Broken("no NVIDIA GPU on the PCI bus (vendor 0x10de, class 0x0300/0x0302 under /sys/bus/pci/devices), yet the "
                     "node has %s" % had,
                     "a GPU that fell off the bus (Xid 79: dmesg | grep -i xid) comes back after a reboot; in a VM, check "
                     "the PCI passthrough; a node without a GPU does not belong in k3s_gpu_nodes")
    return "%d NVIDIA GPU(s) on the PCI bus" % count


def _expected_devices(driver):
    return ["/dev/nvidiactl"] + ["/dev/nvidia%d" % index for index in range(_gpu_count(driver))]


def check_driver(facts, node):
    driver = facts.driver
    operator_driver = node["mode"] == "operator" and facts.gpu_operator.get("driver_container")
    if not driver.get("loaded"):
        raise Broken(
            "the NVIDIA kernel module is not loaded (/proc/driver/nvidia/version is absent)",
            "the GPU Operator's driver pod loads it: look at it (kubectl -n %s get pods -o wide | grep driver) and its log"
            % node["operator_namespace"] if operator_driver else
            "load it (modprobe nvidia), or install it: gpu_node_driver_install: true with k3s_gpu.nvidia.site (a new driver "
            "needs the reboot gpu_node_driver_reboot allows)")
    if not driver.get("version"):
        raise Broken("the driver's version cannot be read from /proc/driver/nvidia/version",
                     "reload the module (modprobe -r nvidia && modprobe nvidia) or reboot the node")
    present = set(driver.get("devices") or [])
    missing = [d for d in _expected_devices(driver) if d not in present]
    if missing:
        raise Broken("device nodes missing: %s (the driver %s is loaded)" % (", ".join(missing), driver["version"]),
                     "nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules, or run nvidia-smi "
                     "once; nvidia-persistenced keeps them")
    unlinked = [d for d in _expected_devices(driver) if d not in set(driver.get("char_links") or [])]
    if unlinked:
        raise Broken("no /dev/char link for %s: at the next `systemctl daemon-reload` systemd takes these GPUs from running "
                     "containers (Failed to initialize NVML: Unknown Error; NVIDIA toolkit #1227)" % ", ".join(unlinked),
                     "k3s_gpu.nvidia.site makes them and installs the udev rule that makes them at every driver load "
                     "(gpu_node_dev_char_symlinks: true, the default); by hand: nvidia-ctk system "
                     "create-dev-char-symlinks --create-all")
    services = node.get("services") or {}
    if driver.get("nvswitches"):
        state = services.get(FABRIC_MANAGER_UNIT)
        if state is not None and state != "active":
            raise Broken("the node has %d NVSwitch(es) and %s is %s: its GPUs cannot talk to each other (CUDA reports "
                         "system not yet initialized)" % (driver["nvswitches"], FABRIC_MANAGER_UNIT, state),
                         "systemctl enable --now %s (its version must match the driver's, %s)" % (
                             FABRIC_MANAGER_UNIT, driver["version"]))
    state = services.get(PERSISTENCED_UNIT)
    if state not in (None, "active", "not-found"):
        raise Broken("%s is installed and %s: without it the driver unloads between GPU jobs and the device nodes may go"
                     % (PERSISTENCED_UNIT, state), "systemctl enable --now %s" % PERSISTENCED_UNIT)
    rule = (driver.get("dev_char_rule") or {}).get("state") == "file"
    return "driver %s, %d device node(s), /dev/char links (%s)" % (
        driver["version"], len(_expected_devices(driver)),
        "udev rule %s" % distro.DEV_CHAR_RULE if rule else "no udev rule: they go at the next reboot")


def _upstream(version):
    """1.20.0 of 1.20.0-1, 1:1.20.0-1 or 1.20.0~rc.1-1."""
    match = re.match(r"(?:\d+:)?(\d+\.\d+\.\d+)", str(version or ""))
    return match.group(1) if match else None


# the runtime whose binary (nvidia-container-runtime) the toolkit's own package ships; the others (.cdi, .legacy)
# come from nvidia-container-toolkit-operator-extensions, which the node's reading does not name
TOOLKIT_RUNTIME = "nvidia"


def _runtime_binary_gone(facts, node):
    """The toolkit's package is installed (dpkg, or its nvidia-ctk answers) but its runtime binary is gone: the first
    broken link, before containerd's config that still names the binary."""
    toolkit = facts.toolkit
    source = "dpkg lists it" if toolkit.get("version_source") == "dpkg" else "%s says so" % toolkit.get("nvidia_ctk")
    binary = (node_reading.loaded_runtimes(facts).get(TOOLKIT_RUNTIME) or (None, None))[0]
    still = "; containerd's nvidia runtime still names %s" % binary if binary else ""
    cause = ("NVIDIA's container toolkit %s is installed (%s), but its nvidia-container-runtime is not on the node "
             "(not in k3s/rke2's PATH%s): pods of the nvidia RuntimeClass fail to start" % (toolkit["version"], source, still))
    fix = ("reinstall the toolkit's packages (apt-get install --reinstall nvidia-container-toolkit-base "
           "nvidia-container-toolkit, or dnf reinstall the same), then restart %s so that containerd loads the "
           "runtime again" % (node.get("unit") or "k3s/rke2"))
    return Broken(cause, fix)


def check_toolkit(facts, node):
    operator = facts.gpu_operator
    if node["mode"] == "operator":
        if not operator.get("present"):
            raise Broken("the GPU Operator's toolkit is not on the node (%s has no nvidia-container-runtime)"
                         % operator.get("toolkit_dir", distro.GPU_OPERATOR_TOOLKIT_DIR),
                         "its toolkit DaemonSet puts it there: look at it (kubectl -n %s get pods -o wide | grep toolkit)"
                         % node["operator_namespace"])
        return "the GPU Operator's toolkit in %s" % operator.get("toolkit_dir")
    if operator.get("present"):
        raise Broken("a GPU Operator toolkit is in %s (left by an operator that was uninstalled, or a second owner): "
                     "k3s/rke2 find it before /usr/bin and run its binaries (NVIDIA gpu-operator #494)"
                     % operator.get("toolkit_dir"),
                     "gpu_node_remove_operator_leftovers: true with k3s_gpu.nvidia.site removes it (or gpu_node_mode: "
                     "operator where the operator is meant to stay)")
    host_runtimes = [r for r in facts.runtimes if r.get("owner") == distro.OWNER_HOST]
    installed = facts.toolkit.get("version")
    if installed and not any(r["name"] == TOOLKIT_RUNTIME for r in host_runtimes):
        raise _runtime_binary_gone(facts, node)
    if not host_runtimes:
        raise Broken("NVIDIA's container toolkit is not installed: no nvidia-container-runtime on the node",
                     "k3s_gpu.nvidia.site installs it (gpu_node_toolkit_install: true, the default; "
                     "gpu_node_toolkit_version pins it)")
    pinned = node.get("toolkit_version")
    if installed and pinned and node.get("toolkit_install") and _upstream(installed) != _upstream(pinned):
        raise Broken("NVIDIA's toolkit %s is installed, gpu_node_toolkit_version pins %s" % (installed, pinned),
                     "k3s_gpu.nvidia.site installs the pinned version (or set gpu_node_toolkit_version to the one you want)")
    return "toolkit %s (%s)" % (installed or "version not read", ", ".join(r["name"] for r in host_runtimes))


def cdi_in_use(node, handlers):
    return bool(node.get("enable_cdi") or node.get("device_list_strategy") == "cdi-cri"
                or any(name == "nvidia-cdi" for name in handlers))


def check_cdi(facts, node):
    handlers = node.get("handlers") or []
    if not cdi_in_use(node, handlers):
        return "not used (no nvidia-cdi handler, no cdi-cri)"
    specs = [s for s in facts.cdi.get("specs") or [] if s.get("kind") == "nvidia.com/gpu"]
    why = "the nvidia-cdi handler" if "nvidia-cdi" in handlers else "the cdi-cri device list strategy"
    if not specs:
        raise Broken("no NVIDIA CDI spec in %s, which %s needs" % (" or ".join(facts.cdi["spec_dirs"]), why),
                     "gpu_node_cdi_generate: true (the default) with k3s_gpu.nvidia.site generates gpu_node_cdi_spec_path; "
                     "or nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml")
    if not any(s.get("current") for s in specs):
        raise Broken("the CDI spec %s was made for another driver or GPU count: it does not name the driver %s's "
                     "libraries (libcuda.so.%s) or lists %s device(s) for %d GPU(s); pods get stale paths "
                     "(NVIDIA toolkit #1611)" % (
                         ", ".join(s["path"] for s in specs), facts.driver.get("version"), facts.driver.get("version"),
                         "/".join(str(len([d for d in s.get("devices") or [] if d.isdigit()])) for s in specs),
                         _gpu_count(facts.driver)),
                     "k3s_gpu.nvidia.site generates it again for the loaded driver (gpu_node_cdi_generate) and enables "
                     "the toolkit's nvidia-cdi-refresh.path where it ships it, which does it at every driver change "
                     "(gpu_node_cdi_refresh)")
    return "CDI spec %s%s" % (", ".join(s["path"] for s in specs if s.get("current")), _check_cdi_refresh(facts, node))


def _toolkit_line(version):
    match = re.match(r"(?:\d+:)?(\d+)\.(\d+)", str(version or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _check_cdi_refresh(facts, node):
    """Where the host toolkit ships nvidia-cdi-refresh (1.18+) and the role's spec is the one it writes: its path unit
    is there and enabled, else the next driver change leaves the spec stale. Returns the passed detail's tail."""
    toolkit = facts.toolkit
    refresh = toolkit.get("cdi_refresh") or {}
    line = _toolkit_line(toolkit.get("version"))
    if node.get("mode") != "host" or node.get("cdi_spec_path", release_rules.CDI_REFRESH_OUTPUT) != release_rules.CDI_REFRESH_OUTPUT:
        return ""
    if line is None or line < release_rules.CDI_REFRESH_SINCE_TOOLKIT:
        return "; no nvidia-cdi-refresh (toolkit %s): k3s_gpu.nvidia.site generates the spec again after a driver " \
               "change" % (toolkit.get("version") or "version not read")
    if not refresh.get("unit"):
        raise Broken("the toolkit %s ships nvidia-cdi-refresh, but %s is not on the node (no unit in /etc, /usr/lib or "
                     "/lib/systemd/system): the next driver change leaves the CDI spec stale" % (
                         toolkit["version"], distro.CDI_REFRESH_UNIT),
                     "reinstall the toolkit's packages (apt-get install --reinstall nvidia-container-toolkit-base, or dnf "
                     "reinstall), then run k3s_gpu.nvidia.site")
    if not refresh.get("enabled") and node.get("cdi_refresh", True):
        raise Broken("%s is not enabled: the next driver change leaves the CDI spec stale (NVIDIA toolkit #1611)"
                     % distro.CDI_REFRESH_UNIT,
                     "k3s_gpu.nvidia.site enables it (gpu_node_cdi_refresh: true, the default), or systemctl enable "
                     "--now %s" % distro.CDI_REFRESH_UNIT)
    return "; refreshed by %s" % distro.CDI_REFRESH_UNIT if refresh.get("enabled") else \
        "; %s not enabled (gpu_node_cdi_refresh: false)" % distro.CDI_REFRESH_UNIT


def _cri_setting(facts, key):
    """`key` of containerd's CRI table in the config.toml k3s/rke2 wrote (None: not set there)."""
    text = node_reading.config_text(facts, "generated_config")
    if not text:
        return None
    try:
        data = toml.loads(text)
    except ValueError:
        return None
    for schema in (3, 2):
        table = toml.value_at(data, distro.cri_table(schema))
        if isinstance(table, dict) and key in table:
            return table[key]
    return None


def _cdi_switch(facts):
    """enable_cdi in the config.toml k3s/rke2 wrote (None: not set there)."""
    switch = _cri_setting(facts, "enable_cdi")
    return None if switch is None else bool(switch)


def _check_dra_cdi(facts):
    """A DRA node: NVIDIA's DRA driver writes each claim's CDI spec into /var/run/cdi, which containerd must resolve:
    CDI on, and that dir among cdi_spec_dirs (containerd's default has it; a template that narrows the list is the
    finding)."""
    switch = _cdi_switch(facts)
    if not (switch if switch is not None else bool(facts.profile.get("cdi_default_on"))):
        raise Broken("enable_cdi is off in %s, but NVIDIA's DRA driver hands each claim's devices to containerd as CDI "
                     "devices: claim pods fail to start" % facts.paths["config"],
                     "leave gpu_node_enable_cdi on (k3s_gpu.nvidia.site turns CDI on where the release lacks it), and "
                     "take enable_cdi = false out of the node's config template")
    dirs = _cri_setting(facts, "cdi_spec_dirs")
    if isinstance(dirs, list) and not claims_cdi.scans_claim_dir(dirs):
        raise Broken("cdi_spec_dirs in %s is %s, without %s, where NVIDIA's DRA driver writes each claim's CDI spec: "
                     "containerd cannot resolve a claim's devices" % (facts.paths["config"], dirs, dra_layers.CLAIM_CDI_DIR),
                     "take cdi_spec_dirs out of the node's config template (containerd's default is /etc/cdi and "
                     "/var/run/cdi), or add %s to it" % dra_layers.CLAIM_CDI_DIR)
    return "; CDI on for NVIDIA's DRA driver (%s scanned)" % dra_layers.CLAIM_CDI_DIR


def check_containerd_config(facts, node):
    if node.get("refusal"):
        refusal = node["refusal"]  # the engine's refusal, {"cause", "fix"} (K3sGpuError.parts)
        raise Broken(refusal["cause"], refusal["fix"] or "fix what it names, then run k3s_gpu.nvidia.site")
    handlers = node.get("handlers") or []
    loaded = node_reading.loaded_runtimes(facts)
    if not node_reading.config_text(facts, "generated_config"):
        raise Broken("%s does not exist: k3s/rke2 has not started on this node since it was installed, or starts "
                     "without containerd" % facts.paths["config"],
                     "start it (systemctl start %s) and look at its log" % (node.get("unit") or "k3s"))
    missing_binary = [(name, binary) for name, (binary, _path) in sorted(loaded.items())
                      if binary and binary not in node.get("existing_binaries", ())]
    if missing_binary:
        name, binary = missing_binary[0]
        raise Broken("the %s runtime's BinaryName %s does not exist or is not executable on the node (%s): pods of "
                     "its RuntimeClass fail to start" % (name, binary, loaded[name][1]),
                     "install the toolkit that ships it (gpu_node_toolkit_install), or k3s_gpu.nvidia.site drops the "
                     "runtime when its binary is gone")
    if node.get("changes"):
        raise Broken("the runtime blocks on the node are not what k3s_gpu.nvidia.site writes for this release: %s"
                     % "; ".join("%s would be %s" % (c["path"], c["action"]) for c in node["changes"]),
                     "run k3s_gpu.nvidia.site (it writes them and restarts k3s/rke2)")
    absent = [name for name in handlers if name not in loaded]
    if absent:
        raise Broken("containerd's config lacks the handler(s) %s that the RuntimeClasses name" % ", ".join(absent),
                     "run k3s_gpu.nvidia.site (gpu_node_runtimes lists the handlers it writes)")
    if node.get("device_list_strategy") == "cdi-cri" or node.get("enable_cdi"):
        switch = _cdi_switch(facts)
        enabled = switch if switch is not None else bool(facts.profile.get("cdi_default_on"))
        if not enabled:
            raise Broken("enable_cdi is off in %s, but the device plugin hands out CDI device names (cdi-cri), which only "
                         "containerd with CDI on resolves: GPU pods fail to start" % facts.paths["config"],
                         "gpu_node_enable_cdi: true with k3s_gpu.nvidia.site (or device list strategy envvar: "
                         "gpu_node_device_plugin_device_list_strategy)")
    dra = _check_dra_cdi(facts) if node.get("allocation") == k8s_labels.ALLOCATION_DRA else ""
    return "handlers %s in what containerd loads%s" % (", ".join(sorted(loaded)) or "none", dra)


def _when(stamp):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp)) + " UTC"


def check_runtime_service(facts, node):
    unit = node.get("unit") or ""
    state = (node.get("services") or {}).get(unit) if unit else None
    if state not in (None, "active"):
        raise Broken("%s is %s" % (unit, state), "journalctl -u %s -n 50, then systemctl restart %s" % (unit, unit))
    generated = facts.files.get("generated_config") or {}
    written = generated.get("mtime")
    ours = [(f["path"], f["mtime"]) for key, f in sorted(facts.files.items())
            if key in ("dropin_v3", "dropin_v2", "dropin", "template_v3", "template_v2", "default_runtime_file")
            and f.get("state") == "file" and f.get("mtime")]
    later = [(path, stamp) for path, stamp in ours if written and stamp > written]
    if later:
        path, stamp = later[0]
        cause = "drift: %s changed at %s, after %s wrote %s at its last start (%s): containerd still runs the " \
                "config of before" % (path, _when(stamp), unit or "k3s/rke2", posixpath.basename(generated["path"]), _when(written))
        raise Broken(cause,
                     "run k3s_gpu.nvidia.site (it restarts %s after a change; gpu_node_restart) or systemctl restart %s"
                     % (unit or "k3s/rke2", unit or "k3s"))
    seen = " active" if state == "active" else " (state not read: sandbox root)"
    return "%s%s, config.toml written at its last start" % (unit or "service", seen)


NODE_CHECKS = (("gpu", check_gpu), ("driver", check_driver), ("toolkit", check_toolkit), ("cdi", check_cdi),
               ("containerd-config", check_containerd_config), ("runtime-service", check_runtime_service))


def unread(host, why):
    """The report of a node that could not be read: nothing of it was checked, so it fails at its first layer."""
    return {"host": host, "gpu_node": True, "passed": [], "handlers": [], "labels": [],
            "broken": {"layer": NODE_LAYERS[0], "cause": "the node could not be read, nothing was checked: %s"
                       % clause(why), "fix": "mend what the message names (reachability, gpu_node_* variables), "
                       "then run the doctor again"}}


def check_node(host, facts, node):
    """{host, gpu_node, passed: [{layer, detail}], broken: {layer, cause, fix} or None} for one node, layers in order,
    stopping at the first broken one. facts: the node's reading (a _node_facts.NodeFacts); node: what the action knows
    besides the reading (mode, handlers, changes, refusal, services, existing_binaries, settings)."""
    report = {"host": host, "gpu_node": True, "passed": [], "broken": None, "cluster_checked": False,
              "handlers": list(node.get("handlers") or []), "labels": list(node.get("labels") or []), "mode": node.get("mode"),
              "allocation": node.get("allocation") or k8s_labels.ALLOCATION_DEVICE_PLUGIN,
              "operator_namespace": node.get("operator_namespace")}
    if not is_gpu_node(facts, node):
        report["gpu_node"] = False
        return report
    for layer, check in NODE_CHECKS:
        try:
            detail = check(facts, node)
        except Broken as exc:
            report["broken"] = {"layer": layer, "cause": exc.cause, "fix": exc.fix}
            return report
        report["passed"].append({"layer": layer, "detail": detail})
    return report


GPU_RESOURCE = device_plugin.RESOURCE_NAME


def _gpu_requests(pod):
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        try:
            total += int(limits.get(GPU_RESOURCE, 0))
        except (TypeError, ValueError):
            continue
    return total


def _app(pod):
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/name") or labels.get("app") or ""


def _plugin_pods(pods, node_name):
    """NVIDIA's device plugin on the node: its chart's pods (app.kubernetes.io/name) or the GPU Operator's (app)."""
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node_name
            and "device-plugin" in _app(p) and "validator" not in _app(p)]


# The GPU Operator's pods on a node (their `app` label) and the layer each one owns
OPERATOR_COMPONENTS = (("nvidia-driver-daemonset", "driver"), ("nvidia-container-toolkit-daemonset", "toolkit"))
# The operator's validator: its init containers, in order, and the layer each one proves
OPERATOR_VALIDATOR = "nvidia-operator-validator"
OPERATOR_VALIDATIONS = (("driver-validation", "driver"), ("toolkit-validation", "toolkit"), ("cuda-validation", "pod"),
                        ("plugin-validation", "device-plugin"))
# the node layers the operator owns in operator mode: a node broken there is explained by its objects
OPERATOR_OWNED = ("driver", "toolkit", "cdi", "containerd-config")


def _state_text(state):
    for key in ("waiting", "terminated"):
        if key in (state or {}):
            entry = state[key] or {}
            text = entry.get("reason") or key
            if key == "terminated" and entry.get("exitCode") is not None:
                text += " (exit code %s)" % entry["exitCode"]
            return text
    return "running"


def operator_finding(report, node_name, cluster):
    """What the GPU Operator's own objects say is wrong for this node, in order: no ClusterPolicy, its driver or
    toolkit pod on the node not running, a validation of its validator not passed, the ClusterPolicy not ready.
    Returns (layer, cause, fix), None when all is well, or when the cluster's operator objects were not read."""
    policies = cluster.get("policies")
    if policies is None:
        return None
    namespace = report.get("operator_namespace") or "gpu-operator"
    if not policies:
        return ("toolkit", "no ClusterPolicy in the cluster: the GPU Operator is not deployed (or not yet) and nothing "
                           "installs its driver, toolkit and device plugin", "k3s_gpu.nvidia.gpu_operator deploys it "
                           "(gpu_node_operator_state: present), then kubectl -n %s get pods" % namespace)
    on_node = [p for p in cluster.get("pods") or [] if (p.get("spec") or {}).get("nodeName") == node_name]
    for component, layer in OPERATOR_COMPONENTS:
        for pod in [p for p in on_node if _app(p) == component and not _running(p)]:
            waiting = [_state_text(c.get("state")) for c in (pod.get("status") or {}).get("containerStatuses") or []]
            return (layer, "the GPU Operator's %s pod %s on the node is %s%s" % (
                component, pod["metadata"]["name"], (pod.get("status") or {}).get("phase", "Unknown"),
                " (%s)" % ", ".join(waiting) if waiting else ""),
                "kubectl -n %s logs %s --all-containers" % (pod["metadata"].get("namespace") or namespace, pod["metadata"]["name"]))
    for pod in [p for p in on_node if _app(p) == OPERATOR_VALIDATOR]:
        statuses = dict((c.get("name"), c.get("state") or {}) for c in (pod.get("status") or {}).get("initContainerStatuses") or [])
        for name, layer in OPERATOR_VALIDATIONS:
            state = statuses.get(name)
            if state is not None and (state.get("terminated") or {}).get("exitCode") != 0:
                return (layer, "the GPU Operator's validator %s on the node has not passed %s: %s" % (
                    pod["metadata"]["name"], name, _state_text(state)),
                    "kubectl -n %s logs %s -c %s" % (pod["metadata"].get("namespace") or namespace, pod["metadata"]["name"], name))
    for policy in policies:
        state = (policy.get("status") or {}).get("state")
        if state != "ready":
            return ("toolkit", "ClusterPolicy %s is %s" % (policy["metadata"]["name"], state or "without a state yet"),
                    "kubectl -n %s logs deploy/gpu-operator says which component it waits for; kubectl -n %s get pods "
                    "-o wide" % (namespace, namespace))
    return None


def check_operator(report, node_name, cluster):
    """Operator mode: the operator's objects explain a node layer it owns that broke, and are checked on a node whose
    layers passed. Returns True when the report is final (broken)."""
    finding = operator_finding(report, node_name, cluster)
    broken = report.get("broken")
    if broken:
        if finding and broken["layer"] in OPERATOR_OWNED:
            broken.update(cause="%s; the GPU Operator's objects say: %s" % (broken["cause"], finding[1]), fix=finding[2])
        return True
    if finding:
        report["broken"] = {"layer": finding[0], "cause": finding[1], "fix": finding[2]}
        return True
    if cluster.get("policies") is not None:
        for entry in report["passed"]:
            if entry["layer"] == "toolkit":
                entry["detail"] += "; the GPU Operator: ClusterPolicy %s ready, no validation failed on the node" % (
                    ", ".join(p["metadata"]["name"] for p in cluster["policies"]))
    return False


def check_runtimeclass(report, node, cluster):
    classes = cluster.get("classes") or []
    by_handler = {}
    for item in classes:
        by_handler.setdefault(str(item.get("handler")), []).append(item)
    missing = [h for h in report["handlers"] if h not in by_handler]
    if missing:
        raise Broken("no RuntimeClass has the handler(s) %s that this node's containerd serves" % ", ".join(missing),
                     "run k3s_gpu.nvidia.runtimeclasses (it applies the classes the release lacks); k3s and rke2 ship "
                     "nvidia and nvidia-experimental themselves")
    labels = (node.get("metadata") or {}).get("labels") or {}
    for handler in report["handlers"]:
        for item in by_handler[handler]:
            selector = ((item.get("scheduling") or {}).get("nodeSelector")) or {}
            lacking = ["%s=%s" % (k, v) for k, v in sorted(selector.items()) if labels.get(k) != v]
            if lacking:
                raise Broken("RuntimeClass %s selects nodes labelled %s, which this node is not: its pods never land here"
                             % (item["metadata"]["name"], ", ".join(lacking)),
                             "k3s_gpu.nvidia.site labels the node (gpu_node_handler_labels); k3s/rke2 apply node-label "
                             "at their next start")
    wanted = [entry.split("=", 1) for entry in report["labels"] if "=" in entry]
    lacking = ["%s=%s" % (k, v) for k, v in wanted if labels.get(k) != v]
    if lacking:
        selector = "DRA driver" if report.get("allocation") == k8s_labels.ALLOCATION_DRA else "device plugin"
        raise Broken("the node lacks the label(s) %s that the %s's HelmChart selects" % (", ".join(lacking), selector),
                     "k3s_gpu.nvidia.site writes them into config.yaml.d; k3s/rke2 apply them at their next start "
                     "(systemctl restart k3s-agent), or kubectl label node %s %s" % (
                         node["metadata"]["name"], " ".join(lacking)))
    return "RuntimeClasses for %s" % (", ".join(report["handlers"]) or "no handler")


def _running(pod):
    return (pod.get("status") or {}).get("phase") == "Running" and all(
        "running" in (c.get("state") or {}) for c in (pod.get("status") or {}).get("containerStatuses") or [{}])


def check_device_plugin(report, node, cluster):
    """A plugin serves the node: capacity with something allocatable, or its pod running there (whose devices may all
    be unhealthy: the allocatable layer). Capacity without allocatable and no plugin running is a plugin that stopped:
    kubelet keeps the capacity a few minutes after the plugin's socket goes."""
    status = node.get("status") or {}
    capacity = (status.get("capacity") or {}).get(GPU_RESOURCE)
    allocatable = (status.get("allocatable") or {}).get(GPU_RESOURCE)
    pods = _plugin_pods(cluster.get("pods") or [], node["metadata"]["name"])
    running = [p for p in pods if _running(p)]
    if capacity not in (None, "0", "") and (allocatable not in (None, "0", "") or running):
        return "nvidia.com/gpu capacity %s%s" % (capacity, " (%s)" % running[0]["metadata"]["name"] if running else "")
    if pods and not running:
        pod = pods[0]
        waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason") for c in (pod.get("status") or {}).get(
            "containerStatuses") or []]
        raise Broken("the device plugin's pod %s on the node is %s%s and serves no nvidia.com/gpu" % (
            pod["metadata"]["name"], (pod.get("status") or {}).get("phase", "Unknown"),
            " (%s)" % ", ".join(w for w in waiting if w) if any(waiting) else ""),
            "kubectl -n %s logs %s (its RuntimeClass, gpu_node_device_plugin_runtime_class, must run it with the "
            "driver's libraries)" % (pod["metadata"].get("namespace"), pod["metadata"]["name"]))
    if capacity in (None, ""):
        why = "no device plugin has registered nvidia.com/gpu with this node's kubelet"
    elif capacity == "0":
        why = "a device plugin registered nvidia.com/gpu once and is gone (capacity 0)"
    else:
        why = "capacity %s, allocatable 0 and no device plugin pod running: the plugin that registered stopped " \
              "(kubelet keeps the capacity a few minutes)" % capacity
    raise Broken(why, "host mode: k3s_gpu.nvidia.site deploys NVIDIA's device plugin (gpu_node_device_plugin_state: "
                      "present), whose DaemonSet places it by nvidia.com/gpu.present=true; operator mode: the GPU "
                      "Operator's; a plugin of your own: restart it on the node")


def check_allocatable(report, node, cluster):
    status = node.get("status") or {}
    allocatable = (status.get("allocatable") or {}).get(GPU_RESOURCE, "0")
    used = sum(_gpu_requests(p) for p in cluster.get("pods") or [] if (p.get("spec") or {}).get("nodeName")
               == node["metadata"]["name"])
    if allocatable in ("0", ""):
        raise Broken("allocatable nvidia.com/gpu is 0 (capacity %s) while the device plugin runs: it reports every "
                     "device unhealthy" % (status.get("capacity") or {}).get(GPU_RESOURCE, "0"),
                     "the device plugin's log says which device it marked unhealthy and why (XID errors): kubectl logs "
                     "of its pod on the node; a GPU with XID 79/48 needs the node rebooted")
    return "allocatable nvidia.com/gpu %s, %d in use" % (allocatable, used)


# --- DRA (gpu_node_allocation=dra): NVIDIA's DRA driver publishes the node's GPUs as ResourceSlices (the rules are
# in _dra_layers, shared with verify)
def _dra_check(check):
    return lambda _report, node, cluster: check(node, cluster)


check_dra_conflict = _dra_check(dra_layers.check_conflict)


CLUSTER_CHECKS = (("runtimeclass", check_runtimeclass), ("dra-conflict", check_dra_conflict),
                  ("device-plugin", check_device_plugin), ("allocatable", check_allocatable))


def check_dra_deviceclass(_report, node, cluster):
    """The DeviceClass a claim names; and whether a pod asking nvidia.com/gpu: 1 (the seed's) is served on the node
    (Kubernetes 1.36's extended-resource bridge) or stays Pending, and why."""
    detail = dra_layers.check_deviceclass(node, cluster)
    served, why = dra_layers.seed_pod_served(node, cluster)
    return "%s; a pod asking nvidia.com/gpu: 1 %s" % (detail, "is served through DRA" if served else "stays Pending: " + why)


DRA_CHECKS = (("runtimeclass", check_runtimeclass),) + tuple(
    (layer, check_dra_deviceclass if layer == "deviceclass" else _dra_check(check)) for layer, check in dra_layers.LAYERS)


def check_cluster(report, node_name, cluster):
    """The cluster's layers for a node whose node layers passed (operator mode: the operator's objects first, also
    for a node broken at a layer the operator owns); report is changed in place."""
    if not report.get("gpu_node"):
        return report
    if report.get("mode") == "operator" and check_operator(report, node_name, cluster):
        return report
    if report.get("broken"):
        return report
    report["cluster_checked"] = True
    node = next((n for n in cluster.get("nodes") or [] if n["metadata"]["name"] == node_name), None)
    if node is None:
        cause = "the node %s is not in the cluster: its kubelet has not registered" % node_name
        report["broken"] = {"layer": "runtime-service", "cause": cause,
                            "fix": "look at the agent's log (journalctl -u k3s-agent); if the node has another name "
                                   "there, set k3s_gpu_node_name for this host"}
        return report
    for layer, check in DRA_CHECKS if report.get("allocation") == k8s_labels.ALLOCATION_DRA else CLUSTER_CHECKS:
        try:
            detail = check(report, node, cluster)
        except Broken as exc:
            report["broken"] = {"layer": layer, "cause": exc.cause, "fix": exc.fix}
            return report
        report["passed"].append({"layer": layer, "detail": detail})
    return report


def pod_pairs(reports, node_names, cluster, wanted=(), claims=False):
    """The pod layer's pods (doctor_run_pod): [[node, RuntimeClass]], one per node whose other layers all passed and
    RuntimeClass whose handler the node serves (the class named as its handler first, as k3s names its own); only the
    classes in `wanted` when it names any."""
    classes = sorted(cluster.get("classes") or [],
                     key=lambda c: (c["metadata"]["name"] != str(c.get("handler")), c["metadata"]["name"]))
    pairs = []
    for report in reports:
        if report.get("broken") or not report.get("gpu_node") or not report.get("cluster_checked"):
            continue
        if (report.get("allocation") == k8s_labels.ALLOCATION_DRA) != claims:
            continue  # a DRA node's GPUs come through claims (claim_pairs), the others' through nvidia.com/gpu limits
        node = node_names.get(report["host"]) or report["host"]
        if claims:
            pairs.append([node, ""])  # a claim's devices come through CDI whatever the handler: none at all too
        for handler in report.get("handlers") or []:
            named = [c["metadata"]["name"] for c in classes if str(c.get("handler")) == handler]
            if named and (not wanted or named[0] in wanted):
                pairs.append([node, named[0]])
    return pairs


def claim_pairs(reports, node_names, cluster, wanted=()):
    """The claim layer's pods on the DRA nodes (gpu_node_allocation=dra) whose other layers passed: [[node, class]],
    one per RuntimeClass of a handler the node serves (of `wanted`, where it names any), and [node, ""] without a
    RuntimeClass."""
    return pod_pairs(reports, node_names, cluster, wanted, claims=True)


def check_pods(report, node_name, pods, events, logs, claims=()):
    """The pod layer of one node from its smoke pods (verify's reading of their status, events and logs), the claim
    layer of a DRA node from its claim pods, which must see exactly their claim's device (claims: the ResourceClaims
    read while they ran); report is changed in place. A pod that did not pass names the layer verify found, in its
    cause."""
    if report.get("broken") or not report.get("gpu_node") or not report.get("cluster_checked"):
        return report
    dra = report.get("allocation") == k8s_labels.ALLOCATION_DRA
    layer = "claim" if dra else "pod"
    found = [(pod, state) for pod, state in verify.settle(pods, events, logs) if verify.node_of(pod) == node_name]
    if not found:
        report["broken"] = {"layer": layer, "cause": "no smoke pod was found for the node",
                            "fix": "kubectl get pods -n the doctor's namespace (doctor_pod_namespace), then run the doctor again"}
        return report
    seen = []
    for pod, state in found:
        runtimeclass = pod["spec"].get("runtimeClassName") or "no RuntimeClass"
        entry, detail = state["broken"], ""
        if entry is None and not state["done"]:
            entry = verify.broken(runtimeclass, layer, "still %s when the wait ended" % (pod.get("status") or {}).get(
                "phase", "Unknown"), "raise k3s_gpu_verify_timeout_seconds, or look at the pod's events (kubectl describe pod)")
        if entry is None and dra_layers.is_claim_pod(pod):
            detail, entry = verify.claim_seen(pod, logs.get(pod["metadata"]["name"], []), claims)
        if entry is not None:
            asked = ("a claim of DeviceClass %s and %s" % (dra_layers.DEVICE_CLASS, "RuntimeClass " + runtimeclass
                                                           if pod["spec"].get("runtimeClassName") else "no RuntimeClass")
                     if dra_layers.is_claim_pod(pod) else "RuntimeClass %s and nvidia.com/gpu: 1" % runtimeclass)
            report["broken"] = {"layer": layer, "fix": entry["fix"],
                                "cause": "the pod with %s did not get its GPU (the %s layer, as the pod shows it): %s"
                                         % (asked, entry["layer"], entry["cause"])}
            return report
        seen.append("%s: %s" % (runtimeclass, " | ".join(filter(None, [detail, verify.gpu_line(
            logs.get(pod["metadata"]["name"], []))]))))
    report["passed"].append({"layer": layer, "detail": "; ".join(seen)})
    return report


def line(report):
    """`<host>: OK` or `<host>: BROKEN at <layer>: <cause>. Fix: <fix>`, and what was not checked."""
    host = report["host"]
    if not report.get("gpu_node"):
        return "%s: no GPU (no NVIDIA device on the PCI bus, no driver, no NVIDIA runtime): not a GPU node" % host
    broken = report.get("broken")
    text = "%s: BROKEN at %s: %s. Fix: %s" % (host, broken["layer"], broken["cause"], broken["fix"]) if broken \
        else "%s: OK" % host
    if not broken and not report.get("cluster_checked"):
        text += " (node layers; the cluster layers were not checked: %s)" % (report.get("cluster_why") or "no cluster")
    return text
