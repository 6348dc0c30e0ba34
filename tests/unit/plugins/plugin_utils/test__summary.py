# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The site summary: what changed or would change, restarts done or needed, effects, and lines that agree with the rows."""

from __future__ import annotations

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary

CONFIGURED = {
    "status": "configured", "reason": "", "distribution": "k3s", "release": "v1.33.10+k3s1", "changed": True,
    "runtimes_detected": ["nvidia", "nvidia-cdi"], "handlers": ["nvidia", "nvidia-cdi", "nvidia-legacy"],
    "written": ["nvidia-legacy"], "rendered_by_release": ["nvidia", "nvidia-cdi"], "restarted": False, "verified": None,
    "mode": "host", "operator_runtimes": [], "pending": [], "reboot_required": False,
    "default_runtime": {"name": "nvidia", "how": "config_yaml", "path": "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"},
    "node_labels": ["k3s-gpu.nvidia/handler.nvidia=true"],
    "files": [{"path": "/srv/x/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml",
               "node_path": "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml",
               "action": "created"}],
}
SKIPPED = {"status": "skipped", "reason": "no NVIDIA GPU on the PCI bus and no driver loaded", "distribution": "k3s",
           "release": "v1.33.10+k3s1", "changed": False, "mode": "host"}


def test_check_mode_says_would_change_and_restart_needed():
    report = summary.summarize([("gpu1", CONFIGURED)], check_mode=True)
    entry = report["hosts"][0]
    assert entry["would_change"] is True and entry["changed"] is False and entry["restart_needed"] is True
    [text] = report["lines"]
    assert "WOULD CHANGE: created /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml" in text
    assert "RESTART NEEDED (check mode)" in text and "default runtime nvidia (config_yaml)" in text
    assert "1 node labels" in text
    assert report["counts"] == {"configured": 1, "changed": 0, "would_change": 1, "restart_needed": 1,
                                "reboot_required": 0, "cgroup_driver_mismatch": 0, "disruptive": 0,
                                "clusters_changed": 0, "clusters_failed": 0}


def test_a_restarted_host_needs_no_restart():
    entry = summary.row("gpu1", dict(CONFIGURED, restarted=True, verified=True))
    assert entry["changed"] is True and entry["restart_needed"] is False
    text = summary.line(entry)
    assert "restarted, verified yes" in text and "RESTART" not in text and "changed: created" in text


def test_a_host_that_changed_nothing_says_nothing_about_changes():
    text = summary.line(summary.row("gpu1", dict(CONFIGURED, changed=False)))
    assert "changed" not in text and "WOULD" not in text and "RESTART" not in text


def test_skipped_failed_and_unreached_hosts():
    report = summary.summarize([("cpu1", SKIPPED), ("gpu2", {"failed": True, "changed": False, "msg": "gpu2: no good"}),
                                ("gpu3", None)])
    assert [entry["status"] for entry in report["hosts"]] == ["skipped", "failed", "failed or unreachable"]
    assert report["lines"][0] == "cpu1: skipped (no NVIDIA GPU on the PCI bus and no driver loaded) | k3s v1.33.10+k3s1"
    assert report["lines"][1] == "gpu2: failed (gpu2: no good)"
    assert report["hosts"][1]["changed"] is False and report["hosts"][1]["restart_needed"] is False
    # a host without the role's result says nothing of modes, operators or runtimes it does not have
    assert "mode" not in report["lines"][0] and "operator" not in report["lines"][0]


ABSENT = {"status": "absent", "reason": "", "distribution": "k3s", "release": "v1.33.10+k3s1", "changed": True,
          "restarted": False, "verified": None, "mode": "host", "state": "absent",
          "files": [{"path": "/x", "node_path": "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml",
                     "action": "removed"}]}


