# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The few calls a rollout makes to a cluster's API server, through the Python kubernetes client on the controller
(the optional dependency kubernetes.core needs too). Objects come back as the API's JSON (dicts), as the pure rules in
_rollout read them. A node's cordon and its annotation are one merge patch; an eviction goes through the Eviction API,
which answers 429 while a PodDisruptionBudget forbids it.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import json

from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

MERGE_PATCH = "application/merge-patch+json"
REQUEST_SECONDS = 30
FIX_CLIENT = "install the Python kubernetes client on the controller (pip install kubernetes), as kubernetes.core needs it too"


class Refused(K3sGpuError):
    """The API server answered with an error status (status: the HTTP code, 429 where a budget forbids an eviction)."""

    def __init__(self, cause, status=0, fix=""):
        super(Refused, self).__init__(cause, fix)
        self.status = status


def _load(response) -> Any:
    data = response.data
    return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data) if data else {}


class Cluster:
    """A cluster's API server, reached with one kubeconfig (its current context)."""

    def __init__(self, kubeconfig: str, context: Optional[str] = None):
        try:
            from kubernetes import client, config  # pylint: disable=import-outside-toplevel
            from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
        except ImportError:
            raise K3sGpuError("the Python kubernetes client is not installed on the controller", fix=FIX_CLIENT)
        self.kubeconfig = kubeconfig
        self._exception = ApiException
        try:
            api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        except Exception as exc:  # the loader raises ConfigException, OSError, ValueError, yaml errors
            raise K3sGpuError("the kubeconfig %s cannot be loaded: %s" % (kubeconfig, type(exc).__name__),
                              fix="point gpu_node_kubeconfig at a kubeconfig file of the node's cluster")
        self.core = client.CoreV1Api(api_client)

    def _call(self, what: str, method, *args, missing_ok: bool = False, **kwargs) -> Any:
        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", REQUEST_SECONDS)
        try:
            return _load(method(*args, **kwargs))
        except self._exception as exc:
            if missing_ok and exc.status == 404:
                return None
            reason = ""
            try:
                reason = (json.loads(exc.body or "{}").get("message") or "").rstrip(".")
            except (TypeError, ValueError):
                pass
            said = ": %s" % reason if reason else ""
            raise Refused("%s: the API server answered %s %s%s" % (what, exc.status, exc.reason or "", said), exc.status)
        except (TypeError, ValueError) as exc:  # the client's own check of an object (pydantic in newer clients)
            raise K3sGpuError("%s: the Python kubernetes client refused the object: %s" % (what, str(exc).splitlines()[0]))
        except OSError as exc:  # urllib3's connection errors are OSErrors
            raise K3sGpuError("%s: the API server of %s cannot be reached (%s)" % (what, self.kubeconfig, type(exc).__name__),
                              fix="check the kubeconfig's server address and that the API server runs")

    # ---- nodes ------------------------------------------------------------------------------------------------------
    def node(self, name: str) -> Optional[Dict[str, Any]]:
        return self._call("read Node %s" % name, self.core.read_node, name, missing_ok=True)

    def nodes(self) -> List[Dict[str, Any]]:
        return (self._call("list Nodes", self.core.list_node) or {}).get("items") or []

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> Dict[str, Any]:
        return self._call("patch Node %s" % name, self.core.patch_node, name, dict(patch), _content_type=MERGE_PATCH)

    # ---- pods -------------------------------------------------------------------------------------------------------
    def pods_on(self, node: str) -> List[Dict[str, Any]]:
        found = self._call("list the pods of node %s" % node, self.core.list_pod_for_all_namespaces,
                           field_selector="spec.nodeName=%s" % node)
        return (found or {}).get("items") or []

    def evict(self, eviction: Mapping[str, Any]) -> None:
        metadata = eviction["metadata"]
        self._call("evict pod %s/%s" % (metadata["namespace"], metadata["name"]), self.core.create_namespaced_pod_eviction,
                   metadata["name"], metadata["namespace"], dict(eviction), missing_ok=True)

    def pod(self, namespace: str, name: str) -> Optional[Dict[str, Any]]:
        return self._call("read pod %s/%s" % (namespace, name), self.core.read_namespaced_pod, name, namespace,
                          missing_ok=True)

    def create_pod(self, pod: Mapping[str, Any]) -> Dict[str, Any]:
        metadata = pod["metadata"]
        return self._call("create pod %s/%s" % (metadata["namespace"], metadata["name"]), self.core.create_namespaced_pod,
                          metadata["namespace"], dict(pod))

    def delete_pod(self, namespace: str, name: str) -> None:
        self._call("delete pod %s/%s" % (namespace, name), self.core.delete_namespaced_pod, name, namespace,
                   body={"gracePeriodSeconds": 0}, missing_ok=True)

    def pod_log(self, namespace: str, name: str) -> List[str]:
        try:
            response = self.core.read_namespaced_pod_log(name, namespace, _preload_content=False,
                                                         _request_timeout=REQUEST_SECONDS)
        except self._exception:
            return []
        data = response.data
        return (data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")).splitlines()

    def events_of(self, namespace: str, name: str) -> List[Dict[str, Any]]:
        found = self._call("list the events of pod %s/%s" % (namespace, name), self.core.list_namespaced_event, namespace,
                           field_selector="involvedObject.name=%s" % name)
        return (found or {}).get("items") or []

    def ensure_namespace(self, name: str) -> None:
        if self._call("read Namespace %s" % name, self.core.read_namespace, name, missing_ok=True) is None:
            try:
                self._call("create Namespace %s" % name, self.core.create_namespace,
                           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
                               "app.kubernetes.io/managed-by": "k3s_gpu.nvidia"}}})
            except Refused as exc:
                if exc.status != 409:  # made meanwhile by another host's step
                    raise
