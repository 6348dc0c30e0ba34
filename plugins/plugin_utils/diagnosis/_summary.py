# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet summary of k3s_gpu.nvidia.site: one row and one line per host from its gpu_node_result (pure).

PRIVATE to the collection."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import guarded
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _disruption as disruption

_LISTS = ("runtimes_detected", "handlers", "written", "rendered_by_release", "operator_runtimes", "pending")


def rollout_entry(disruption, planned=None, failure=None):
    """What the rollout says of one host: its changes and whether they disrupt (gpu_node__disruption), its wave
    (k3s_gpu__rollout's entry) and the failure its rescue kept; None when the role classified nothing there."""
    if not isinstance(disruption, dict) or "disruptive" not in disruption:
        return None
    planned = planned if isinstance(planned, dict) else {}
    return {"disruptive": bool(disruption.get("disruptive")), "reason": disruption.get("reason") or "",
            "changes": [dict((k, c.get(k)) for k in ("change", "disruptive")) for c in disruption.get("changes") or []],
            "drain": bool(disruption.get("drain")), "wave": planned.get("wave"), "canary": bool(planned.get("canary")),
            "failure": guarded(str(failure)) if failure else None}


def _rollout_part(rollout, files_changed=False):
    """What the line says of the rollout; files_changed: the run changed (or would change) the node's files, whose
    restart is not disruptive."""
    changes = [c["change"] for c in (rollout or {}).get("changes") or []]
    if files_changed and disruption.RESTART_CHANGE not in changes:
        changes.append(disruption.RESTART_CHANGE)
    if not rollout or not changes:
        return None
    if not rollout["disruptive"]:
        return "not disruptive (%s)" % ", ".join(changes)
    where = ("wave %s%s" % (rollout["wave"], ", canary" if rollout["canary"] else "")) if rollout["wave"] else ""
    how = "drained" if rollout["drain"] else "NOT DRAINED"
    return "DISRUPTIVE: %s (%s)" % (rollout["reason"], ", ".join(part for part in (where, how) if part))


# a host's status when the role never decided one: the run left it out, or it failed or was unreachable first
LEFT_OUT = "left out"
UNREACHABLE = "unreachable"
FAILED = "failed"
NO_GPU = "skipped"  # the role's status for a host without an NVIDIA GPU
NOT_REACHED = "failed or unreachable"  # no result and nothing kept: a play without the site's rescue
FAILING = (FAILED, UNREACHABLE, NOT_REACHED)  # the statuses that fail the run


def row(host, result, check_mode=False, rollout=None, failure=None, left_out=None, cluster=""):
    """The summary row of one host; `result` is its gpu_node_result (None: the role never reached it); rollout: its
    rollout_entry(); failure: the message of the failure site's rescue kept for it; left_out: why the run did not
    reach it (the batches stopped); cluster: its k3s_gpu_cluster."""
    result = result if isinstance(result, dict) else {}
    # Ansible's own mark, or site's host step on a node it could not reach (ignore_unreachable)
    unreachable = bool(result.get("unreachable") or result.get("node_unreachable"))
    if rollout and rollout.get("failure"):
        result = dict(result, failed=True, msg=rollout["failure"])
    elif failure and not unreachable:
        result = dict(result, failed=True, msg=failure)
    # the first pass's reading only (work_due): site's batches stopped before the role went further on the host
    left = bool(left_out) and (bool(result.get("work_due")) or "status" not in result)
    failed = bool(result.get("failed")) or unreachable or "status" not in result or left
    if unreachable:
        status = UNREACHABLE
    elif result.get("failed"):
        status = FAILED
    elif left:
        status, result = LEFT_OUT, dict(result, msg=left_out)
    elif "status" in result:
        status = result["status"]
    else:
        status = NOT_REACHED
    # host_changed: set by the restart handler, whose own `changed` is the restart
    changed = bool(result.get("host_changed", result.get("changed"))) and not failed
    restarted = bool(result.get("restarted"))
    entry = {
        # a module's own message may carry a URL it fetched, with its password
        # a host step's msg on a host it configured says what it told the host (the row says it its own way)
        "host": host, "cluster": cluster or "", "status": status,
        "reason": guarded(str(result.get("reason") or (result.get("msg") if failed or status == LEFT_OUT else "") or "")),
        "distribution": result.get("distribution") or "", "release": result.get("release") or "",
        "restarted": restarted, "verified": result.get("verified"), "mode": result.get("mode") or "host",
        "reboot_required": bool(result.get("reboot_required")),
        "runtime_in_use": result.get("runtime_in_use"), "cgroup_driver_mismatch": result.get("cgroup_driver_mismatch"),
        "default_runtime": result.get("default_runtime"), "node_labels": result.get("node_labels") or [],
        "files": [{"path": f.get("node_path") or f.get("path"), "action": f.get("action")} for f in result.get("files") or []],
        # what this run did to the host's files, or would do (check mode); and a change the service has not read yet
        "changed": changed and not check_mode, "would_change": changed and check_mode,
        "restart_needed": changed and not restarted, "rollout": rollout,
    }
    for key in _LISTS:
        entry[key] = list(result.get(key) or [])
    return entry