def test_a_host_taken_back_says_what_went_and_whether_a_restart_is_due():
    text = summary.summarize([("gpu1", ABSENT)], check_mode=False)["lines"][0]
    assert text == ("gpu1: absent | k3s v1.33.10+k3s1 | taken back: removed "
                    "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml | RESTART NEEDED")
    text = summary.summarize([("gpu1", ABSENT)], check_mode=True)["lines"][0]
    assert "WOULD TAKE BACK: removed " in text and "RESTART NEEDED (check mode)" in text
    text = summary.summarize([("gpu1", dict(ABSENT, changed=False, files=[]))])["lines"][0]
    assert text == "gpu1: absent | k3s v1.33.10+k3s1 | nothing of ours left"


def _cluster(**extra):
    result = {"cluster": "default", "writer": "server1", "complete": True, "changed": True,
              "gpu_operator": {"wanted": False, "chart_version": "v26.3.3"},
              "runtimeclasses": {"written": ["nvidia-cdi", "nvidia-legacy"]},
              "files": [{"path": "/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml", "action": "created"}]}
    result.update(extra)
    return result


def test_one_row_per_cluster_with_what_changed_or_would():
    report = summary.summarize([], clusters=[_cluster()])
    assert report["lines"] == ["cluster default: done | from server1 | changed: created "
                               "/var/lib/rancher/k3s/server/manifests/k3s-gpu-nvidia-runtimeclasses.yaml | no GPU Operator "
                               "from this collection | RuntimeClasses nvidia-cdi,nvidia-legacy"]
    assert report["counts"]["clusters_changed"] == 1 and report["counts"]["clusters_failed"] == 0
    report = summary.summarize([], check_mode=True, clusters=[_cluster(complete=False)])
    assert "WOULD CHANGE: created " in report["lines"][0] and report["lines"][0].endswith("partial run: nothing removed")
    report = summary.summarize([], clusters=[_cluster(changed=False, files=[],
                                                      gpu_operator={"wanted": True, "chart_version": "v26.3.3"})])
    assert "| unchanged | GPU Operator v26.3.3 |" in report["lines"][0]


def test_a_failed_cluster_says_why():
    failed = {"failed": True, "msg": "cluster default (written from server1): one cluster, two modes",
              "item": {"name": "default", "writer": "server1", "complete": True}}
    report = summary.summarize([], clusters=[failed])
    assert report["lines"] == ["cluster default: FAILED | cluster default (written from server1): one cluster, two modes"]
    assert report["counts"]["clusters_failed"] == 1


def test_a_result_registered_by_the_restart_handler_keeps_what_the_host_step_changed():
    from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _summary as summary_rows
    base = {"status": "configured", "distribution": "k3s", "release": "v1.33.10+k3s1"}
    would = summary_rows.row("gpu", dict(base, changed=False, host_changed=True), check_mode=True)
    assert would["would_change"] and would["restart_needed"]
    done = summary_rows.row("gpu", dict(base, changed=True, host_changed=True, restarted=True, verified=True))
    assert done["changed"] and not done["restart_needed"]
    assert not summary_rows.row("gpu", dict(base, changed=False, host_changed=False))["changed"]


def test_a_failed_hosts_reason_shows_no_url_password():
    # a module's own message (apt, get_url) may carry the URL it fetched
    failed = {"failed": True, "changed": False, "msg": "gpu2: apt failed: 407 from http://alice:S3cr3t@proxy:3128/deb"}
    report = summary.summarize([("gpu2", failed)])
    assert report["lines"][0] == "gpu2: failed (gpu2: apt failed: 407 from http://alice:********@proxy:3128/deb)"
    assert "S3cr3t" not in repr(report)


def test_what_the_host_step_told_a_host_it_configured_stays_on_the_host_result_not_in_its_row():
    told = dict(CONFIGURED, msg="gpu1: the containerd configuration changed; restart k3s to apply it (check mode).")
    [text] = summary.summarize([("gpu1", told)], check_mode=True)["lines"]
    assert text.startswith("gpu1: configured | k3s v1.33.10+k3s1") and "restart k3s to apply it" not in text
    failed = summary.row("gpu1", dict(CONFIGURED, failed=True, msg="gpu1: restarting k3s failed"))
    assert failed["reason"] == "gpu1: restarting k3s failed"
