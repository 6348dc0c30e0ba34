#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Boot and stop Debian test nodes: systemd as PID 1 (systemd-nspawn), sshd on 127.0.0.1:PORT.

    nodes.py up --name NAME [--port PORT] [--k3s v1.28.15+k3s1] [--copy] [--json]
    nodes.py down --name NAME | --all
    nodes.py list | check --name NAME | exec NAME -- CMD...

A node is .cache/nodes/<name>/: rootfs/ (an overlay on the base built by rootfs.sh, or a copy with
--copy), node.json, console.log. The host network is shared; .cache/nodes/apt-repo is bound read-only
at /srv/nvidia-repo, .cache/nodes/rpm-repo at /srv/nvidia-rpm, and .cache/containerd (if present) at /opt/standin-containerd. Needs root.
Importable: up(), down(), down_all(), list_nodes(), node_info(), inventory_line(), run_in().
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# pylint: disable=wrong-import-position
import nspawn  # noqa: E402
import standin_files  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = Path(os.environ.get("K3S_GPU_NODES_CACHE", str(REPO / ".cache" / "nodes")))
BASE = CACHE / "rootfs-base"
APT_REPO_DIR = CACHE / "apt-repo"
APT_REPO_MOUNT = "/srv/nvidia-repo"
RPM_REPO_DIR = CACHE / "rpm-repo"
RPM_REPO_MOUNT = "/srv/nvidia-rpm"
CONTAINERD_DIR = REPO / ".cache" / "containerd"
CONTAINERD_MOUNT = "/opt/standin-containerd"
PORT_RANGE = range(22200, 23000)
DEFAULT_K3S_RELEASE = "v1.28.15+k3s1"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]


class NodeError(RuntimeError):
    """A node could not be booted or stopped cleanly."""


def node_dir(name):
    return CACHE / name


def ssh_key():
    """The private key every node accepts for root (generated once)."""
    key = CACHE / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "k3s-gpu-nodes", "-f", str(key)], check=True)
    return key


def node_info(name):
    """node.json of a node, or None."""
    try:
        return json.loads((node_dir(name) / "node.json").read_text())
    except FileNotFoundError:
        return None


def _save(info):
    path = node_dir(info["name"]) / "node.json"
    path.write_text(json.dumps(info, indent=1) + "\n")


def list_nodes():
    return sorted(p.parent.name for p in CACHE.glob("*/node.json"))


def inventory_line(info):
    """One INI inventory line for the node (ssh to 127.0.0.1:PORT as root with the nodes' key)."""
    return ("%s ansible_host=127.0.0.1 ansible_port=%d ansible_user=root ansible_ssh_private_key_file=%s "
            "ansible_python_interpreter=/usr/bin/python3 ansible_ssh_common_args='%s'") % (
                info["name"], info["port"], info["key"], " ".join(SSH_OPTS))


@contextlib.contextmanager
def _lock():
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "nodes.lock", "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _free_port():
    infos = [node_info(n) or {} for n in list_nodes()]
    taken = {i.get("port") for i in infos} | {i.get("stream_port") for i in infos}
    for port in PORT_RANGE:
        if port not in taken and not nspawn.port_open(port):
            return port
    raise NodeError("no free port in %d-%d" % (PORT_RANGE[0], PORT_RANGE[-1]))


def _ensure_base():
    if not (BASE / "usr/bin/python3").exists() or not (CACHE / "rootfs-base.stamp").exists():
        subprocess.run([str(HERE / "rootfs.sh")], check=True, stdout=subprocess.DEVNULL)


def _make_rootfs(directory, copy):
    rootfs = directory / "rootfs"
    if copy:
        subprocess.run(["cp", "-a", "--reflink=auto", str(BASE), str(rootfs)], check=True)
        return rootfs, "copy"
    for sub in ("upper", "work", "rootfs"):
        (directory / sub).mkdir()
    options = "lowerdir=%s,upperdir=%s,workdir=%s" % (BASE, directory / "upper", directory / "work")
    result = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(rootfs)],
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise NodeError("overlay mount failed (%s); boot with --copy instead" % result.stderr.strip())
    return rootfs, "overlay"