def _files(entry):
    return ", ".join("%s %s" % (f["action"], f["path"]) for f in entry["files"])


def _what_changed(entry, changed, would_change, nothing):
    """The part of a line that says what this run changed, would change (check mode), or that nothing did."""
    if entry["would_change"]:
        return "%s: %s" % (would_change, _files(entry))
    if entry["changed"]:
        return "%s: %s" % (changed, _files(entry))
    return nothing


def _restart(entry, check_mode):
    if entry["restarted"]:
        return "restarted, verified " + {True: "yes", False: "NO", None: "-"}[entry["verified"]]
    if entry["restart_needed"]:
        return "RESTART NEEDED" + (" (check mode)" if check_mode else "")
    return None


def line(entry, check_mode=False):
    """One line per host that never contradicts itself (only what the row says, each fact once)."""
    parts = ["%s: %s" % (entry["host"], entry["status"]) + (" (%s)" % entry["reason"] if entry["reason"] else "")]
    rollout = _rollout_part(entry.get("rollout"), bool(entry["changed"] or entry["would_change"]))
    if rollout:
        parts.append(rollout)
    if entry["distribution"]:
        parts.append("%s %s" % (entry["distribution"], entry["release"]))
    if entry["status"] == "absent":
        # gpu_node_state=absent: what was taken back, or would be
        parts.append(_what_changed(entry, "taken back", "WOULD TAKE BACK", "nothing of ours left"))
        restart = _restart(entry, check_mode)
        return " | ".join(parts + ([restart] if restart else []))
    if entry["status"] != "configured":
        return " | ".join(parts)
    parts.append("detected " + (",".join(entry["runtimes_detected"]) or "-"))
    parts.append("written " + (",".join(entry["written"]) or "-"))
    parts.append("by release " + (",".join(entry["rendered_by_release"]) or "-"))
    if entry["would_change"] or entry["changed"]:
        parts.append(_what_changed(entry, "changed", "WOULD CHANGE", None))
    default = entry["default_runtime"]
    if default:
        parts.append("default runtime %s (%s)" % (default.get("name"), default.get("how")))
    if entry["node_labels"]:
        parts.append("%d node labels" % len(entry["node_labels"]))
    restart = _restart(entry, check_mode)
    if restart:
        parts.append(restart)
    parts.append("%s mode" % entry["mode"])
    if entry["operator_runtimes"]:
        parts.append("operator runtimes %s (RuntimeClasses of the same names route to them)" % ",".join(entry["operator_runtimes"]))
    if entry["pending"]:
        parts.append("PENDING: " + "; ".join(entry["pending"]))
    if entry["reboot_required"]:
        parts.append("REBOOT NEEDED")
    in_use = entry["runtime_in_use"] or {}
    if in_use.get("distribution") and in_use.get("runtime") == "containerd":
        parts.append("pods on the host containerd (%s container-runtime-endpoint)" % in_use["distribution"])
    if entry["cgroup_driver_mismatch"]:
        parts.append("CGROUP DRIVER MISMATCH: " + ",".join(entry["cgroup_driver_mismatch"].get("runtimes") or []))
    return " | ".join(parts)


