# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The objects of one k3s/rke2 cluster (the GPU Operator HelmChart, the RuntimeClasses), decided on the controller
for the cluster action (plugins/action/gpu_cluster.py): which clusters a run touches and which server writes for
each, what each cluster's GPU nodes report, and the files the writer gets.

A run that does not see every GPU node of a cluster (--limit, a node that failed or was unreachable) only adds:
it keeps every RuntimeClass the manifest already has and never removes a manifest, so that a partial run cannot
take a RuntimeClass or the GPU Operator away from the nodes it did not look at.

PRIVATE to the collection."""

from __future__ import annotations

import hashlib

import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _labels as k8s_labels
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _dra_driver as dra_driver
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _rollout as rollout
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

GPU_OPERATOR = "gpu_operator"
RUNTIMECLASSES = "runtimeclasses"
DEVICE_PLUGIN = "device_plugin"
OBJECTS = (GPU_OPERATOR, RUNTIMECLASSES, DEVICE_PLUGIN)
RUNTIMECLASS_MANIFEST = distro.RUNTIMECLASS_MANIFEST
OPERATOR_MANIFEST = gpu_operator.MANIFEST_FILE
MANIFESTS = (OPERATOR_MANIFEST, RUNTIMECLASS_MANIFEST, device_plugin.MANIFEST_FILE, dra_driver.MANIFEST_FILE)
# what the verify playbook cannot tell without a cluster
NOT_CHECKED_OFFLINE = ("whether k3s/rke2 applied the manifests and helm-controller installed the charts",
                       "the nodes' allocatable nvidia.com/gpu", "a GPU pod (runtimeClassName and nvidia.com/gpu: 1)")
DEFAULT_CLUSTER = "default"
# the hosts of k3s_gpu.nvidia.site whose failure its host play rescued (and the unreachable ones): still in the plays
# after it, never a cluster's leader or writer
FAILED_GROUP = "k3s_gpu_nvidia_failed"
# the keys k3s_gpu.nvidia.runtimeclasses reads from its first play's reading of a node (runtime_info)
READING_VAR = "runtimeclasses__info"

# the playbooks' cluster variables, converted as the role's are (-e and INI values arrive as text)
SETTINGS_SPEC = {
    "runtimeclasses_state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "runtimeclasses_method": {"type": "str", "choices": ["manifest", "api"], "default": "manifest"},
    "runtimeclasses_kubeconfig": {"type": "str", "default": ""},
    "runtimeclasses_node_selector": {"type": "dict", "default": {}},
    "runtimeclasses_overhead": {"type": "dict", "default": {}},
    "runtimeclasses_select_nodes": {"type": "bool", "default": False},
}
# the role's variables that shape a cluster's objects, read from the writer (the same values on every host of a cluster)
OPERATOR_VARS = ("gpu_node_operator_state", "gpu_node_operator_chart_version", "gpu_node_operator_chart_repo",
                 "gpu_node_operator_chart_archive", "gpu_node_operator_namespace", "gpu_node_operator_cdi",
                 "gpu_node_operator_driver", "gpu_node_operator_toolkit", "gpu_node_operator_values",
                 "gpu_node_operator_helmchart_spec")
# the GPU allocation objects (DEVICE_PLUGIN): NVIDIA's device plugin and, for gpu_node_allocation=dra, its DRA driver
DEVICE_PLUGIN_VARS = device_plugin.ROLE_VARS + dra_driver.ROLE_VARS
SERVER_VARS = ("gpu_node_root", "gpu_node_distribution", "gpu_node_release", "gpu_node_newer_release", "gpu_node_data_dir")
NODE_VARS = ("gpu_node_mode", "gpu_node_driver_install", "gpu_node_allocation")


def read_settings(values):
    """The runtimeclasses_* variables (a mapping of what is set), converted; raises K3sGpuError."""
    given = dict((name, values[name]) for name in SETTINGS_SPEC if name in values)
    validated = ArgumentSpecValidator(SETTINGS_SPEC).validate(given)
    if validated.error_messages:
        raise K3sGpuError("; ".join(validated.error_messages))
    settings = validated.validated_parameters
    if settings["runtimeclasses_method"] == "api" and not settings["runtimeclasses_kubeconfig"]:
        raise K3sGpuError(
            "runtimeclasses_method is api but runtimeclasses_kubeconfig is not set",
            fix="set it to the kubeconfig of the cluster, or use runtimeclasses_method=manifest",
            variable="runtimeclasses_kubeconfig")
    # the shape of the RuntimeClass fields, before any host is touched
    k8s_labels.check_node_selector(settings["runtimeclasses_node_selector"] or None)
    runtimeclasses.check_overhead(settings["runtimeclasses_overhead"] or None)
    return settings


def clusters(cluster_of, run_hosts, active_hosts, pattern_hosts, servers, servers_pattern):
    """The clusters a run touches: [{name, writer, hosts, complete, leader}] in the order their first host appears.
    The leader is the cluster's first host still in the play: its worker writes the cluster's objects (delegated to
    the writer), so that the clusters are written side by side; a cluster whose hosts all failed has none.

    cluster_of(host): the host's k3s_gpu_cluster. run_hosts: the GPU hosts of this run (the play's, within
    --limit); active_hosts: those of them still in the play (not failed, not unreachable); pattern_hosts: every
    host of k3s_gpu_nodes in the inventory (--limit aside); servers: every host of k3s_gpu_servers (inventory
    order, --limit aside). The writer is the cluster's first server that has not failed in this run."""
    if not servers:
        raise K3sGpuError(
            "k3s_gpu_servers (now %s) matches no host of the inventory" % servers_pattern,
            fix="set it to the group or pattern of your k3s/rke2 servers (k3s-ansible: server, rke2-ansible: "
                "rke2_servers)",
            variable="k3s_gpu_servers")
    in_run = set(run_hosts)
    failed = in_run - set(active_hosts)
    found = {}
    order = []
    for host in run_hosts:
        name = cluster_of(host)
        if name not in found:
            found[name] = {"name": name, "hosts": [], "writer": None, "complete": True, "leader": None}
            order.append(name)
        found[name]["hosts"].append(host)
        if found[name]["leader"] is None and host not in failed:
            found[name]["leader"] = host
    for host in pattern_hosts:
        entry = found.get(cluster_of(host))
        if entry is not None and (host not in in_run or host in failed):
            entry["complete"] = False  # --limit left out a host of this cluster, or it failed earlier in the run
    for name in order:
        entry = found[name]
        candidates = [s for s in servers if cluster_of(s) == name]
        usable = [s for s in candidates if s not in failed]
        if not candidates:
            raise K3sGpuError(
                "cluster %s (hosts %s) has no server in k3s_gpu_servers (%s)" % (name, ", ".join(entry["hosts"]),
                                                                                 servers_pattern),
                fix="add its servers to that group, or set k3s_gpu_cluster on them to %s" % (name,))
        if not usable:
            # its servers failed or were unreachable in this run: this cluster's objects wait for the next run, the
            # other clusters' are written, and the cluster is a failed row of the summary
            entry["leader"] = None
            entry["result"] = {"failed": True, "cluster": name, "item": dict(entry),
                               "msg": "not written: every server of cluster %s in k3s_gpu_servers (%s) failed or was "
                                      "unreachable in this run; the next run writes its objects" % (name, ", ".join(candidates))}
            continue
        entry["writer"] = usable[0]
    return [found[name] for name in order]


