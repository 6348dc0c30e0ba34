# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify playbook's decisions, on the controller: `phase: choose` picks the RuntimeClasses and GPU nodes from the
API's objects (with a kubeconfig it checks it, then reads them itself) and says what is broken before a pod runs;
`phase: wait` polls the smoke pods and their events (kubernetes.core.k8s_info) until each one has ended or is stuck in
a way kubelet only retries; `phase: report` turns the pods, their events and logs into one line per node and
RuntimeClass, naming the broken layer, and fails when anything did not pass. A kubeconfig that does not work, or
kubernetes.core missing, fails the task with one line. The rules are in plugin_utils/diagnosis/_verify.py."""

from __future__ import annotations

import importlib.util
import os
import time

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _dra_layers as dra_layers
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _verify as verify

POLL_SECONDS = 2
# a pod stuck in one broken state this long is taken as broken: kubelet retries a failed pod sync after its pod
# workers' back-off (10 s, capped at its syncFrequency, 1 min by default) plus up to 50% jitter, so a failure that
# the retry mends clears within it
STUCK_SECONDS = 20
# what `choose` reads with a kubeconfig: objects of no namespace
CLUSTER_KINDS = {"RuntimeClass": {"kind": "RuntimeClass", "api_version": "node.k8s.io/v1"}, "Node": {"kind": "Node"},
                 "DeviceClass": {"kind": "DeviceClass", "api_version": dra_layers.RESOURCE_API},
                 "ResourceSlice": {"kind": "ResourceSlice", "api_version": dra_layers.RESOURCE_API}}
NAMESPACED_KINDS = {"ResourceClaim": {"kind": "ResourceClaim", "api_version": dra_layers.RESOURCE_API}}


def kubernetes_core_installed():
    """Whether Ansible's collection loader finds kubernetes.core; asked quietly (the plugin loader would warn with the
    ImportError's text)."""
    try:
        return importlib.util.find_spec("ansible_collections.kubernetes.core") is not None
    except ImportError:
        return False


def _failure_message(found):
    """A failed module's message: its msg, or the message of the exception it failed with (ansible-core 2.19 keeps
    that in `exception`, without a msg)."""
    event = getattr(found.get("exception"), "event", None)
    return found.get("msg") or getattr(event, "msg", None) or str(found.get("exception") or "")


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_VERIFY_SPEC

    def failure_message(self, exc):
        return verify.error_line(exc)  # the playbook's one line: cause, then "Fix: ..."

    def run_validated(self, result, args, task_vars):
        result["changed"] = False
        phase = args["phase"]
        if phase == "connect":
            self._check_kubeconfig(args.get("kubeconfig") or "")  # the check alone (the doctor's, before any read)
            return result
        if phase == "choose":
            classes, nodes, dra = args["classes"], args["nodes"], args["dra"]
            if args.get("kubeconfig"):
                self._check_kubeconfig(args["kubeconfig"])
                classes, nodes = self._read("RuntimeClass", args, task_vars), self._read("Node", args, task_vars)
                if any(dra_layers.is_dra_node(node) for node in nodes):
                    dra = self._read_dra(args, task_vars)
            chosen = verify.choose(classes, nodes, args["wanted"], dra)
            result.update(chosen)
            result["pods"] = verify.smoke_pods(chosen, args["namespace"], args["image"])
            result["claim_templates"] = verify.claim_templates(chosen, args["namespace"])
            result["lines"] = [verify.broken_line(entry) for entry in chosen["problems"]] + chosen["notes"]
            message = verify.refusal(chosen)
            if message:
                result.update(failed=True, msg=result["lines"] + [message])
            return result
        if phase == "wait":
            result.update(self._wait(args, task_vars))
            return result
        logs = [{"name": (entry.get("item") or {}).get("metadata", {}).get("name"), "lines": entry.get("log_lines") or []}
                for entry in args["logs"]]
        reported = verify.report(args["pods"], logs, args["expected"], args["allocatable"], args["events"], args["problems"],
                                 args["notes"], args["claims"])
        result.update(lines=reported["lines"], failed_pods=reported["failed"], msg=reported["lines"])
        if reported["failed"]:
            result.update(failed=True, msg=reported["lines"] + ["GPU smoke test failed: %s" % ", ".join(reported["failed"])])
        return result

    def _check_kubeconfig(self, kubeconfig):
        """Before the first read: the kubeconfig reaches its API server, and kubernetes.core is there to read it."""
        verify.check_kubeconfig(kubeconfig, os.environ.get("K8S_AUTH_CONTEXT"), proxied=bool(os.environ.get("K8S_AUTH_PROXY")))
        if not kubernetes_core_installed():
            raise verify.kubernetes_core_missing()

    def _read(self, kind, args, task_vars):
        return self._read_found(kind, args, task_vars).get("resources") or []

    def _read_found(self, kind, args, task_vars):
        module_args = dict(CLUSTER_KINDS.get(kind) or dict(NAMESPACED_KINDS.get(kind) or {"kind": kind},
                                                           namespace=args["namespace"]))
        if kind == "Pod":
            module_args["label_selectors"] = [verify.LABEL_SELECTOR]
        if args.get("kubeconfig"):
            module_args["kubeconfig"] = args["kubeconfig"]
        found = self._execute_module(module_name=verify.KUBERNETES_CORE_MODULE, module_args=module_args, task_vars=task_vars)
        if found.get("failed"):
            raise verify.read_error(kind, _failure_message(found), args.get("kubeconfig"))
        return found

    def _read_dra(self, args, task_vars):
        """What the DRA nodes' layers need: whether resource.k8s.io/v1 is served (k8s_info's api_found: a cluster
        without it is no failure), the ResourceSlices and the DeviceClasses."""
        slices = self._read_found("ResourceSlice", args, task_vars)
        classes = self._read_found("DeviceClass", args, task_vars)
        return {"dra_api": bool(slices.get("api_found", True)), "resourceslices": slices.get("resources") or [],
                "deviceclasses": classes.get("resources") or []}

    def _wait(self, args, task_vars):
        """{pods, events, waited_seconds}: polls until every pod has ended or been broken for STUCK_SECONDS, or the timeout."""
        if args.get("kubeconfig"):
            self._check_kubeconfig(args["kubeconfig"])
        started = time.monotonic()
        deadline = started + args["timeout"]
        broken_since, allocated = {}, {}
        while True:
            pods = self._read("Pod", args, task_vars)
            events = self._read("Event", args, task_vars)
            if any(dra_layers.is_claim_pod(pod) for pod in pods):
                # a claim's allocation is read while its pod holds it: the claim controller releases it once the pod ends
                for claim in self._read("ResourceClaim", args, task_vars):
                    if dra_layers.allocation(claim):
                        allocated[claim["metadata"]["name"]] = claim
            now = time.monotonic()
            open_pods = []
            for pod, found in verify.settle(pods, events):
                if found["done"]:
                    continue
                if found["broken"] is None:
                    broken_since.pop(pod["metadata"]["name"], None)
                    open_pods.append(pod)
                elif now - broken_since.setdefault(pod["metadata"]["name"], now) < STUCK_SECONDS:
                    open_pods.append(pod)
            if (not open_pods and len(pods) >= args["expected"]) or now >= deadline:
                return {"pods": pods, "events": events, "claims": [allocated[name] for name in sorted(allocated)],
                        "waited_seconds": round(now - started, 1)}
            time.sleep(POLL_SECONDS)
