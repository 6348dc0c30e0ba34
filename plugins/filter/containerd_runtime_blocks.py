# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: containerd_runtime_blocks
short_description: Render containerd runtime tables for your own containerd config or k3s template
version_added: 1.0.0
description:
  - Renders the C([plugins...containerd.runtimes.<name>]) table and its C(.options) table for each runtime,
    for containerd config schema 2 (C(io.containerd.grpc.v1.cri)), 3 or 4 (C(io.containerd.cri.v1.runtime)).
  - Keys are quoted by tomlkit, runtime names are checked (lowercase DNS labels), binaries must be absolute,
    and runc shim options are checked against the shim's known options.
  - Takes a list of runtimes, or the result of M(k3s_gpu.nvidia.runtime_info), whose C(plan.write) runtimes
    (see RV(k3s_gpu.nvidia.runtime_info#module:plan); those the release does not render itself) and schema are then used.
  - If you template a k3s/rke2 C(.tmpl) yourself, do not include runtimes the release detects;
    M(k3s_gpu.nvidia.containerd_runtimes) does that bookkeeping for you.
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
options:
  _input:
    description: A list of runtimes (C(name), C(binary), optional C(runtime_type), C(options), C(systemd_cgroup)), or a M(k3s_gpu.nvidia.runtime_info) result.
    type: raw
    required: true
  schema:
    description: containerd config schema; default 3, or the plan's schema for a M(k3s_gpu.nvidia.runtime_info) result.
    type: int
    choices: [2, 3]
  systemd_cgroup:
    description:
      - C(SystemdCgroup) for runtimes that do not set C(systemd_cgroup); omitted when not set.
      - For a M(k3s_gpu.nvidia.runtime_info) result, the node's value.
    type: bool
requirements:
  - tomlkit on the controller
"""

EXAMPLES = r"""
- name: Runtime blocks for a plain containerd config template
  ansible.builtin.copy:
    dest: /etc/containerd/conf.d/60-gpu.toml
    mode: "0600"
    content: |
      version = 3
      {{ [{'name': 'nvidia-legacy', 'binary': '/usr/bin/nvidia-container-runtime.legacy'}]
         | k3s_gpu.nvidia.containerd_runtime_blocks(schema=3, systemd_cgroup=true) }}

- name: Blocks for what k3s will not render, from runtime_info
  ansible.builtin.debug:
    msg: "{{ gpu | k3s_gpu.nvidia.containerd_runtime_blocks }}"
"""

RETURN = r"""
_value:
  description: TOML text, one runtime table and its options table per runtime; empty string for no runtimes.
  type: str
  sample: |
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia-legacy.options]
      BinaryName = "/usr/bin/nvidia-container-runtime.legacy"
      SystemdCgroup = true
"""

from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._filter import one_filter


def containerd_runtime_blocks(data, schema=None, systemd_cgroup=None):
    if isinstance(data, Mapping) and "plan" in data:
        plan = data["plan"]
        if "error" in plan:
            raise AnsibleFilterError("containerd_runtime_blocks: runtime_info found no safe plan: %s" % plan["error"])
        runtimes, schema = plan["write"], schema or plan["schema"]
        if systemd_cgroup is None:
            systemd_cgroup = data.get("systemd_cgroup")
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        runtimes = data
    else:
        raise AnsibleFilterError("containerd_runtime_blocks: expected a list of runtimes or a runtime_info result, got %s"
                                 % type(data).__name__)
    schema = int(schema or 3)
    if schema not in distro.CONFIG_VERSIONS:
        raise AnsibleFilterError("containerd_runtime_blocks: schema must be one of %s, not %s" % (
            ", ".join(str(v) for v in distro.CONFIG_VERSIONS), schema))
    items = []
    try:
        for runtime in runtimes:
            if not isinstance(runtime, Mapping):
                raise K3sGpuError("each runtime must be a dict with name and binary, got %r" % (runtime,))
            name = runtime.get("name")
            planner.check_runtime_name(name)
            binary = runtime.get("binary")
            if not isinstance(binary, str) or not binary.startswith("/"):
                raise K3sGpuError("runtime %s: binary must be an absolute path, got %r" % (name, binary))
            runtime_type = runtime.get("runtime_type") or distro.RUNC_V2
            options = dict(runtime.get("options") or {})
            planner.check_options(name, runtime_type, options)
            items.append({"name": name, "binary": binary, "runtime_type": runtime_type, "options": options,
                          "systemd_cgroup": runtime.get("systemd_cgroup")})
        return toml.render_runtime_blocks(schema, items, systemd_cgroup)
    except K3sGpuError as exc:
        raise AnsibleFilterError("containerd_runtime_blocks: %s" % exc)


FilterModule = one_filter(containerd_runtime_blocks)