def assignments(found, run_hosts):
    """Per host of the play: whether it writes, the cluster it writes for (its leader's entry) or None, and the host its task is
    delegated to (the writer; itself when it writes nothing)."""
    leads = dict((entry["leader"], entry) for entry in found if entry["leader"])
    return dict((host, {"writes": host in leads, "cluster": leads.get(host),
                        "delegate": leads[host]["writer"] if host in leads else host}) for host in run_hosts)


def node_reports(hosts, host_vars, read_node_vars):
    """What each host of a cluster tells: ([{host, handlers, gpu_operator, mode, driver_install}], complete).

    host_vars(host): what tasks registered on the host (gpu_node_result from the role in this run, or the runtimeclasses playbook's
    reading); read_node_vars(host): its gpu_node_mode and gpu_node_driver_install, converted (where its gpu_node_result
    does not have them in its settings). A host whose role step
    failed, was deferred to the rollout play or left out by site's stopped batches, or has no reading at all
    (unreachable), makes the picture incomplete; a host the role left alone (no
    GPU) is not a GPU node. A host with neither (the gpu_operator playbook on its own) counts with its mode only."""
    nodes = []
    complete = True
    for host in hosts:
        seen = host_vars(host)
        result = seen.get("gpu_node_result")
        reading = seen.get(READING_VAR)
        if isinstance(result, dict) and result:
            # deferred: k3s_gpu.nvidia.site changes it later, in its rollout play; its handlers are not known yet
            deferred = (seen.get(rollout.DISRUPTION_FACT) or {}).get("deferred")
            # work_due: site's first pass read it, and its batches stopped before the role changed it
            if result.get("failed") or result.get("unreachable") or deferred or result.get("work_due"):
                complete = False
                continue
            if result.get("status", "configured") != "configured":
                continue
            handlers = list(result.get("handlers") or [])
            present = bool(result.get("gpu_operator"))
            cdi = result.get("cdi") or {}
        elif isinstance(reading, dict) and reading and not reading.get("skipped"):
            if reading.get("failed"):
                complete = False
                continue
            names = [r["name"] for r in reading.get("release_runtimes") or []]
            names += list((reading.get("loaded_config") or {}).get("runtimes") or [])
            # the drop-ins the collection (or another) wrote: before k3s/rke2 has started once there is no config.toml
            # whose imports loaded_config follows, and containerd loads them at that first start
            names += list(node_reading.loaded_runtimes(playbook_reading(host, reading)))
            handlers = sorted(set(n for n in names if n.startswith("nvidia")))
            present = bool((reading.get("gpu_operator") or {}).get("present"))
            cdi = {}
        else:
            handlers, present, cdi = None, False, {}
        node = {"host": host, "handlers": handlers, "gpu_operator": present, "cdi_enabled": bool(cdi.get("enabled")),
                "cdi_spec": bool(cdi.get("spec")), "config": (result or {}).get("device_plugin_config") or "",
                "dra": (result or {}).get("dra") or None}
        # the host step resolved them in this run (gpu_node_result.settings): no need to read the host's variables again
        known = (result or {}).get("settings")
        if isinstance(known, dict) and all(key in known for key in ("mode", "driver_install", "allocation")):
            node.update(mode=known["mode"], driver_install=known["driver_install"], allocation=known["allocation"])
        else:
            node.update(read_node_vars(host))
        node.setdefault("allocation", k8s_labels.ALLOCATION_DEVICE_PLUGIN)
        nodes.append(node)
    return nodes, complete