def _configure(rootfs, hostname, port, key):
    (rootfs / "etc/hostname").write_text(hostname + "\n")
    (rootfs / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (rootfs / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/ssh/sshd_config.d/k3s-gpu-node.conf").write_text(
        "# host network: loopback only, own port\nListenAddress 127.0.0.1\nPort %d\n"
        "PasswordAuthentication no\nUseDNS no\n" % port)
    ssh_dir = rootfs / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(str(key) + ".pub").read_text(encoding="utf-8"), encoding="utf-8")
    (ssh_dir / "authorized_keys").chmod(0o600)


def _ssh_ok(port, key):
    argv = ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "ConnectTimeout=2"] + SSH_OPTS
    return subprocess.run(argv + ["root@127.0.0.1", "true"], capture_output=True, check=False, timeout=10).returncode == 0


def _wait_ready(info, deadline):
    """PID 1 up, `is-system-running` = running/degraded, and sshd taking the key."""
    state = ""
    while time.monotonic() < deadline:
        if not nspawn.is_nspawn(info["nspawn_pid"], info["rootfs"]):
            raise NodeError("systemd-nspawn exited: %s" % _tail(info))
        pid1 = nspawn.container_pid1(info["nspawn_pid"])
        if pid1:
            result = nspawn.nsenter(pid1, ["systemctl", "is-system-running"], timeout=10)
            state = result.stdout.strip()
            if state in ("running", "degraded") and _ssh_ok(info["port"], info["key"]):
                return pid1, state
        time.sleep(0.1)
    raise NodeError("node %s not ready (is-system-running=%r): %s" % (info["name"], state, _tail(info)))


