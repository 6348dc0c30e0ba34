# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Check a converged sandbox node in real containerd: compose what k3s/rke2 will load at the
next start (or take a plain containerd node's config), run `containerd config dump` with the
release's containerd major, and require every NVIDIA runtime installed on the node as a handler
whose BinaryName is that runtime's binary. Used by the molecule sandbox scenarios' verify.

  python -m ansible_collections.k3s_gpu.nvidia.tests.conformance.check_node \\
      --root DIR --distribution k3s --release v1.33.10+k3s1 [--toolkit-dir DIR ...]

Prints one JSON line; exit 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro

from . import cases
from . import lab


def lines_for(profile):
    if profile["distribution"] == distro.CONTAINERD:
        return ["2.x" if profile["containerd"].startswith("2.") else profile["containerd"]]
    return ["1.6", "1.7"] if profile["containerd"] == "1.7" else ["2.x"]


def check(root, distribution, release, toolkit_dirs=()):
    facts = detect.gather(root, distribution, release, toolkit_dirs=toolkit_dirs)
    binaries = [r["binary"] for r in facts["runtimes"]]
    if distribution == distro.CONTAINERD:
        with open(root + facts["paths"]["config"]) as handle:
            config = cases.relocate(handle.read(), root, binaries).replace(
                '"/etc/containerd/conf.d/', '"%s/etc/containerd/conf.d/' % root)
        dropin_path = root + facts["paths"]["dropin"]
        try:
            with open(dropin_path) as handle:
                dropin = (dropin_path, cases.relocate(handle.read(), root, binaries))
        except FileNotFoundError:
            dropin = None
    else:
        loaded = cases.compose_node(root, distribution, release, binaries, toolkit_dirs)
        config, dropin = loaded.config_text, loaded.dropin
    original = None
    if dropin:  # containerd imports the file itself: give it the relocated text for the check
        with open(dropin[0]) as handle:
            original = handle.read()
        with open(dropin[0], "w") as handle:
            handle.write(dropin[1])
    report = {"root": root, "release": release, "lines": {}, "problems": []}
    try:
        for line in lines_for(facts["profile"]):
            result = lab.config_dump(line, config)
            if result.rc != 0:
                report["problems"].append("containerd %s refused the config: %s" % (line, result.stderr.strip()[-500:]))
                continue
            if "Ignoring unknown key" in result.stderr:
                report["problems"].append("containerd %s ignored keys: %s" % (line, result.stderr.strip()[-500:]))
            version = int(result.data.get("version", 1))
            plugin = "io.containerd.cri.v1.runtime" if version >= 3 else "io.containerd.grpc.v1.cri"
            handlers = result.data["plugins"][plugin]["containerd"]["runtimes"]
            report["lines"][line] = sorted(handlers)
            for runtime in facts["runtimes"]:
                got = (handlers.get(runtime["name"]) or {}).get("options", {}).get("BinaryName")
                if got != root + runtime["binary"]:
                    report["problems"].append("containerd %s: handler %s has BinaryName %r, expected %s" % (
                        line, runtime["name"], got, root + runtime["binary"]))
    finally:
        if original is not None:
            with open(dropin[0], "w") as handle:
                handle.write(original)
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--distribution", required=True, choices=distro.DISTRIBUTIONS)
    parser.add_argument("--release", required=True)
    parser.add_argument("--toolkit-dir", action="append", default=[])
    args = parser.parse_args(argv)
    report = check(args.root, args.distribution, args.release, args.toolkit_dir)
    print(json.dumps(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
