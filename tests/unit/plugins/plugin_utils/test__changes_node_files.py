# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The containerd_runtimes controller-side choices (plugin_utils._changes): when a registered runtime_info result replaces the read,
and what each change asks node_files to check and write. The whole task runs in the integration target."""

from __future__ import annotations

import hashlib
import json

import pytest

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.testing import patch_module_args

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_write as node_write
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.modules import runtime_info
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd._types import FileChange


def read(sandbox, capsys, **options):
    args = {"root": sandbox.root, "release": "v1.31.6+k3s1", "include_content": True}
    args.update(options)
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            runtime_info.main()
    return json.loads(capsys.readouterr().out)


def params(sandbox, **overrides):
    out = {"root": sandbox.root, "distribution": "k3s", "release": "v1.31.6+k3s1", "data_dir": None, "toolkit_dirs": [],
           "path": None, "backup": False, "validate": None}
    out.update(overrides)
    return out


def test_a_fitting_reading_is_used_and_copied(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    facts = read(sandbox, capsys)
    used = node_reading.given_facts(dict(params(sandbox), node_facts=facts), [])
    assert used == facts and used is not facts
    used["files"].clear()
    assert facts["files"]  # the registered variable is never modified
    # distribution auto in the task takes the reading's
    assert node_reading.given_facts(dict(params(sandbox, distribution="auto"), node_facts=facts), []) is not None


@pytest.mark.parametrize("read_options, overrides, binaries", [
    ({"include_content": False}, {}, []),
    ({}, {"root": "/elsewhere"}, []),
    ({}, {"distribution": "rke2"}, []),
    ({}, {"release": "v1.33.10+k3s1"}, []),
    ({}, {"data_dir": "/srv/k3s"}, []),
    ({}, {"toolkit_dirs": ["/opt/nvidia/bin"]}, []),
    ({}, {"path": "/etc/containerd/config.toml"}, []),
    ({}, {}, ["/opt/nvidia/bin/nvidia-container-runtime"]),  # a binary the reading did not look at
])
def test_a_reading_that_does_not_fit_is_not_used(sandbox, capsys, read_options, overrides, binaries):
    sandbox.k3s("k3s", "package")
    facts = read(sandbox, capsys, **read_options)
    assert node_reading.given_facts(dict(params(sandbox, **overrides), node_facts=facts), binaries) is None


def test_failed_or_skipped_results_are_not_used(sandbox, capsys):
    sandbox.k3s("k3s", "package")
    facts = read(sandbox, capsys)
    assert node_reading.given_facts(dict(params(sandbox), node_facts=dict(facts, failed=True)), []) is None
    assert node_reading.given_facts(dict(params(sandbox), node_facts={"skipped": True, "changed": False}), []) is None
    assert node_reading.given_facts(dict(params(sandbox), node_facts=None), []) is None


@pytest.mark.parametrize("section, value, found", [("cdi", None, "a NoneType"), ("files", [], "a list"), ("paths", "x", "a str")])
def test_node_facts_that_are_not_a_reading_are_refused_by_name(sandbox, capsys, section, value, found):
    # containerd_runtimes types the reading it is given once (_configure.run): a section of another type is refused
    # with the option's name before anything is read or written
    sandbox.k3s("k3s", "package")
    facts = read(sandbox, capsys)
    facts[section] = value
    validated = ArgumentSpecValidator(configure.SPEC).validate({"root": sandbox.root, "release": "v1.31.6+k3s1",
                                                                "node_facts": facts})
    assert not validated.error_messages

    def execute_module(name, _args):
        raise AssertionError("nothing is read or written (%s)" % name)

    result = configure.run({}, validated.validated_parameters, execute_module, False)
    assert result["failed"] is True and result["changed"] is False and result["facts_source"] == "node_facts"
    assert result["msg"].startswith("node_facts: %s is %s, not a " % (section, found)), result["msg"]
    assert "k3s_gpu.nvidia.runtime_info" in result["msg"] and result["error"]["variables"] == ["node_facts"]


@pytest.mark.parametrize("layout, due", [("package", True), ("nothing", False)])
def test_deciding_only_says_whether_node_files_would_run_and_writes_nothing(sandbox, capsys, layout, due):
    # write=False (the role's host step where k3s/rke2 can restart): the decision and write_due, no node_files execution;
    # its configure task then writes from the same reading
    sandbox.k3s("k3s", layout)
    facts = read(sandbox, capsys)
    validated = ArgumentSpecValidator(configure.SPEC).validate({"root": sandbox.root, "release": "v1.31.6+k3s1",
                                                                "node_facts": facts})
    before = sandbox.snapshot()

    def execute_module(name, _args):
        raise AssertionError("nothing is read or written (%s)" % name)

    result = configure.run({}, validated.validated_parameters, execute_module, False, write=False)
    assert not result.get("failed"), result.get("msg")
    assert result["write_due"] is due and result["changed"] is due and sandbox.snapshot() == before


def test_write_entries_carry_what_the_decision_was_made_from(sandbox):
    change = FileChange(key="template_v3", path=sandbox.root + "/t.tmpl", node_path="/t.tmpl", before="a\n",
                        after="a\nb\n", exists=True, parent_exists=True)
    entry = node_write.write_entry(change, params(sandbox, validate="containerd config dump -c %s", mode="0640", backup=True))
    assert entry["expected_state"] == "file" and entry["expected_sha1"] == hashlib.sha1(b"a\n").hexdigest()
    assert entry["content"] == "a\nb\n" and entry["validate"] == "containerd config dump -c %s"
    assert entry["mode"] == "0640" and entry["backup"] is True
    created = node_write.write_entry(change.replaced(key="default_runtime_file", before=None, exists=False),
                                     params(sandbox, validate="containerd config dump -c %s"))
    assert created["expected_state"] == "absent" and created["expected_sha1"] is None
    assert "validate" not in created  # the YAML file is not containerd's TOML
    removed = node_write.write_entry(change.replaced(after=None), params(sandbox))
    assert removed["state"] == "absent" and "content" not in removed
