# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fleet benchmark: k3s_gpu.nvidia.site on a simulated fleet of sandbox nodes (localhost), first
converge and a no-op second run, against a floor of one ansible.builtin.stat per host and a bound for the
converge (a second stat in the same task on each host the converge changes); per size, the wall times,
ratios, work per host, the runs task by task and the controller's memory.

Run it through benchmarks/fleet.sh (venv and collection path); see benchmarks/fleet/README.md."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import events
import playbook_run
import report
import sandbox_fleet

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_SIZES = (10, 50, 100, 200)
# no package installs (on a sandbox tree the role installs none anyway; this keeps it so on any root)
SITE_EXTRA_VARS = {"gpu_node_driver_install": False, "gpu_node_toolkit_install": False}
MANIFEST_GLOB = "*/var/lib/rancher/*/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml"
# what the plays run: the collection is used from the checkout, so edits during a run change the figures
COLLECTION_DIRS = ("roles", "plugins", "playbooks", "meta")


def progress(message):
    print(message, file=sys.stderr, flush=True)


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("sizes", nargs="*", type=positive_int, default=list(DEFAULT_SIZES),
                        help="fleet sizes in hosts (default: %s)" % " ".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--forks", type=positive_int, default=int(os.environ.get("FORKS", "10")))
    parser.add_argument("--reps", type=positive_int, default=int(os.environ.get("REPS", "3")))
    parser.add_argument("--work-dir", help="an empty directory for the trees and logs, removed by the caller "
                                           "(default: a temporary directory removed at exit)")
    parser.add_argument("--json", dest="json_path",
                        help="results file (default: .tmp/fleet-bench/fleet-<date>.json in the checkout)")
    return parser.parse_args()


def harness_environment(work_dir):
    """The ANSIBLE_* settings of every run (the caller's other ANSIBLE_* variables pass through)."""
    return {
        "ANSIBLE_CALLBACK_PLUGINS": os.path.join(HERE, "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "fleet_events",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",  # what an operator watches, output to a log file
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        # keep ansible's scratch files with the trees, removed with them
        "ANSIBLE_LOCAL_TEMP": os.path.join(work_dir, "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": os.path.join(work_dir, "ansible-remote"),
    }


class Bench:
    def __init__(self, work_dir, forks):
        self.work_dir = work_dir
        self.forks = forks
        bin_dir = os.path.dirname(sys.executable)  # the venv's python runs this, its ansible-playbook runs the plays
        self.ansible_playbook = os.path.join(bin_dir, "ansible-playbook")
        self.env = dict(os.environ, **harness_environment(work_dir))

    def run(self, path_prefix, inventory, playbook, extra_vars=None):
        """One ansible-playbook run; its log and events go to path_prefix.log and .events.jsonl."""
        events_path, log_path = path_prefix + ".events.jsonl", path_prefix + ".log"
        if os.path.exists(events_path):
            os.remove(events_path)  # the callback appends (a size given twice reuses the names)
        argv = [self.ansible_playbook, "-i", inventory, "--forks", str(self.forks), playbook]
        if extra_vars:
            argv += ["-e", json.dumps(extra_vars)]
        env = dict(self.env, FLEET_EVENTS_OUT=events_path)
        run = playbook_run.run_playbook(argv, env, log_path, REPO_ROOT)
        # no events file: ansible-playbook stopped before its first play
        run_events = events.read_events(events_path, REPO_ROOT) if os.path.exists(events_path) else None
        if run.returncode != 0 or run_events is None or run_events.failed:
            with open(log_path, encoding="utf-8", errors="replace") as handle:
                tail = handle.read()[-6000:]
            raise SystemExit("%s: ansible-playbook exited %d (failed host results: %s); end of its output:\n%s" % (
                os.path.basename(path_prefix), run.returncode, run_events.failed if run_events else "-", tail))
        return run, run_events

    def measure_size(self, size, reps):
        nodes = sandbox_fleet.plan_fleet(size)
        fleet = sandbox_fleet.describe(nodes)
        size_dir = os.path.join(self.work_dir, "fleet-%d" % size)
        trees_dir = os.path.join(size_dir, "nodes")
        os.makedirs(size_dir, exist_ok=True)
        inventory = os.path.join(size_dir, "inventory.json")
        sandbox_fleet.write_inventory(inventory, trees_dir, nodes, sys.executable)
        progress("== %d hosts: %d clusters, %d GPU hosts, %s" % (
            size, fleet["clusters"], fleet["gpu_hosts"], ", ".join("%s %d" % item for item in fleet["layouts"].items())))

        repetitions, converge_runs, noop_runs = [], [], []
        for rep in range(1, reps + 1):
            sandbox_fleet.write_trees(trees_dir, nodes)  # every converge starts from an untouched fleet
            prefix = os.path.join(size_dir, "rep%d-" % rep)
            bound = self.run(prefix + "bound", inventory, os.path.join(HERE, "read_write_bound.yml"),
                             {"fleet_gpu_hosts": [node.name for node in nodes if node.has_gpu]})[0]
            converge, converge_events = self.run(prefix + "converge", inventory, "k3s_gpu.nvidia.site", SITE_EXTRA_VARS)
            manifests = len(glob.glob(os.path.join(trees_dir, MANIFEST_GLOB)))
            # the floor right before the no-op and again right after it: on a shared VM the same work costs more
            # or less CPU from one run to the next, and at 1,000 hosts a floor measured before the bound and the
            # converge ran 13 minutes before the no-op
            floor, floor_events = self.run(prefix + "floor", inventory, os.path.join(HERE, "floor.yml"))
            noop, noop_events = self.run(prefix + "noop", inventory, "k3s_gpu.nvidia.site", SITE_EXTRA_VARS)
            floor_after = self.run(prefix + "floor-after", inventory, os.path.join(HERE, "floor.yml"))[0]
            record = report.repetition_record({"floor": floor, "bound": bound, "converge": converge, "noop": noop,
                                               "floor_after": floor_after}, floor_events, noop_events, nodes)
            record["converge"].update(changed_results=converge_events.changed, manifests_written=manifests)
            repetitions.append(record)
            converge_runs.append(converge_events)
            noop_runs.append(noop_events)
            progress("   rep %d/%d: bound %.1f s, converge %.1f s, floor %.1f s, no-op %.1f s, floor after %.1f s "
                     "(no-op/floor %.2fx, changed on no-op %d)" % (
                         rep, reps, bound.wall_seconds, converge.wall_seconds, floor.wall_seconds, noop.wall_seconds,
                         floor_after.wall_seconds, record["ratios"]["noop_to_floor"], noop_events.changed))
            cpu = [" · ".join("%.1f ms" % record[name]["cpu_ms_per_host"][part]
                              for part in ("main", "workers", "modules", "children")) for name in ("floor", "noop")]
            progress("   CPU per host, main process · in the workers' task · in modules · workers whole with modules: "
                     "floor %s; no-op %s" % tuple(cpu))
        summary = report.size_summary(size, fleet, repetitions, report.task_breakdown(noop_runs),
                                      report.task_breakdown(converge_runs))
        summary["nodes"] = [dataclasses.asdict(node) for node in nodes]
        return summary


def _git(*args):
    return subprocess.run(("git", "-C", REPO_ROOT) + args, check=True, capture_output=True).stdout


def collection_state():
    """The commit, whether the collection has uncommitted changes, and a hash of its files as they are
    (FLEET_REF: the plays run a commit unpacked by fleet.sh, which nobody edits)."""
    ref = os.environ.get("FLEET_REF")
    if ref:
        return {"commit": _git("rev-parse", "--short", ref).decode().strip(), "uncommitted_changes": False,
                "files_sha256": None}
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *COLLECTION_DIRS)
    digest = hashlib.sha256()
    for name in sorted(filter(None, listed.split(b"\0"))):
        path = os.path.join(REPO_ROOT, os.fsdecode(name))
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                digest.update(name + b"\0" + handle.read() + b"\0")
    return {"commit": _git("rev-parse", "--short", "HEAD").decode().strip(),
            "uncommitted_changes": bool(_git("status", "--porcelain", "--", *COLLECTION_DIRS).strip()),
            "files_sha256": digest.hexdigest()[:16]}


def ansible_settings_passed_through():
    """The caller's ANSIBLE_* variables (e.g. ANSIBLE_PIPELINING=1), for the report; a value with a path
    in it is named only, so that no path of this machine lands in the results."""
    ours = set(harness_environment("")) | {"ANSIBLE_COLLECTIONS_PATH"}
    return ["%s=%s" % (name, value) if "/" not in value else name + " (set)"
            for name, value in sorted(os.environ.items()) if name.startswith("ANSIBLE_") and name not in ours]


def versions():
    from ansible.release import __version__ as ansible_version  # pylint: disable=import-outside-toplevel
    return "ansible-core %s, Python %s, %d CPUs, kernel %s" % (
        ansible_version, platform.python_version(), os.cpu_count(), platform.release())


def main():
    args = parse_args()
    if not os.environ.get("ANSIBLE_COLLECTIONS_PATH"):
        raise SystemExit("ANSIBLE_COLLECTIONS_PATH is not set: run ./benchmarks/fleet.sh")
    if any(size < sandbox_fleet.SERVERS_PER_CLUSTER + 1 for size in args.sizes):
        raise SystemExit("every size must be at least %d hosts" % (sandbox_fleet.SERVERS_PER_CLUSTER + 1))
    json_path = args.json_path or os.path.join(
        REPO_ROOT, ".tmp", "fleet-bench", time.strftime("fleet-%Y%m%d-%H%M%S.json"))
    settings = {"forks": args.forks, "reps": args.reps, "versions": versions(), "date": time.strftime("%Y-%m-%d %H:%M"),
                "site_extra_vars": SITE_EXTRA_VARS, "collection": collection_state(),
                "ansible_environment": ansible_settings_passed_through()}

    # fleet.sh passes its own mktemp directory (removed by its trap, even when this is killed)
    owned = contextlib.nullcontext(args.work_dir) if args.work_dir else tempfile.TemporaryDirectory(prefix="fleet-bench.")
    with owned as work_dir:
        bench = Bench(work_dir, args.forks)
        summaries = []
        for size in args.sizes:
            before = collection_state()["files_sha256"]
            summary = bench.measure_size(size, args.reps)
            # someone editing the role during a run would mix two versions in one size's figures
            summary["collection_changed"] = collection_state()["files_sha256"] != before
            if summary["collection_changed"]:
                progress("WARNING: the collection's files changed while %d hosts were measured" % size)
            summaries.append(summary)

    text = report.markdown(summaries, settings)
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w", encoding="utf-8") as handle:
        json.dump({"settings": settings, "sizes": summaries, "markdown": text}, handle, indent=1)
    print(text)
    progress("results: %s" % os.path.relpath(json_path))


if __name__ == "__main__":
    main()
