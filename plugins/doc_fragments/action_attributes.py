# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """What the collection's action-backed modules share in their documentation: the author and the attributes,
    described here in full so that a module extends this one fragment (a module's own attributes win over these)."""

    DOCUMENTATION = r"""
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
attributes:
  action:
    description: The task runs as an action plugin on the controller, which reads and writes the node through modules.
    support: full
  async:
    description: Whether the task can run with the C(async) keyword.
    support: none
  bypass_host_loop:
    description: Whether one task runs for all hosts at once instead of once per host.
    support: none
  check_mode:
    description: Runs in check mode and reports what would change, without changing anything.
    support: full
  diff_mode:
    description: Shows in diff mode what changes (or, in check mode, would change).
    support: full
  platform:
    description: The target operating systems.
    support: N/A
    platforms: posix
"""
