#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_files
short_description: Internal - write or remove several files of a node in one round trip, each only if still as read
version_added: 1.0.0
description:
  - B(Internal to M(k3s_gpu.nvidia.containerd_runtimes) and the role k3s_gpu.nvidia.gpu_node; its options and results may
    change without notice.)
  - The writer behind M(k3s_gpu.nvidia.containerd_runtimes) - after the controller has read a node and decided
    the exact text of every file it changes, this module applies all of them in one module execution instead
    of one M(ansible.builtin.copy) (a checksum, then a copy) per file.
  - Compare and swap - each file can carry the SHA-1 of the text the decision was made from (or the promise that
    it did not exist). Every expectation is checked before anything is written; when one no longer holds (a person
    or another tool changed the file since it was read) the module fails, names the file, and writes nothing.
  - Each write is atomic (a temporary file in the same directory, validated, then renamed over the target) and keeps
    the SELinux context, owner and mode of the file it replaces. A new file gets O(files[].mode) (default V(0600))
    and missing parent directories are created with O(files[].directory_mode).
  - Files are applied in the order given, all or nothing - when one cannot be written, the files this execution
    already changed are put back (text, mode, owner) and the directories it created removed, and the error names the
    file, the OS error and the fix.
  - One writer per node - the module holds an exclusive lock on O(root) for its whole execution, so that two runs never
    both pass the compare and swap on one file. Temporary files a killed run left next to these files
    (C(.<name>.k3s-gpu-nvidia-tmp.*)) are removed first.
  - Every path lies under O(root) - its directories are resolved there as M(k3s_gpu.nvidia.runtime_info) reads them (an
    absolute symlink such as C(/var/lib/rancher -> /data/rancher) in an image tree points into that tree, not into
    the machine running the module); a path that leaves O(root) is refused.
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
  root:
    description:
      - The directory that stands for C(/) of the node (an image tree, a sandbox); every path lies under it.
    type: path
    default: /
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
            V(absent) removes the file; V(tidy) leaves the file as it is and only does O(files[].drop_backups) and,
            where the file is gone, O(files[].remove_empty_parent) (what an interrupted take-back left).
        type: str
        default: file
        choices: [file, absent, tidy]
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
      prune_parents_to:
        description:
          - With O(files[].remove_empty_parent), also remove the directories above the file's while they are left
            empty, up to and including this one.
        type: path
      backup_to:
        description:
          - Where the copies of O(files[].backup) go instead of next to the file - each copy is
            C(<backup_to>.<pid>.<date>@<time>~), and missing directories are created with mode V(0700) (V(0755) above
            O(files[].backup_root)). Keep it
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
import fcntl
import hashlib
import os
import shlex
import shutil
import stat
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._detect import NodeFS
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._specs import NODE_FILES_SPEC

_ATTRIBUTE_KEYS = ("mode", "owner", "group", "seuser", "serole", "setype", "selevel", "attributes", "unsafe_writes")
NEW_FILE_MODE = "0600"
# the temporary file of a write: `.<name>` + this + a random part; what a killed run left is removed by the next one
TEMP_MARK = ".k3s-gpu-nvidia-tmp."
# what to do about an OS error, by errno (the file is named in the message)
_OS_FIXES = {
    errno.EPERM: "the file or its directory is immutable or append-only (lsattr shows i or a: chattr -i it) or a "
                 "security module refuses the write; fix that, then run again",
    errno.EACCES: "the module's user may not write there: run the task with become, or fix the permissions",
    errno.EROFS: "the file system is mounted read-only: remount it read-write (or write the image that holds it)",
    errno.ENOSPC: "the file system is full: free some space, then run again",
    errno.EDQUOT: "the disk quota is used up: free some space, then run again",
    errno.EEXIST: "something that is not a directory stands where a directory is needed: move it away",
    errno.ENOTDIR: "something that is not a directory stands where a directory is needed: move it away",
    errno.EISDIR: "a directory stands where the file goes: move it away",
}


class NodeFileError(K3sGpuError):
    """A file that cannot be written as asked (the collection's one error type); its message is kept as written."""

    def __init__(self, message):
        super(NodeFileError, self).__init__(message)
        self.message = message

    def __str__(self):
        return self.message


