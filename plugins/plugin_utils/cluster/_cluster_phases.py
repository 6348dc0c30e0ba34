# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The playbooks' step once per cluster, phase by phase (the action k3s_gpu.nvidia.gpu_cluster only dispatches):
plan (the clusters of the run and the server that writes for each), read (a GPU node's reading), inspect (the
manifests on a cluster's server, read only) and apply (decide the cluster's objects and write or remove its
manifests in one module execution). The decisions are in _cluster_step; each phase takes the ClusterTask of its
Ansible task and fills the task's result; a refusal is raised as a K3sGpuError, which the action's failure boundary
(_spec_action.SpecAction) reports.

What the step reads of the gpu_node role (its variables, converted; what it registered on each host) comes through
the task's RoleView, which the action builds from the role's wing: the cluster wing does not import the role's.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as cluster_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading


class RoleView(Protocol):
    """The play's hosts as the cluster step reads them (role/_role_view.RoleView is the one there is)."""

    def host_vars(self, host: str) -> Mapping[str, Any]:
        """The host's variables (the inventory's, in that host's context)."""

    def registered(self, host: str) -> Mapping[str, Any]:
        """What tasks registered on the host in this run (gpu_node_result, the runtimeclasses playbook's reading)."""

    def read(self, values: Mapping[str, Any], names: Sequence[str]) -> Dict[str, Any]:
        """The role's variables `names` among `values`, converted by its argument spec (raises K3sGpuError)."""

    def release_to_read(self, distribution: str, release: str,
                        values: Mapping[str, Any]) -> Tuple[str, str, Optional[str]]:
        """(distribution, release, the inventory variable it came from) a node is read for, as the role reads it."""

    def host_facts(self, node: Any, what: str) -> NodeFacts:
        """The reading in a host state the role's host step registered (raises K3sGpuError)."""

    def message(self, outcome: Dict[str, Any]) -> str:
        """A module's failed result as the role's user reads it (in the role's variable names)."""


@dataclass(frozen=True)
class ClusterTask:
    """What a phase needs of its Ansible task: the task's variables, a runner of modules on the host the task runs
    on (execute_module(name, args) -> result) and the play's hosts as the role left them (RoleView)."""
    task_vars: Mapping[str, Any]
    execute_module: Callable[[str, Dict[str, Any]], Dict[str, Any]]
    role: RoleView


def run(task: ClusterTask, result: Dict[str, Any], args: Mapping[str, Any]) -> Dict[str, Any]:
    """The task's result for its phase (args: gpu_cluster's arguments, validated). Raises K3sGpuError."""
    phase = args["phase"]
    if phase == "plan":
        return plan(task, result, args)
    if phase == "read":
        return read(task, result)
    if phase == "inspect":
        return inspect(task, result, args["cluster"])
    return apply(task, result, args["cluster"], list(args["objects"]))


def _cluster_of(task, host):
    default = cluster_step.DEFAULT_CLUSTER
    return str(task.role.host_vars(host).get("k3s_gpu_cluster", default) or default)


def plan(task: ClusterTask, result: Dict[str, Any], args: Mapping[str, Any]) -> Dict[str, Any]:
    """The clusters of the run, each with its writer (and its leader, whose task writes), or its decision where the
    writer's reading shows it unchanged (skip_unchanged)."""
    task_vars = task.task_vars
    cluster_step.read_settings(task_vars)  # refused here, before any host is touched
    run_hosts = list(args["hosts"])
    # site rescues a host's failure (and ignores an unreachable node) so that the run goes on to its report: those
    # hosts stay in the play, in the group k3s_gpu_nvidia_failed
    failed = set((task_vars.get("groups") or {}).get(cluster_step.FAILED_GROUP) or [])
    active = set(task_vars.get("ansible_play_hosts") or run_hosts) - failed
    found = cluster_step.clusters(lambda host: _cluster_of(task, host), run_hosts, [h for h in run_hosts if h in active],
                                  list(args["pattern_hosts"]), list(args["servers"]), args["servers_pattern"] or "server")
    if args["skip_unchanged"]:
        for entry in found:
            _skip_if_unchanged(task, entry, list(args["objects"]))
    partial = " (partial run: nothing removed)"
    result.update(changed=False, clusters=found, hosts=cluster_step.assignments(found, run_hosts),
                  objects=list(args["objects"]),
                  msg=["cluster %s: %s" % (c["name"], c["result"]["msg"]) if (c.get("result") or {}).get("failed") else
                       "cluster %s: %s %s%s" % (c["name"], "unchanged on" if c.get("result") else "written from",
                                                c["writer"], "" if c["complete"] else partial) for c in found])
    return result


