# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Turn the repetitions of one fleet size into the figures quoted (medians), and all sizes into the
Markdown tables that go into benchmarks/RESULTS.md."""

from __future__ import annotations

import statistics

from playbook_run import PSS_SAMPLE_SECONDS, SAMPLE_SECONDS

MIB = 1024 * 1024
RUNS = ("floor", "bound", "converge", "noop")
HOST_WORK_FIELDS = ("dispatched", "module_tasks", "controller_tasks", "skipped", "modules", "connection_ops")


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def host_work_by_class(noop_events, nodes):
    """Mean work per host on the no-op run, for GPU hosts and CPU-only hosts apart (a CPU-only host
    stops after the detection, so one mean over both would describe neither)."""
    classes = {"gpu": [node.name for node in nodes if node.has_gpu],
               "cpu_only": [node.name for node in nodes if not node.has_gpu]}
    summary = {}
    for label, names in classes.items():
        works = [noop_events.hosts[name] for name in names if name in noop_events.hosts]
        summary[label] = {field: _mean(getattr(work, field) for work in works) for field in HOST_WORK_FIELDS}
        summary[label]["hosts"] = len(names)
    return summary


def _mib(size):
    return None if size is None else size / MIB


def _measured(run):
    return {"wall_seconds": run.wall_seconds, "peak_tree_rss_mib": run.peak_tree_rss / MIB,
            "peak_forks_rss_mib": run.peak_forks_rss / MIB, "peak_main_rss_mib": run.peak_main_rss / MIB,
            # None: smaps_rollup missing or unreadable
            "peak_tree_pss_mib": _mib(run.peak_tree_pss), "peak_forks_pss_mib": _mib(run.peak_forks_pss),
            "peak_processes": run.peak_processes, "memory_samples": run.samples, "pss_samples": run.pss_samples}


def repetition_record(runs, floor_events, noop_events, nodes):
    """One repetition: the four runs measured from outside, and the floor's and no-op run's events."""
    record = {name: _measured(run) for name, run in runs.items()}
    stat = floor_events.tasks[0]  # floor.yml has one task
    record["floor"]["stat_ms_per_host"] = stat.host_seconds / stat.ran * 1000
    record["noop"].update({
        # interpreter, imports, inventory and playbook parsing, until the first play starts
        "startup_seconds": noop_events.playbook_start - runs["noop"].started,
        "tasks_seconds": sum(task.wall_seconds for task in noop_events.tasks),
        "changed_results": noop_events.changed,
        "per_host": host_work_by_class(noop_events, nodes),
    })
    for name, events in (("floor", floor_events), ("noop", noop_events)):
        # CPU per host: where a run's time goes when the machine's cores are the limit (ms)
        record[name]["cpu_ms_per_host"] = {
            "main": events.main_cpu / len(nodes) * 1000, "workers": events.worker_cpu / len(nodes) * 1000,
            "modules": events.module_cpu / len(nodes) * 1000,
            # the workers' whole life (fork, task setup, result sent) and their modules
            "children": events.children_cpu / len(nodes) * 1000}
    # the floor: the mean of the runs right before and right after the no-op, which bracket it
    floors = [runs[name].wall_seconds for name in ("floor", "floor_after") if name in runs]
    floor = sum(floors) / len(floors)
    record["floor"]["bracketed_seconds"] = floor
    record["floor"]["after_to_before"] = floors[-1] / floors[0]  # how far the machine drifted across the no-op
    record["ratios"] = {"converge_to_floor": runs["converge"].wall_seconds / floor,
                        "noop_to_floor": runs["noop"].wall_seconds / floor,
                        # the least a converge of two module executions per changed host could be, and the rest
                        "bound_to_floor": runs["bound"].wall_seconds / floor,
                        "converge_to_bound": runs["converge"].wall_seconds / runs["bound"].wall_seconds}
    return record


def task_breakdown(runs):
    """A run's tasks (the converge's or the no-op run's), averaged over repetitions, in the order they ran."""
    merged = {}
    for events in runs:
        for task in events.tasks:
            merged.setdefault(task.location, []).append(task)
    rows = []
    for location, tasks in merged.items():
        ran = _mean(task.ran for task in tasks)
        rows.append({
            "location": location, "name": tasks[0].name, "action": tasks[0].action, "play": tasks[0].play,
            "ran_on": ran, "skipped_on": _mean(task.skipped for task in tasks),
            "changed_on": _mean(task.changed for task in tasks),
            "modules_per_run": _mean(task.modules for task in tasks) / ran if ran else 0.0,
            "module_names": sorted(set().union(*(task.module_names for task in tasks))),
            "connection_ops_per_run": _mean(task.connection_ops for task in tasks) / ran if ran else 0.0,
            "wall_ms": _mean(task.wall_seconds for task in tasks) * 1000,
            "ms_per_host": (_mean(task.host_seconds for task in tasks) / ran * 1000) if ran else 0.0,
        })
    return rows