def playbook_reading(host, reading):
    """The runtimeclasses playbook's reading of a host (its READING_VAR, gpu_cluster's read phase) as a NodeFacts."""
    return NodeFacts.from_reading(reading, "%s: %s" % (host, READING_VAR), "the runtimeclasses playbook "
                                  "registers it from gpu_cluster's read phase: leave it as it is")


def earlier_handlers(manifest_text):
    """The handlers of the RuntimeClasses in a manifest this collection wrote earlier (kept by a partial run)."""
    handlers = set()
    try:
        documents = list(yaml.safe_load_all(manifest_text or ""))
    except yaml.YAMLError:
        return []
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == runtimeclasses.KIND and document.get("handler"):
            handlers.add(str(document["handler"]))
    return sorted(handlers)


def decide(cluster, server, nodes, settings, operator_settings, objects, root="/", earlier=None, plugin_settings=None):
    """The files the writer gets for one cluster and what to report.

    cluster: an entry of clusters(); server: the writer's reading (a _node_facts.NodeFacts); nodes: node_reports()[0];
    settings: read_settings(); operator_settings: the role's gpu_node_operator_* read by _role_vars (operator_*), converted;
    objects: which of OBJECTS this run writes; earlier: handlers of the RuntimeClass manifest on the server (read
    only when the run is partial); plugin_settings: the role's device plugin variables (without the gpu_node_ prefix).
    Raises K3sGpuError."""
    complete = cluster["complete"]
    paths = server.paths
    prefix = root.rstrip("/")
    result = {"cluster": cluster["name"], "writer": cluster["writer"], "complete": complete,
              "distribution": server.distribution, "release": server.release,
              "nodes": [n["host"] for n in nodes], "files": [], "messages": [], "chart_archives": [],
              "gpu_operator": None, "runtimeclasses": None, "device_plugin": None, "dra_driver": None}
    mode_nodes = [{"host": n["host"], "mode": n["mode"], "driver_install": n["driver_install"]} for n in nodes]
    operator_plan = gpu_operator.plan_cluster(server, _plan_settings(operator_settings), mode_nodes)
    if GPU_OPERATOR in objects:
        result["gpu_operator"] = _operator_files(result, operator_plan, operator_settings, paths, prefix, complete)
    owned = operator_plan["runtimeclasses"]
    reported = [dict((k, n[k]) for k in ("host", "handlers", "gpu_operator")) for n in nodes if n["handlers"] is not None]
    for node in reported:
        if next(n for n in nodes if n["host"] == node["host"])["mode"] == gpu_operator.MODE_OPERATOR:
            node["operator_runtimeclasses"] = owned
    if not complete and earlier:
        reported.append({"host": "(RuntimeClasses written by an earlier run)", "handlers": earlier})
    classes = runtimeclasses.plan_runtimeclasses(
        server, reported, node_selector=settings["runtimeclasses_node_selector"] or None,
        overhead=settings["runtimeclasses_overhead"] or None, select_by_handler_label=settings["runtimeclasses_select_nodes"])
    if RUNTIMECLASSES in objects:
        result["runtimeclasses"] = _runtimeclass_files(result, classes, settings, paths, prefix, complete)
    if DEVICE_PLUGIN in objects:
        # the RuntimeClasses the cluster has: the release's and ours (the operator's mode never gets the plugin)
        available = list(classes["shipped"])
        if settings["runtimeclasses_state"] == "present":
            available += [m["metadata"]["name"] for m in classes["manifests"]]
        result["device_plugin"] = _device_plugin_files(result, server, nodes, plugin_settings or {}, operator_plan["wanted"],
                                                       sorted(set(available)), paths, prefix, complete)
        result["dra_driver"] = _dra_driver_files(result, server, nodes, plugin_settings or {}, paths, prefix, complete)
    return result


