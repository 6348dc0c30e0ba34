# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_operator_manifest
short_description: Render the GPU Operator HelmChart as manifest text
version_added: 1.0.0
description:
  - Takes a P(k3s_gpu.nvidia.gpu_operator_plan#filter) result and returns the text of one manifest for the k3s/rke2
    auto-deploy directory (C(<data-dir>/server/manifests/)).
  - A comment line naming the collection, the chart version and the operator's mode, then the HelmChart; fields in a fixed
    order and every scalar quoted, C(valuesContent) as a literal block, so the same plan always gives the same bytes.
positional: _input
options:
  _input:
    description: A P(k3s_gpu.nvidia.gpu_operator_plan#filter) result whose C(wanted) is true.
    type: dict
    required: true
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
"""

EXAMPLES = r"""
- name: Write the GPU Operator HelmChart into the auto-deploy directory of a k3s server
  ansible.builtin.copy:
    dest: /var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-gpu-operator.yaml
    content: "{{ operator_plan | k3s_gpu.nvidia.gpu_operator_manifest }}"
    mode: "0600"
"""

RETURN = r"""
_value:
  description: YAML text, ending with a newline.
  type: str
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _gpu_operator as gpu_operator
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._filter import one_filter


def gpu_operator_manifest(plan):
    if not isinstance(plan, Mapping):
        raise AnsibleFilterError("gpu_operator_manifest: expected a gpu_operator_plan result, got %s" % type(plan).__name__)
    try:
        return gpu_operator.render_manifest(plan)
    except ValueError as exc:
        raise AnsibleFilterError("gpu_operator_manifest: %s" % exc) from exc


FilterModule = one_filter(gpu_operator_manifest)
