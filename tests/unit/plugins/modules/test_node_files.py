# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""node_files, run as Ansible runs it: several files in one execution, compare and swap, nothing on a refusal."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import stat

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.k3s_gpu.nvidia.plugins.modules import node_files

OLD = "version = 2\n# the user's line\n"
NEW = "version = 2\n# the user's line\n[extra]\n"


def run(capsys, files, root=None, **flags):
    """node_files' result for these entries (root: its root option; flags: _ansible_<flag> arguments)."""
    args = {"files": files}
    if root is not None:
        args["root"] = str(root)
    args.update(("_ansible_" + k, v) for k, v in flags.items())
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            node_files.main()
    return json.loads(capsys.readouterr().out)


def sha1(text):
    return hashlib.sha1(text.encode()).hexdigest()


@pytest.fixture
def node(tmp_path):
    (tmp_path / "etc").mkdir()
    target = tmp_path / "etc" / "config.toml"
    target.write_text(OLD)
    target.chmod(0o640)
    return tmp_path


def snapshot(root):
    out = {}
    for path in sorted(glob.glob(str(root) + "/**", recursive=True)):
        info = os.lstat(path)
        out[path] = (stat.S_IMODE(info.st_mode), open(path, "rb").read() if stat.S_ISREG(info.st_mode) else None)
    return out


def test_writes_updates_creates_and_removes_in_one_execution(node, capsys):
    gone = node / "etc" / "old.toml"
    gone.write_text("[old]\n")
    result = run(capsys, [
        {"path": str(node / "etc" / "config.toml"), "content": NEW, "expected_state": "file", "expected_sha1": sha1(OLD),
         "backup": True},
        {"path": str(node / "new" / "deep" / "labels.yaml"), "content": "node-label: [a=b]\n", "expected_state": "absent"},
        {"path": str(gone), "state": "absent", "expected_state": "file", "expected_sha1": sha1("[old]\n")},
    ])
    assert result["changed"] is True and not result.get("failed")
    assert [f["action"] for f in result["files"]] == ["updated", "created", "removed"]
    assert (node / "etc" / "config.toml").read_text() == NEW
    assert stat.S_IMODE((node / "etc" / "config.toml").stat().st_mode) == 0o640  # kept on update
    assert open(result["files"][0]["backup_file"]).read() == OLD
    created = node / "new" / "deep" / "labels.yaml"
    assert created.read_text() == "node-label: [a=b]\n"
    assert stat.S_IMODE(created.stat().st_mode) == 0o600
    assert stat.S_IMODE((node / "new").stat().st_mode) == 0o700
    assert not gone.exists()
    assert not [p for p in os.listdir(node / "etc") if p.startswith(".config.toml.")]  # no scratch left


def test_second_run_changes_nothing(node, capsys):
    entry = {"path": str(node / "etc" / "config.toml"), "content": OLD, "expected_state": "file", "expected_sha1": sha1(OLD)}
    result = run(capsys, [entry])
    assert result["changed"] is False and result["files"][0]["action"] == "unchanged"


def test_a_file_changed_since_it_was_read_stops_everything(node, capsys):
    before = snapshot(node)
    result = run(capsys, [
        {"path": str(node / "etc" / "first.toml"), "content": "[a]\n", "expected_state": "absent"},
        {"path": str(node / "etc" / "config.toml"), "content": NEW, "expected_state": "file",
         "expected_sha1": sha1("what the controller saw\n")},
    ])
    assert result["failed"] is True and result["changed"] is False and result["files"] == []
    assert str(node / "etc" / "config.toml") in result["msg"] and "changed after it was read" in result["msg"]
    assert snapshot(node) == before  # not even the first file


@pytest.mark.parametrize("expected_state, message", [
    ("absent", "was created after it was read"),
    ("file", "was removed after it was read"),
])
def test_existence_expectations(node, capsys, expected_state, message):
    path = node / "etc" / ("config.toml" if expected_state == "absent" else "missing.toml")
    before = snapshot(node)
    result = run(capsys, [{"path": str(path), "content": NEW, "expected_state": expected_state}])
    assert result["failed"] is True and message in result["msg"] and str(path) in result["msg"]
    assert snapshot(node) == before


