# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""runtime_info and the containerd_runtimes module entry point, run as Ansible runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.k3s_gpu.nvidia.plugins.modules import containerd_runtimes, runtime_info


def run_module(module, capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(capsys.readouterr().out)


def test_reports_detection_and_plan(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    before = sandbox.snapshot()
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.31.6+k3s1", "_ansible_check_mode": True})
    assert result["changed"] is False and not result.get("failed")
    assert result["distribution"] == "k3s" and result["release_source"] == "option"
    assert [r["name"] for r in result["release_runtimes"]] == ["nvidia", "nvidia-cdi"]
    assert [(r["name"], r["source"]) for r in result["runtimes"]] == [("nvidia", "k3s"), ("nvidia-cdi", "k3s"), ("nvidia-legacy", "path")]
    assert result["plan"]["mode"] == "template"
    assert result["plan"]["path"] == "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
    assert [w["name"] for w in result["plan"]["write"]] == ["nvidia-legacy"]
    assert "content" not in result["files"]["template_v3"]
    assert sandbox.snapshot() == before  # read-only


def test_include_content(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    sandbox.write("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl", '{{ template "base" . }}\n')
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.31.6+k3s1", "include_content": True})
    assert result["files"]["template_v3"]["content"] == '{{ template "base" . }}\n'


def test_a_reading_without_the_plan_spares_the_node_the_planner(sandbox, capsys):
    # what the gpu_node role and containerd_runtimes ask for: they plan on the controller
    sandbox.k3s("k3s", "package")
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.31.6+k3s1", "include_plan": False})
    assert not result.get("failed") and "plan" not in result and result["read_options"]["include_plan"] is False
    # the module imports the planner only when it is asked for the plan (a fresh interpreter, as on a node)
    probe = ("import sys; from ansible_collections.k3s_gpu.nvidia.plugins.modules import runtime_info; "
             "print('ansible_collections.k3s_gpu.nvidia.plugins.module_utils._plan' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert found.stdout.strip() == "False", found.stderr


def test_plan_error_is_reported_not_raised(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    sandbox.write("/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl", b"\xff\xfe")
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.31.6+k3s1"})
    assert not result.get("failed") and "not valid UTF-8" in result["plan"]["error"]


@pytest.mark.parametrize("args,message", [
    ({"release": "v1.26.3+k3s1"}, "older than the oldest release line this collection supports"),
    ({"release": "v1.40.0+k3s1"}, "does not know yet"),
    ({"distribution": "rke2", "release": "v1.31.6+k3s1"}, "is a k3s release, but distribution is rke2"),
    ({}, "set release"),
    ({"distribution": "gpu"}, "value of distribution must be one of"),
])
def test_errors(sandbox, capsys, args, message):
    sandbox.k3s("k3s", "package").binary("/usr/local/bin/k3s")
    result = run_module(runtime_info, capsys, dict(args, root=sandbox.root))
    assert result["failed"] is True and message in result["msg"]
    assert "Traceback" not in result["msg"]


def test_known_bad_release_warns(sandbox, capsys, monkeypatch):
    # record warn() calls: where they end up differs between ansible-core versions and whether
    # controller code was imported in this process
    warned = []
    monkeypatch.setattr(runtime_info.AnsibleModule, "warn", lambda self, msg: warned.append(msg))
    sandbox.k3s("k3s", "package")
    run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.28.3+k3s1"})
    assert len(warned) == 1 and "8761" in warned[0]


def test_containerd_runtimes_module_needs_its_action_plugin(capsys):
    result = run_module(containerd_runtimes, capsys, {})
    assert result["failed"] is True and "action plugin" in result["msg"]


def test_newer_release_refused_by_default_naming_the_option(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.38.0+k3s1"})
    assert result["failed"] is True
    assert "does not know yet" in result["msg"] and "newer_release=assume_newest_known" in result["msg"]


def test_newer_release_assumed_with_a_warning(sandbox, capsys, monkeypatch):
    warned = []
    monkeypatch.setattr(runtime_info.AnsibleModule, "warn", lambda self, msg: warned.append(msg))
    sandbox.k3s("k3s", "package")
    args = {"root": sandbox.root, "release": "v1.38.0+k3s1", "newer_release": "assume_newest_known"}
    result = run_module(runtime_info, capsys, args)
    assert not result.get("failed") and result["read_options"]["newer_release"] == "assume_newest_known"
    assert (result["profile"]["line"], result["profile"]["assumed_line"]) == ("1.38", "1.37")
    assert result["plan"]["mode"] == "dropin" and [w["name"] for w in result["plan"]["write"]] == ["nvidia-legacy"]
    assert len(warned) == 1 and "v1.38.0+k3s1" in warned[0] and "newest 1.37 release" in warned[0] and "Risk:" in warned[0]
    # a known release: no warning, and the option is in the reading
    warned.clear()
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.37.0+k3s1"})
    assert warned == [] and result["read_options"]["newer_release"] == "refuse" and result["profile"]["assumed_line"] is None


def test_newer_release_choices(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    result = run_module(runtime_info, capsys, {"root": sandbox.root, "release": "v1.38.0+k3s1", "newer_release": "guess"})
    assert result["failed"] is True and "value of newer_release must be one of: refuse, assume_newest_known" in result["msg"]


@pytest.mark.parametrize("below", ["not-there", "a-file"])
def test_a_root_that_is_no_directory_is_refused_by_name(sandbox, capsys, below):
    # issue 41: a missing sandbox root read as a node without a GPU (rc 0), and with force the role created it
    sandbox.write("/a-file", "x\n")
    root = os.path.join(sandbox.root, below)
    result = run_module(runtime_info, capsys, {"root": root, "distribution": "k3s", "release": "v1.31.6+k3s1"})
    assert result["failed"] is True and result["error"]["variables"] == ["root"], result
    assert result["msg"].startswith("root: %r is not a directory on the node" % root), result["msg"]
    assert not os.path.isdir(root)