def _tail(info, lines=5):
    try:
        return " | ".join((Path(info["dir"]) / "console.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no console.log)"


def _start_info(name, port, hostname, k3s_release, copy, k3s_server=False):
    """Reserve the port and the node dir (under the lock); return node.json's first content."""
    with _lock():
        if node_dir(name).exists():
            raise NodeError("node %s exists (%s); stop it first: nodes.py down --name %s" % (name, node_dir(name), name))
        port = port or _free_port()
        if nspawn.port_open(port):
            raise NodeError("port 127.0.0.1:%d is already in use" % port)
        node_dir(name).mkdir(parents=True)
        info = {"name": name, "hostname": hostname or name, "port": port, "dir": str(node_dir(name)),
                "key": str(ssh_key()), "k3s_release": k3s_release, "k3s_server": k3s_server, "copy": copy,
                "stream_port": port + 30000 if port + 30000 < 65536 else port - 30000}
        _save(info)
    return info


def up(name, *, port=0, hostname=None, k3s_release=None, copy=False, timeout=60, k3s_server=False):  # pylint: disable=too-many-arguments
    """Boot a node; return its node.json content (with pid1, state, boot_s). Idempotent when running."""
    if not NAME_RE.match(name):
        raise NodeError("node name %r: use 1-40 of [a-z0-9-]" % name)
    existing = node_info(name)
    if existing and nspawn.is_nspawn(existing.get("nspawn_pid", 0), existing.get("rootfs", "")) and (
            not port or port == existing["port"]):
        return existing
    if existing or node_dir(name).exists():
        down(name)
    _ensure_base()
    info = _start_info(name, port, hostname, k3s_release, copy, k3s_server)
    started = time.monotonic()
    try:
        rootfs, info["mode"] = _make_rootfs(node_dir(name), copy)
        info["rootfs"] = str(rootfs)
        _save(info)
        _configure(rootfs, info["hostname"], info["port"], info["key"])
        if k3s_release:
            standin_files.install(rootfs, k3s_release, info["stream_port"], server=k3s_server)
        APT_REPO_DIR.mkdir(parents=True, exist_ok=True)
        RPM_REPO_DIR.mkdir(parents=True, exist_ok=True)
        binds = [(APT_REPO_DIR, APT_REPO_MOUNT), (RPM_REPO_DIR, RPM_REPO_MOUNT)]
        if CONTAINERD_DIR.is_dir():
            binds.append((CONTAINERD_DIR, CONTAINERD_MOUNT))
        info["nspawn_pid"] = nspawn.start(name, rootfs, info["hostname"], binds, node_dir(name) / "console.log")
        _save(info)
        (node_dir(name) / "nspawn.pid").write_text("%d\n" % info["nspawn_pid"])
        info["pid1"], info["state"] = _wait_ready(info, started + timeout)
    except BaseException:
        with contextlib.suppress(NodeError):
            down(name)
        raise
    info["mntns"] = nspawn.mount_ns(info["pid1"])
    info["boot_s"] = round(time.monotonic() - started, 2)
    info["inventory"] = inventory_line(info)
    # one entry of molecule's instance_config.yml (default driver); the instance is the hostname
    info["instance_config"] = {"instance": info["hostname"], "address": "127.0.0.1", "user": "root",
                               "port": info["port"], "identity_file": info["key"]}
    _save(info)
    return info


def down(name, timeout=20):
    """Stop a node (clean poweroff, then kill) and remove what it left and its dir; True if there was
    anything to remove. Raises NodeError on leftovers."""
    directory = node_dir(name)
    info = node_info(name) or {}
    existed = directory.exists() or any(d.exists() for d in nspawn.cgroup_dirs(name))
    if info.get("nspawn_pid"):
        nspawn.stop(info["nspawn_pid"], info.get("rootfs", ""), timeout)
    nspawn.kill_all(nspawn.node_processes(name, info.get("mntns")))
    nspawn.remove_cgroups(name)
    nspawn.unmount_all(directory)
    nspawn.remove_run_dirs(name)
    if directory.exists() and not nspawn.mounts_under(directory):
        shutil.rmtree(directory)
    found = nspawn.leftovers(name, directory, info.get("mntns"), info.get("port"))
    if found:
        raise NodeError("node %s left: %s" % (name, "; ".join(found)))
    return existed


def down_all(timeout=20):
    """Stop every node, including ones whose dir is gone but whose cgroup is still there."""
    names = set(list_nodes())
    names.update(p.name[len(nspawn.CGROUP_PREFIX):] for p in nspawn.CGROUP_ROOT.glob("*/" + nspawn.CGROUP_PREFIX + "*"))
    for name in sorted(names):
        down(name, timeout)
    return sorted(names)


def run_in(name, argv, timeout=60):
    """Run a command inside a running node (nsenter into its PID 1); CompletedProcess with text."""
    info = node_info(name)
    if not info or not info.get("pid1"):
        raise NodeError("node %s is not running" % name)
    return nspawn.nsenter(info["pid1"], argv, timeout=timeout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="boot a node; print its inventory line (or JSON)")
    p_up.add_argument("--name", required=True)
    p_up.add_argument("--port", type=int, default=0, help="sshd port on 127.0.0.1 (default: a free one from %d)" % PORT_RANGE[0])
    p_up.add_argument("--hostname", help="default: the name")
    p_up.add_argument("--k3s", nargs="?", const=DEFAULT_K3S_RELEASE, metavar="RELEASE",
                      help="install the stand-in k3s agent (default release %s)" % DEFAULT_K3S_RELEASE)
    p_up.add_argument("--server", action="store_true", help="with --k3s: a k3s server (k3s.service) instead of an agent")
    p_up.add_argument("--copy", action="store_true", help="cp -a the base instead of an overlay")
    p_up.add_argument("--timeout", type=float, default=60)
    p_up.add_argument("--json", action="store_true")
    p_down = sub.add_parser("down", help="stop nodes and remove them")
    group = p_down.add_mutually_exclusive_group(required=True)
    group.add_argument("--name")
    group.add_argument("--all", action="store_true")
    sub.add_parser("list", help="running nodes, one JSON object a line")
    p_check = sub.add_parser("check", help="what a node left behind (exit 1 if anything)")
    p_check.add_argument("--name", required=True)
    p_exec = sub.add_parser("exec", help="run a command in a node")
    p_exec.add_argument("name")
    p_exec.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root (mount, cgroups, systemd-nspawn)")
    try:
        if args.command == "up":
            info = up(args.name, port=args.port, hostname=args.hostname, k3s_release=args.k3s, copy=args.copy,
                      timeout=args.timeout, k3s_server=args.server)
            print(json.dumps(info) if args.json else info["inventory"])
        elif args.command == "down":
            for name in down_all() if args.all else [args.name] if down(args.name) else []:
                print("%s removed" % name)
        elif args.command == "list":
            for name in list_nodes():
                print(json.dumps(node_info(name)))
        elif args.command == "check":
            found = nspawn.leftovers(args.name, node_dir(args.name))
            print("\n".join(found) or "clean")
            return 1 if found else 0
        else:
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            result = run_in(args.name, cmd)
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            return result.returncode
    except NodeError as exc:
        print("ERROR: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
