# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""CDI as containerd will load it on a node whose GPUs are allocated through DRA (allocation dra).

NVIDIA's DRA driver writes each claim's CDI spec into /var/run/cdi and hands the claim's devices to containerd as CDI
device names: containerd must have CDI on and scan that directory, or every claim pod fails to start
(`unresolvable CDI devices`). What containerd loads is composed from layers: the root config (plain containerd), or
what k3s/rke2 render from the user's template or their base; then each drop-in of the import directory, in import
order. A layer that turns CDI off or narrows cdi_spec_dirs is named with its file and line, before anything is written
(the doctor names the same in the config k3s/rke2 rendered, after).

PRIVATE to the collection. Controller side, no I/O."""

from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence, Tuple

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _plan as planner
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, several
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _layers as config_layers
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as template_check

# where NVIDIA's DRA driver writes the CDI spec of each prepared claim (/run/cdi is the same directory)
CLAIM_CDI_DIR = "/var/run/cdi"
_SAME_DIRS = (CLAIM_CDI_DIR, "/run/cdi")

CDI_OFF = "cdi_off_for_claims"
CDI_DIR = "cdi_dir_for_claims"

Layer = config_layers.Layer


def scans_claim_dir(dirs: Sequence[Any]) -> bool:
    """Whether a cdi_spec_dirs list holds the directory NVIDIA's DRA driver writes each claim's spec into."""
    return any(str(d).rstrip("/") in _SAME_DIRS for d in dirs)


def refusal(facts: NodeFacts, layers: Sequence[Layer], schema: int, explicit_only: bool = False) -> Optional[K3sGpuError]:
    """Why containerd, loading these layers (of config schema 2 or 3), cannot start a claim pod (None: it can).
    explicit_only: name only a setting a file makes (before the toolkit install; the role's own edit turns CDI on
    later where the release has it off by default)."""
    findings = claim_findings(facts, layers, schema, explicit_only)
    if not findings:
        return None
    return several([("%s[%s]" % ("line %d " % f.line if f.line else "", f.code), f.cause_text(path), f.fix)
                    for path, f in findings], "nothing was written")


def claim_findings(facts: NodeFacts, layers: Sequence[Layer], schema: int,
                   explicit_only: bool = False) -> List[Tuple[str, Any]]:
    """[(path, template_check.Finding)] for CDI off and for cdi_spec_dirs without /var/run/cdi, each at the last layer
    that sets it (containerd merges each layer over the ones before)."""
    settings, last = config_layers.origins(layers, distro.cri_table(schema), ("enable_cdi", "cdi_spec_dirs"),
                                           config_layers.deep_merge_of(facts))
    enable, dirs = settings.get("enable_cdi"), settings.get("cdi_spec_dirs")
    found = []
    on = enable[2] if enable is not None else (None if explicit_only else bool(facts.profile.get("cdi_default_on")))
    if on is False:
        path, text = enable[:2] if enable is not None else (last, None)
        found.append((path, template_check.Finding(
            CDI_OFF, _line_of(text, "enable_cdi"),
            "enable_cdi is %s in what containerd loads on this DRA node (gpu allocation dra), but NVIDIA's DRA driver "
            "hands each claim's devices to containerd as CDI devices: every claim pod fails to start" % (
                "false" if enable is not None else "off by default (containerd %s%s)" % (
                    facts.profile.get("containerd"), "" if last == layers[0][0] else
                    ": this file's table of the CRI plugin replaces the whole table of the files before it")),
            ("take enable_cdi = false out of that file, or set it to true" if enable is not None else
             "turn CDI on (gpu_node_enable_cdi: true, containerd_runtimes' enable_cdi: true)")
            + "; or keep this node on the device plugin (gpu_node_allocation=device_plugin)")))
    if dirs is not None and isinstance(dirs[2], list) and not scans_claim_dir(dirs[2]):
        path, text, value = dirs
        found.append((path, template_check.Finding(
            CDI_DIR, _line_of(text, "cdi_spec_dirs"),
            "cdi_spec_dirs is %s, without %s, where NVIDIA's DRA driver writes each claim's CDI spec: containerd "
            "cannot resolve a claim's devices (`unresolvable CDI devices`)" % (value, CLAIM_CDI_DIR),
            "add %s to cdi_spec_dirs, or take cdi_spec_dirs out of that file (containerd's default is /etc/cdi and "
            "/var/run/cdi)" % CLAIM_CDI_DIR)))
    return found


def refusal_now(facts: NodeFacts) -> Optional[K3sGpuError]:
    """refusal() for the node as it is now (before the role's toolkit install): only what a file sets, nothing of ours
    added. None also where no target can be chosen (containerd_runtimes names why, with its own options)."""
    try:
        target = planner.select_target(facts.reading)
    except K3sGpuError:
        return None
    current = (facts.files.get(target["key"]) or {}).get("content")
    now = config_layers.compose(facts, config_layers.Where.now(facts, target), current)
    return refusal(facts, now, target["schema"], explicit_only=True)


def _line_of(text, key):
    """The line of the last `key =` in text (0: not found, the base sets it)."""
    if not text:
        return 0
    lines = [number for number, line in enumerate(text.splitlines(), 1) if re.match(r"\s*%s\s*=" % re.escape(key), line)]
    return lines[-1] if lines else 0