def _plan_settings(operator_settings):
    """The role's gpu_node_operator_* variables (read without the gpu_node_ prefix) as _gpu_operator.plan_cluster takes them."""
    setting = dict((name[len("operator_"):], value) for name, value in operator_settings.items() if name.startswith("operator_"))
    return {"chart_version": setting.get("chart_version") or "", "chart_repo": setting.get("chart_repo") or "",
            "chart_archive": device_plugin.chart_archive_name(setting.get("chart_archive")), "namespace": setting.get("namespace"),
            "cdi": setting.get("cdi"), "driver": setting.get("driver"), "toolkit": setting.get("toolkit"),
            "values": setting.get("values") or {}, "helmchart_spec": setting.get("helmchart_spec") or {}}


def _chart_archive(result, source, plan, paths, prefix):
    """An air-gapped chart: the archive on the controller goes to the server's static/charts, where the HelmChart points."""
    if plan["chart_archive_path"]:
        result["chart_archives"].append({"src": source, "dest": prefix + plan["chart_archive_path"],
                                         "directory": prefix + paths["static_charts_dir"]})


def _operator_files(result, plan, operator_settings, paths, prefix, complete):
    path = "%s%s/%s" % (prefix, paths["manifests_dir"], OPERATOR_MANIFEST)
    wanted = operator_settings.get("operator_state", "present") == "present" and plan["wanted"]
    report = {"wanted": wanted, "chart_version": plan["chart_version"], "operator_mode": plan["operator_mode"],
              "operator_nodes": plan["operator_nodes"], "runtimeclasses_created": plan["runtimeclasses_created"],
              "runtimeclasses_deleted": plan["runtimeclasses_deleted"], "manifest": path}
    if wanted:
        result["files"].append({"path": path, "state": "file", "content": gpu_operator.render_manifest(plan),
                                "mode": "0600", "directory_mode": "0700"})
        result["messages"].append("GPU Operator %s (%s mode) for %s; its RuntimeClasses: creates %s, deletes %s" % (
            plan["chart_version"], plan["operator_mode"], ", ".join(plan["operator_nodes"]),
            ", ".join(plan["runtimeclasses_created"]) or "-", ", ".join(plan["runtimeclasses_deleted"]) or "-"))
        _chart_archive(result, operator_settings.get("operator_chart_archive"), plan, paths, prefix)
    elif complete:
        # k3s/rke2 do not delete the objects of a removed manifest: the README says how to uninstall the chart
        result["files"].append({"path": path, "state": "absent"})
        result["messages"].append("no GPU Operator from this collection (%s)" % (
            "gpu_node_operator_state=absent" if plan["wanted"] else "no GPU node of the cluster is in operator mode"))
    else:
        result["messages"].append("GPU Operator manifest left as it is: this run does not see every GPU node of the "
                                  "cluster (--limit, or a node failed), and only a full run removes it")
    return report


