# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The site report that always arrives (issue 44): failed, unreachable and left-out hosts are rows, rows sorted by cluster
then host, the totals, and what one task prints staying under AWX's event limit at 5,000 hosts."""

from __future__ import annotations

import json

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary

from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.plugin_utils.test__summary import CONFIGURED, SKIPPED

AWX_EVENT_LIMIT = 700000


def test_rows_are_sorted_by_cluster_then_host_and_the_totals_count_every_kind():
    results = [("gpu9", CONFIGURED), ("cpu1", SKIPPED), ("gpu2", {"failed": True, "node_unreachable": True,
                                                                  "msg": "unreachable: ssh: connect to host 127.0.0.1 port 1"}),
               ("gpu3", None), ("gpu1", dict(CONFIGURED, changed=False)), ("gpu4", {"failed": True, "msg": "no good"})]
    cluster_of = {"gpu9": "a", "cpu1": "b", "gpu2": "b", "gpu3": "b", "gpu1": "b", "gpu4": "a"}
    report = summary.summarize(results, cluster_of=cluster_of, failures={"gpu4": "gpu4: refused"},
                               left_out={"gpu3": "left out: 1 of the 4 hosts before this batch failed"})
    assert [(row["cluster"], row["host"]) for row in report["hosts"]] == [
        ("a", "gpu4"), ("a", "gpu9"), ("b", "cpu1"), ("b", "gpu1"), ("b", "gpu2"), ("b", "gpu3")]
    status = dict((row["host"], row["status"]) for row in report["hosts"])
    assert status == {"gpu4": "failed", "gpu9": "configured", "cpu1": "skipped", "gpu1": "configured",
                      "gpu2": "unreachable", "gpu3": "left out"}
    assert report["lines"][4] == "gpu2: unreachable (unreachable: ssh: connect to host 127.0.0.1 port 1)"
    assert report["lines"][5] == "gpu3: left out (left out: 1 of the 4 hosts before this batch failed)"
    assert report["lines"][0] == "gpu4: failed (gpu4: refused)"  # the rescued failure's message wins over the result's
    totals = report["totals"]
    assert {k: totals[k] for k in ("hosts", "ok", "changed", "failed", "unreachable", "no_gpu", "left_out")} == \
        {"hosts": 6, "ok": 2, "changed": 1, "failed": 1, "unreachable": 1, "no_gpu": 1, "left_out": 1}
    assert totals["per_cluster"]["a"] == {"hosts": 2, "ok": 1, "changed": 1, "failed": 1, "unreachable": 0, "no_gpu": 0,
                                          "left_out": 0}
    assert report["totals_line"] == ("totals: 6 hosts | 2 ok (1 changed) | 1 failed | 1 unreachable | 1 no GPU | 1 left out "
                                     "| clusters: 0 done, 0 failed")


def test_check_mode_totals_say_would_change():
    report = summary.summarize([("gpu1", CONFIGURED)], check_mode=True)
    assert report["totals_line"].startswith("totals: 1 hosts | 1 ok (1 would change) | 0 failed")


def test_a_left_out_host_that_has_a_result_keeps_it():
    """The batches stopped after this host ran (a later batch's failure): its row is its own result."""
    report = summary.summarize([("gpu1", CONFIGURED)], left_out={"gpu1": "left out: ..."})
    assert report["hosts"][0]["status"] == "configured"


def test_a_host_whose_batch_was_stopped_after_the_first_reading_is_left_out_and_unchanged():
    """site's first pass read it (the host step's probe: work_due, the configured status of its reading); the batches
    stopped before the role went further: left out, the reason of the stop, nothing changed or to restart."""
    probed = dict(CONFIGURED, changed=False, configure_due=True, work_due=True, add_group="k3s_gpu_nvidia_due")
    report = summary.summarize([("gpu1", probed)], left_out={"gpu1": "left out: 1 of the 4 hosts before this batch failed"})
    row = report["hosts"][0]
    assert (row["status"], row["reason"], row["changed"], row["restart_needed"]) == (
        "left out", "left out: 1 of the 4 hosts before this batch failed", False, False), row
    # the same reading where no batch stopped (a run without batches, k3s_gpu_serial 100%) is the host's own row
    assert summary.summarize([("gpu1", dict(CONFIGURED, changed=False))])["hosts"][0]["status"] == "configured"


def fleet(hosts):
    """A fleet's results as the site's summary gets them: three in four GPU nodes configured and unchanged, the others
    without a GPU, one changed and one failed per 500."""
    results, cluster_of = [], {}
    for number in range(hosts):
        host = "gpu-node-%05d.rack%02d.example.internal" % (number, number % 40)
        cluster_of[host] = "cluster-%02d" % (number % 7)
        if number % 500 == 1:
            result = dict(CONFIGURED)
        elif number % 500 == 2:
            result = {"failed": True, "msg": "%s: apt failed: 404 Not Found from https://nvidia.github.io/..." % host}
        elif number % 4 == 3:
            result = SKIPPED
        else:
            result = dict(CONFIGURED, changed=False)
        results.append((host, result))
    return results, cluster_of


def test_what_one_task_prints_stays_under_awx_event_limit_at_5000_hosts():
    results, cluster_of = fleet(5000)
    report = summary.summarize(results, cluster_of=cluster_of)
    every_line = sum(len(text) + 4 for text in report["lines"])
    assert every_line > summary.PRINT_BUDGET  # the case this is about: one line each would not fit
    printed = summary.printed_lines(report)
    event = len(json.dumps({"msg": printed + [report["totals_line"]], "totals": report["totals"]}))
    print("\n5,000 hosts: every line %d bytes, printed %d lines, %d bytes" % (every_line, len(printed), event))
    assert event < AWX_EVENT_LIMIT
    # every host with something to say keeps its own line; the quiet ones are named in their cluster's line
    loud = [row["host"] for row in report["hosts"] if row["status"] == "failed" or row["changed"]]
    assert len(loud) == 20 and all(any(text.startswith(host + ": ") for text in printed) for host in loud)
    folded = [text for text in printed if text.startswith("cluster ") and "nothing to change" in text]
    named = sum(int(text.split(": ", 1)[1].split(" hosts ", 1)[0]) for text in folded)
    assert named == 5000 - len(loud)
    assert all(row["host"] in " ".join(folded) for row in report["hosts"] if row["host"] not in loud)


def test_a_fleet_that_fits_prints_every_line():
    results, cluster_of = fleet(200)
    report = summary.summarize(results, cluster_of=cluster_of)
    assert summary.printed_lines(report) == report["lines"]
