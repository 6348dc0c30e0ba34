# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""k3s_gpu.nvidia.site's report always arrives (issue 44): a 56-host sandbox fleet (7 clusters, the benchmark's fleet:
benchmarks/fleet/sandbox_fleet.py, one node tree per host on localhost) with one host that fails (a runtime name the
role refuses), one host that cannot be reached (ssh to a closed port) and the fleet's hosts without a GPU, run as
users run it, under ansible-playbook and under ansible-runner (what AWX/AAP runs):

- the run ends with rc 2 after the report, never before it: the summary lists every host, sorted by cluster then
  host, then the clusters and a totals line; the JSON report (k3s_gpu_summary_path) has the same rows, in check mode
  too; every cluster's objects are written (the two with the broken hosts as partial runs);
- the recap's failed hosts are exactly the summary's failed and unreachable ones; ansible-runner's stats artifact
  (set_stats) carries the same totals, and no job event comes near AWX's 700,000-byte limit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "fleet"))
import sandbox_fleet  # noqa: E402  pylint: disable=wrong-import-position,import-error

HOSTS = 56
AWX_EVENT_LIMIT = 700000
# what the benchmark's site runs set: no package installs on a sandbox tree
SITE_VARS = {"gpu_node_driver_install": False, "gpu_node_toolkit_install": False}
COLLECTIONS_PATH = os.pathsep.join((os.path.join(ROOT, ".tmp", "collections"), os.path.join(ROOT, ".tmp", "extra-collections")))


def env():
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS_PATH, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
                ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_HOST_KEY_CHECKING="False",
                ANSIBLE_LOCALHOST_WARNING="false")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fleet's trees and inventory; the broken hosts picked among the GPU agents of two clusters."""
    work = tmp_path_factory.mktemp("fleet")
    nodes = sandbox_fleet.plan_fleet(HOSTS)
    trees = str(work / "trees")
    sandbox_fleet.write_trees(trees, nodes)
    inventory_path = str(work / "inventory.json")
    sandbox_fleet.write_inventory(inventory_path, trees, nodes, sys.executable)
    with open(inventory_path, encoding="utf-8") as handle:
        inventory = json.load(handle)
    agents = inventory["all"]["children"]["agent"]["hosts"]
    gpu_agents = [node.name for node in nodes if node.role == "agent" and node.has_gpu]
    failing = next(name for name in gpu_agents if name.startswith("c1-"))
    unreachable = next(name for name in gpu_agents if name.startswith("c3-"))
    agents[failing]["gpu_node_runtimes"] = [{"name": "bad.name"}]
    # a closed port on this machine: refused at once, whatever the network around
    agents[unreachable].update(ansible_connection="ssh", ansible_host="127.0.0.1", ansible_port=1,
                               ansible_ssh_common_args="-o ConnectTimeout=5 -o StrictHostKeyChecking=no")
    with open(inventory_path, "w", encoding="utf-8") as handle:
        json.dump(inventory, handle, indent=1)
    no_gpu = sorted(node.name for node in nodes if not node.has_gpu)
    clusters = {node.name: node.cluster for node in nodes}
    return {"work": work, "trees": trees, "nodes": nodes, "inventory": inventory_path, "failing": failing,
            "unreachable": unreachable, "no_gpu": no_gpu, "clusters": clusters}


def reset_trees(fleet):
    shutil.rmtree(fleet["trees"])
    sandbox_fleet.write_trees(fleet["trees"], fleet["nodes"])


def recap(output):
    """{host: {ok, changed, unreachable, failed, ...}} from the PLAY RECAP."""
    found = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", output.split("PLAY RECAP", 1)[1], flags=re.M):
        found[host] = dict((key, int(value)) for key, value in re.findall(r"(\w+)=(\d+)", counts))
    return found


def printed_summary(output):
    """The lines the summary task printed (the default callback's JSON of its msg)."""
    block = output.split("TASK [One row per host, sorted by cluster and host, then the totals]", 1)[1]
    start = block.index("{")
    return json.loads(block[start:block.index("\n}\n", start) + 2])["msg"]