def cluster_row(result, check_mode=False):
    """The summary row of one cluster from its gpu_cluster result (a loop item of the cluster step)."""
    result = result if isinstance(result, dict) else {}
    failed = bool(result.get("failed")) or bool(result.get("unreachable"))
    changed = bool(result.get("changed")) and not failed
    operator = result.get("gpu_operator") or {}
    classes = result.get("runtimeclasses") or {}
    plugin = result.get("device_plugin") or {}
    item = result.get("item") if isinstance(result.get("item"), dict) else {}  # the plan's entry, when not written
    return {
        "cluster": result.get("cluster") or item.get("name") or "", "writer": result.get("writer") or item.get("writer") or "",
        "status": "failed" if failed else "done", "reason": result.get("msg") if failed else "",
        "complete": bool(result.get("complete", item.get("complete", True))),
        "gpu_operator": operator.get("chart_version") if operator.get("wanted") else None,
        "runtimeclasses": list(classes.get("written") or []),
        "device_plugin": dict((k, plugin.get(k)) for k in ("chart_version", "runtime_class", "device_list_strategy", "sharing"))
        if plugin.get("wanted") else None,
        "files": [{"path": f.get("path"), "action": f.get("action")} for f in result.get("files") or []],
        "changed": changed and not check_mode, "would_change": changed and check_mode,
    }


def cluster_line(entry, check_mode=False):
    parts = ["cluster %s: %s" % (entry["cluster"], entry["status"].upper() if entry["status"] == "failed" else "done")]
    if entry["status"] == "failed":
        parts.append(str(entry["reason"]))
        return " | ".join(parts)
    parts.append("from %s" % entry["writer"])
    parts.append(_what_changed(entry, "changed", "WOULD CHANGE", "unchanged"))
    parts.append("GPU Operator %s" % entry["gpu_operator"] if entry["gpu_operator"] else "no GPU Operator from this collection")
    parts.append("RuntimeClasses %s" % (",".join(entry["runtimeclasses"]) or "none of ours"))
    plugin = entry["device_plugin"]
    if plugin:
        sharing = plugin.get("sharing") or {}
        parts.append("device plugin %s (%s, %s%s)" % (plugin["chart_version"], plugin["runtime_class"],
                                                      plugin["device_list_strategy"],
                                                      ", %s x%s" % (sharing["strategy"], sharing["replicas"]) if sharing else ""))
    if not entry["complete"]:
        parts.append("partial run: nothing removed")
    return " | ".join(parts)


# bytes of summary lines one task prints: AWX drops a job event over 700,000 bytes; past this budget the hosts with nothing
# to say are folded into one line per cluster (names only; the JSON report keeps every row)
PRINT_BUDGET = 400000


def _quiet(entry):
    """A host whose line says only that it is as it should be (or has no GPU)."""
    if entry["status"] not in ("configured", "absent", NO_GPU):
        return False
    flags = ("changed", "would_change", "restart_needed", "reboot_required", "pending", "cgroup_driver_mismatch")
    return not any(entry[flag] for flag in flags) and not (entry["rollout"] or {}).get("disruptive")


def printed_lines(report, budget=PRINT_BUDGET):
    """The lines to print: every row's line while they fit in budget bytes, else the hosts with something to say one
    line each and the others folded per cluster and status, by name."""
    host_lines = report["lines"][:len(report["hosts"])]
    cluster_lines = report["lines"][len(report["hosts"]):]
    if sum(len(text) + 4 for text in report["lines"]) <= budget:
        return list(report["lines"])
    kept, folded = [], {}
    for entry, text in zip(report["hosts"], host_lines):
        if _quiet(entry):
            folded.setdefault((entry["cluster"], entry["status"]), []).append(entry["host"])
        else:
            kept.append(text)
    for (cluster, status), hosts in sorted(folded.items()):
        kept.append("cluster %s: %d hosts %s, nothing to change (each has its row in the JSON report): %s"
                    % (cluster or "-", len(hosts), "without a GPU" if status == NO_GPU else status, ", ".join(hosts)))
    return kept + cluster_lines


