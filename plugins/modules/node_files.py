#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_files
short_description: Write or remove several files of a node in one round trip, each only if it is still what was read
version_added: 0.1.0
description:
  - The writer behind M(k3s_gpu.nvidia.containerd_runtimes) - after the controller has read a node and decided
    the exact text of every file it changes, this module applies all of them in one module execution instead
    of one M(ansible.builtin.copy) (a checksum, then a copy) per file.
  - Compare and swap - each file can carry the SHA-1 of the text the decision was made from (or the promise that
    it did not exist). Every expectation is checked before anything is written; when one no longer holds (a person
    or another tool changed the file since it was read) the module fails, names the file, and writes nothing.
  - Each write is atomic (a temporary file in the same directory, validated, then renamed over the target) and keeps
    the SELinux context, owner and mode of the file it replaces. A new file gets O(files[].mode) (default V(0600))
    and missing parent directories are created with O(files[].directory_mode).
  - Files are applied in the order given. A failure stops there; the result lists the files already applied.
author:
  - k3s_gpu.nvidia maintainers (@k3s-gpu)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
options:
  files:
    description: The files, in the order they are applied.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path on the node.
        type: path
        required: true
      state:
        description:
          - V(file) writes O(files[].content) (or, without it, only sets the attributes of an existing file);
            V(absent) removes the file.
        type: str
        default: file
        choices: [file, absent]
      content:
        description: The whole text of the file (UTF-8). Omit it to leave the text of an existing file as it is.
        type: str
      expected_state:
        description:
          - What the file must be before the change - V(absent) or V(file). Omit it for no check.
        type: str
        choices: [absent, file]
      expected_sha1:
        description:
          - The SHA-1 (hex) of the text the change was computed from; implies O(files[].expected_state=file).
        type: str
      backup:
        description: Keep a timestamped copy of a file before replacing or removing it.
        type: bool
        default: false
      validate:
        description:
          - Command run on the new text before it replaces the file; C(%s) stands for the temporary file.
            Run without a shell. The file is not written when the command fails.
        type: str
      mode:
        description:
          - Permissions of the file (octal string). An existing file keeps its mode when this is not given;
            a new one gets V(0600).
        type: raw
      # the file's ownership and SELinux context, one line each (as ansible.builtin.file takes them)
      owner: {description: Owner of the file., type: str}
      group: {description: Group of the file., type: str}
      seuser: {description: SELinux user of the file., type: str}
      serole: {description: SELinux role of the file., type: str}
      setype: {description: SELinux type of the file., type: str}
      selevel: {description: SELinux level of the file., type: str}
      attributes:
        description: Filesystem attributes of the file, as C(chattr) takes them (for example V(+i)).
        type: str
        aliases: [attr]
      unsafe_writes:
        description: Fall back to a non-atomic write when an atomic one is impossible (some bind mounts).
        type: bool
        default: false
      directory_mode:
        description: Mode of parent directories this module creates.
        type: raw
        default: "0700"
      remove_empty_parent:
        description:
          - With O(files[].state=absent), also remove the file's directory when the removal leaves it empty (a
            directory that holds anything else, a backup included, stays).
        type: bool
        default: false
      backup_to:
        description:
          - Where the copies of O(files[].backup) go instead of next to the file - each copy is
            C(<backup_to>.<pid>.<date>@<time>~), and missing directories are created with mode V(0700). Keep it
            outside every directory a program imports as a whole (such as containerd's C(conf.d)).
        type: path
      backup_keep:
        description:
          - With O(files[].backup_to), keep only the newest N copies of the file there after making one (V(0) keeps all).
        type: int
        default: 0
      backup_root:
        description:
          - The top of the backup tree that O(files[].backup_to) lies in; O(files[].drop_backups) removes the
            directories it leaves empty up to and including this one.
        type: path
      drop_backups:
        description:
          - After the file is applied, remove every copy of it under O(files[].backup_to) (C(<backup_to>.*~)) and the
            directories this leaves empty up to O(files[].backup_root) (what the collection's take-back does).
        type: bool
        default: false
notes:
  - The text of each file travels in the module arguments; the module is meant for configuration files of a few
    KiB, not for large payloads.
seealso:
  - module: k3s_gpu.nvidia.containerd_runtimes
  - module: ansible.builtin.copy
"""

EXAMPLES = r"""
- name: Write two files in one round trip, refusing if the first changed since it was read
  k3s_gpu.nvidia.node_files:
    files:
      - path: /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/50-k3s-gpu-nvidia.toml
        content: "{{ new_dropin }}"
        expected_state: file
        expected_sha1: "{{ old_dropin | hash('sha1') }}"
        backup: true
      - path: /etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml
        content: "default-runtime: nvidia\n"
        expected_state: absent
        mode: "0600"
"""

RETURN = r"""
files:
  description: One entry per file applied (all of them in check mode), in order.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The file.
      type: str
    action:
      description: V(created), V(updated), V(removed), V(attributes) (only owner, group, mode or context changed) or V(unchanged).
      type: str
    backup_file:
      description: The copy made with O(files[].backup), else null.
      type: str
    parent_removed:
      description: The directory removed (in check mode, that would be removed) with O(files[].remove_empty_parent), else null.
      type: str
    backups_removed:
      description: The copies removed (in check mode, that would be removed) with O(files[].drop_backups).
      type: list
      elements: str
  sample: [{"path": "/etc/rancher/k3s/config.yaml.d/50-k3s-gpu-nvidia.yaml", "action": "created", "backup_file": null,
            "parent_removed": null}]
"""

import errno
import hashlib
import os
import shlex
import shutil
import stat
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import NODE_FILES_SPEC

_ATTRIBUTE_KEYS = ("mode", "owner", "group", "seuser", "serole", "setype", "selevel", "attributes", "unsafe_writes")
NEW_FILE_MODE = "0600"


class NodeFileError(Exception):
    pass


def _read(path):
    """(state, bytes): state is 'absent', 'file', or what else is there (never follows a final symlink)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "absent", None
        raise NodeFileError("%s cannot be read: %s" % (path, to_native(exc)))
    if stat.S_ISLNK(info.st_mode):
        return "symlink", None
    if not stat.S_ISREG(info.st_mode):
        return "directory" if stat.S_ISDIR(info.st_mode) else "special file", None
    try:
        with open(path, "rb") as handle:
            return "file", handle.read()
    except OSError as exc:
        raise NodeFileError("%s cannot be read: %s" % (path, to_native(exc)))


def _check_expectations(entries):
    """Every file is as the controller read it; else nothing is written."""
    current = []
    for index, entry in enumerate(entries):
        path = entry["path"]
        if not os.path.isabs(path):
            raise NodeFileError("files[%d].path must be absolute, got %r" % (index, path))
        if entry["state"] == "file" and entry["content"] is None and entry["expected_state"] == "absent":
            raise NodeFileError("files[%d] (%s): expected_state=absent needs content to create the file" % (index, path))
        state, data = _read(path)
        if state not in ("file", "absent"):
            raise NodeFileError("%s is a %s, not a regular file; nothing was written. Replace it with the file it "
                                "points to (or move it away) and run again" % (path, state))
        expected = entry["expected_state"] or ("file" if entry["expected_sha1"] else None)
        if expected == "absent" and state != "absent":
            raise NodeFileError("%s was created after it was read (it did not exist then); nothing was written. "
                                "Look at who writes it, then run again" % path)
        if expected == "file":
            if state != "file":
                raise NodeFileError("%s was removed after it was read; nothing was written. Run again" % path)
            if entry["expected_sha1"] and hashlib.sha1(data).hexdigest() != entry["expected_sha1"].lower():
                raise NodeFileError("%s changed after it was read (someone or something else edited it); nothing was "
                                    "written. Look at the change, then run again" % path)
        if entry["state"] == "file" and entry["content"] is None and state == "absent":
            raise NodeFileError("%s does not exist; give its content to create it" % path)
        current.append((state, data))
    return current


def _file_args(module, entry, creating):
    params = dict((key, entry[key]) for key in _ATTRIBUTE_KEYS)
    if creating and params["mode"] is None:
        params["mode"] = NEW_FILE_MODE
    return module.load_file_common_arguments(params, path=entry["path"])


def _make_parents(module, entry):
    parent = os.path.dirname(entry["path"])
    missing = []
    while parent and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        os.mkdir(directory)
        module.set_mode_if_different(directory, entry["directory_mode"], False)


def _validate(module, entry, scratch):
    command = entry["validate"]
    if "%s" not in command:
        raise NodeFileError("files[].validate for %s must contain %%s (the new file), got %r" % (entry["path"], command))
    argv = [part.replace("%s", scratch) for part in shlex.split(command)]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        raise NodeFileError("%s was not written: %r failed (rc %d): %s" % (entry["path"], command, rc, (err or out).strip()))


def _backup(module, entry):
    """Copy the file before it is replaced or removed: next to it, or under backup_to (then prune to backup_keep)."""
    if not entry["backup_to"]:
        return module.backup_local(entry["path"])
    target = entry["backup_to"]
    parent = os.path.dirname(target)
    missing = []
    while parent and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        os.mkdir(directory, 0o700)
    stamp = "%s.%s.%s" % (target, os.getpid(), time.strftime("%Y-%m-%d@%H:%M:%S", time.localtime(time.time())))
    copy, number = stamp + "~", 0
    while os.path.lexists(copy):  # two copies within a second: the older one stays
        number += 1
        copy = "%s.%d~" % (stamp, number)
    shutil.copy2(entry["path"], copy)
    keep = entry["backup_keep"] or 0
    if keep > 0:
        for old in _copies(target)[:-keep]:
            os.unlink(old)
    return copy


def _copies(target):
    """The copies of one file under its backup_to, oldest first."""
    directory, stem = os.path.dirname(target), os.path.basename(target) + "."
    try:
        names = [n for n in os.listdir(directory) if n.startswith(stem) and n.endswith("~")]
    except OSError:
        return []
    paths = [os.path.join(directory, n) for n in names]
    return sorted(paths, key=lambda p: (os.path.getmtime(p), p))


def _drop_backups(module, entry):
    """Remove every copy of the file under backup_to and the directories that leaves empty, up to backup_root.
    Returns the paths removed (in check mode: that would be)."""
    if not entry["backup_to"]:
        return []
    removed = _copies(entry["backup_to"])
    if module.check_mode:
        return removed
    for path in removed:
        os.unlink(path)
    top = os.path.normpath(entry["backup_root"] or os.path.dirname(entry["backup_to"]))
    directory = os.path.dirname(entry["backup_to"])
    while directory == top or directory.startswith(top + os.sep):
        try:
            os.rmdir(directory)
        except OSError:
            break  # not empty (or gone): what is above it stays too
        directory = os.path.dirname(directory)
    return removed


def _write(module, entry, state):
    path = entry["path"]
    creating = state == "absent"
    if creating:
        _make_parents(module, entry)
    descriptor, scratch = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=os.path.dirname(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(to_bytes(entry["content"], errors="surrogate_or_strict"))
            handle.flush()
            os.fsync(handle.fileno())
        if entry["validate"]:
            _validate(module, entry, scratch)
        backup = _backup(module, entry) if entry["backup"] and not creating else None
        module.atomic_move(scratch, path, unsafe_writes=entry["unsafe_writes"])
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    module.set_fs_attributes_if_different(_file_args(module, entry, creating), False)
    return backup


def _remove_empty_parent(module, entry):
    """The file's directory, removed when nothing else is in it (check mode: when only the file is); else None."""
    if entry["backup"] and not entry["backup_to"]:
        return None  # the backup sits next to the removed file
    parent = os.path.dirname(entry["path"])
    if [name for name in os.listdir(parent) if name != os.path.basename(entry["path"])]:
        return None
    if not module.check_mode:
        try:
            os.rmdir(parent)
        except OSError:
            return None  # something appeared in it meanwhile: it stays
    return parent


def apply(module, entries, result):
    """Apply every entry in order; result["files"] grows as files are applied (a failure leaves it exact)."""
    diffs = []
    current = _check_expectations(entries)
    for entry, (state, data) in zip(entries, current):
        outcome = {"path": entry["path"], "action": "unchanged", "backup_file": None, "parent_removed": None}
        if entry["drop_backups"]:
            outcome["backups_removed"] = []
        new = None if entry["state"] == "absent" else (
            data if entry["content"] is None else to_bytes(entry["content"], errors="surrogate_or_strict"))
        if entry["state"] == "absent":
            if state == "file":
                outcome["action"] = "removed"
                if not module.check_mode:
                    if entry["backup"]:
                        outcome["backup_file"] = _backup(module, entry)
                    os.unlink(entry["path"])
                if entry["remove_empty_parent"]:
                    outcome["parent_removed"] = _remove_empty_parent(module, entry)
        elif new != data:
            outcome["action"] = "created" if state == "absent" else "updated"
            if not module.check_mode:
                outcome["backup_file"] = _write(module, entry, state)
        elif module.set_fs_attributes_if_different(_file_args(module, entry, False), False):
            # in check mode AnsibleModule only reports what it would change
            outcome["action"] = "attributes"
        if entry["drop_backups"]:
            outcome["backups_removed"] = _drop_backups(module, entry)
            if outcome["backups_removed"]:
                result["changed"] = True
        result["files"].append(outcome)
        if outcome["action"] != "unchanged":
            result["changed"] = True
        if module._diff and outcome["action"] in ("created", "updated", "removed"):
            diffs.append(dict(before_header=entry["path"], after_header=entry["path"],
                              before=to_native(data or b"", errors="surrogate_or_replace"),
                              after=to_native(new or b"", errors="surrogate_or_replace")))
    if diffs:
        result["diff"] = diffs
    return result


def main():
    module = AnsibleModule(argument_spec=NODE_FILES_SPEC, supports_check_mode=True)
    result = {"changed": False, "files": []}
    try:
        apply(module, module.params["files"], result)
    except NodeFileError as exc:
        module.fail_json(msg=str(exc), **result)
    except (IOError, OSError) as exc:
        # the files before this one stay applied; result says exactly which
        module.fail_json(msg="writing failed: %s" % to_native(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