def _skip_if_unchanged(task, entry, objects):
    """No writer for a cluster whose manifests are already what this run would write, by the writer's reading in
    this run (the role's host step read its manifests' digests): the decision goes into the entry as `result`,
    the one the cluster step would have returned, and no module runs for the cluster. Anything this cannot tell
    (no reading, a partial run that keeps earlier RuntimeClasses, a follow-up, a refusal) is left to the writer."""
    server = _facts_in_run(task, entry["writer"], readings=True)
    manifests = server.reading.get("manifests") if server is not None else None
    if not entry["leader"] or not isinstance(manifests, dict):
        return
    try:
        decided, server, cluster = decide(task, entry, objects, server, read_earlier=False)
    except K3sGpuError:
        return  # not a failure of the plan: the writer's own task reports it
    if decided is None or decided["follow_up"]:
        return
    if not cluster_step.unchanged_on_server(decided["files"], manifests):
        return
    entry["result"] = dict(decided, changed=False, files=[], msg=_lines(cluster, server, decided))
    entry["leader"] = None


def read(task: ClusterTask, result: Dict[str, Any]) -> Dict[str, Any]:
    """This GPU node's reading (runtime_info), with the release the role would plan for (k3s_version, ...)."""
    task_vars = task.task_vars
    host = task_vars.get("inventory_hostname", "")
    node_vars = task.role.read(task_vars, cluster_step.SERVER_VARS + ("gpu_node_toolkit_dirs",))
    own = _facts_in_run(task, host)
    # the module's result: the reading as runtime_info returned it
    reading = own.reading if own is not None else _read_now(task, task_vars, node_vars)
    if reading.get("failed"):
        raise K3sGpuError("%s: %s" % (host, task.role.message(reading)))
    result.update(reading, changed=False)
    return result


def inspect(task: ClusterTask, result: Dict[str, Any], cluster: Mapping[str, Any]) -> Dict[str, Any]:
    """Without a cluster (the verify playbook): what the manifests on the cluster's server say, read only."""
    writer_vars = task.role.host_vars(cluster["writer"])
    server_vars = task.role.read(writer_vars, cluster_step.SERVER_VARS)
    server = _read_server(task, cluster, writer_vars, server_vars)
    texts = {}
    for name in cluster_step.MANIFESTS:
        path = "%s%s/%s" % (server_vars["root"].rstrip("/"), server.paths["manifests_dir"], name)
        read_back = task.execute_module("ansible.builtin.slurp", {"src": path})
        texts[name] = None if read_back.get("failed") else base64.b64decode(read_back["content"]).decode("utf-8", "replace")
    found = cluster_step.inspect_manifests(texts)
    lines, problems = cluster_step.inspection_lines(cluster, found)
    result.update(changed=False, manifests=found, msg=lines, not_checked=list(cluster_step.NOT_CHECKED_OFFLINE))
    if problems:
        result.update(failed=True, msg=lines + problems)
    return result


def apply(task: ClusterTask, result: Dict[str, Any], cluster: Mapping[str, Any], objects: List[str]) -> Dict[str, Any]:
    """Decide the cluster's objects and write (or remove) its manifests on the writer in one node_files execution."""
    decided, server, cluster = decide(task, cluster, objects)
    writer = cluster["writer"]
    manifests = server.reading.get("manifests")
    if decided["files"] and isinstance(manifests, dict) and cluster_step.unchanged_on_server(decided["files"], manifests):
        decided = dict(decided, files=[])  # the server's reading shows each manifest as it would be written
    if not decided["files"]:
        result.update(decided, changed=False, msg=_lines(cluster, server, decided))
        return result
    written = task.execute_module("k3s_gpu.nvidia.node_files", {"files": decided["files"]})
    # what happened to each file (created, updated, removed), or would happen in check mode
    files = [f for f in written.get("files") or [] if f.get("action") != "unchanged"]
    if written.get("failed"):
        # what the user acts on: the message and the files written before the failure, not the decision
        result.update(failed=True, changed=bool(written.get("changed")), cluster=cluster["name"], writer=writer,
                      complete=cluster["complete"], msg="cluster %s: writing on %s failed: %s" % (
                          cluster["name"], writer, written.get("msg")), files=files)
        return result
    result.update(decided)
    result["changed"] = bool(written.get("changed"))
    if "diff" in written:
        result["diff"] = written["diff"]
    result["files"] = files
    result["msg"] = _lines(cluster, server, decided)
    return result


