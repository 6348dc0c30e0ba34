# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's restart of k3s/rke2/containerd after a change (its handler), as decisions: whether to restart,
whether the restarted service is healthy, and what a rollback puts back.

Healthy = the unit is active, stays active longer than its restart delay without restarting (a crash-looping unit is
briefly active between crashes), and the config containerd loads declares every expected runtime table.

PRIVATE to the collection."""

from __future__ import annotations

STATE_KEYS = ("ActiveState", "SubState", "NRestarts")
JOURNAL_LINES = 5


def why_not(check_mode, restart, live, units):
    """Why the service is not restarted ("" when it is)."""
    if check_mode:
        return "check mode"
    if not restart:
        return "gpu_node_restart is false"
    if not live:
        return "gpu_node_root is a sandbox tree"
    if not units:
        return "no systemd unit found"
    return ""


def notified(check_mode, restart, live):
    """Whether a change is written by the role's task that notifies the restart handler. Where not (check mode,
    gpu_node_restart false, a sandbox tree), the host step writes it and says itself that a restart is needed, and the
    fleet pays no handler task per changed host."""
    return not check_mode and bool(restart) and bool(live)


def not_restarted(host, service, reason):
    """The line that says a change waits for a restart that the role does not do."""
    return "%s: the containerd configuration changed; restart %s to apply it (%s)." % (host, service, reason)


def unit_state(status):
    return [str((status or {}).get(key, "")) for key in STATE_KEYS]


def problems(unit, first, second, expected, loaded_config, timeout, settle):
    """What is wrong with the restarted service ([] when healthy). first, second: unit_state() of the two readings."""
    found = []
    if first[0] != "active":
        found.append("%s did not become active within %s s (%s)" % (unit, timeout, "/".join(first)))
    if second != first:
        found.append("%s is not stable (ActiveState/SubState/NRestarts %s, then %s s later %s)" % (
            unit, "/".join(first), settle, "/".join(second)))
    missing = [name for name in expected if name not in ((loaded_config or {}).get("runtimes") or [])]
    if missing:
        found.append("%s lacks the runtime tables %s" % ((loaded_config or {}).get("path"), ", ".join(missing)))
    return found


def rollback(files):
    """(paths to remove: files this run created, [(backup, path)] to copy back: files it changed or removed)."""
    created = [f["path"] for f in files if f.get("action") == "created"]
    restored = [(f["backup_file"], f["path"]) for f in files if f.get("action") != "created" and f.get("backup_file")]
    return created, restored


def rewritten(files):
    """[(text, path)]: files this run changed or removed without a copy on the node (the take-back keeps none), to
    write back from the text the run read."""
    return [(f["restore_content"], f["path"]) for f in files
            if f.get("action") != "created" and not f.get("backup_file") and f.get("restore_content") is not None]


def failure(host, found, unit, journal_lines):
    return ("%s: the new containerd configuration was rolled back because %s. The old files are restored and %s was "
            "restarted on them. Last log lines of the failed start: %s" % (
                host, "; ".join(found), unit, " | ".join(line[:300] for line in journal_lines)))
