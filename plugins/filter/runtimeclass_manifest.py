# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: runtimeclass_manifest
short_description: Render RuntimeClass objects as one multi-document YAML manifest
version_added: 1.0.0
description:
  - Takes the result of P(k3s_gpu.nvidia.runtimeclass_plan#filter) (or its C(manifests) list) and returns the text
    of one manifest for the k3s/rke2 auto-deploy directory (C(<data-dir>/server/manifests/)) or for C(kubectl apply).
  - A comment line naming the collection and the handlers, then one C(---) document per object, sorted by name,
    fields in a fixed order and every value quoted, so the same plan always gives the same bytes.
  - With no objects, only the comment line; remove the file instead of writing it.
positional: _input
options:
  _input:
    description: A P(k3s_gpu.nvidia.runtimeclass_plan#filter) result, or a list of RuntimeClass dicts.
    type: raw
    required: true
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
"""

EXAMPLES = r"""
- name: Write the RuntimeClasses into the auto-deploy directory of a k3s server
  ansible.builtin.copy:
    dest: /var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml
    content: "{{ plan | k3s_gpu.nvidia.runtimeclass_manifest }}"
    mode: "0600"
"""

RETURN = r"""
_value:
  description: Multi-document YAML text, ending with a newline.
  type: str
  sample: |
    # Managed by k3s_gpu.nvidia; edits are overwritten. RuntimeClasses for the handlers: nvidia-cdi
    ---
    apiVersion: "node.k8s.io/v1"
    kind: "RuntimeClass"
    metadata:
      name: "nvidia-cdi"
      labels:
        "app.kubernetes.io/managed-by": "k3s_gpu.nvidia"
    handler: "nvidia-cdi"
"""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _runtimeclasses as runtimeclasses
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._filter import one_filter


def runtimeclass_manifest(data):
    if isinstance(data, Mapping):
        if "manifests" not in data:
            raise AnsibleFilterError("runtimeclass_manifest: expected a runtimeclass_plan result (with manifests) or a list "
                                     "of RuntimeClass dicts, got a dict with keys %s" % ", ".join(sorted(map(str, data))))
        data = data["manifests"]
    try:
        return runtimeclasses.render_manifest_yaml(data)
    except ValueError as exc:
        raise AnsibleFilterError("runtimeclass_manifest: %s" % exc) from exc


FilterModule = one_filter(runtimeclass_manifest)
