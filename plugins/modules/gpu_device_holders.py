#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_device_holders
short_description: List the processes of a node that hold an NVIDIA device open
version_added: 1.0.0
description:
  - Reads every C(<proc>/<pid>/fd) of the node and reports the processes that hold an NVIDIA device open, with the
    pod and container they run in. A driver cannot be unloaded or replaced while one does - the drain before a driver
    change waits until RV(holders) is empty.
  - An fd counts when it is a character device of an NVIDIA major (195, and every C(nvidia*) name of
    C(/proc/devices), such as C(nvidia-uvm) and C(nvidia-caps)), or when it is the same file as one of
    C(<root>/dev/nvidia*) (a sandbox tree's plain files, a bind-mounted device).
  - Processes that end while the module reads, and fds closed meanwhile, are skipped. Processes whose fds the module
    may not read are listed in RV(unreadable) with a warning - run it with root privileges.
  - Read-only. Needs only the Python standard library on the node. Internal to the C(gpu_node) role.
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  root:
    description:
      - Directory that stands for C(/) of the node; the device files are C(<root>/dev/nvidia*). Use a sandbox tree in tests.
    type: path
    default: /
  proc:
    description:
      - Where the processes are read. Not under O(root) - in a sandbox tree the processes are still the host's.
    type: path
    default: /proc
notes:
  - The GPU is not needed; a node without a driver reports no holders.
seealso:
  - module: k3s_gpu.nvidia.runtime_info
"""

EXAMPLES = r"""
- name: Wait until no process holds an NVIDIA device (before a driver change)
  k3s_gpu.nvidia.gpu_device_holders:
  register: held
  until: held.holders | length == 0 and held.unreadable | length == 0
  retries: 30
  delay: 10

- name: Show the pods that still use a GPU
  ansible.builtin.debug:
    msg: "{{ held.holders | map(attribute='pod_uid') | select | unique | list }}"
"""

RETURN = r"""
error:
  description:
    - When O(root) or O(proc) cannot be read, C(cause), C(fix) and C(variables), the options the fix names.
  returned: failure
  type: dict
holders:
  description:
    - The processes that hold an NVIDIA device open, sorted by C(pid) - C(command) (from C(comm)), C(devices) (the
      paths of the fds as the kernel shows them, V(?) when unreadable), C(pod_uid) and C(container_id) (from the
      kubelet's cgroup path, null outside a pod or container).
  returned: success
  type: list
  elements: dict
  sample:
    - pid: 4242
      command: python3
      devices: [/dev/nvidia-uvm, /dev/nvidia0, /dev/nvidiactl]
      pod_uid: 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0
      container_id: 3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b8559
devices:
  description: The node paths of the NVIDIA device files (C(/dev/nvidia*) and C(/dev/nvidia-caps/*)), directories left out.
  returned: success
  type: list
  elements: str
  sample: [/dev/nvidia-uvm, /dev/nvidia0, /dev/nvidiactl]
majors:
  description: The character device majors counted as NVIDIA's, sorted.
  returned: success
  type: list
  elements: int
  sample: [195, 234, 507]
unreadable:
  description:
    - The pids whose fds the module was not allowed to read; one of them may hold a device. Empty when run as root.
  returned: success
  type: list
  elements: int
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _holders
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_DEVICE_HOLDERS_SPEC
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


def main():
    module = AnsibleModule(argument_spec=GPU_DEVICE_HOLDERS_SPEC, supports_check_mode=True)
    try:
        result = _holders.holders(root=module.params["root"], proc=module.params["proc"])
    except K3sGpuError as exc:
        module.fail_json(msg=exc.text(), error=exc.as_dict())
    if result["unreadable"]:
        # a drain that trusted an empty list here could unload a driver in use
        module.warn("%d processes could not be read (permission denied); run the module with root privileges"
                    % len(result["unreadable"]))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
