# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one module execution costs on a node, the collection's against Ansible's stat (figures for benchmarks/RESULTS.md,
never asserted). A converge needs a reading and a write per changed GPU node, two module executions; the fleet
benchmark's bound is two stats. Whether the collection's modules can be cheaper than that is measured here:

1. one GPU agent of the sandbox fleet, configured by k3s_gpu.nvidia.site with ANSIBLE_KEEP_REMOTE_FILES=1, and the
   floor's stat on it: the AnsiballZ files of runtime_info, node_files and stat as Ansible sends them;
2. each run again and again, interleaved: CPU milliseconds per execution (user + system of the process); node_files
   finds the files it wrote already and refuses its compare-and-swap, after the same imports and reads;
3. `python -X importtime` of each: what Ansible's module loader imports for every module, and what the module adds.

    .venv/bin/python benchmarks/fleet/module_cost.py [--runs 30]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import sandbox_fleet  # noqa: E402 (next to this file)

MODULES = ("stat", "runtime_info", "node_files")


def keep_payloads(work):
    """{module: its AnsiballZ file} from a site run and a floor run on one GPU agent of a 10-host sandbox fleet."""
    nodes = sandbox_fleet.plan_fleet(10)
    agent = next(n for n in nodes if n.has_gpu)
    sandbox_fleet.write_trees(os.path.join(work, "nodes"), nodes)
    inventory = os.path.join(work, "inventory.json")
    sandbox_fleet.write_inventory(inventory, os.path.join(work, "nodes"), nodes, sys.executable)
    env = dict(os.environ, ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_REMOTE_TEMP=os.path.join(work, "remote"),
               ANSIBLE_LOCAL_TEMP=os.path.join(work, "local"), ANSIBLE_NOCOLOR="1")
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    extra = json.dumps({"gpu_node_driver_install": False, "gpu_node_toolkit_install": False})
    for target in ("k3s_gpu.nvidia.site", os.path.join(HERE, "floor.yml")):
        subprocess.run([playbook, "-i", inventory, "-l", agent.name, "-e", extra, target], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    found = {}
    for module in MODULES:
        paths = sorted(glob.glob(os.path.join(work, "remote", "*", "AnsiballZ_%s.py" % module)))
        if not paths:
            raise SystemExit("no AnsiballZ_%s.py was kept under %s" % (module, os.path.join(work, "remote")))
        found[module] = paths[0]
    return agent.name, found


def cpu_ms(path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)  # node_files refuses
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def import_times(path):
    """{module name: (self µs, cumulative µs)} of one execution under -X importtime."""
    done = subprocess.run([sys.executable, "-X", "importtime", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    times = {}
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, total, name = line[len("import time:"):].split("|")
            times[name.strip()] = (int(own), int(total))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as work:
        host, payloads = keep_payloads(work)
        samples = dict((module, []) for module in MODULES)
        for _run in range(runs):
            for module in MODULES:
                samples[module].append(cpu_ms(payloads[module]))
        print("One GPU agent (%s), %d interleaved executions of each module as Ansible sent it; CPU ms per execution "
              "(user + system)\n" % (host, runs))
        print("| module | median | min | max |\n|---|---|---|---|")
        for module in MODULES:
            values = samples[module]
            print("| %s | %.1f | %.1f | %.1f |" % (module, statistics.median(values), min(values), max(values)))
        print("\nImports of one execution (`-X importtime`, ms, compiling from the zip included):\n")
        print("| module | ansible.module_utils.basic (cumulative) | the collection's module_utils (self, summed) |")
        print("|---|---|---|")
        for module in MODULES:
            times = import_times(payloads[module])
            basic = times.get("ansible.module_utils.basic", (0, 0))[1]
            own = sum(v[0] for k, v in times.items() if k.startswith("ansible_collections.k3s_gpu.nvidia.plugins.module_utils"))
            print("| %s | %.1f | %.1f |" % (module, basic / 1000.0, own / 1000.0))


if __name__ == "__main__":
    main()