def size_summary(size, fleet, repetitions, breakdown, converge_breakdown):
    """The figures quoted for one size: medians over repetitions (ratios: median of the per-repetition ratios)."""
    def median(*keys):
        values = []
        for record in repetitions:
            value = record
            for key in keys:
                value = value[key]
            values.append(value)
        return None if None in values else statistics.median(values)  # None: not measured (PSS unreadable)

    summary = {"hosts": size, "fleet": fleet, "repetitions": repetitions, "noop_tasks": breakdown,
               "converge_tasks": converge_breakdown}
    for run in RUNS:
        summary[run] = {field: median(run, field)
                        for field in ("wall_seconds", "peak_tree_rss_mib", "peak_forks_rss_mib", "peak_main_rss_mib",
                                      "peak_tree_pss_mib", "peak_forks_pss_mib", "peak_processes")}
        summary[run]["ms_per_host"] = summary[run]["wall_seconds"] / size * 1000
    summary["floor"]["stat_ms_per_host"] = median("floor", "stat_ms_per_host")
    summary["floor"]["after_to_before"] = median("floor", "after_to_before")
    summary["floor"]["bracketed_seconds"] = median("floor", "bracketed_seconds")
    summary["noop"]["startup_seconds"] = median("noop", "startup_seconds")
    summary["noop"]["tasks_seconds"] = median("noop", "tasks_seconds")
    summary["noop"]["changed_results"] = max(record["noop"]["changed_results"] for record in repetitions)
    summary["noop"]["per_host"] = {
        label: {field: median("noop", "per_host", label, field) for field in HOST_WORK_FIELDS + ("hosts",)}
        for label in ("gpu", "cpu_only")}
    summary["ratios"] = {name: median("ratios", name) for name in
                         ("converge_to_floor", "noop_to_floor", "bound_to_floor", "converge_to_bound")}
    return summary


# ---------------------------------------------------------------- Markdown

def _num(value):
    return ("%.1f" % value).rstrip("0").rstrip(".")


def _modules(row):
    """'2 (stat, file)': how many modules a task ran per host, and which."""
    names = [name.rsplit(".", 1)[-1] for name in row["module_names"]]
    return _num(row["modules_per_run"]) + (" (%s)" % ", ".join(names) if names else "")


def _pair(per_host, field):
    return "%s · %s" % (_num(per_host["gpu"][field]), _num(per_host["cpu_only"][field]))


def markdown(summaries, settings):
    sections = [_header(summaries, settings), _wall_table(summaries), _fleets(summaries), _work_table(summaries),
                _memory_table(summaries), _warnings(summaries)]
    sections += [breakdown_markdown(summary, run) for summary in summaries for run in ("noop", "converge")]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def _header(summaries, settings):
    collection = settings["collection"]
    return ["Command: `%s%s./benchmarks/fleet.sh %s` (FORKS=%d, REPS=%d); collection at %s%s; %s." % (
        "".join(setting + " " for setting in settings["ansible_environment"]),
        "FLEET_REF=%s " % collection["commit"] if collection["files_sha256"] is None else "",
        " ".join(str(summary["hosts"]) for summary in summaries), settings["forks"], settings["reps"],
        collection["commit"], " with uncommitted changes" if collection["uncommitted_changes"] else "",
        settings["versions"]),
        "Every figure is the median of %d repetition(s); in each repetition the bound, the converge, the floor, "
        "the no-op run and the floor again follow each other on a freshly built fleet; a ratio's floor is the mean "
        "of the two floors that bracket the no-op, and the ratios are medians of the per-repetition ratios." % (
            settings["reps"])]