def _runtimeclass_files(result, plan, settings, paths, prefix, complete):
    path = "%s%s/%s" % (prefix, paths["manifests_dir"], RUNTIMECLASS_MANIFEST)
    names = [m["metadata"]["name"] for m in plan["manifests"]]
    wanted = settings["runtimeclasses_state"] == "present" and bool(plan["manifests"])
    report = {"manifests": plan["manifests"] if wanted else [], "written": names if wanted else [],
              "shipped": plan["shipped"], "skipped": plan["skipped"], "owners": plan["owners"],
              "method": settings["runtimeclasses_method"], "manifest": path}
    left = "; ".join("%s: %s" % (s["name"], s["reason"]) for s in plan["skipped"])
    if settings["runtimeclasses_method"] == "api":
        result["messages"].append("RuntimeClasses through the API: %s%s" % (
            ", ".join(report["written"]) or "none", "; left to their owner: " + left if left else ""))
        return report
    if wanted:
        result["files"].append({"path": path, "state": "file", "content": runtimeclasses.render_manifest_yaml(plan["manifests"]),
                                "mode": "0600", "directory_mode": "0700"})
        result["messages"].append("RuntimeClasses written: %s%s" % (", ".join(names), "; left to their owner: " + left if left else ""))
    elif complete:
        result["files"].append({"path": path, "state": "absent"})
        result["messages"].append("no RuntimeClass manifest (%s)%s" % (
            "runtimeclasses_state=absent" if settings["runtimeclasses_state"] == "absent"
            else "the release or the GPU Operator provides every class the nodes need", "; " + left if left else ""))
    else:
        result["messages"].append("RuntimeClass manifest left as it is: this run does not see every GPU node of the "
                                  "cluster (--limit, or a node failed), and only a full run removes it")
    return report


