# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""node_files under a hostile or careless node (issue 41): every write stays inside root, two writers never both win,
a write is all or nothing, a killed run's temporary files go, and an OS refusal names the file, the error and the fix.
Each case failed on 0baaf98."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import multiprocessing
import os
import stat

import pytest

from ansible.module_utils.testing import patch_module_args

from ansible_collections.k3s_gpu.nvidia.plugins.modules import node_files
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.modules.test_node_files import run

DROPIN = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml"


def tree(top):
    """Every path under top with its kind, mode and bytes."""
    out = {}
    for path in sorted(glob.glob(str(top) + "/**", recursive=True) + glob.glob(str(top) + "/**/.*", recursive=True)):
        info = os.lstat(path)
        data = open(path, "rb").read() if stat.S_ISREG(info.st_mode) else os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
        out[path] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), data)
    return out


@pytest.fixture
def outside(tmp_path):
    """A directory of the machine running the module, outside the node's root: nothing may ever land here."""
    path = tmp_path / "build-host"
    (path / "data" / "rancher").mkdir(parents=True)
    return path


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "image"
    path.mkdir()
    return path


@pytest.mark.parametrize("link", ["/var/lib/rancher", "/var", "/var/lib/rancher/k3s/agent"])
def test_an_absolute_symlink_in_the_image_points_into_the_image(capsys, root, outside, link):
    # image root filesystems carry links such as /var/lib/rancher -> /data/rancher: that is /data/rancher of the image
    target = str(outside / "data" / "rancher") if link == "/var/lib/rancher" else "/data/" + link.strip("/").replace("/", "-")
    os.makedirs(str(root) + os.path.dirname(link), exist_ok=True)
    os.symlink(target, str(root) + link)
    before = tree(outside)
    result = run(capsys, [{"path": str(root) + DROPIN, "content": "x\n", "expected_state": "absent"}], root=root)
    assert not result.get("failed"), result.get("msg")
    assert tree(outside) == before  # nothing on the build host
    written = [p for p, (kind, _m, data) in tree(root).items() if data == b"x\n"]
    assert len(written) == 1 and written[0].startswith(str(root) + "/") and written[0].endswith("50-k3s-gpu-nvidia.toml")
    assert result["files"][0]["path"] == str(root) + DROPIN  # reported as asked


def test_a_relative_symlink_that_climbs_out_stays_in_the_root(capsys, root, outside):
    os.makedirs(str(root) + "/var/lib")
    os.symlink("../../../../../../../../" + str(outside).lstrip("/") + "/data/rancher", str(root) + "/var/lib/rancher")
    before = tree(outside)
    result = run(capsys, [{"path": str(root) + DROPIN, "content": "x\n", "expected_state": "absent"}], root=root)
    assert not result.get("failed"), result.get("msg")
    assert tree(outside) == before


@pytest.mark.parametrize("path, lands", [
    ("/../../../x/agent/etc/containerd/config.toml", "/x/agent/etc/containerd/config.toml"),  # data-dir: /../../../x
    ("/var/lib/../../../../x.toml", "/x.toml"),
])
def test_dots_that_climb_above_the_root_stop_at_it(capsys, root, outside, path, lands):
    # as on the node itself (/.. is /) and as runtime_info reads it: the root is the node's /
    before = dict((p, v) for p, v in tree(root.parent).items() if not p.startswith(str(root)))
    result = run(capsys, [{"path": str(root) + path, "content": "x\n"}], root=root)
    assert not result.get("failed"), result.get("msg")
    assert open(str(root) + lands).read() == "x\n"
    assert dict((p, v) for p, v in tree(root.parent).items() if not p.startswith(str(root))) == before


def test_a_path_outside_the_root_is_refused(capsys, root, outside):
    result = run(capsys, [{"path": str(outside) + "/x.toml", "content": "x\n"}], root=root)
    assert result["failed"] and "is not under root %s" % root in result["msg"]
    assert not os.path.exists(str(outside) + "/x.toml")


def test_a_missing_root_is_refused_and_not_created(capsys, tmp_path):
    missing = tmp_path / "no-such-root"
    result = run(capsys, [{"path": str(missing) + "/etc/x", "content": "x\n"}], root=missing)
    assert result["failed"] and "cannot be opened" in result["msg"] and not missing.exists()


def test_a_multi_file_write_is_all_or_nothing(capsys, root):
    # config.yaml.d is a regular file: the second file cannot be written, and the first one is put back
    os.makedirs(str(root) + "/etc/rancher/k3s")
    open(str(root) + "/etc/rancher/k3s/config.yaml.d", "w").write("not a directory\n")
    os.makedirs(str(root) + "/var/lib/rancher/k3s/agent/etc/containerd")
    template = str(root) + "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl"
    open(template, "w").write("mine\n")
    before = tree(root)
    result = run(capsys, [
        {"path": template, "content": "ours\n", "expected_state": "file",
         "expected_sha1": hashlib.sha1(b"mine\n").hexdigest()},
        {"path": str(root) + "/var/lib/rancher/k3s/agent/etc/containerd/new.toml", "content": "new\n"},
        {"path": str(root) + "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml", "content": "a: b\n"},
    ], root=root)
    assert result["failed"] and result["files"] == [] and result["changed"] is False
    message = result["msg"]
    assert "config.yaml.d" in message and "errno %d" % errno.ENOTDIR in message or "errno %d" % errno.EEXIST in message
    assert "move it away" in message and "nothing was changed: the 2 file(s) before it were put back" in message
    assert tree(root) == before  # bytes, modes, no new directory, no temporary file


