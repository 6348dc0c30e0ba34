# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What k3s/rke2's start does to a sandbox node's containerd config: compose config.toml from the release's base and
the node's template or drop-ins, and write it into the node (k3s rewrites it at every start). A test double of that
one step of the k3s binary, which cannot run here. Used by the molecule sandbox_doctor scenario.

  python -m ansible_collections.k3s_gpu.nvidia.tests.conformance.start_node --root DIR --distribution k3s \\
      --release v1.34.6+k3s1

Prints the path it wrote.
"""

from __future__ import annotations

import argparse
import sys

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro

from . import cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--distribution", required=True, choices=(distro.K3S, distro.RKE2))
    parser.add_argument("--release", required=True)
    parser.add_argument("--toolkit-dir", action="append", default=[])
    args = parser.parse_args(argv)
    facts = detect.gather(args.root, args.distribution, args.release, toolkit_dirs=args.toolkit_dir)
    loaded = cases.start_node(args.root, args.distribution, args.release, [r["binary"] for r in facts["runtimes"]],
                              args.toolkit_dir)
    print(args.root + loaded.facts["paths"]["config"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