def _lines(cluster, server, decided):
    return ["cluster %s (%s %s, written from %s): %s" % (
        cluster["name"], server.distribution, server.release, cluster["writer"], m) for m in decided["messages"]]


def decide(task: ClusterTask, cluster: Mapping[str, Any], objects: List[str], server: Optional[NodeFacts] = None,
           read_earlier: bool = True) -> Tuple[Optional[Dict[str, Any]], NodeFacts, Dict[str, Any]]:
    """(decided, server, cluster) of one cluster: its objects as cluster_step.decide returns them, with
    follow_up (what Ansible's own modules do after: the air-gapped chart archive, the API method's objects).
    server: the writer's reading when the caller has it; read_earlier=False: None instead of reading the
    RuntimeClasses a partial run keeps. Raises K3sGpuError."""
    writer = cluster["writer"]
    role = task.role
    writer_vars = role.host_vars(writer)
    settings = cluster_step.read_settings(writer_vars)
    server_vars = role.read(writer_vars, cluster_step.SERVER_VARS)
    operator = role.read(writer_vars, cluster_step.OPERATOR_VARS)
    plugin = role.read(writer_vars, cluster_step.DEVICE_PLUGIN_VARS)
    nodes, complete = cluster_step.node_reports(cluster["hosts"], role.registered,
                                                lambda host: role.read(role.host_vars(host), cluster_step.NODE_VARS))
    cluster = dict(cluster, complete=cluster["complete"] and complete)
    if server is None:
        server = _read_server(task, cluster, writer_vars, server_vars)
    earlier = None
    if not cluster["complete"] and cluster_step.RUNTIMECLASSES in objects:
        if not read_earlier:
            return None, server, cluster
        earlier = _earlier_handlers(task, server, server_vars["root"])
    try:
        decided = cluster_step.decide(cluster, server, nodes, settings, operator, objects, server_vars["root"], earlier,
                                      plugin_settings=plugin)
    except K3sGpuError as exc:
        raise exc.within("cluster %s (written from %s)" % (cluster["name"], writer)) from exc
    decided["follow_up"] = bool(decided["chart_archives"]) or (decided["runtimeclasses"] or {}).get("method") == "api"
    return decided, server, cluster


def _facts_in_run(task, host, readings=False):
    """The host's reading by the role's host step in this run (a NodeFacts), or None. readings: else the
    runtimeclasses playbook's reading of it (gpu_cluster's read phase), where it has one."""
    registered = task.role.registered(host)
    own = registered.get("gpu_node_result")
    if isinstance(own, dict) and own.get("node"):
        return task.role.host_facts(own["node"], "%s: gpu_node_result.node" % host)
    reading = registered.get(cluster_step.READING_VAR) if readings else None
    if isinstance(reading, dict) and reading and not (reading.get("failed") or reading.get("skipped")):
        return cluster_step.playbook_reading(host, reading)
    return None


def _read_server(task, cluster, writer_vars, server_vars):
    """The reading of the cluster's writer (a NodeFacts): the role's host step's in this run (when it is a GPU
    node), else one now. Raises K3sGpuError where reading it fails."""
    writer = cluster["writer"]
    own = _facts_in_run(task, writer)
    if own is not None:
        return own
    reading = _read_now(task, writer_vars, server_vars)
    if reading.get("failed"):
        raise K3sGpuError("cluster %s: reading the server %s failed: %s" % (
            cluster["name"], writer, task.role.message(reading)))
    return NodeFacts.from_reading(reading, "cluster %s: runtime_info's reading of the server %s" % (
        cluster["name"], writer), "")


def _read_now(task, host_vars, server_vars):
    """runtime_info's result for the host now (failed included), for the release the role would plan for."""
    distribution, release, _source = task.role.release_to_read(server_vars["distribution"], server_vars["release"],
                                                               host_vars)
    return node_reading.read_node(task.execute_module, dict(
        root=server_vars["root"], distribution=distribution, release=release or None,
        newer_release=server_vars["newer_release"], data_dir=server_vars["data_dir"] or None,
        toolkit_dirs=server_vars.get("toolkit_dirs") or []))


def _earlier_handlers(task, server, root):
    path = "%s%s/%s" % (root.rstrip("/"), server.paths["manifests_dir"], cluster_step.RUNTIMECLASS_MANIFEST)
    read_back = task.execute_module("ansible.builtin.slurp", {"src": path})
    if read_back.get("failed") or "content" not in read_back:
        return []
    return cluster_step.earlier_handlers(base64.b64decode(read_back["content"]).decode("utf-8", "replace"))
