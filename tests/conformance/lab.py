# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Real containerd on the development machine: the conformance suite's lab.

Three containerd lines ("1.6" Debian 12's package, "1.7" trixie's, "2.x" sid's), installed by
scripts/install-containerd.sh, which writes .cache/containerd/versions.json (read by versions()).

- config_dump(line, text): `containerd --config F config dump`, the offline validator.
- lab_settings(line, workdir): the values the k3s base template takes (root, state, socket, opt,
  pause image, snapshotter, CNI dirs, registry dir), all private to workdir / a short /tmp dir.
- apply_lab_overrides(text, line): adds the few keys only THIS machine needs (no CAP_SYS_RESOURCE,
  no systemd as PID 1, no NRI socket in /run) by editing the composed config text in place:
  under the existing table header when the config has one (k3s's base always emits the CRI
  tables, so appending a table would duplicate it and containerd would refuse the file), else as
  a new table before the first header. The result is checked with tomllib. lab_only_overrides()
  describes them for the test output.
- Daemon(line, text, workdir): containerd with private root/state/socket (passed on the command
  line, as k3s does for v2 configs), CRI status, image import, pods through CRI. Daemons of the
  same line and workdir may overlap: the second takes slot 1 (lab-16.1/, 16.1.sock), and so on;
  each slot's root persists for the workdir, so imported images are reused by the next daemon.
- build_images(workdir), write_fake_runtime(path, log): busybox/pause OCI image tars, and a
  stand-in NVIDIA runtime that logs its argv and execs runc.
- cleanup_stale(): kills and removes what an interrupted run (owner process gone) left behind.
- host_snapshot() / leftovers(before): what a run left on the host (conftest checks it at session end).

What a daemon writes outside its workdir and removes again: /run/containerd/{s,runc,fifo} entries
(shim sockets, runc state; paths the shim and runc hard-code), /run/containerd itself (2.x),
/run/nri (2.x, only if NRI were enabled), cgroup v1 dirs under /sys/fs/cgroup/<controller>/
(pods get the cgroup parent /k3sgpu-lab-<line>-<id>; `k8s.io`/`default` are removed too when the
run created them), and its own socket dir /tmp/k3sgpu-lab-<hash>/.

Stdlib + grpc + cri_api (PyPI container-runtime-interface-api) only; no pytest import here.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import glob
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import tomllib
import uuid

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc

MARK = "k3sgpu-lab"
LINES = ("1.6", "1.7", "2.x")
INSTALL_HINT = "run scripts/install-containerd.sh (as root: apt containerd runc busybox-static + extracted 1.7/2.x .debs)"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
MANIFEST = os.path.join(REPO_ROOT, ".cache", "containerd", "versions.json")
TMP = tempfile.gettempdir()
LOCK_PATH = os.path.join(TMP, MARK + ".lock")
RUN_DIR = "/run/containerd"
RUN_ENTRIES = ("s", "runc", "fifo")
NRI_DIR = "/run/nri"
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_NAMESPACE_DIRS = ("k8s.io", "default")
OWNER_ENV = "K3SGPU_LAB_OWNER"
IMAGE_NAMES = {"busybox": "localhost/lab/busybox:1", "pause": "localhost/lab/pause:1"}
V2_CRI = ("plugins", "io.containerd.grpc.v1.cri")
V3_RUNTIME = ("plugins", "io.containerd.cri.v1.runtime")
V3_IMAGES = ("plugins", "io.containerd.cri.v1.images")
NRI = ("plugins", "io.containerd.nri.v1.nri")

DumpResult = collections.namedtuple("DumpResult", "rc data stdout stderr")
PodResult = collections.namedtuple("PodResult", "stdout_text exit_code error log_text pod_id")
PluginStatus = collections.namedtuple("PluginStatus", "type id status error rows")
Override = collections.namedtuple("Override", "table key value why mode")


class LabMissing(Exception):
    """containerd (or runc, busybox) is not installed the way the lab expects."""


class LabError(Exception):
    """The lab itself failed (daemon did not start, override could not be applied, ...)."""


# ------------------------------------------------------------------------------------ versions
def versions():
    """{"1.6": {"version", "package", "suite", "bin_dir"}, "1.7": {...}, "2.x": {...}}."""
    try:
        with open(MANIFEST, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise LabMissing("no containerd lab manifest (%s): %s" % (os.path.relpath(MANIFEST, REPO_ROOT), INSTALL_HINT)) from None
    for line in LINES:
        info = data.get(line)
        if not info or not os.access(os.path.join(info["bin_dir"], "containerd"), os.X_OK):
            raise LabMissing("containerd %s missing from the lab (%s): %s" % (line, MANIFEST, INSTALL_HINT))
    for tool in ("runc", "busybox"):
        if not shutil.which(tool, path=_PATH_TAIL):
            raise LabMissing("%s not found: %s" % (tool, INSTALL_HINT))
    return data


def binary(line, name="containerd"):
    """Path of containerd / ctr / containerd-shim-runc-v2 of a line."""
    if line not in LINES:
        raise ValueError("unknown containerd line %r (one of %s)" % (line, ", ".join(LINES)))
    return os.path.join(versions()[line]["bin_dir"], name)


_PATH_TAIL = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _line_env(line):
    """containerd's environment: the line's shim first on PATH (the shim, runc and the fake runtime inherit it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTAINERD_", "NOTIFY_SOCKET"))}
    env["PATH"] = versions()[line]["bin_dir"] + ":" + _PATH_TAIL
    return env


# --------------------------------------------------------------------------------- config dump
def config_dump(line, config_text, timeout=30):
    """`containerd --config <tmp> config dump` of a line; data is the parsed stdout (rc 0) or None."""
    exe = binary(line)
    fd, path = tempfile.mkstemp(prefix=MARK + "-dump-", suffix=".toml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(config_text)
        proc = subprocess.run([exe, "--config", path, "config", "dump"], capture_output=True, text=True,
                              timeout=timeout, env=_line_env(line), check=False)
    finally:
        os.unlink(path)
    data = None
    if proc.returncode == 0:
        try:
            data = tomllib.loads(proc.stdout)
        except tomllib.TOMLDecodeError:
            data = None
    return DumpResult(proc.returncode, data, proc.stdout, proc.stderr)


# ------------------------------------------------------------------------------ lab settings
def _line_tag(line):
    return {"1.6": "16", "1.7": "17", "2.x": "2x"}[line]


def socket_dir(workdir, create=True):
    """Short per-workdir dir for sockets (a unix socket path must stay <= 104 chars)."""
    digest = hashlib.sha1(os.path.abspath(workdir).encode()).hexdigest()[:10]
    path = os.path.join(TMP, "%s-%s" % (MARK, digest))
    if not create:
        return path
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
            raise LabError("%s exists and is not our directory" % path) from None
    return path


def lab_settings(line, workdir, slot=0):
    """Values for the k3s base template (names as base_fixtures.render_base takes them).

    Daemon(line, ..., workdir) runs on exactly these root/state/address (slot 0; a second daemon of
    the same line and workdir running at the same time takes slot 1, ...). It passes them on its
    command line, so a config naming other paths (e.g. composed for another line) still runs there.
    """
    workdir = os.path.abspath(workdir)
    tag = _line_tag(line) + ("" if slot == 0 else ".%d" % slot)
    base = os.path.join(workdir, "lab-" + tag)
    settings = {
        "root": os.path.join(base, "root"),
        "state": os.path.join(base, "state"),
        "address": os.path.join(socket_dir(workdir, create=False), tag + ".sock"),
        "opt": os.path.join(workdir, "lab-opt"),
        "pause_image": IMAGE_NAMES["pause"],
        "snapshotter": "overlayfs",
        "cni_bin_dir": os.path.join(workdir, "lab-cni", "bin"),
        "cni_conf_dir": os.path.join(workdir, "lab-cni", "conf"),
        "registry_dir": os.path.join(workdir, "lab-registry"),
        "systemd_cgroup": False,
    }
    if len(settings["address"]) + len(".ttrpc") > 104:
        raise LabError("socket path too long for containerd: %s" % settings["address"])
    return settings


# ----------------------------------------------------------------------------- lab overrides
def _schema(data):
    return int(data.get("version", 1))


def _cri_tables(schema):
    """(table with restrict_oom_score_adj, table with stream_server_port, opt table)."""
    if schema >= 3:
        return V3_RUNTIME, V2_CRI, ("plugins", "io.containerd.internal.v1.opt")
    if schema == 2:
        return V2_CRI, V2_CRI, ("plugins", "io.containerd.internal.v1.opt")
    return ("plugins", "cri"), ("plugins", "cri"), ("plugins", "opt")


def lab_overrides(line, schema, run_pods=True, opt_path=None):
    """[Override(table, key, value, why, mode)]; mode "set" (replace or add) or "default" (add if absent)."""
    oom, stream, opt = _cri_tables(schema)
    out = [
        Override(oom, "restrict_oom_score_adj", True, "no CAP_SYS_RESOURCE here: runc cannot set the sandbox's "
                 "oom_score_adj (-998) and pods fail with 'can't get final child's PID from pipe: EOF'", "set"),
        Override(stream, "stream_server_port", "0", "k3s's fixed 10010 would collide between lab daemons; "
                 "0 = any free port (containerd's own default)", "set"),
    ]
    if line in (None, "2.x"):
        out.append(Override(NRI, "disable", True, "containerd 2.x enables NRI by default and would create "
                            "/run/nri/nri.sock outside the lab dirs", "set"))
    if opt_path:
        out.append(Override(opt, "path", opt_path, "only when the config names none: the default "
                            "/opt/containerd is outside the lab dirs", "default"))
    if run_pods:
        out.append(Override(None, "SystemdCgroup", False, "no systemd as PID 1 here: runc's systemd cgroup "
                            "driver cannot start pods; set false in every runtime's options table that has it", "runtimes"))
    return out


def _header_text(path):
    return "[" + ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k) for k in path) + "]"


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def lab_only_overrides(schema, line=None, run_pods=True):
    """(toml_text, explanation) of what apply_lab_overrides adds, for the test output (line None: all lines).

    Display only: do NOT append toml_text to a composed config (it would redefine tables that
    k3s's base already emits); use apply_lab_overrides().
    """
    toml_lines, why = [], []
    for ovr in lab_overrides(line, schema, run_pods=run_pods, opt_path="<workdir>/lab-opt"):
        where = "runtimes.*.options" if ovr.table is None else _header_text(ovr.table)
        if ovr.table is not None:
            toml_lines += [_header_text(ovr.table), "  %s = %s" % (ovr.key, _toml_value(ovr.value))]
        else:
            toml_lines += ["# in every [...runtimes.<name>.options] that sets it", "  SystemdCgroup = false"]
        why.append("%s %s = %s: %s" % (where, ovr.key, _toml_value(ovr.value), ovr.why))
    return "\n".join(toml_lines) + "\n", "\n".join(why)


_HEADER_RE = re.compile(r"^\s*\[(?!\[).*\]\s*(#.*)?$")


def _header_path(line):
    """Table path of a `[a."b".c]` header line, or None (not a header)."""
    if not _HEADER_RE.match(line):
        return None
    try:
        node = tomllib.loads(line.strip())
    except tomllib.TOMLDecodeError:
        return None
    path = []
    while isinstance(node, dict) and len(node) == 1:
        key = next(iter(node))
        path.append(key)
        node = node[key]
    return tuple(path) if node == {} else None


def _key_line_re(key):
    return re.compile(r"^(\s*)(%s|\"%s\"|'%s')\s*=.*$" % ((re.escape(key),) * 3))


# as plugin_utils/containerd/_toml.value_at: the oracle imports nothing of the engine it checks (docs/architecture-duplicates.md)
def _get(data, path):
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def apply_lab_overrides(config_text, line, run_pods=True, opt_path=None, extra=(), only_runtimes=False):
    """The config text plus the lab-only keys (see lab_overrides); (text, [Override applied]).

    Text edit, so the composed config stays what k3s would write: a key goes under its table's
    existing header (replacing the key's line when set), or a new table is inserted before the
    first header. Idempotent. Raises LabError if the result is not valid TOML with those values.
    extra: more Overrides (the cluster lab's CDI spec dir); only_runtimes: only the runtimes' options.
    """
    try:
        data = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as exc:
        raise LabError("config is not valid TOML, lab overrides not applied: %s" % exc) from None
    schema = _schema(data)
    overrides = lab_overrides(line, schema, run_pods=run_pods, opt_path=opt_path) + list(extra)
    if only_runtimes:  # a drop-in: only its own runtime tables, the CRI tables are the root config's
        overrides = [ovr for ovr in overrides if ovr.mode == "runtimes"]
    lines = config_text.split("\n")
    applied = []
    for ovr in overrides:
        if ovr.mode == "default" and _get(data, ovr.table + (ovr.key,)) is not None:
            continue
        headers = [(i, _header_path(text)) for i, text in enumerate(lines)]
        headers = [(i, p) for i, p in headers if p is not None]
        if ovr.mode == "runtimes":
            changed = False
            for idx, (start, path) in enumerate(headers):
                if len(path) < 2 or path[-1] != "options" or "runtimes" not in path[:-2]:
                    continue
                end = headers[idx + 1][0] if idx + 1 < len(headers) else len(lines)
                for j in range(start + 1, end):
                    match = _key_line_re(ovr.key).match(lines[j])
                    if match and lines[j].split("=", 1)[1].split("#")[0].strip() != _toml_value(ovr.value):
                        lines[j] = "%s%s = %s" % (match.group(1), ovr.key, _toml_value(ovr.value))
                        changed = True
            if changed:
                applied.append(ovr)
            continue
        new_line = "%s = %s" % (ovr.key, _toml_value(ovr.value))
        found = [(idx, start) for idx, (start, path) in enumerate(headers) if path == ovr.table]
        if found:
            idx, start = found[0]
            end = headers[idx + 1][0] if idx + 1 < len(headers) else len(lines)
            indent = re.match(r"\s*", lines[start]).group(0) + "  "
            existing = [j for j in range(start + 1, end) if _key_line_re(ovr.key).match(lines[j])]
            if existing:
                if lines[existing[0]].strip() == new_line:
                    continue
                lines[existing[0]] = indent + new_line
            else:
                lines.insert(start + 1, indent + new_line)
        else:
            at = headers[0][0] if headers else len(lines)
            lines[at:at] = [_header_text(ovr.table), "  " + new_line, ""]
        applied.append(ovr)
    text = "\n".join(lines)
    try:
        result = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LabError("lab overrides made the config invalid (%s); config:\n%s" % (exc, text)) from None
    for ovr in overrides:
        if ovr.mode == "runtimes":
            for name, runtime in _runtimes_of(result).items():
                value = (runtime.get("options") or {}).get(ovr.key)
                if value is not None and value != ovr.value:
                    raise LabError("lab override: runtime %s still has %s = %r" % (name, ovr.key, value))
            continue
        value = _get(result, ovr.table + (ovr.key,))
        if value is None or (ovr.mode == "set" and value != ovr.value):
            raise LabError("lab override %s.%s = %r not in the result" % (".".join(ovr.table), ovr.key, ovr.value))
    return text, applied


def _runtimes_of(data):
    """The CRI runtimes map of a parsed config (v3 or v2 names), {} when there is none."""
    for path in (V3_RUNTIME + ("containerd", "runtimes"), V2_CRI + ("containerd", "runtimes"), ("plugins", "cri", "containerd", "runtimes")):
        value = _get(data, path)
        if isinstance(value, dict):
            return value
    return {}


# ----------------------------------------------------------------------------------- images
def _arch():
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}.get(machine, machine)


def _tar_add(tar, name, data=None, mode=0o755, kind=tarfile.REGTYPE, target=""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = kind, mode, 0, 0, 0
    info.linkname = target
    if data is not None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def _busybox_layer():
    exe = shutil.which("busybox", path=_PATH_TAIL)
    if not exe:
        raise LabMissing("busybox not found: " + INSTALL_HINT)
    with open(exe, "rb") as handle:
        data = handle.read()
    applets = subprocess.run([exe, "--list"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "root"):
            _tar_add(tar, d, kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        _tar_add(tar, "bin/busybox", data)
        for applet in sorted(set(applets) - {"busybox"}):
            _tar_add(tar, "bin/" + applet, kind=tarfile.SYMTYPE, mode=0o777, target="busybox")
        _tar_add(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
        _tar_add(tar, "etc/group", b"root:x:0:\n", mode=0o644)
    return buf.getvalue()


def _oci_tar(path, name, layer, cmd):
    """Write an OCI image-layout tar with one uncompressed layer, named `name` for ctr import."""
    def blob(data):
        return "sha256:" + hashlib.sha256(data).hexdigest()

    layer_digest = blob(layer)
    config = json.dumps({
        "architecture": _arch(), "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }, sort_keys=True).encode()
    config_digest = blob(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}],
    }, sort_keys=True).encode()
    manifest_digest = blob(manifest)
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
                       "size": len(manifest), "platform": {"architecture": _arch(), "os": "linux"},
                       "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}],
    }, sort_keys=True).encode()
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), mode=0o644)
        _tar_add(tar, "index.json", index, mode=0o644)
        _tar_add(tar, "blobs", kind=tarfile.DIRTYPE)
        _tar_add(tar, "blobs/sha256", kind=tarfile.DIRTYPE)
        for data in (layer, config, manifest):
            _tar_add(tar, "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data, mode=0o644)
    os.replace(tmp, path)


def build_images(workdir):
    """{"busybox": tar, "pause": tar, "names": {"busybox": ref, "pause": ref}}; built once per workdir."""
    out_dir = os.path.join(os.path.abspath(workdir), "lab-images")
    os.makedirs(out_dir, exist_ok=True)
    paths = {kind: os.path.join(out_dir, kind + ".tar") for kind in IMAGE_NAMES}
    if not all(os.path.exists(p) for p in paths.values()):
        layer = _busybox_layer()
        _oci_tar(paths["busybox"], IMAGE_NAMES["busybox"], layer, ["/bin/sh"])
        _oci_tar(paths["pause"], IMAGE_NAMES["pause"], layer, ["/bin/sleep", "2147483"])
    return dict(paths, names=dict(IMAGE_NAMES))


def write_fake_runtime(path, log_path):
    """A stand-in NVIDIA runtime: appends its argv to log_path, then execs runc."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\n# lab stand-in for an NVIDIA runtime (tests/conformance/lab.py)\n"
                     "echo \"$0 $*\" >> %s\nexec runc \"$@\"\n" % shlex.quote(os.path.abspath(log_path)))
    os.chmod(path, 0o755)
    return path


# ------------------------------------------------------------------------ process helpers
def _proc_start(pid):
    """Start time of a process (field 22 of /proc/PID/stat), or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


def _owner_token():
    return "%d:%s" % (os.getpid(), _proc_start(os.getpid()))


def _owner_alive(token):
    try:
        pid, start = token.split(":", 1)
        return _proc_start(int(pid)) == start
    except (ValueError, AttributeError):
        return False


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def _environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            return dict(a.decode(errors="replace").split("=", 1) for a in handle.read().split(b"\0") if b"=" in a)
    except OSError:
        return {}


def _pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _lab_processes(owner=None, sock=None):
    """PIDs of lab containerd daemons and shims: the owner marker in their environment (shims
    inherit containerd's), optionally limited to one owner token or one socket."""
    found = []
    me = os.getpid()
    for pid in _pids():
        if pid == me:
            continue
        args = _cmdline(pid)
        if not args or not os.path.basename(args[0]).startswith("containerd"):
            continue
        token = _environ(pid).get(OWNER_ENV)
        if token is None or (owner is not None and token != owner):
            continue
        if sock is not None and sock not in args:
            continue
        found.append((pid, token, args))
    return found


def _kill_wait(pids, sig=signal.SIGKILL, timeout=5.0):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            state = None
            try:
                with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                pass
            if state in (None, "Z"):
                alive.remove(pid)
        if alive:
            time.sleep(0.02)
    return alive


def _mounts_under(prefixes):
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for row in handle:
            mount_point = row.split()[4].replace("\\040", " ")
            if any(mount_point == p or mount_point.startswith(p.rstrip("/") + "/") for p in prefixes):
                out.append(mount_point)
    return sorted(set(out), key=len, reverse=True)


def _umount_under(prefixes):
    for mount_point in _mounts_under(prefixes):
        subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)


def _runc_leftovers(state_dirs):
    """Containers whose bundle is under one of state_dirs: force-delete them with runc."""
    runc = shutil.which("runc", path=_PATH_TAIL)
    for runc_root in glob.glob(os.path.join(RUN_DIR, "runc", "*")):
        proc = subprocess.run([runc, "--root", runc_root, "list", "-f", "json"], capture_output=True, text=True, check=False)
        for entry in json.loads(proc.stdout or "null") or []:
            bundle = entry.get("bundle", "")
            if any(bundle.startswith(s.rstrip("/") + "/") for s in state_dirs):
                subprocess.run([runc, "--root", runc_root, "delete", "--force", entry["id"]], capture_output=True, check=False)


def _cgroup_controllers():
    return [d for d in glob.glob(os.path.join(CGROUP_ROOT, "*")) if os.path.isdir(d) and not os.path.islink(d)]


def _rmdir_tree(path):
    """rmdir a cgroup tree bottom-up (cgroup dirs go with rmdir only); False if something stayed."""
    ok = True
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok


def _run_snapshot():
    snap = {"run": os.path.isdir(RUN_DIR), "nri": os.path.exists(NRI_DIR)}
    for entry in RUN_ENTRIES:
        path = os.path.join(RUN_DIR, entry)
        snap[entry] = set(os.listdir(path)) if os.path.isdir(path) else None
    snap["cgroups"] = {os.path.join(c, d) for c in _cgroup_controllers() for d in CGROUP_NAMESPACE_DIRS
                       if os.path.isdir(os.path.join(c, d))}
    return snap


def _clean_run_entries(before, exclusive):
    """Remove what appeared under /run since `before`. Entries inside pre-existing dirs only
    when no other lab daemon runs (exclusive lock held); dirs we created only when empty."""
    for entry in RUN_ENTRIES:
        path = os.path.join(RUN_DIR, entry)
        if not os.path.isdir(path):
            continue
        if before.get(entry) is None:
            if exclusive:
                shutil.rmtree(path, ignore_errors=True)
            else:
                _rmdir_empty(path)
        elif exclusive:
            for name in set(os.listdir(path)) - before[entry]:
                target = os.path.join(path, name)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(target)
    if not before.get("run"):
        with contextlib.suppress(OSError):
            os.rmdir(RUN_DIR)
    if not before.get("nri") and os.path.exists(NRI_DIR) and exclusive:
        shutil.rmtree(NRI_DIR, ignore_errors=True)
    for cg in _run_snapshot()["cgroups"] - before.get("cgroups", set()):
        _rmdir_tree(cg)


def _rmdir_empty(path):
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


@contextlib.contextmanager
def _exclusive_lock():
    """Yields True when no other lab daemon holds the shared lock (so /run entries are ours)."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            got = True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            got = False
        yield got
    finally:
        os.close(fd)


@contextlib.contextmanager
def _deferred_sigint():
    """Teardown must finish: hold a Ctrl-C until the end of the block, then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    previous = signal.signal(signal.SIGINT, lambda *_: got.append(1))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if got:
            raise KeyboardInterrupt


# ------------------------------------------------------------------------------ stale runs
def cleanup_stale():
    """Kill and remove what lab daemons of an interrupted run left (their owner process is gone).

    Daemons and shims are found by the owner marker in their environment (never by name alone);
    their record in /tmp/k3sgpu-lab-*/<line>.json names the dirs and cgroups to remove.
    Returns the number of stale daemons/shims killed.
    """
    stale = [pid for pid, token, _args in _lab_processes() if not _owner_alive(token)]
    left = _kill_wait(stale)
    if left:
        raise LabError("stale lab processes survive SIGKILL: %s" % left)
    for record_path in glob.glob(os.path.join(TMP, MARK + "-*", "*.json")):
        try:
            with open(record_path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if _owner_alive(record.get("owner")):
            continue
        _teardown_dirs(record)
    return len(stale)


def _teardown_dirs(record):
    """Everything outside the daemon process: containers, mounts, /run entries, cgroups, socket dir."""
    state_dirs = [record["state"], record["root"]]
    if record.get("containers_started"):
        _runc_leftovers(state_dirs)
    _umount_under(state_dirs)
    for controller in _cgroup_controllers():
        path = os.path.join(controller, record["cgroup_parent"].strip("/"))
        if os.path.isdir(path):
            _rmdir_tree(path)
    before = {k: set(v) if isinstance(v, list) else v for k, v in (record.get("before") or {}).items()}
    with _exclusive_lock() as exclusive:
        _clean_run_entries(before, exclusive)
    for path in (record["address"], record["address"] + ".ttrpc", record["config"], record["record"]):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(record["address"]))


# ----------------------------------------------------------------------------------- daemon
_STALE_CHECKED = []


class Daemon:
    """containerd of one line with private dirs; a context manager.

    Daemon(line, config_text, workdir, overrides=True, run_pods=True): overrides applies
    apply_lab_overrides (run_pods=False leaves SystemdCgroup as configured: config-level checks only).
    .config_text (what the daemon loads), .applied (the overrides), .socket, .log(), .plugin_status(id),
    .cri_status(), .runtime_handlers(), .import_image(tar), .ensure_images(images), .run_pod(...).
    """

    START_TIMEOUT = 15.0

    def __init__(self, line, config_text, workdir, overrides=True, run_pods=True):
        self.line = line
        self.workdir = os.path.abspath(workdir)
        self.settings = lab_settings(line, self.workdir)  # slot 0 until start() picks a free slot
        self.applied = []
        if overrides:
            config_text, self.applied = apply_lab_overrides(config_text, line, run_pods=run_pods, opt_path=self.settings["opt"])
        self.config_text = config_text
        self.socket = self.settings["address"]
        self.base = os.path.dirname(self.settings["root"])
        self._slot_fd = None
        self.cgroup_parent = "/%s-%s-%s" % (MARK, _line_tag(line), uuid.uuid4().hex[:8])
        self.proc = None
        self.log_path = None
        self._channel = None
        self._lock_fd = None
        self._record = None
        self._closed = False
        self._pods = 0
        self.teardown_notes = []

    # ---- lifecycle
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self):
        exe = binary(self.line)
        if not _STALE_CHECKED:
            cleanup_stale()
            _STALE_CHECKED.append(True)
        sock_dir = socket_dir(self.workdir)
        self._take_slot()
        tag = os.path.basename(self.socket)[:-len(".sock")]
        record_path = os.path.join(sock_dir, tag + ".json")
        if os.path.exists(record_path):  # a previous holder of this slot died without teardown
            with open(record_path, encoding="utf-8") as handle:
                old = json.load(handle)
            _kill_wait([pid for pid, _t, _a in _lab_processes(owner=old.get("owner"), sock=self.socket)])
            _teardown_dirs(old)
        for path in (self.settings["root"], self.settings["state"], self.settings["opt"]):
            os.makedirs(path, exist_ok=True)
        config_path = os.path.join(sock_dir, tag + ".toml")
        with open(config_path, "w", encoding="utf-8") as handle:
            handle.write(self.config_text)
        for path in (self.socket, self.socket + ".ttrpc"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._lock_fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
        before = _run_snapshot()
        self._record = {
            "owner": _owner_token(), "line": self.line, "pid": None, "address": self.socket, "config": config_path,
            "record": record_path, "root": self.settings["root"], "state": self.settings["state"],
            "cgroup_parent": self.cgroup_parent, "containers_started": False,
            "before": {k: (sorted(v) if isinstance(v, set) else v) for k, v in before.items()},
        }
        self._write_record()
        count = len(glob.glob(os.path.join(self.base, "containerd-*.log"))) + 1
        self.log_path = os.path.join(self.base, "containerd-%d.log" % count)
        env = _line_env(self.line)
        env[OWNER_ENV] = self._record["owner"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [exe, "--config", config_path, "--address", self.socket,
                 "--root", self.settings["root"], "--state", self.settings["state"]],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._record["pid"] = self.proc.pid
        self._write_record()
        deadline = time.monotonic() + self.START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise LabError("containerd %s exited with rc %s before serving; log tail:\n%s"
                               % (self.line, self.proc.returncode, self.log(tail=40)))
            if self._socket_ready():
                break
            if time.monotonic() > deadline:
                raise LabError("containerd %s: no socket after %ss; log tail:\n%s" % (self.line, self.START_TIMEOUT, self.log(tail=40)))
            time.sleep(0.02)
        self._channel = grpc.insecure_channel("unix://" + self.socket)
        self._wait_cri_initialized(deadline)
        return self

    def _wait_cri_initialized(self, deadline):
        """The socket answers before the CRI service is up ("server is not initialized yet"): wait
        for any other answer (a CRI plugin in error answers UNIMPLEMENTED at once)."""
        while True:
            try:
                self._runtime().Version(cri.VersionRequest(), timeout=5)
                return
            except grpc.RpcError as exc:
                if "not initialized" not in (exc.details() or "") or time.monotonic() > deadline:
                    return
            time.sleep(0.05)

    def _take_slot(self):
        """Hold an exclusive flock on <workdir>/lab-<line>[.N]/slot.lock for the daemon's life."""
        for slot in range(64):
            settings = lab_settings(self.line, self.workdir, slot)
            base = os.path.dirname(settings["root"])
            os.makedirs(base, exist_ok=True)
            fd = os.open(os.path.join(base, "slot.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self._slot_fd, self.settings, self.base, self.socket = fd, settings, base, settings["address"]
            return
        raise LabError("no free lab slot for containerd %s in %s" % (self.line, self.workdir))

    def _socket_ready(self):
        if not os.path.exists(self.socket):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(self.socket)
            except OSError:
                return False
        return True

    def _write_record(self):
        tmp = self._record["record"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self._record, handle)
        os.replace(tmp, self._record["record"])

    def close(self):
        """Stop pods, the daemon and its shims; remove what the run created outside workdir.
        Runs every step even when one fails (and holds Ctrl-C until done); raises LabError after."""
        if self._closed:
            return
        self._closed = True
        errors = []
        with _deferred_sigint():
            try:
                self._stop(errors)
            finally:
                for name in ("_lock_fd", "_slot_fd"):  # the shared lock goes before _teardown_dirs' exclusive try
                    if getattr(self, name) is not None:
                        os.close(getattr(self, name))
                        setattr(self, name, None)
                if self._record is not None:
                    try:
                        _teardown_dirs(self._record)
                    except Exception as exc:  # pylint: disable=broad-except
                        errors.append("cleaning up: %s" % exc)
        if errors:
            raise LabError("containerd %s teardown: %s" % (self.line, "; ".join(errors)))

    def _stop(self, errors):
        if self.proc is not None and self.proc.poll() is None and self._channel is not None:
            try:
                self._remove_all_pods()
            except Exception as exc:  # pylint: disable=broad-except
                errors.append("removing pods: %s" % exc)
        if self._channel is not None:
            self._channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._record is not None:
            shims = self._wait_shims_gone(timeout=2.0)
            if shims:  # pods not removed cleanly: kill the shims; _teardown_dirs runc-deletes their containers
                self._record["containers_started"] = True
                self.teardown_notes.append("killed shims left after the daemon stopped: %s" % shims)
            left = _kill_wait(shims)
            if left:
                errors.append("processes survive SIGKILL: %s" % left)

    def _wait_shims_gone(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            shims = [pid for pid, _t, _a in _lab_processes(owner=self._record["owner"], sock=self.socket)]
            if not shims or time.monotonic() > deadline:
                return shims
            time.sleep(0.05)

    def _remove_all_pods(self):
        rt = self._runtime()
        p = cri
        try:
            pods = rt.ListPodSandbox(p.ListPodSandboxRequest(), timeout=10).items
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # CRI plugin not loaded: no pods
                return
            raise
        for pod in pods:
            rt.StopPodSandbox(p.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
            rt.RemovePodSandbox(p.RemovePodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)

    # ---- observation
    def log(self, tail=None):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except (OSError, TypeError):
            return ""
        return "\n".join(text.splitlines()[-tail:]) if tail else text

    def ctr(self, *args, namespace=None, timeout=60, check=True):
        cmd = [binary(self.line, "ctr"), "-a", self.socket] + (["-n", namespace] if namespace else []) + list(args)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_line_env(self.line), check=False)
        if check and proc.returncode:
            raise LabError("%s: rc %s: %s" % (" ".join(cmd), proc.returncode, proc.stderr.strip()))
        return proc

    def plugin_status(self, plugin_id="cri"):
        """PluginStatus(type, id, status ok|error|skip, error details or "", all rows with that id)."""
        rows = []
        for row in self.ctr("plugins", "ls").stdout.splitlines()[1:]:
            cols = row.split()
            if len(cols) >= 4 and cols[1] == plugin_id:
                rows.append({"type": cols[0], "id": cols[1], "status": cols[-1]})
        if not rows:
            return PluginStatus(None, plugin_id, None, "plugin %s not listed" % plugin_id, rows)
        error = ""
        if any(r["status"] != "ok" for r in rows):
            error = self.ctr("plugins", "ls", "-d", "id==" + plugin_id).stdout
        main = next((r for r in rows if r["type"] == "io.containerd.grpc.v1"), rows[0])
        return PluginStatus(main["type"], plugin_id, main["status"], error, rows)

    def _runtime(self):
        return cri_grpc.RuntimeServiceStub(self._channel)

    def _images(self):
        return cri_grpc.ImageServiceStub(self._channel)

    def status(self, timeout=10):
        return self._runtime().Status(cri.StatusRequest(verbose=True), timeout=timeout)

    def cri_status(self, timeout=10):
        """The live CRI config (json of Status(verbose=True).info["config"])."""
        return json.loads(self.status(timeout).info["config"])

    def runtime_handlers(self, timeout=10):
        """Handler names: from Status.runtime_handlers (2.x), else the config's runtimes map."""
        status = self.status(timeout)
        names = [h.name for h in status.runtime_handlers if h.name]
        if names:
            return sorted(names)
        return sorted(json.loads(status.info["config"])["containerd"]["runtimes"])

    # ---- images and pods
    def _snapshotter(self):
        data = tomllib.loads(self.config_text)
        for path in (V3_IMAGES + ("snapshotter",), V2_CRI + ("containerd", "snapshotter"), ("plugins", "cri", "containerd", "snapshotter")):
            value = _get(data, path)
            if value:
                return value
        return "overlayfs"

    def import_image(self, tar_path, namespace="k8s.io"):
        self.ctr("images", "import", "--snapshotter", self._snapshotter(), tar_path, namespace=namespace)

    def has_image(self, ref):
        p = cri
        return bool(self._images().ImageStatus(p.ImageStatusRequest(image=p.ImageSpec(image=ref)), timeout=10).image.id)

    def ensure_images(self, images):
        """Import build_images()' tars unless the CRI already has them (the root persists per workdir/line)."""
        for kind, ref in images["names"].items():
            if not self.has_image(ref):
                self.import_image(images[kind])

    def run_pod(self, handler, command, timeout=30, images=None, name="lab"):
        """A host-network pod with runtime_handler=handler and one busybox container running
        `command`, as kubelet would; waits for the exit, reads the container log, removes the pod.
        Returns PodResult(stdout_text, exit_code, error, log_text, pod_id); error is the gRPC
        error's details (or "timeout") when a step failed, exit_code is None then."""
        p = cri
        rt = self._runtime()
        if images is None:
            images = build_images(self.workdir)
        self.ensure_images(images)
        self._pods += 1
        uid = "%s-%d-%s" % (name, self._pods, uuid.uuid4().hex[:6])
        log_dir = os.path.join(self.base, "pods", uid)
        os.makedirs(log_dir, exist_ok=True)
        node_ns = p.NamespaceOption(network=p.NODE, pid=p.CONTAINER, ipc=p.POD)
        sandbox_config = p.PodSandboxConfig(
            metadata=p.PodSandboxMetadata(name=uid, uid=uid, namespace="lab", attempt=0),
            log_directory=log_dir,  # no hostname: host network means the host UTS namespace (kubelet does the same)
            linux=p.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=p.LinuxSandboxSecurityContext(namespace_options=node_ns)))
        pod_id = None
        self._record["containers_started"] = True
        self._write_record()
        try:
            pod_id = rt.RunPodSandbox(p.RunPodSandboxRequest(config=sandbox_config, runtime_handler=handler), timeout=timeout).pod_sandbox_id
            container_config = p.ContainerConfig(
                metadata=p.ContainerMetadata(name="main", attempt=0),
                image=p.ImageSpec(image=images["names"]["busybox"]),
                command=list(command), log_path="main.log",
                linux=p.LinuxContainerConfig(security_context=p.LinuxContainerSecurityContext(namespace_options=node_ns)))
            cid = rt.CreateContainer(p.CreateContainerRequest(pod_sandbox_id=pod_id, config=container_config,
                                                              sandbox_config=sandbox_config), timeout=timeout).container_id
            rt.StartContainer(p.StartContainerRequest(container_id=cid), timeout=timeout)
            deadline = time.monotonic() + timeout
            while True:
                st = rt.ContainerStatus(p.ContainerStatusRequest(container_id=cid), timeout=10).status
                if st.state == p.CONTAINER_EXITED:
                    break
                if time.monotonic() > deadline:
                    return PodResult("", None, "timeout: container still %s after %ss" % (p.ContainerState.Name(st.state), timeout),
                                     self._read_log(log_dir), pod_id)
                time.sleep(0.05)
            log_text = self._read_log(log_dir, wait=True)
            return PodResult(_cri_log_stream(log_text, "stdout"), st.exit_code, None, log_text, pod_id)
        except grpc.RpcError as exc:
            return PodResult("", None, exc.details() or str(exc), self._read_log(log_dir), pod_id)
        finally:
            if pod_id:
                with contextlib.suppress(grpc.RpcError):
                    rt.StopPodSandbox(p.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)
                    rt.RemovePodSandbox(p.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=30)

    @staticmethod
    def _read_log(log_dir, wait=False):
        path = os.path.join(log_dir, "main.log")
        deadline = time.monotonic() + (1.0 if wait else 0)
        while True:
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    text = handle.read()
            except FileNotFoundError:
                text = ""
            if text or time.monotonic() >= deadline:
                return text
            time.sleep(0.05)


def _cri_log_stream(log_text, stream):
    """The text of one stream from a CRI log file (`<time> <stream> <P|F> <text>` lines)."""
    out = []
    for row in log_text.splitlines():
        parts = row.split(" ", 3)
        if len(parts) >= 3 and parts[1] == stream:
            out.append((parts[3] if len(parts) == 4 else "") + ("\n" if parts[2] == "F" else ""))
    return "".join(out)


# --------------------------------------------------------------------------------- leftovers
def host_snapshot():
    """What lab runs may leave on the host; compare two snapshots with leftovers()."""
    snap = _run_snapshot()
    snap["lab_cgroups"] = set(glob.glob(os.path.join(CGROUP_ROOT, "*", MARK + "-*")))
    snap["sock_dirs"] = set(glob.glob(os.path.join(TMP, MARK + "-*")))
    snap["mounts"] = set(_mounts_under([TMP]))
    return snap


def leftovers(before, owner_only=True):
    """Human-readable list of what appeared since `before` (host_snapshot()) and is still there:
    lab daemons/shims of this process (of any process when owner_only is False), /run entries,
    cgroup dirs, socket dirs, mounts. /run and cgroup entries are only judged when no other lab
    daemon runs (another session's daemon may legitimately hold them)."""
    out = []
    owner = _owner_token() if owner_only else None
    for pid, _token, args in _lab_processes(owner=owner):
        out.append("process %d: %s" % (pid, " ".join(args)[:200]))
    now = host_snapshot()
    with _exclusive_lock() as alone:
        if alone:
            if now["run"] and not before["run"]:
                out.append(RUN_DIR)
            for entry in RUN_ENTRIES:
                new = (now[entry] or set()) - (before[entry] or set())
                if now[entry] is not None and before[entry] is None:
                    out.append("%s/%s %s" % (RUN_DIR, entry, sorted(new)))
                elif new:
                    out.append("%s/%s: %s" % (RUN_DIR, entry, sorted(new)))
            if now["nri"] and not before["nri"]:
                out.append(NRI_DIR)
            out += sorted(now["cgroups"] - before["cgroups"])
            out += sorted(now["lab_cgroups"] - before["lab_cgroups"])
            out += sorted(now["sock_dirs"] - before["sock_dirs"])
            out += ["mount " + m for m in sorted(now["mounts"] - before["mounts"])]
    return out


class NodeTree:
    """A node's file tree under a root prefix (the engine's sandbox), with stub runtime binaries that exec runc."""

    STUB = "#!/bin/sh\nexec runc \"$@\"\n"

    def __init__(self, root, binaries=()):
        self.root = str(root)
        for binary in binaries:
            self.write(binary, self.STUB, 0o755)

    def host(self, node_path):
        return self.root + node_path

    def write(self, node_path, text, mode=0o644):
        path = self.host(node_path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, mode)

    def read(self, node_path):
        with open(self.host(node_path), encoding="utf-8") as handle:
            return handle.read()