def check_report(fleet, report, lines, check_mode=False):
    hosts = report["hosts"]
    names = [row["host"] for row in hosts]
    assert len(hosts) == HOSTS and names == sorted(names, key=lambda h: (fleet["clusters"][h], h)), names
    assert [row["cluster"] for row in hosts] == [fleet["clusters"][h] for h in names]
    status = dict((row["host"], row["status"]) for row in hosts)
    assert status[fleet["failing"]] == "failed", hosts
    assert status[fleet["unreachable"]] == "unreachable", hosts
    assert sorted(h for h, s in status.items() if s == "skipped") == fleet["no_gpu"]
    failing_row = next(row for row in hosts if row["host"] == fleet["failing"])
    assert "'bad.name' is not a valid runtime name" in failing_row["reason"], failing_row
    unreachable_row = next(row for row in hosts if row["host"] == fleet["unreachable"])
    assert unreachable_row["reason"].startswith("unreachable: "), unreachable_row
    totals = report["totals"]
    assert (totals["hosts"], totals["failed"], totals["unreachable"], totals["no_gpu"], totals["left_out"]) == \
        (HOSTS, 1, 1, len(fleet["no_gpu"]), 0), totals
    assert totals["ok"] == HOSTS - 2 - len(fleet["no_gpu"])
    assert totals["clusters_done"] == 7 and totals["clusters_failed"] == 0, report["clusters"]
    partial = sorted(row["cluster"] for row in report["clusters"] if not row["complete"])
    assert partial == sorted({fleet["clusters"][fleet["failing"]], fleet["clusters"][fleet["unreachable"]]}), partial
    assert report["check_mode"] is check_mode
    # the printed lines: one per host in the same order, one per cluster, then the totals
    assert [text.split(":", 1)[0] for text in lines[:HOSTS]] == names
    assert [text.split(":", 1)[0] for text in lines[HOSTS:HOSTS + 7]] == ["cluster c%d" % n for n in range(1, 8)]
    verb = "would change" if check_mode else "changed"
    assert lines[-1] == ("totals: %d hosts | %d ok (%d %s) | 1 failed | 1 unreachable | %d no GPU | 0 left out | "
                         "clusters: 7 done, 0 failed" % (HOSTS, totals["ok"], totals["changed"], verb, len(fleet["no_gpu"])))
    return totals


def run_site(fleet, extra, *options):
    """ansible-playbook k3s_gpu.nvidia.site on the fleet as users run it; (its output, the JSON report). rc 2: the run
    fails after its report, because of the broken hosts."""
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", fleet["inventory"], "--forks", "10"]
    argv += list(options) + ["-e", json.dumps(dict(SITE_VARS, **extra)), "k3s_gpu.nvidia.site"]
    proc = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=1800, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-5000:]
    with open(extra["k3s_gpu_summary_path"], encoding="utf-8") as handle:
        return output, json.load(handle)


def test_ansible_playbook_reports_every_host_then_fails_the_broken_ones(fleet):
    reset_trees(fleet)
    report_path = str(fleet["work"] / "summary.json")
    output, report = run_site(fleet, {"k3s_gpu_summary_path": report_path})
    totals = check_report(fleet, report, printed_summary(output))
    assert totals["changed"] == totals["ok"]  # a fresh fleet: every configured host changed
    counts = recap(output)
    broken = sorted(host for host, c in counts.items() if c.get("failed") or c.get("unreachable"))
    assert broken == sorted([fleet["failing"], fleet["unreachable"]]), counts
    # every cluster's objects, the broken hosts' clusters too: each manifest its row names is on its first server
    nodes = dict((node.name, node) for node in fleet["nodes"])
    for row in report["clusters"]:
        assert row["status"] == "done" and row["writer"] == row["cluster"] + "-server1", row
        assert row["files"] and all(os.path.isfile(f["path"]) for f in row["files"]), row
        assert all(f["path"].startswith(sandbox_fleet.node_root(fleet["trees"], nodes[row["writer"]])) for f in row["files"])

    # check mode on the converged fleet: the same rows, nothing would change, the JSON written all the same
    os.unlink(report_path)
    output, report = run_site(fleet, {"k3s_gpu_summary_path": report_path}, "--check")
    totals = check_report(fleet, report, printed_summary(output), check_mode=True)
    assert totals["changed"] == 0, [row for row in report["hosts"] if row["would_change"]]
    # a run with nothing to do: no task banner per host (each banner once), none of the role's tasks past its host
    # step, and the play of the hosts with work to do has none
    for play in output.split("PLAY [")[1:]:
        banners = re.findall(r"^TASK \[(.*)\]", play, flags=re.M)
        assert len(banners) == len(set(banners)), sorted(b for b in set(banners) if banners.count(b) > 1)
        assert not [b for b in banners if b.startswith("k3s_gpu.nvidia.gpu_node")], banners
    play = output.split("PLAY [Configure the GPU nodes with work to do]", 1)[1].split("PLAY [", 1)[0]
    assert "skipping: no hosts matched" in play, play


