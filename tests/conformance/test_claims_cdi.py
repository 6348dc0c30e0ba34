# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd_runtimes' `allocation: dra` check (plugin_utils/containerd/_claims_cdi) against the real containerd of
each line that has CDI (Debian's 1.7 and 2.1, upstream 2.2.7 and 2.3.4): the engine must refuse exactly where the
config containerd loads after the write (`containerd config dump` of the root config with its imported drop-ins) has
CDI off or a cdi_spec_dirs without /var/run/cdi, where NVIDIA's DRA driver writes each claim's CDI spec.

Each case is a plain containerd node whose config is the line's `containerd config default` importing its conf.d:
the engine's files are written as a device-plugin node gets them, then a drop-in of the user's is added and the engine
runs again for a DRA node (allocation changes only whether the files are refused; a refusal writes nothing, so
containerd loads the files the engine judged), and containerd's own merge of the layers is the oracle:
1.7 and 2.0 replace a plugin's whole table with an imported file's, 2.1 and newer merge its keys."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _claims_cdi as claims_cdi

from .test_plain_containerd import LINES, Node, config_case, dump

CDI_LINES = tuple(line for line in LINES if line != "1.6")  # 1.6 has no CDI: the role refuses dra there first
DROPIN = "/etc/containerd/conf.d/40-site.toml"

# the user's drop-in: what it says of the CRI plugin (None: no drop-in)
CASES = {
    "no-dropin": None,
    "cdi-off": "enable_cdi = false\n",
    "dirs-narrowed": "cdi_spec_dirs = ['/etc/cdi']\n",
    "dirs-with-run-cdi": "cdi_spec_dirs = ['/etc/cdi', '/run/cdi']\n",
    # another key of the plugin: on 1.7 the drop-in's table replaces the root's, CDI then off by default
    "other-key": "max_container_log_line_size = 32768\n",
}


def _plugin(line):
    return "io.containerd.grpc.v1.cri" if line == "1.7" else "io.containerd.cri.v1.runtime"


def loaded_cdi(data, line):
    table = (data.get("plugins") or {}).get(_plugin(line)) or {}
    return table.get("enable_cdi"), table.get("cdi_spec_dirs")


@pytest.mark.parametrize("line,case", [(line, case) for line in CDI_LINES for case in CASES])
def test_dra_is_refused_exactly_where_containerd_loads_no_cdi_for_claims(tmp_path, line, case, request):
    node = Node(tmp_path)
    node.write("/etc/containerd/config.toml", config_case(line, "default-dropin", node))
    params = {"enable_cdi": True} if line == "1.7" else {}  # the role turns CDI on where the line has it off
    node.converge(line, **params)  # the engine's files, as a device-plugin node gets them
    if CASES[case] is not None:
        node.write(DROPIN, "[plugins.'%s']\n%s" % (_plugin(line), CASES[case]))
    try:
        node.converge(line, allocation="dra", **params)
        refusal = None
    except K3sGpuError as exc:
        refusal = exc.text()  # nothing written: containerd loads the files the engine judged
    enabled, dirs = loaded_cdi(dump(line, node.host("/etc/containerd/config.toml")), line)
    broken = enabled is not True or (dirs is not None and not claims_cdi.scans_claim_dir(dirs))
    request.node.user_properties.append(("loaded", {"enable_cdi": enabled, "cdi_spec_dirs": dirs, "refused": refusal}))
    print("%s %s: containerd loads enable_cdi=%s cdi_spec_dirs=%s; engine: %s" % (
        line, case, enabled, dirs, refusal or "written"))
    assert (refusal is not None) == broken, (enabled, dirs, refusal)
    if refusal is not None:
        # on 1.7 any drop-in of the CRI plugin also drops the runtimes of the root config: that refusal comes first
        codes = ("[cdi_off_for_claims]", "[cdi_dir_for_claims]", "[runtimes_replaced]")
        assert DROPIN in refusal and any(code in refusal for code in codes), refusal