def _device_plugin_files(result, server, nodes, plugin_settings, operator_wanted, available, paths, prefix, complete):
    """Host mode: NVIDIA's device plugin HelmChart for the cluster's host-mode GPU nodes; removed where the cluster is
    in operator mode (the GPU Operator ships its own plugin: never two on a node), on state absent, or with no GPU node."""
    path = "%s%s/%s" % (prefix, paths["manifests_dir"], device_plugin.MANIFEST_FILE)
    state = plugin_settings.get("device_plugin_state", "present")
    gpu_nodes = [device_plugin.PluginNode(host=n["host"], cdi_enabled=n["cdi_enabled"], cdi_spec=n["cdi_spec"],
                                          handlers=tuple(n["handlers"]) if n["handlers"] is not None else None,
                                          config=n["config"])
                 for n in nodes if n["mode"] == gpu_operator.MODE_HOST and n["handlers"] is not None
                 and n.get("allocation") != k8s_labels.ALLOCATION_DRA]
    wanted = state == "present" and not operator_wanted and bool(gpu_nodes)
    report = {"wanted": wanted, "manifest": path}
    if wanted:
        dra_nodes = any(n.get("allocation") == k8s_labels.ALLOCATION_DRA for n in nodes)
        plan = device_plugin.plan_cluster(server, device_plugin.settings_of_role(plugin_settings), gpu_nodes, available,
                                          dra_nodes)
        sharing = (plan["values"].get("config") or {}).get("map") or {}
        report.update(chart_version=plan["chart_version"], runtime_class=plan["runtime_class"],
                      device_list_strategy=plan["device_list_strategy"], device_list_reason=plan["device_list_reason"],
                      configs=plan["configs"], sharing=device_plugin.settings_of_role(plugin_settings).get("sharing"))
        result["files"].append({"path": path, "state": "file", "content": device_plugin.render_manifest(plan),
                                "mode": "0600", "directory_mode": "0700"})
        result["messages"].append("NVIDIA device plugin %s under RuntimeClass %s, device list %s (%s)%s" % (
            plan["chart_version"], plan["runtime_class"], plan["device_list_strategy"], plan["device_list_reason"],
            "; configs %s" % ", ".join(sorted(sharing)) if sharing else ""))
        _chart_archive(result, plugin_settings.get("device_plugin_chart_archive"), plan, paths, prefix)
    elif complete:
        result["files"].append({"path": path, "state": "absent"})
        result["messages"].append("no device plugin from this collection (%s)" % (
            "the GPU Operator brings its own" if operator_wanted else "gpu_node_device_plugin_state=absent"
            if state != "present" else "no host-mode GPU node with gpu_node_allocation=device_plugin"))
    else:
        result["messages"].append("device plugin manifest left as it is: this run does not see every GPU node of the "
                                  "cluster (--limit, or a node failed), and only a full run removes it")
    return report


def _dra_driver_files(result, server, nodes, plugin_settings, paths, prefix, complete):
    """NVIDIA's DRA driver HelmChart for the cluster's nodes with gpu_node_allocation=dra (host mode: the role refuses dra
    in operator mode); removed on state absent or where no node chooses DRA."""
    path = "%s%s/%s" % (prefix, paths["manifests_dir"], dra_driver.MANIFEST_FILE)
    state = plugin_settings.get("dra_driver_state", "present")
    dra_nodes = [dict(n.get("dra") or {}, host=n["host"]) for n in nodes
                 if n.get("allocation") == k8s_labels.ALLOCATION_DRA and n["mode"] == gpu_operator.MODE_HOST
                 and n["handlers"] is not None]
    wanted = state == "present" and bool(dra_nodes)
    report = {"wanted": wanted, "manifest": path}
    if wanted:
        plan = dra_driver.plan_cluster(server, dra_driver.settings_of_role(plugin_settings), dra_nodes)
        report.update(chart_version=plan["chart_version"], nodes=plan["nodes"],
                      driver_root=plan["values"]["nvidiaDriverRoot"],
                      kubelet_plugins_dir=plan["values"]["kubeletPlugin"]["kubeletPluginsDirectoryPath"])
        result["files"].append({"path": path, "state": "file", "content": dra_driver.render_manifest(plan),
                                "mode": "0600", "directory_mode": "0700"})
        result["messages"].append("NVIDIA DRA driver %s on %s (driver root %s, kubelet plugins in %s)" % (
            plan["chart_version"], ", ".join(plan["nodes"]), report["driver_root"], report["kubelet_plugins_dir"]))
        _chart_archive(result, plugin_settings.get("dra_driver_chart_archive"), plan, paths, prefix)
    elif complete:
        result["files"].append({"path": path, "state": "absent"})
        result["messages"].append("no DRA driver from this collection (%s)" % (
            "gpu_node_dra_driver_state=absent" if state != "present" else "no node with gpu_node_allocation=dra"))
    else:
        result["messages"].append("DRA driver manifest left as it is: this run does not see every GPU node of the "
                                  "cluster (--limit, or a node failed), and only a full run removes it")
    return report


