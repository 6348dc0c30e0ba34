# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The play's hosts as the cluster step reads them (cluster/_cluster_phases.RoleView): each host's variables, what the
gpu_node role registered there, its variables converted by its spec. The cluster wing does not import the role's; the
gpu_cluster action hands it this one.

PRIVATE to the collection. Controller side."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars


class RoleView:
    """hostvars: the task's hostvars; template: the task's templar's template."""

    def __init__(self, hostvars: Mapping[str, Any], template: Callable[[Any], Any]):
        self._hostvars = hostvars
        self._template = template
        self._host_vars: Dict[str, Mapping[str, Any]] = {}

    def host_vars(self, host: str) -> Mapping[str, Any]:
        # each hostvars[host] computes the host's variables anew: once per host and task
        if host not in self._host_vars:
            self._host_vars[host] = self._hostvars[host] if host in self._hostvars else {}
        return self._host_vars[host]

    def registered(self, host: str) -> Mapping[str, Any]:
        return role_vars.registered(self._hostvars, host)

    def read(self, values: Mapping[str, Any], names: Sequence[str]) -> Dict[str, Any]:
        return role_vars.read(values, self._template, names)

    def release_to_read(self, distribution: str, release: str,
                        values: Mapping[str, Any]) -> Tuple[str, str, Optional[str]]:
        return role_vars.release_to_read(distribution, release, values, self._template)

    def host_facts(self, node: Any, what: str) -> NodeFacts:
        return host_state.HostState.from_result(node, what).facts

    def message(self, outcome: Dict[str, Any]) -> str:
        return host_step.role_message(outcome)