def test_symlink_is_refused_not_replaced(node, capsys):
    link = node / "etc" / "link.toml"
    link.symlink_to(node / "etc" / "config.toml")
    before = snapshot(node)
    result = run(capsys, [{"path": str(link), "content": NEW}])
    assert result["failed"] is True and "is a symlink" in result["msg"]
    assert snapshot(node) == before and os.path.islink(link)


def test_validate_failure_writes_nothing(node, capsys):
    before = snapshot(node)
    result = run(capsys, [{"path": str(node / "etc" / "config.toml"), "content": NEW, "validate": "false %s"}])
    assert result["failed"] is True and "was not written" in result["msg"]
    assert snapshot(node) == before


def test_validate_sees_the_new_text(node, capsys):
    result = run(capsys, [{"path": str(node / "etc" / "config.toml"), "content": NEW, "validate": "grep -q extra %s"}])
    assert result["changed"] is True and (node / "etc" / "config.toml").read_text() == NEW


def test_check_mode_and_diff_write_nothing(node, capsys):
    before = snapshot(node)
    result = run(capsys, [
        {"path": str(node / "etc" / "config.toml"), "content": NEW, "expected_state": "file", "expected_sha1": sha1(OLD)},
        {"path": str(node / "etc" / "config.toml"), "mode": "0600"},
    ], check_mode=True, diff=True)
    assert result["changed"] is True and [f["action"] for f in result["files"]] == ["updated", "attributes"]
    assert result["diff"][0]["before"] == OLD and result["diff"][0]["after"] == NEW
    assert snapshot(node) == before


def test_attributes_only(node, capsys):
    path = node / "etc" / "config.toml"
    result = run(capsys, [{"path": str(path), "mode": "0600", "expected_state": "file"}])
    assert result["changed"] is True and result["files"][0]["action"] == "attributes"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == OLD
    again = run(capsys, [{"path": str(path), "mode": "0600", "expected_state": "file"}])
    assert again["changed"] is False


@pytest.mark.parametrize("entry, message", [
    ({"path": "relative/config.toml", "content": "x"}, "must be absolute"),
    ({"path": "/nonexistent-node-files-test/a.toml"}, "does not exist; give its content"),
])
def test_bad_entries(capsys, entry, message):
    result = run(capsys, [entry])
    assert result["failed"] is True and message in result["msg"]


def test_a_checksum_alone_means_the_file_must_exist_unchanged(node, capsys):
    before = snapshot(node)
    result = run(capsys, [{"path": str(node / "etc" / "config.toml"), "content": NEW, "expected_sha1": sha1("other\n")}])
    assert result["failed"] is True and "changed after it was read" in result["msg"]
    assert snapshot(node) == before


@pytest.mark.parametrize("others, check_mode, backup, removed", [
    ([], False, False, True),          # the directory held only the file: it goes too
    (["keep.toml"], False, False, False),  # anything else in it keeps it
    ([], True, False, True),           # check mode says so and removes nothing
    ([], False, True, False),          # the backup stays next to the removed file, so the directory stays
])
def test_remove_empty_parent(tmp_path, capsys, others, check_mode, backup, removed):
    directory = tmp_path / "config-v3.toml.d"
    directory.mkdir()
    (directory / "50-k3s-gpu-nvidia.toml").write_text("[x]\n")
    for name in others:
        (directory / name).write_text("")
    result = run(capsys, [{"path": str(directory / "50-k3s-gpu-nvidia.toml"), "state": "absent", "expected_state": "file",
                           "remove_empty_parent": True, "backup": backup}], check_mode=check_mode)
    assert result["files"][0]["action"] == "removed"
    assert result["files"][0]["parent_removed"] == (str(directory) if removed else None)
    assert directory.exists() is (check_mode or not removed)


@pytest.mark.parametrize("entry, words", [
    ({"validate": "containerd config dump"}, "files[].validate for {path} must contain %s (the new file), got "
                                             "'containerd config dump'"),
    ({"content": None, "expected_state": "absent"}, "files[0] ({path}): expected_state=absent needs content to create the file"),
])
def test_an_entry_the_module_cannot_apply_is_refused_and_nothing_is_written(node, capsys, entry, words):
    path = str(node / "etc" / "config.toml")
    before = snapshot(node)
    result = run(capsys, [dict({"path": path, "content": NEW}, **entry)])
    assert result["failed"] is True and words.format(path=path) in result["msg"], result["msg"]
    assert snapshot(node) == before
