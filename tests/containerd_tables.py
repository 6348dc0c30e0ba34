# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd config text the unit and conformance tests write: the default runtime and runtime tables under a
CRI table, left as %(t)s for the test to fill in (its schema's containerd table)."""

from __future__ import annotations

import json


def _value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def default_runtime(name):
    return '[%%(t)s]\n  default_runtime_name = "%s"\n' % name


def runtime(name, runtime_type="io.containerd.runc.v2", options=(), **keys):
    """[%(t)s.runtimes.<name>]: runtime_type, then keys; then its options table ((key, value) pairs, in order) if any."""
    lines = ["[%%(t)s.runtimes.%s]" % name, '  runtime_type = "%s"' % runtime_type]
    lines += ["  %s = %s" % (key, _value(value)) for key, value in keys.items()]
    if options:
        lines.append("[%%(t)s.runtimes.%s.options]" % name)
        lines += ["  %s = %s" % (key, _value(value)) for key, value in options]
    return "\n".join(lines) + "\n"


# runc as k3s renders it under systemd
RUNC_SYSTEMD = runtime("runc", options=[("SystemdCgroup", True)])
# crun: a runc shim with its own binary, privileged pods without every host device, SystemdCgroup off
CRUN = runtime("crun", privileged_without_host_devices=True, options=[("BinaryName", "/usr/bin/crun"), ("SystemdCgroup", False)])

# what `nvidia-ctk runtime configure --config config.toml.tmpl` writes on a k3s node: plain TOML, no base include
NVIDIA_CTK_V2 = """version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "rancher/mirrored-pause:3.6"

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/var/lib/rancher/k3s/data/current/bin"
      conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      snapshotter = "overlayfs"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
            SystemdCgroup = true

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi.options]
            BinaryName = "/usr/bin/nvidia-container-runtime.cdi"
            SystemdCgroup = true

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
"""