def _wall_table(summaries):
    out = ["| hosts | GPU hosts | clusters | floor | floor after / before | bound | converge | no-op | bound / floor "
           "| converge / floor | converge / bound | no-op / floor | converge per host | no-op per host |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for summary in summaries:
        ratios = summary["ratios"]
        out.append("| %d | %d | %d | %.1f s | %.2fx | %.1f s | %.1f s | %.1f s | %.2fx | %.2fx | %.2fx | **%.2fx** "
                   "| %.0f ms | %.0f ms |" % (
                       summary["hosts"], summary["fleet"]["gpu_hosts"], summary["fleet"]["clusters"],
                       summary["floor"]["bracketed_seconds"], summary["floor"]["after_to_before"],
                       summary["bound"]["wall_seconds"],
                       summary["converge"]["wall_seconds"], summary["noop"]["wall_seconds"], ratios["bound_to_floor"],
                       ratios["converge_to_floor"], ratios["converge_to_bound"], ratios["noop_to_floor"],
                       summary["converge"]["ms_per_host"], summary["noop"]["ms_per_host"]))
    out += ["", "bound: one task per host, one `stat`, and a second `stat` in the same task on each GPU host (the hosts "
                "the converge changes): the two module executions a changed host needs at least, with no decision "
                "and no write (`read_write_bound.yml`)."]
    return out


def _fleets(summaries):
    out = ["Fleets (2 CPU-only servers per cluster, one toolkit layout per cluster, every 4th agent CPU-only):", ""]
    for summary in summaries:
        fleet = summary["fleet"]
        manifests = statistics.median(record["converge"]["manifests_written"] for record in summary["repetitions"])
        out.append("- %d hosts: %s; %s; RuntimeClass manifests written: %s" % (
            summary["hosts"], ", ".join("%s: %d" % item for item in fleet["release_lines"].items()),
            ", ".join("%s %d" % item for item in fleet["layouts"].items()), _num(manifests)))
    return out


def _work_table(summaries):
    out = ["No-op run, per host (GPU host · CPU-only host): tasks sent to a worker, of those the tasks that ran "
           "a module, those that ran on the controller side only (set_fact, debug, assert, include_tasks), and "
           "those skipped; module executions (an action plugin may run several) and connection operations "
           "(commands and file transfers: round trips over ssh).",
           "",
           "| hosts | tasks sent | ran a module | controller side | skipped | module executions | connection ops |",
           "|---|---|---|---|---|---|---|"]
    for summary in summaries:
        per_host = summary["noop"]["per_host"]
        out.append("| %d | %s |" % (summary["hosts"], " | ".join(_pair(per_host, field) for field in HOST_WORK_FIELDS)))
    return out


def _memory_table(summaries):
    out = ["Controller memory, peaks, floor · bound · converge · no-op: ansible-playbook and every descendant added up "
           "(with the local connection, also each host's module process), ansible-playbook and its forked "
           "workers added up (what a controller of a real fleet holds), and ansible-playbook alone (VmHWM). "
           "RSS is sampled every %.0f ms and counts copy-on-write pages once per process, so its sums are upper "
           "bounds; PSS (every %.0f ms) splits shared pages among the processes that share them, so the PSS "
           "sum is what the processes really occupy together (n/a: smaps_rollup unreadable)." % (
               SAMPLE_SECONDS * 1000, PSS_SAMPLE_SECONDS * 1000),
           "",
           "| hosts | all descendants, RSS | all descendants, PSS | ansible-playbook + workers, RSS "
           "| ansible-playbook + workers, PSS | ansible-playbook | most processes |",
           "|---|---|---|---|---|---|---|"]
    for summary in summaries:
        def three(field, unit=" MiB"):
            values = (summary[run][field] for run in RUNS)
            return " · ".join("n/a" if value is None else "%.0f" % value for value in values) + unit
        out.append("| %d | %s | %s | %s | %s | %s | %s |" % (
            summary["hosts"], three("peak_tree_rss_mib"), three("peak_tree_pss_mib"), three("peak_forks_rss_mib"),
            three("peak_forks_pss_mib"), three("peak_main_rss_mib"), three("peak_processes", "")))
    return out


def _warnings(summaries):
    out = []
    for summary in summaries:
        if summary.get("collection_changed"):
            out.append("**%d hosts: the collection's files changed during the measurement; these figures mix "
                       "versions.**" % summary["hosts"])
        if summary["noop"]["changed_results"]:
            out.append("**%d hosts: the no-op run reported %d changed results (a second run must change nothing).**" % (
                summary["hosts"], summary["noop"]["changed_results"]))
    return out


def breakdown_markdown(summary, run="noop"):
    """The task table of one run ("noop" or "converge") of one size."""
    hosts, measured, rows = summary["hosts"], summary[run], summary.get(run + "_tasks") or []
    if not rows:
        return []
    title = "No-op run" if run == "noop" else "Converge (first run on an untouched fleet)"
    out = ["%s at %d hosts (%d with a GPU), task by task (means over repetitions): hosts it ran on and was "
           "skipped on, module executions and connection operations per host it ran on, wall time from its start "
           "to its last host's result, and time in the worker per host it ran on (the floor's stat: %.0f ms)." % (
               title, hosts, summary["fleet"]["gpu_hosts"], summary["floor"]["stat_ms_per_host"]),
           "",
           "| task | where | action | ran | skipped | modules | conn. ops | wall | per host |",
           "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        out.append("| %s | `%s` | %s | %s | %s | %s | %s | %.0f ms | %.0f ms |" % (
            row["name"].replace("|", "\\|"), row["location"], row["action"].replace("ansible.builtin.", ""),
            _num(row["ran_on"]), _num(row["skipped_on"]), _modules(row),
            _num(row["connection_ops_per_run"]), row["wall_ms"], row["ms_per_host"]))
    plays = {}
    for row in rows:
        plays[row["play"]] = plays.get(row["play"], 0.0) + row["wall_ms"] / 1000
    never_ran = [row for row in rows if not row["ran_on"]]
    startup = measured.get("startup_seconds")
    out += ["",
            "Where the %.1f s go: %sin tasks %s; the rest (%.1f s) between tasks and plays. %d tasks were skipped on "
            "every host and still took %.1f s together." % (
                measured["wall_seconds"],
                "%.1f s from the process start until the playbook is loaded; " % startup if startup is not None else "",
                ", ".join("%.1f s in '%s'" % (seconds, play) for play, seconds in plays.items()),
                measured["wall_seconds"] - (startup or 0.0) - sum(plays.values()),
                len(never_ran), sum(row["wall_ms"] for row in never_ran) / 1000)]
    return out
