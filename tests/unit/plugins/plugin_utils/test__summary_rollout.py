# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The site summary's rollout part (issue 43): whether a host's changes disrupt its GPU pods, its wave, whether it was
drained, a rollout failure as the host's row, and the count of disruptive hosts."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _disruption as disruption

CONFIGURED = {"status": "configured", "reason": "", "distribution": "k3s", "release": "v1.33.10+k3s1", "changed": False,
              "mode": "host", "restarted": False, "verified": None}
LOADED = {"loaded": True, "version": "580.95.05"}
# what the role keeps in gpu_node__disruption: classify() and drain_decision() merged, as _rollout_plan.classify does
UPGRADE = dict(disruption.classify({"install_driver": True}, LOADED, {"packages_changed": True}, "if_needed",
                                   toolkit_due=True), drain=True, note="")
QUIET = dict(disruption.classify({}, LOADED, {}, "never", toolkit_due=True, cdi_due=True, configure_due=True),
             drain=False, note="")


def test_a_disruptive_host_says_its_change_its_wave_and_that_it_was_drained():
    entry = summary.rollout_entry(UPGRADE, {"wave": 1, "canary": True})
    text = summary.summarize([("gpu1", CONFIGURED)], rollouts={"gpu1": entry})["lines"][0]
    assert text.startswith("gpu1: configured | DISRUPTIVE: driver upgrade from 580.95.05 (wave 1, canary, drained) | "
                           "k3s v1.33.10+k3s1")


@pytest.mark.parametrize("planned, drain, part", [
    ({"wave": 2, "canary": False}, True, "DISRUPTIVE: driver upgrade from 580.95.05 (wave 2, drained)"),
    ({"wave": 3}, False, "DISRUPTIVE: driver upgrade from 580.95.05 (wave 3, NOT DRAINED)"),
    (None, False, "DISRUPTIVE: driver upgrade from 580.95.05 (NOT DRAINED)"),
    ("not a dict", True, "DISRUPTIVE: driver upgrade from 580.95.05 (drained)"),
], ids=["later-wave", "not-drained", "no-wave", "bad-plan"])
def test_the_disruptive_part_says_only_what_is_known(planned, drain, part):
    entry = summary.rollout_entry(dict(UPGRADE, drain=drain), planned)
    assert summary.line(summary.row("gpu1", CONFIGURED, rollout=entry)).split(" | ")[1] == part


def test_a_host_whose_changes_do_not_disrupt_says_which_they_are():
    entry = summary.rollout_entry(QUIET)
    assert entry["disruptive"] is False and entry["wave"] is None
    part = summary.line(summary.row("gpu1", CONFIGURED, rollout=entry)).split(" | ")[1]
    assert part == "not disruptive (container toolkit, CDI spec, containerd config and a k3s/rke2 restart)"


@pytest.mark.parametrize("classified", [None, {}, "x", {"changes": []}], ids=["none", "empty", "text", "no-verdict"])
def test_a_host_the_role_did_not_classify_has_no_rollout_entry(classified):
    assert summary.rollout_entry(classified) is None
    text = summary.line(summary.row("gpu1", CONFIGURED, rollout=summary.rollout_entry(classified)))
    assert "disruptive" not in text.lower()


def test_a_host_without_any_change_says_nothing_of_the_rollout():
    entry = summary.rollout_entry(dict(disruption.classify({}, LOADED, {}, "never"), drain=False))
    assert entry is not None and entry["changes"] == []
    assert "disruptive" not in summary.line(summary.row("gpu1", CONFIGURED, rollout=entry)).lower()


def test_a_rollout_failure_makes_the_row_failed_with_its_message():
    failure = "gpu1: node gpu1 stays cordoned: BROKEN at driver: nvidia-smi -L failed in the pod"
    entry = summary.rollout_entry(UPGRADE, {"wave": 1, "canary": True}, failure)
    report = summary.summarize([("gpu1", CONFIGURED)], rollouts={"gpu1": entry})
    row = report["hosts"][0]
    assert row["status"] == "failed" and row["reason"] == failure
    assert row["rollout"]["failure"] == failure
    assert report["lines"][0].startswith("gpu1: failed (%s) | DISRUPTIVE: driver upgrade from 580.95.05" % failure)
    assert report["counts"]["failed"] == 1 and "configured" not in report["counts"]


def test_a_rollout_failure_of_a_host_the_role_never_reached_is_its_reason():
    entry = summary.rollout_entry(UPGRADE, None, "gpu2: node gpu2 was not drained: ml/train")
    row = summary.row("gpu2", None, rollout=entry)
    assert row["status"] == "failed" and row["reason"] == "gpu2: node gpu2 was not drained: ml/train"


def test_a_rollout_failure_hides_a_password_in_a_url():
    entry = summary.rollout_entry(UPGRADE, None, "cannot pull https://user:s3cret@registry.example/prove:1")
    assert "s3cret" not in entry["failure"]
    assert "s3cret" not in summary.summarize([("gpu1", CONFIGURED)], rollouts={"gpu1": entry})["lines"][0]


def test_the_counts_say_how_many_hosts_are_disrupted():
    rollouts = {"gpu1": summary.rollout_entry(UPGRADE, {"wave": 1, "canary": True}),
                "gpu2": summary.rollout_entry(QUIET),
                "gpu3": summary.rollout_entry(dict(UPGRADE, drain=False), {"wave": 2})}
    report = summary.summarize([("gpu1", CONFIGURED), ("gpu2", CONFIGURED), ("gpu3", CONFIGURED), ("gpu4", CONFIGURED)],
                               rollouts=rollouts)
    assert report["counts"]["disruptive"] == 2 and report["counts"]["configured"] == 4
    assert [entry["rollout"] is None for entry in report["hosts"]] == [False, False, False, True]


def test_without_rollouts_nothing_is_disruptive():
    report = summary.summarize([("gpu1", CONFIGURED)])
    assert report["counts"]["disruptive"] == 0 and report["hosts"][0]["rollout"] is None
