# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The playbooks' step once per cluster: `phase: plan` (run once, on the controller) checks the cluster settings and
lists the clusters of the run with the server that writes for each; `phase: apply` (delegated to that server) reads
it, decides the cluster's GPU Operator HelmChart and RuntimeClasses from what its GPU nodes reported, and writes or
removes the manifests in one module execution. The decisions are in plugin_utils/cluster/_cluster_step.py."""

from __future__ import annotations

import base64

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _cluster_step as cluster_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, ended
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_CLUSTER_SPEC
    REQUIRED_IF = specs.GPU_CLUSTER_REQUIRED_IF

    def run_validated(self, result, args, task_vars):
        self._hostvars = task_vars["hostvars"]
        self._host_vars = {}
        phase = args["phase"]
        try:
            if phase == "plan":
                return self._plan(result, args, task_vars)
            if phase == "read":
                return self._read(result, task_vars)
            if phase == "inspect":
                return self._inspect(result, args, task_vars)
            return self._apply(result, args, task_vars)
        except K3sGpuError as exc:
            result.update(failed=True, changed=False, msg=ended(str(exc)))
            return result
        finally:
            if phase != "plan":
                self._remove_tmp_path(self._connection._shell.tmpdir)

    def _vars(self, host):
        # each hostvars[host] computes the host's variables anew: once per host and task
        if host not in self._host_vars:
            self._host_vars[host] = self._hostvars[host] if host in self._hostvars else {}
        return self._host_vars[host]

    def _registered(self, host):
        """What tasks registered on the host in this run (gpu_node_result, the runtimeclasses playbook's reading)."""
        return role_vars.registered(self._hostvars, host)

    def _cluster_of(self, host):
        return str(self._vars(host).get("k3s_gpu_cluster", cluster_step.DEFAULT_CLUSTER) or cluster_step.DEFAULT_CLUSTER)

    def _plan(self, result, args, task_vars):
        cluster_step.read_settings(task_vars)  # refused here, before any host is touched
        run_hosts = list(args["hosts"])
        active = set(task_vars.get("ansible_play_hosts") or run_hosts)
        found = cluster_step.clusters(self._cluster_of, run_hosts, [h for h in run_hosts if h in active],
                                      list(args["pattern_hosts"]), list(args["servers"]), args["servers_pattern"] or "server")
        if args["skip_unchanged"]:
            for entry in found:
                self._skip_if_unchanged(entry, list(args["objects"]), task_vars)
        partial = " (partial run: nothing removed)"
        result.update(changed=False, clusters=found, hosts=cluster_step.assignments(found, run_hosts),
                      objects=list(args["objects"]),
                      msg=["cluster %s: %s %s%s" % (c["name"], "unchanged on" if c.get("result") else "written from",
                                                    c["writer"], "" if c["complete"] else partial) for c in found])
        return result

    def _skip_if_unchanged(self, entry, objects, task_vars):
        """No writer for a cluster whose manifests are already what this run would write, by the writer's reading in
        this run (the role's host step read its manifests' digests): the decision goes into the entry as `result`,
        the one the cluster step would have returned, and no module runs for the cluster. Anything this cannot tell
        (no reading, a partial run that keeps earlier RuntimeClasses, a follow-up, a refusal) is left to the writer."""
        server = self._facts_in_run(entry["writer"], readings=True)
        manifests = server.reading.get("manifests") if server is not None else None
        if not entry["leader"] or not isinstance(manifests, dict):
            return
        try:
            decided, server, cluster = self._decide(entry, objects, task_vars, server, read_earlier=False)
        except K3sGpuError:
            return  # the writer's task reports it
        if decided is None or decided["follow_up"]:
            return
        if not cluster_step.unchanged_on_server(decided["files"], manifests):
            return
        entry["result"] = dict(decided, changed=False, files=[], msg=self._lines(cluster, server, decided))
        entry["leader"] = None

    def _read(self, result, task_vars):
        """This GPU node's reading (runtime_info), with the release the role would plan for (k3s_version, ...)."""
        host = task_vars.get("inventory_hostname", "")
        node_vars = role_vars.read(task_vars, self._templar.template, cluster_step.SERVER_VARS + ("gpu_node_toolkit_dirs",))
        own = self._facts_in_run(host)
        # the module's result: the reading as runtime_info returned it
        reading = own.reading if own is not None else self._read_now(host, task_vars, node_vars, task_vars)
        if reading.get("failed"):
            raise K3sGpuError("%s: %s" % (host, host_step.role_message(reading)))
        result.update(reading, changed=False)
        return result

    def _inspect(self, result, args, task_vars):
        """Without a cluster (the verify playbook): what the manifests on the cluster's server say, read only."""
        cluster = args["cluster"]
        writer_vars = self._vars(cluster["writer"])
        server_vars = role_vars.read(writer_vars, self._templar.template, cluster_step.SERVER_VARS)
        server = self._read_server(cluster, writer_vars, server_vars, task_vars)
        texts = {}
        for name in cluster_step.MANIFESTS:
            path = "%s%s/%s" % (server_vars["root"].rstrip("/"), server.paths["manifests_dir"], name)
            read = self._execute_module(module_name="ansible.builtin.slurp", module_args={"src": path}, task_vars=task_vars)
            texts[name] = None if read.get("failed") else base64.b64decode(read["content"]).decode("utf-8", "replace")
        found = verify.inspect_manifests(texts)
        lines, problems = cluster_step.inspection_lines(cluster, found)
        result.update(changed=False, manifests=found, msg=lines, not_checked=list(cluster_step.NOT_CHECKED_OFFLINE))
        if problems:
            result.update(failed=True, msg=lines + problems)
        return result

    def _apply(self, result, args, task_vars):
        decided, server, cluster = self._decide(args["cluster"], list(args["objects"]), task_vars)
        writer = cluster["writer"]
        manifests = server.reading.get("manifests")
        if decided["files"] and isinstance(manifests, dict) and cluster_step.unchanged_on_server(decided["files"], manifests):
            decided = dict(decided, files=[])  # the server's reading shows each manifest as it would be written
        if decided["files"]:
            written = self._execute_module(module_name="k3s_gpu.nvidia.node_files",
                                           module_args={"files": decided["files"]}, task_vars=task_vars)
            if written.get("failed"):
                # what the user acts on: the message and the files written before the failure, not the decision
                result.update(failed=True, changed=bool(written.get("changed")), cluster=cluster["name"], writer=writer,
                              complete=cluster["complete"], msg="cluster %s: writing on %s failed: %s" % (
                                  cluster["name"], writer, written.get("msg")),
                              files=[f for f in written.get("files") or [] if f.get("action") != "unchanged"])
                return result
            result.update(decided)
            result["changed"] = bool(written.get("changed"))
            if "diff" in written:
                result["diff"] = written["diff"]
            # what happened to each file (created, updated, removed), or would happen in check mode
            result["files"] = [f for f in written.get("files") or [] if f.get("action") != "unchanged"]
        else:
            result.update(decided, changed=False)
        result["msg"] = self._lines(cluster, server, decided)
        return result

    @staticmethod
    def _lines(cluster, server, decided):
        return ["cluster %s (%s %s, written from %s): %s" % (
            cluster["name"], server.distribution, server.release, cluster["writer"], m) for m in decided["messages"]]

    def _decide(self, cluster, objects, task_vars, server=None, read_earlier=True):
        """(decided, server, cluster) of one cluster: its objects as cluster_step.decide returns them, with
        follow_up (what Ansible's own modules do after: the air-gapped chart archive, the API method's objects).
        server: the writer's reading (a NodeFacts) when the caller has it; read_earlier=False: None instead of reading the
        RuntimeClasses a partial run keeps. Raises K3sGpuError."""
        writer = cluster["writer"]
        writer_vars = self._vars(writer)
        template = self._templar.template
        settings = cluster_step.read_settings(writer_vars)
        server_vars = role_vars.read(writer_vars, template, cluster_step.SERVER_VARS)
        operator = role_vars.read(writer_vars, template, cluster_step.OPERATOR_VARS)
        plugin = role_vars.read(writer_vars, template, cluster_step.DEVICE_PLUGIN_VARS)

        def node_vars(host):
            return role_vars.read(self._vars(host), template, cluster_step.NODE_VARS)

        nodes, complete = cluster_step.node_reports(cluster["hosts"], self._registered, node_vars)
        cluster = dict(cluster, complete=cluster["complete"] and complete)
        if server is None:
            server = self._read_server(cluster, writer_vars, server_vars, task_vars)
        earlier = None
        if not cluster["complete"] and cluster_step.RUNTIMECLASSES in objects:
            if not read_earlier:
                return None, server, cluster
            earlier = self._earlier_handlers(server, server_vars["root"], task_vars)
        try:
            decided = cluster_step.decide(cluster, server, nodes, settings, operator, objects, server_vars["root"], earlier,
                                          plugin_settings=plugin)
        except K3sGpuError as exc:
            raise exc.within("cluster %s (written from %s)" % (cluster["name"], writer)) from exc
        decided["follow_up"] = bool(decided["chart_archives"]) or (decided["runtimeclasses"] or {}).get("method") == "api"
        return decided, server, cluster

    def _facts_in_run(self, host, readings=False):
        """The host's reading by the role's host step in this run (a NodeFacts), or None. readings: else the
        runtimeclasses playbook's reading of it (gpu_cluster's read phase), where it has one."""
        registered = self._registered(host)
        own = registered.get("gpu_node_result")
        if isinstance(own, dict) and own.get("node"):
            return host_state.HostState.from_result(own["node"], "%s: gpu_node_result.node" % host).facts
        reading = registered.get(cluster_step.READING_VAR) if readings else None
        if isinstance(reading, dict) and reading and not (reading.get("failed") or reading.get("skipped")):
            return cluster_step.playbook_reading(host, reading)
        return None

    def _read_server(self, cluster, writer_vars, server_vars, task_vars):
        """The reading of the cluster's writer (a NodeFacts): the role's host step's in this run (when it is a GPU
        node), else one now. Raises K3sGpuError where reading it fails."""
        writer = cluster["writer"]
        own = self._facts_in_run(writer)
        if own is not None:
            return own
        reading = self._read_now(writer, writer_vars, server_vars, task_vars)
        if reading.get("failed"):
            raise K3sGpuError("cluster %s: reading the server %s failed: %s" % (
                cluster["name"], writer, host_step.role_message(reading)))
        return NodeFacts.from_reading(reading, "cluster %s: runtime_info's reading of the server %s" % (
            cluster["name"], writer), "")

    def _read_now(self, host, host_vars, server_vars, task_vars):
        """runtime_info's result for the host now (failed included), for the release the role would plan for."""
        distribution, release, _source = role_vars.release_to_read(server_vars["distribution"], server_vars["release"],
                                                                   host_vars, self._templar.template)

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)
        return node_reading.read_node(execute_module, dict(
            root=server_vars["root"], distribution=distribution, release=release or None,
            newer_release=server_vars["newer_release"], data_dir=server_vars["data_dir"] or None,
            toolkit_dirs=server_vars.get("toolkit_dirs") or []))

    def _earlier_handlers(self, server, root, task_vars):
        path = "%s%s/%s" % (root.rstrip("/"), server.paths["manifests_dir"], cluster_step.RUNTIMECLASS_MANIFEST)
        read = self._execute_module(module_name="ansible.builtin.slurp", module_args={"src": path}, task_vars=task_vars)
        if read.get("failed") or "content" not in read:
            return []
        return cluster_step.earlier_handlers(base64.b64decode(read["content"]).decode("utf-8", "replace"))