def unchanged_on_server(files, manifests):
    """Whether node_files would leave every one of these manifest entries (decide()'s files) as it is, by the writer's
    reading of its manifests (runtime_info's `manifests`: state, mode and SHA-256 of each). False where the reading
    cannot tell (a manifest it did not read, a file it could not digest)."""
    for entry in files:
        seen = manifests.get(entry["path"].rsplit("/", 1)[-1])
        if not isinstance(seen, dict) or not entry["path"].endswith(str(seen.get("path"))):
            return False
        if entry["state"] == "absent":
            if seen["state"] != "absent":
                return False
        elif seen["state"] != "file" or seen.get("mode") != entry["mode"] or seen.get("sha256") != hashlib.sha256(
                entry["content"].encode("utf-8")).hexdigest():
            return False
    return True


def inspect_manifests(texts):
    """Without a cluster: what the manifests this collection wrote on a server say. texts: {file name: text or None}."""
    found = {}
    for name, text in sorted(texts.items()):
        if text is None:
            found[name] = None
            continue
        documents = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        kinds = sorted(set(d.get("kind", "?") for d in documents))
        entry = {"kinds": kinds, "names": sorted((d.get("metadata") or {}).get("name", "?") for d in documents)}
        for document in documents:
            if document.get("kind") == "HelmChart":
                values = yaml.safe_load((document.get("spec") or {}).get("valuesContent") or "") or {}
                entry["chart"] = (document.get("spec") or {}).get("chart")
                entry["version"] = (document.get("spec") or {}).get("version")
                entry["runtimeClassName"] = values.get("runtimeClassName")
        found[name] = entry
    return found


def inspection_lines(cluster, found):
    """(lines, problems) of the verify playbook without a cluster, from inspect_manifests of the writer."""
    where = "cluster %s (%s)" % (cluster["name"], cluster["writer"])
    lines = []
    for name in MANIFESTS:
        entry = found.get(name)
        if entry is None:
            lines.append("%s: %s not there" % (where, name))
        elif "chart" in entry:
            runs_under = ", runtimeClassName %s" % entry["runtimeClassName"] if entry.get("runtimeClassName") else ""
            version = entry.get("version") or "(archive)"
            lines.append("%s: %s - HelmChart %s %s%s" % (where, name, entry["chart"], version, runs_under))
        else:
            lines.append("%s: %s - %s" % (where, name, ", ".join(entry["names"])))
    problems = []
    if found.get(OPERATOR_MANIFEST) is None and found.get(device_plugin.MANIFEST_FILE) is None:
        problems.append("%s: neither NVIDIA's device plugin nor the GPU Operator is deployed by this collection, so no "
                        "node advertises nvidia.com/gpu and a pod asking for one stays Pending; run k3s_gpu.nvidia.site "
                        "(gpu_node_device_plugin_state: present in host mode)" % where)
    lines.append("%s: not checked without a cluster: %s" % (where, "; ".join(NOT_CHECKED_OFFLINE)))
    return lines, problems