def totals(rows, cluster_rows):
    """What the totals line says: hosts ok / changed / failed / unreachable / no GPU / left out, per cluster too, and the
    clusters written or failed. A host is ok when the role decided its state (configured, absent, ...)."""
    def count(entries):
        found = {"hosts": len(entries), "ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "no_gpu": 0, "left_out": 0}
        for entry in entries:
            key = {FAILED: "failed", NOT_REACHED: "failed", UNREACHABLE: "unreachable", NO_GPU: "no_gpu",
                   LEFT_OUT: "left_out"}.get(entry["status"], "ok")
            found[key] += 1
            found["changed"] += int(bool(entry["changed"] or entry["would_change"]))
        return found
    per_cluster = {}
    for entry in rows:
        per_cluster.setdefault(entry["cluster"], []).append(entry)
    found = count(rows)
    found["clusters_done"] = sum(1 for c in cluster_rows if c["status"] != "failed")
    found["clusters_failed"] = sum(1 for c in cluster_rows if c["status"] == "failed")
    found["per_cluster"] = dict((name, count(entries)) for name, entries in sorted(per_cluster.items()))
    return found


def totals_line(found, check_mode=False):
    return ("totals: %(hosts)d hosts | %(ok)d ok (%(changed)d %(verb)s) | %(failed)d failed | %(unreachable)d unreachable | "
            "%(no_gpu)d no GPU | %(left_out)d left out | clusters: %(clusters_done)d done, %(clusters_failed)d failed"
            % dict(found, verb="would change" if check_mode else "changed"))


def summarize(results, check_mode=False, clusters=(), rollouts=None, failures=None, left_out=None, cluster_of=None):
    """{"hosts": [rows], "clusters": [rows], "lines": [lines], "counts": {status: n, "changed", "would_change",
    "restart_needed", "disruptive", ...}, "totals", "totals_line"}: rows sorted by cluster, then host. rollouts: {host:
    rollout_entry()}; failures: {host: the message its rescue kept}; left_out: {host: why the run did not reach it};
    cluster_of: {host: its cluster}."""
    rollouts, failures, left_out, cluster_of = rollouts or {}, failures or {}, left_out or {}, cluster_of or {}
    rows = sorted((row(host, result, check_mode, rollouts.get(host), failures.get(host), left_out.get(host),
                       cluster_of.get(host, "")) for host, result in results),
                  key=lambda entry: (entry["cluster"], entry["host"]))
    counts = {}
    for entry in rows:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
        for flag in ("changed", "would_change", "restart_needed", "reboot_required"):
            counts[flag] = counts.get(flag, 0) + int(bool(entry[flag]))
        counts["cgroup_driver_mismatch"] = counts.get("cgroup_driver_mismatch", 0) + int(bool(entry["cgroup_driver_mismatch"]))
        counts["disruptive"] = counts.get("disruptive", 0) + int(bool((entry["rollout"] or {}).get("disruptive")))
    cluster_rows = sorted((cluster_row(result, check_mode) for result in clusters or ()), key=lambda entry: entry["cluster"])
    counts["clusters_changed"] = sum(1 for c in cluster_rows if c["changed"] or c["would_change"])
    counts["clusters_failed"] = sum(1 for c in cluster_rows if c["status"] == "failed")
    lines = [line(entry, check_mode) for entry in rows] + [cluster_line(entry, check_mode) for entry in cluster_rows]
    found = totals(rows, cluster_rows)
    return {"hosts": rows, "clusters": cluster_rows, "lines": lines, "counts": counts, "totals": found,
            "totals_line": totals_line(found, check_mode)}