class Undo:
    """What this execution changed, to put back when a later file fails: the node ends as it was (all or nothing)."""

    def __init__(self):
        self.files = []  # (host path, bytes or None, stat or None), in the order they were changed
        self.created = []  # files and directories this execution created that were not there

    def keep(self, path):
        try:
            info = os.lstat(path)
        except OSError:
            self.files.append((path, None, None))
            return
        with open(path, "rb") as handle:
            self.files.append((path, handle.read(), info))

    def put_back(self):
        for path, data, info in reversed(self.files):
            try:
                if data is None:
                    if os.path.lexists(path):
                        os.unlink(path)
                    continue
                _write_back(path, data, info)
            except OSError:
                continue  # the first error is what the user reads; the rest stays as the failure left it
        for path in reversed(self.created):
            try:
                os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
            except OSError:
                continue


def _write_back(path, data, info):
    descriptor, scratch = tempfile.mkstemp(prefix=".%s%s" % (os.path.basename(path), TEMP_MARK), dir=os.path.dirname(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.chmod(scratch, stat.S_IMODE(info.st_mode))
        if hasattr(os, "chown"):
            os.chown(scratch, info.st_uid, info.st_gid)
        os.rename(scratch, path)
    finally:
        if os.path.lexists(scratch):
            os.unlink(scratch)


def _os_error(exc, path):
    """One line for an OS error while writing path: the file (and where it failed, when elsewhere), the error, the fix."""
    where = to_native(exc.filename) if exc.filename else None
    at = " (at %s)" % where if where and where != path else ""
    reason = exc.strerror or to_native(exc)
    fix = _OS_FIXES.get(exc.errno, "fix that, then run again")
    return "%s was not written%s: %s (errno %s); %s" % (path, at, reason, exc.errno, fix)


# --- where a path lies: inside the node's root, as the reading resolves it -----------------------------------

def _inside(root, path):
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def confine(root, path, what):
    """The host path of path (a path under root), its directories' symlinks resolved inside root as runtime_info
    reads them (an absolute link target is a path of the node, not of the machine running this): a write never
    leaves the root. Its last part is not followed (a symlink there is refused by _read)."""
    root = os.path.abspath(root or "/")
    if not os.path.isabs(path):
        raise NodeFileError("%s must be absolute, got %r; nothing was written" % (what, path))
    if not _inside(root, path):  # as written: the part after root is the node's path (its dots stop at its /)
        raise NodeFileError("%s %s is not under root %s; nothing was written. Give a path under root" % (what, path, root))
    node_path = "/" + path[len(root.rstrip("/")):].lstrip("/") if root != "/" else path
    node_path = os.path.normpath(node_path).replace("//", "/")  # `..` above the node's / stays at it, as on the node
    directory = NodeFS(root).host_path(os.path.dirname(node_path) or "/")
    if directory is None:
        raise NodeFileError("%s %s: its directories hold a symlink loop; nothing was written. Replace the links" % (what, path))
    name = os.path.basename(node_path)
    if name in ("", ".", ".."):
        raise NodeFileError("%s %s does not name a file; nothing was written" % (what, path))
    return os.path.join(directory, name)


def confined_entries(root, entries):
    """The entries with every path resolved inside root (given: the path as the caller wrote it, for the result)."""
    out = []
    for index, entry in enumerate(entries):
        entry = dict(entry, given=entry["path"])
        entry["path"] = confine(root, entry["path"], "files[%d].path" % index)
        for key in ("backup_to", "backup_root", "prune_parents_to"):
            if entry.get(key):
                entry[key] = confine(root, entry[key], "files[%d].%s" % (index, key))
        out.append(entry)
    return out


class NodeLock:
    """One writer per node: an exclusive lock on the root directory for the whole execution, so that two runs never
    both pass the compare and swap on one file (the kernel drops it when the process ends, even when it is killed)."""

    def __init__(self, root):
        self.root = root
        self.descriptor = None

    def __enter__(self):
        try:
            self.descriptor = os.open(self.root, os.O_RDONLY)
        except OSError as exc:
            raise NodeFileError("root %s cannot be opened: %s; nothing was written. Give an existing directory"
                                % (self.root, exc.strerror or to_native(exc)))
        fcntl.flock(self.descriptor, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info):
        os.close(self.descriptor)  # closing the descriptor releases the lock
        return False


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
        if entry["state"] == "file" and entry["content"] is None and entry["expected_state"] == "absent":
            raise NodeFileError("files[%d] (%s): expected_state=absent needs content to create the file" % (index, path))
        state, data = _read(path)
        if entry["state"] == "tidy":
            current.append((state, data))
            continue  # the file itself is not touched: nothing to expect of it
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


def remove_stale_temporaries(module, entries):
    """The temporary files a killed run left next to these files (`.<name>.k3s-gpu-nvidia-tmp.*`; no program reads
    them, and under the node lock no other run is writing one). Returns their paths."""
    stale = []
    for entry in entries:
        directory, prefix = os.path.dirname(entry["path"]), ".%s%s" % (os.path.basename(entry["path"]), TEMP_MARK)
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        stale.extend(os.path.join(directory, n) for n in sorted(names) if n.startswith(prefix))
    if not module.check_mode:
        for path in stale:
            os.unlink(path)
    return stale


def _file_args(module, entry, creating):
    params = dict((key, entry[key]) for key in _ATTRIBUTE_KEYS)
    if creating and params["mode"] is None:
        params["mode"] = NEW_FILE_MODE
    return module.load_file_common_arguments(params, path=entry["path"])


def _make_parents(module, entry, undo):
    parent = os.path.dirname(entry["path"])
    missing = []
    while parent and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        os.mkdir(directory, _initial_mode(entry["directory_mode"]))  # its mode from the first instant (umask aside)
        undo.created.append(directory)
        module.set_mode_if_different(directory, entry["directory_mode"], False)


def _validate(module, entry, scratch):
    command = entry["validate"]
    if "%s" not in command:
        raise NodeFileError("files[].validate for %s must contain %%s (the new file), got %r" % (entry["path"], command))
    argv = [part.replace("%s", scratch) for part in shlex.split(command)]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        raise NodeFileError("%s was not written: %r failed (rc %d): %s" % (entry["path"], command, rc, (err or out).strip()))


def _backup(module, entry, undo):
    """Copy the file before it is replaced or removed: next to it, or under backup_to (then prune to backup_keep)."""
    if not entry["backup_to"]:
        copy = module.backup_local(entry["path"])
        undo.created.append(copy)
        return copy
    target = entry["backup_to"]
    parent = os.path.dirname(target)
    missing = []
    while parent and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    top = entry["backup_root"] or os.path.dirname(target)
    for directory in reversed(missing):
        # the tree of copies is private (they are copies of 0600 files); what holds it is as the OS makes it
        mode = 0o700 if directory.startswith(top.rstrip("/") + "/") else 0o755
        os.mkdir(directory, mode)  # its mode from the first instant; chmod for a umask that takes more away
        if stat.S_IMODE(os.stat(directory).st_mode) != mode:
            os.chmod(directory, mode)
        undo.created.append(directory)
    stamp = "%s.%s.%s" % (target, os.getpid(), time.strftime("%Y-%m-%d@%H:%M:%S", time.localtime(time.time())))
    copy, number = stamp + "~", 0
    while os.path.lexists(copy):  # two copies within a second: the older one stays
        number += 1
        copy = "%s.%d~" % (stamp, number)
    shutil.copy2(entry["path"], copy)
    undo.created.append(copy)
    return copy


def _prune_copies(entry):
    """Keep only the newest backup_keep copies of the file (after every file is applied: pruning cannot be undone)."""
    keep = entry["backup_keep"] or 0
    if entry["backup_to"] and keep > 0:
        for old in _copies(entry["backup_to"])[:-keep]:
            os.unlink(old)


def _copies(target):
    """The copies of one file under its backup_to, oldest first."""
    directory, stem = os.path.dirname(target), os.path.basename(target) + "."
    try:
        names = [n for n in os.listdir(directory) if n.startswith(stem) and n.endswith("~")]
    except OSError:
        return []
    paths = [os.path.join(directory, n) for n in names]
    return sorted(paths, key=lambda p: (os.path.getmtime(p), p))


def _remove_empty_directories(directory, top):
    """Remove directory and its parents while they are empty, up to and including top. Returns those removed."""
    top = os.path.normpath(top)
    removed = []
    while not os.path.isdir(directory) and directory.startswith(top.rstrip("/") + os.sep):
        directory = os.path.dirname(directory)  # an interrupted run removed it: go on from the first one left
    while directory == top or directory.startswith(top.rstrip("/") + os.sep):
        try:
            os.rmdir(directory)
        except OSError:
            break  # not empty (or gone): what is above it stays too
        removed.append(directory)
        directory = os.path.dirname(directory)
    return removed


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
    _remove_empty_directories(os.path.dirname(entry["backup_to"]),
                              entry["backup_root"] or os.path.dirname(entry["backup_to"]))
    return removed


def _atomic_move(module, scratch, path, unsafe_writes):
    """AnsibleModule.atomic_move (it keeps the replaced file's owner, mode and SELinux context), its failure raised
    instead of ending the module, so that what this execution already changed is put back first."""
    def refuse(msg="", **_kwargs):
        raise NodeFileError("%s was not written: %s" % (path, msg))
    fail_json = module.fail_json
    module.fail_json = refuse
    try:
        module.atomic_move(scratch, path, unsafe_writes=unsafe_writes)
    except (NodeFileError, OSError):
        raise
    except Exception as exc:  # pylint: disable=broad-except
        # ansible-core 2.19 raises a bare Exception from a failed final rename, its OS error as the cause
        cause = exc.__cause__
        if isinstance(cause, OSError):
            raise OSError(cause.errno, cause.strerror, path) from exc
        raise NodeFileError("%s was not written: %s" % (path, to_native(exc)))
    finally:
        module.fail_json = fail_json


def _initial_mode(mode):
    """The permission bits a new file starts with: the octal mode asked for, else (none, or a symbolic one, which
    set_fs_attributes applies right after) 0600."""
    if isinstance(mode, int):
        return mode & 0o7777
    text = str(mode or NEW_FILE_MODE)
    return int(text, 8) & 0o7777 if text.isdigit() and set(text) <= set("01234567") else int(NEW_FILE_MODE, 8)


def _write(module, entry, state, undo):
    path = entry["path"]
    creating = state == "absent"
    if creating:
        _make_parents(module, entry, undo)
    descriptor, scratch = tempfile.mkstemp(prefix=".%s%s" % (os.path.basename(path), TEMP_MARK), dir=os.path.dirname(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(to_bytes(entry["content"], errors="surrogate_or_strict"))
            handle.flush()
            os.fsync(handle.fileno())
        if entry["validate"]:
            _validate(module, entry, scratch)
        backup = _backup(module, entry, undo) if entry["backup"] and not creating else None
        undo.keep(path)
        if creating:
            # a new file has its mode before it has its name: a run killed right after the rename leaves no file
            # readable by more than it should be (atomic_move would chmod it only after the rename)
            os.chmod(scratch, _initial_mode(entry["mode"]))
            os.rename(scratch, path)
        else:
            _atomic_move(module, scratch, path, entry["unsafe_writes"])
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    module.set_fs_attributes_if_different(_file_args(module, entry, creating), False)
    return backup


def _remove_empty_parent(module, entry):
    """The file's directory, removed when nothing else is in it (check mode: when only the file is); else None.
    With prune_parents_to, the directories above it go too while they are empty, up to and including that one."""
    if entry["backup"] and not entry["backup_to"]:
        return None  # the backup sits next to the removed file
    parent = os.path.dirname(entry["path"])
    top = entry["prune_parents_to"] or parent
    while not os.path.isdir(parent) and parent.startswith(top.rstrip("/") + "/"):
        parent = os.path.dirname(parent)  # an interrupted take-back removed it: go on from the first one left
    try:
        if [name for name in os.listdir(parent) if name != os.path.basename(entry["path"])]:
            return None
    except OSError:
        return None  # gone already
    if module.check_mode:
        return parent
    removed = _remove_empty_directories(parent, top)
    return removed[0] if removed else None


def _apply_one(module, entry, state, data, undo):
    """Write or remove one file (not in check mode); returns its outcome."""
    outcome = {"path": entry["given"], "action": "unchanged", "backup_file": None, "parent_removed": None}
    if entry["state"] == "tidy":
        return outcome, data
    new = None if entry["state"] == "absent" else (
        data if entry["content"] is None else to_bytes(entry["content"], errors="surrogate_or_strict"))
    if entry["state"] == "absent":
        if state == "file":
            outcome["action"] = "removed"
            if not module.check_mode:
                if entry["backup"]:
                    outcome["backup_file"] = _backup(module, entry, undo)
                undo.keep(entry["path"])
                os.unlink(entry["path"])
    elif new != data:
        outcome["action"] = "created" if state == "absent" else "updated"
        if not module.check_mode:
            outcome["backup_file"] = _write(module, entry, state, undo)
    else:
        if not module.check_mode:
            undo.keep(entry["path"])  # its attributes may change
        if module.set_fs_attributes_if_different(_file_args(module, entry, False), False):
            # in check mode AnsibleModule only reports what it would change
            outcome["action"] = "attributes"
    return outcome, new


def _tidy(module, entry, outcome, result):
    """What cannot be undone, done once every file is applied: old copies pruned or dropped, emptied directories."""
    if not module.check_mode and outcome["backup_file"]:
        _prune_copies(entry)
    gone = outcome["action"] == "removed" or (entry["state"] == "tidy" and not os.path.lexists(entry["path"]))
    if entry["remove_empty_parent"] and gone:
        # tidy: a file already gone (an interrupted take-back) still leaves its emptied directory to remove
        outcome["parent_removed"] = _remove_empty_parent(module, entry)
        if outcome["parent_removed"]:
            result["changed"] = True
    if entry["drop_backups"]:
        outcome["backups_removed"] = _drop_backups(module, entry)
        if outcome["backups_removed"]:
            result["changed"] = True


def apply(module, entries, result):
    """Apply every entry in order, all or nothing: when one fails, what the others changed is put back and the error
    says so. Then the tidying that cannot be undone (old copies, emptied directories). result["files"] is filled only
    once every file is applied."""
    diffs = []
    removed = remove_stale_temporaries(module, entries)
    if removed:
        result["temporaries_removed"] = removed
        result["changed"] = True
    current = _check_expectations(entries)
    undo = Undo()
    outcomes = []
    try:
        for entry, (state, data) in zip(entries, current):
            outcomes.append(_apply_one(module, entry, state, data, undo) + (data,))
    except (NodeFileError, IOError, OSError) as exc:
        undo.put_back()
        text = _os_error(exc, entry["path"]) if isinstance(exc, (IOError, OSError)) else str(exc)
        others = len(outcomes)
        ending = "nothing was changed: the %d file(s) before it were put back" % others if others else "nothing was changed"
        raise NodeFileError("%s; %s" % (text, ending))
    for entry, (outcome, new, data) in zip(entries, outcomes):
        _tidy(module, entry, outcome, result)
        result["files"].append(outcome)
        if outcome["action"] != "unchanged":
            result["changed"] = True
        if module._diff and outcome["action"] in ("created", "updated", "removed"):
            diffs.append(dict(before_header=entry["given"], after_header=entry["given"],
                              before=to_native(data or b"", errors="surrogate_or_replace"),
                              after=to_native(new or b"", errors="surrogate_or_replace")))
    if diffs:
        result["diff"] = diffs
    return result


def main():
    module = AnsibleModule(argument_spec=NODE_FILES_SPEC, supports_check_mode=True)
    result = {"changed": False, "files": []}
    root = os.path.abspath(module.params["root"] or "/")
    try:
        entries = confined_entries(root, module.params["files"])
        with NodeLock(root):
            apply(module, entries, result)
    except NodeFileError as exc:
        module.fail_json(msg=str(exc), **result)
    except (IOError, OSError) as exc:
        # only the tidying after every file was applied can get here: the files stay applied
        module.fail_json(msg="every file was written, but tidying after the write failed: %s (errno %s) at %s; remove "
                             "what is left by hand" % (exc.strerror or to_native(exc), exc.errno, to_native(exc.filename)),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
