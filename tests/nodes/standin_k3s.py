# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Stand-in for `k3s agent` inside a test node: what k3s does for containerd at start, then containerd.

1. the release from /etc/standin-k3s/release (e.g. v1.28.15+k3s1) and its profile (_distro);
2. the runtimes that release detects, searched like k3s does with this process's PATH (_detect);
3. the base template rendered for that release (plugins/module_utils/_k3s_base.py), composed with
   <data-dir>/agent/etc/containerd/config-v3.toml.tmpl or config.toml.tmpl (first found, like k3s);
4. <data-dir>/agent/etc/containerd/config.toml written, then containerd exec'd with it
   (`-a/--state/--root` on the command line for schema 2, as k3s passes them).
If containerd rejects the config it exits, and systemd restarts this unit: k3s's crash loop.

containerd: a 1.7-line release runs /opt/standin-containerd/1.7 when the host's .cache/containerd
is bound there, else Debian's 1.6 (/usr/bin/containerd), which loads schema 2 the same way.
A 2.x-line release needs /opt/standin-containerd/2.x: 1.6 would misread `version = 3` silently.
One deviation from k3s: stream_server_port comes from /etc/standin-k3s/stream-port, because every
node shares the host's network and k3s's fixed 10010 would collide.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# pylint: disable=import-error,wrong-import-position
import base_fixtures  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _detect as detect  # noqa: E402
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro  # noqa: E402

ETC = "/etc/standin-k3s"
CONTAINERD_OPT = "/opt/standin-containerd"
PAUSE_IMAGE = "rancher/mirrored-pause:3.6"
STATE = "/run/k3s/containerd"


def log(message):
    print("standin-k3s: " + message, file=sys.stderr, flush=True)


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def flag(argv, *names):
    """Value of --flag V / --flag=V (last wins), as k3s's CLI reads it."""
    value = None
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                value = argv[index + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def choose_template(profile, containerd_dir):
    """(schema, path or None): config-v3.toml.tmpl then config.toml.tmpl; the first that exists wins."""
    for name in profile["templates"]:
        path = os.path.join(containerd_dir, name)
        if os.path.exists(path):
            return distro.schema_of_template(name), path
    return profile["schema"], None


def containerd_binary(line):
    major = "2.x" if line.startswith("2.") else line
    candidate = os.path.join(CONTAINERD_OPT, major, "usr/bin/containerd")
    if os.path.exists(candidate):
        return candidate
    if major == "2.x":
        raise SystemExit("standin-k3s: this release embeds containerd %s (schema 3) but %s is missing; "
                         "run scripts/install-containerd.sh on the host and boot the node again" % (line, candidate))
    return "/usr/bin/containerd"


def template_params(paths, detected, systemd_cgroup, default_runtime):
    """What k3s fills into its base template (values as k3s sets them for a default agent)."""
    root = paths["data_dir"] + "/agent/containerd"
    return {"root": root, "state": STATE, "address": STATE + "/containerd.sock", "opt": root,
            "pause_image": PAUSE_IMAGE, "snapshotter": "overlayfs",
            "cni_bin_dir": paths["data_dir"] + "/data/current/bin",
            "cni_conf_dir": paths["data_dir"] + "/agent/etc/cni/net.d",
            "registry_dir": paths["containerd_dir"] + "/certs.d", "containerd_dir": paths["containerd_dir"],
            "detected": detected, "systemd_cgroup": systemd_cgroup, "default_runtime": default_runtime}


def write_config(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)  # as k3s writes it


def render(argv):
    """Write config.toml as k3s would; return (containerd argv, env)."""
    release = (read(ETC + "/release") or "").strip()
    if not release:
        raise ValueError("no release in %s/release (e.g. v1.28.15+k3s1)" % ETC)
    profile = distro.profile(distro.K3S, release)
    fs = detect.NodeFS("/")
    paths = distro.distribution_paths(distro.K3S, None)
    paths = distro.distribution_paths(distro.K3S, flag(argv, "--data-dir", "-d") or detect.k3s_config_value(fs, paths, "data-dir")[0])
    schema, template = choose_template(profile, paths["containerd_dir"])
    detected = detect.k3s_detected_runtimes(fs, profile, os.environ.get("PATH", distro.SYSTEMD_DEFAULT_PATH))
    params = template_params(paths, detected, detect.systemd_running(fs),
                             flag(argv, "--default-runtime") or detect.k3s_config_value(fs, paths, "default-runtime")[0])
    base = base_fixtures.render_base(profile, schema, params)
    port = (read(ETC + "/stream-port") or "10010").strip()
    base = base.replace('stream_server_port = "10010"', 'stream_server_port = "%s"' % port)
    text = base_fixtures.compose(read(template) if template else None, base)
    write_config(paths["config"], text)
    log("release %s (containerd %s line, schema %d), template %s, detected %s, wrote %s" % (
        release, profile["containerd"], schema, template or "none",
        ",".join(r["name"] for r in detected) or "none", paths["config"]))
    binary = containerd_binary(profile["containerd"])
    command = [binary, "-c", paths["config"]]
    if schema < 3:
        command += ["-a", params["address"], "--state", STATE, "--root", params["root"]]
    env = dict(os.environ, PATH=os.path.dirname(binary) + ":" + os.environ.get("PATH", distro.SYSTEMD_DEFAULT_PATH))
    return command, env


def main(argv):
    if len(argv) < 2 or argv[1] not in ("agent", "server"):
        raise SystemExit("usage: k3s agent|server [--data-dir DIR] [--default-runtime NAME]")
    try:
        command, env = render(argv[2:])
    except (ValueError, OSError) as exc:  # K3sGpuError, template with other Go actions, I/O
        raise SystemExit("standin-k3s: %s" % exc) from exc
    log("exec " + " ".join(command))
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main(sys.argv)
