# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A simulated fleet of sandbox nodes on localhost: the layout (clusters, release lines, servers and
agents, toolkit layouts), the node trees and the inventory.

The trees are what extensions/molecule/sandbox/prepare.yml builds, written directly in Python (a
200-host fleet in well under a second instead of minutes of Ansible tasks)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

# One cluster per release line: (distribution, release, how the release reads runtime blocks, where
# the GPU agents' toolkit is). A cluster has one toolkit layout: the role leaves every RuntimeClass to the
# GPU Operator in a cluster where it runs on any node. Ordered so that any three clusters cover the three
# families (schema 2 template, schema 3 template with containerd 2, drop-in directory) and both layouts.
CLUSTER_PROFILES = (
    ("k3s", "v1.28.15+k3s1", "schema 2", "package"),
    ("rke2", "v1.31.6+rke2r1", "schema 3", "operator"),
    ("k3s", "v1.33.10+k3s1", "drop-in", "package"),
    ("k3s", "v1.31.6+k3s1", "schema 3", "package"),
    ("k3s", "v1.30.10+k3s1", "schema 2", "package"),
    ("rke2", "v1.34.6+rke2r1", "drop-in", "operator"),
    ("k3s", "v1.34.6+k3s1", "drop-in", "package"),
)
SERVERS_PER_CLUSTER = 2  # CPU-only
CPU_ONLY_AGENT_EVERY = 4  # every 4th agent of a cluster has no GPU (layout "nothing")

# From extensions/molecule/sandbox/prepare.yml: stub runtimes per layout, and the files of a node with
# a GPU on the PCI bus and a loaded driver.
RUNTIME_BINARIES = {
    "package": ("/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
                "/usr/bin/nvidia-container-runtime.legacy"),
    "operator": ("/usr/local/nvidia/toolkit/nvidia-container-runtime", "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi",
                 "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy"),
    "nothing": (),
}
RUNTIME_STUB = '#!/bin/sh\nexec runc "$@"\n'
GPU_FILES = {
    "/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n",
    "/dev/nvidia0": "",
    "/dev/nvidiactl": "",
    "/sys/bus/pci/devices/0000:17:00.0/vendor": "0x10de\n",
    "/sys/bus/pci/devices/0000:17:00.0/class": "0x030200\n",
}


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    cluster: str
    role: str  # server | agent (the inventory group)
    distribution: str
    release: str
    family: str  # schema 2 | schema 3 | drop-in
    layout: str  # package | operator | nothing

    @property
    def has_gpu(self):
        return self.layout != "nothing"


def cluster_count(hosts):
    """Three clusters (the three release families) from 9 hosts on, one more per 8 hosts beyond,
    at most one per profile."""
    return min(len(CLUSTER_PROFILES), max(1, min(3, hosts // 3), hosts // 8))


def plan_fleet(hosts):
    """The nodes of a fleet of `hosts` hosts, servers first (inventory order decides which server
    of a cluster writes its RuntimeClass manifest), agents dealt to the clusters in turn."""
    clusters = cluster_count(hosts)
    agents = hosts - clusters * SERVERS_PER_CLUSTER
    if agents < 1:
        raise ValueError("a fleet needs at least %d hosts" % (SERVERS_PER_CLUSTER + 1))
    nodes = []
    for index in range(clusters):
        distribution, release, family, _layout = CLUSTER_PROFILES[index]
        for number in range(1, SERVERS_PER_CLUSTER + 1):
            nodes.append(Node("c%d-server%d" % (index + 1, number), "c%d" % (index + 1), "server",
                              distribution, release, family, "nothing"))
    for number in range(agents):
        index, number_in_cluster = number % clusters, number // clusters + 1
        distribution, release, family, layout = CLUSTER_PROFILES[index]
        if number_in_cluster % CPU_ONLY_AGENT_EVERY == 0:
            layout = "nothing"
        nodes.append(Node("c%d-agent%03d" % (index + 1, number_in_cluster), "c%d" % (index + 1), "agent",
                          distribution, release, family, layout))
    return nodes


def describe(nodes):
    """Counts for the report: per release line and per layout."""
    lines, layouts = {}, {}
    for node in nodes:
        line = "%s %s (%s)" % (node.distribution, node.release, node.family)
        lines[line] = lines.get(line, 0) + 1
        kind = "server (CPU-only)" if node.role == "server" else "agent, " + node.layout
        layouts[kind] = layouts.get(kind, 0) + 1
    return {"hosts": len(nodes), "clusters": len({node.cluster for node in nodes}),
            "gpu_hosts": sum(node.has_gpu for node in nodes), "release_lines": lines, "layouts": layouts}


def _write(path, text, mode):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)


def write_tree(root, node):
    """One node tree, as prepare.yml leaves it: the k3s/rke2 containerd directory, stub runtimes and,
    on a GPU node, the driver and PCI files."""
    os.makedirs(root + "/var/lib/rancher/%s/agent/etc/containerd" % node.distribution, mode=0o755)
    for binary in RUNTIME_BINARIES[node.layout]:
        _write(root + binary, RUNTIME_STUB, 0o755)
    if node.has_gpu:
        for path, text in GPU_FILES.items():
            _write(root + path, text, 0o600)


def node_root(trees_dir, node):
    return os.path.join(trees_dir, node.name)


def write_trees(trees_dir, nodes):
    """(Re)build every tree from scratch: each converge must start from an untouched fleet."""
    shutil.rmtree(trees_dir, ignore_errors=True)
    os.makedirs(trees_dir)
    for node in nodes:
        write_tree(node_root(trees_dir, node), node)


def write_inventory(path, trees_dir, nodes, python):
    """A YAML inventory (written as JSON, which is YAML): groups server and agent, the defaults of
    k3s_gpu_servers and the runtimeclasses playbook; every host is localhost with its own tree."""
    groups = {"server": {"hosts": {}}, "agent": {"hosts": {}}}
    for node in nodes:
        groups[node.role]["hosts"][node.name] = {
            "gpu_node_root": node_root(trees_dir, node),
            "gpu_node_distribution": node.distribution,
            "gpu_node_release": node.release,
            "k3s_gpu_cluster": node.cluster,
        }
    inventory = {"all": {"children": groups,
                         "vars": {"ansible_connection": "local", "ansible_python_interpreter": python}}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(inventory, handle, indent=1)