def test_ansible_runner_gets_the_same_report_as_stats_and_small_events(fleet):
    """What AWX/AAP runs: ansible-runner with a project and an inventory; the totals arrive as the job's stats
    artifact (set_stats), the same as the JSON report, and every job event stays far under AWX's limit."""
    reset_trees(fleet)
    private = fleet["work"] / "runner"
    (private / "project").mkdir(parents=True)
    (private / "inventory").mkdir()
    (private / "env").mkdir()
    (private / "project" / "site.yml").write_text("- ansible.builtin.import_playbook: k3s_gpu.nvidia.site\n", encoding="utf-8")
    shutil.copy(fleet["inventory"], private / "inventory" / "hosts.json")
    report_path = str(fleet["work"] / "runner-summary.json")
    (private / "env" / "extravars").write_text(json.dumps(dict(SITE_VARS, k3s_gpu_summary_path=report_path)), encoding="utf-8")
    envvars = {"ANSIBLE_COLLECTIONS_PATH": COLLECTIONS_PATH, "ANSIBLE_HOST_KEY_CHECKING": "False"}
    (private / "env" / "envvars").write_text(json.dumps(envvars), encoding="utf-8")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-runner"), "run", str(private), "-p",
                           "site.yml", "--ident", "site", "--forks", "10"],
                          env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]),
                          capture_output=True, text=True, timeout=1800, check=False)
    artifacts = private / "artifacts" / "site"
    assert (artifacts / "rc").read_text(encoding="utf-8").strip() == "2", proc.stdout[-5000:] + proc.stderr[-3000:]
    assert (artifacts / "status").read_text(encoding="utf-8").strip() == "failed"
    with open(report_path, encoding="utf-8") as handle:
        report = json.load(handle)
    events, sizes = [], []
    for name in sorted(os.listdir(artifacts / "job_events")):
        text = (artifacts / "job_events" / name).read_text(encoding="utf-8")
        sizes.append((len(text.encode()), name))
        events.append(json.loads(text))
    stats = next(e for e in events if e.get("event") == "playbook_on_stats")["event_data"]
    data = stats["artifact_data"]["k3s_gpu_nvidia"]
    assert data["totals"] == report["totals"], (data["totals"], report["totals"])
    assert sorted(data["failed_hosts"]) == sorted([fleet["failing"], fleet["unreachable"]])
    assert sorted(host for host in stats.get("failures", {})) == sorted([fleet["failing"], fleet["unreachable"]]), stats
    biggest = max(sizes)
    print("\nansible-runner: %d job events, the biggest %d bytes (%s); totals %s"
          % (len(events), biggest[0], biggest[1], json.dumps(report["totals"], sort_keys=True)))
    assert biggest[0] < AWX_EVENT_LIMIT / 10, biggest


def test_k3s_gpu_max_fail_percentage_stops_the_next_batches_and_the_report_still_comes(fleet):
    """Batches of 8 (k3s_gpu_serial) of the hosts with work to do, no failure allowed (k3s_gpu_max_fail_percentage 0,
    the default): the first batch past the failing host (in the run's order) is left untouched, and so is every one
    after it; their rows say why, the clusters are written as partial runs, and the run fails after the report. The
    hosts without a GPU had nothing to do: they are no batch's and no row of theirs says left out."""
    reset_trees(fleet)
    output, report = run_site(fleet, {"k3s_gpu_summary_path": str(fleet["work"] / "batches.json"), "k3s_gpu_serial": 8})
    order = [node.name for node in fleet["nodes"] if node.role == "server"] + \
        [node.name for node in fleet["nodes"] if node.role == "agent"]  # the inventory's order: the run's
    broken = (fleet["failing"], fleet["unreachable"])  # the first pass cannot read them
    gpu = set(node.name for node in fleet["nodes"] if node.has_gpu)
    due = [host for host in order if host in gpu and host not in broken]
    batches = [due[start:start + 8] for start in range(0, len(due), 8)]
    halted_at = next(number for number, batch in enumerate(batches)
                     if number and any(host in broken for host in order[:order.index(batch[0])]))
    before = order[:order.index(batches[halted_at][0])]
    failed_before = [host for host in before if host in broken]
    expected_left = sorted(host for batch in batches[halted_at:] for host in batch)
    rows = dict((row["host"], row) for row in report["hosts"])
    left = sorted(host for host, row in rows.items() if row["status"] == "left out")
    assert left and left == expected_left, (left, expected_left)
    reason = "left out: %d of the %d hosts before this batch failed (%s)" % (len(failed_before), len(before),
                                                                             ", ".join(failed_before))
    assert all(rows[host]["reason"].startswith(reason) for host in left), (rows[left[0]], reason)
    assert report["totals"]["left_out"] == len(left) and report["totals"]["failed"] == 1
    assert sorted(host for host, row in rows.items() if row["status"] == "skipped") == fleet["no_gpu"]
    # nothing of a left-out host was touched, and its cluster was written as a partial run
    for node in fleet["nodes"]:
        if node.name in left:
            root = sandbox_fleet.node_root(fleet["trees"], node)
            assert not os.path.exists(os.path.join(root, "etc/rancher", node.distribution, "config.yaml.d")), node.name
    partial = set(row["cluster"] for row in report["clusters"] if not row["complete"])
    assert set(fleet["clusters"][host] for host in left) <= partial, (partial, left)
    assert "PLAY RECAP" in output and recap(output)[fleet["failing"]]["failed"] == 1
