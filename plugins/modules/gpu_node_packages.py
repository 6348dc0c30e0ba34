#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_node_packages
short_description: Internal - the k3s_gpu.nvidia.gpu_node role's package step on one host
version_added: 1.0.0
description:
  - B(Internal to the role k3s_gpu.nvidia.gpu_node; its options and results may change without notice.) Use the role.
  - O(state=present) adds NVIDIA's signed repository of the O(source) (the key downloaded to a temporary file and
    refused unless it has the pinned fingerprint; apt C(Signed-By) or dnf C(gpgkey) trust only that key) and installs its
    packages pinned and held (dpkg hold, dnf versionlock). When the install fails, the repository files are put back as
    they were. The driver also gets the nouveau blacklist, and the result says whether the new driver needs a reboot.
  - O(state=absent) releases the holds and locks and removes the packages; with O(remove_source) also the repository,
    its key and (the driver) the nouveau blacklist the role wrote.
  - Reads the role's C(gpu_node_*) variables itself, converted by the role's argument spec, and the host's
    C(ansible_facts) (OS family, distribution, version, architecture, kernel). Runs Ansible's own modules on the host,
    each with C(gpu_node_proxy_env) over the task's own C(environment); no result holds it, and a URL in a message has
    its password masked.
extends_documentation_fragment: k3s_gpu.nvidia.action_attributes
attributes:
  diff_mode:
    support: none
options:
  source:
    description: V(toolkit) - the NVIDIA container toolkit; V(driver) - the NVIDIA driver from NVIDIA's CUDA repository.
    type: str
    default: toolkit
    choices: [toolkit, driver]
  state:
    description: V(present) installs, V(absent) removes.
    type: str
    default: present
    choices: [present, absent]
  remove_source:
    description: With O(state=absent), also remove the repository and its key (the driver - also the nouveau blacklist).
    type: bool
    default: false
seealso:
  - module: ansible.builtin.deb822_repository
  - module: ansible.builtin.yum_repository
"""

EXAMPLES = r"""
# Internal: the role k3s_gpu.nvidia.gpu_node calls it.
- name: Add NVIDIA's container toolkit repository and install the toolkit
  k3s_gpu.nvidia.gpu_node_packages:
    source: toolkit
  register: toolkit
"""

RETURN = r"""
source:
  description: V(toolkit) or V(driver).
  returned: always
  type: str
family:
  description: The package manager, V(apt) or V(dnf).
  returned: success
  type: str
packages_changed:
  description: Whether packages were installed, upgraded, downgraded or removed.
  returned: success
  type: bool
key_changed:
  description: O(state=present) - whether the repository key was installed or replaced.
  returned: success
  type: bool
repository_changed:
  description: O(state=present) - whether a repository file was written or the one-line C(.list) of earlier versions removed.
  returned: success
  type: bool
unseen:
  description: O(state=present) in check mode - the repository is not there yet, so the package step was not evaluated.
  returned: success
  type: bool
driver_changed:
  description: O(source=driver) - whether the driver packages or the nouveau blacklist changed.
  returned: success
  type: bool
reboot_required:
  description: O(source=driver) - whether the new driver cannot be loaded without a reboot.
  returned: success
  type: bool
reboot_reason:
  description: O(source=driver) - why (nouveau loaded, another driver version loaded, C(modprobe nvidia) failed).
  returned: success
  type: str
reboot:
  description: O(source=driver) - whether the role reboots now (RV(reboot_required) and the reboot policy, or policy V(always)).
  returned: success
  type: bool
files_removed:
  description: O(state=absent) - the files removed (repository, key, nouveau blacklist).
  returned: success
  type: list
  elements: str
"""

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import GPU_NODE_PACKAGES_SPEC, refuse_outside_action


def main():
    refuse_outside_action("k3s_gpu.nvidia.gpu_node_packages runs through its action plugin, inside the role k3s_gpu.nvidia.gpu_node", GPU_NODE_PACKAGES_SPEC)


if __name__ == "__main__":
    main()