def test_an_immutable_file_is_named_with_the_errno_and_the_fix(capsys, root, monkeypatch):
    # what the OS says for a chattr +i file (EPERM on the rename over it)
    target = str(root) + "/config.toml"
    open(target, "w").write("old\n")

    def refuse(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted", dst)
    monkeypatch.setattr(os, "rename", refuse)
    result = run(capsys, [{"path": target, "content": "new\n"}], root=root)
    assert result["failed"] and "None" not in result["msg"]
    assert target in result["msg"] and "errno %d" % errno.EPERM in result["msg"] and "chattr -i" in result["msg"]
    monkeypatch.undo()
    assert open(target).read() == "old\n" and [n for n in os.listdir(str(root)) if n != "config.toml"] == []


def test_the_temporaries_a_killed_run_left_are_removed(capsys, root):
    directory = str(root) + "/etc/rancher/k3s/config.yaml.d"
    os.makedirs(directory)
    left = [directory + "/.50-k3s-gpu-nvidia.yaml" + node_files.TEMP_MARK + suffix for suffix in ("ab12cd34", "x")]
    for path in left:
        open(path, "w").write("half")
    users = directory + "/.50-k3s-gpu-nvidia.yaml.backup01"  # a name of the user's: not ours to remove
    open(users, "w").write("mine")
    result = run(capsys, [{"path": directory + "/50-k3s-gpu-nvidia.yaml", "content": "a: b\n"}], root=root)
    assert not result.get("failed"), result.get("msg")
    assert sorted(result["temporaries_removed"]) == sorted(left) and not any(os.path.exists(p) for p in left)
    assert open(users).read() == "mine"
    # check mode names them and leaves them
    open(left[0], "w").write("half")
    checked = run(capsys, [{"path": directory + "/50-k3s-gpu-nvidia.yaml", "content": "a: b\n"}], root=root, check_mode=True)
    assert checked["temporaries_removed"] == [left[0]] and os.path.exists(left[0])


def _race(root, path, barrier, results):
    """One writer: waits for the other at the barrier, then creates path only if it does not exist."""
    import contextlib
    import io
    args = {"root": root, "files": [{"path": path, "content": "writer %d\n" % os.getpid(), "expected_state": "absent"}]}
    out = io.StringIO()
    barrier.wait()
    with patch_module_args(args), contextlib.redirect_stdout(out):
        try:
            node_files.main()
        except SystemExit:
            pass
    results.put(json.loads(out.getvalue()))


def test_two_writers_never_both_create_one_file(tmp_path):
    # 200 races of two processes with expected_state absent on one path: exactly one creates it each time
    context = multiprocessing.get_context("fork")
    both = []
    for number in range(200):
        root = tmp_path / ("r%d" % number)
        root.mkdir()
        path = str(root) + "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml"
        barrier, results = context.Barrier(2), context.Queue()
        writers = [context.Process(target=_race, args=(str(root), path, barrier, results)) for _writer in range(2)]
        for writer in writers:
            writer.start()
        outcomes = [results.get(timeout=60) for _writer in writers]
        for writer in writers:
            writer.join()
        created = [o for o in outcomes if not o.get("failed") and o["files"][0]["action"] == "created"]
        refused = [o for o in outcomes if o.get("failed") and "was created after it was read" in o["msg"]]
        if len(created) != 1 or len(refused) != 1:
            both.append((number, outcomes))
    assert both == []


def test_a_tidy_entry_never_touches_its_file(capsys, root):
    # the take-back's clean-up of what an interrupted take-back left: copies go, an emptied directory goes, and a file
    # that exists (k3s wrote its config.toml meanwhile) is neither expected absent nor removed
    backups = str(root) + "/var/backups/k3s-gpu-nvidia/etc/x"
    os.makedirs(backups)
    open(backups + "/config.toml.1.2026-12-05@10:00:00~", "w").write("old copy\n")
    os.makedirs(str(root) + "/etc/x")
    open(str(root) + "/etc/x/config.toml", "w").write("written by k3s after the reading\n")
    os.makedirs(str(root) + "/etc/rancher/k3s/config.yaml.d")
    result = run(capsys, [
        {"path": str(root) + "/etc/x/config.toml", "state": "tidy", "drop_backups": True,
         "backup_to": backups + "/config.toml", "backup_root": str(root) + "/var/backups", "remove_empty_parent": True},
        {"path": str(root) + "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml", "state": "tidy",
         "remove_empty_parent": True, "prune_parents_to": str(root) + "/etc/rancher"},
    ], root=root)
    assert not result.get("failed"), result.get("msg")
    assert open(str(root) + "/etc/x/config.toml").read() == "written by k3s after the reading\n"
    assert not os.path.exists(str(root) + "/var/backups") and not os.path.exists(str(root) + "/etc/rancher")
    assert [f["action"] for f in result["files"]] == ["unchanged", "unchanged"] and result["changed"]


def test_a_path_that_reaches_the_root_only_through_dots_is_refused(capsys, root, outside):
    # /elsewhere/../<root>/x is not written as <root>/x: the part after root is what names the node's file
    detour = str(outside) + "/.." + str(root)[len(str(outside.parent)):] + "/x.toml"
    result = run(capsys, [{"path": detour, "content": "x\n"}], root=root)
    assert result["failed"] and "is not under root" in result["msg"] and not os.path.exists(str(root) + "/x.toml")
