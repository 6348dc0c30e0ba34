# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 41: the role's variables refused by name before anything is decided - one short line with the variable
(a runtime entry's key as gpu_node_runtimes[N].key), the value cut when long and never a secret, and the fix."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError

SECRET_URL = "http://alice:S3cr3t@proxy:3128"
MB = 1048576


def identity(value):
    return value


def refusal(name, value):
    """The message role_vars.read refuses {name: value} with (every variable read, as the plan phase reads them)."""
    with pytest.raises(K3sGpuError) as caught:
        role_vars.read({name: value}, identity)
    return str(caught.value)


def assert_short_line(message):
    assert "\n" not in message and len(message) < 400, message[:400]
    for internal in ("<class", "NoneType", "type str", "dict'", "list'", "Tagged"):
        assert internal not in message, message


@pytest.mark.parametrize("name, value, expected", [
    # gpu_node_toolkit_dirs: each entry an absolute path, without .., without a newline, a text
    ("gpu_node_toolkit_dirs", ["opt/nvidia/bin"], "gpu_node_toolkit_dirs[0]: 'opt/nvidia/bin' is not an absolute path"),
    ("gpu_node_toolkit_dirs", ["/opt/a", "/opt/../etc"], "gpu_node_toolkit_dirs[1]: '/opt/../etc' has a .. part"),
    ("gpu_node_toolkit_dirs", ["/opt/nvidia/bin\n"], "gpu_node_toolkit_dirs[0]: '/opt/nvidia/bin\\n' holds a newline"),
    ("gpu_node_toolkit_dirs", [{"path": "/opt/x"}], 'gpu_node_toolkit_dirs[0]: {"path": "/opt/x"} is a dictionary, not a text'),
    ("gpu_node_toolkit_dirs", ["/opt/a", None], "gpu_node_toolkit_dirs[1]: null is not a text"),
    ("gpu_node_toolkit_dirs", [True], "gpu_node_toolkit_dirs[0]: true is a boolean, not a text"),
    ("gpu_node_toolkit_dirs", [["/opt/a"]], 'gpu_node_toolkit_dirs[0]: ["/opt/a"] is a list, not a text'),
    ("gpu_node_toolkit_dirs", [5], "gpu_node_toolkit_dirs[0]: '5' is not an absolute path"),
    ("gpu_node_toolkit_dirs", "/opt/a,opt/b", "gpu_node_toolkit_dirs[1]: 'opt/b' is not an absolute path"),  # -e text
    ("gpu_node_toolkit_dirs", {"a": 1}, 'gpu_node_toolkit_dirs: {"a": 1} is a dictionary, not a list'),
    ("gpu_node_toolkit_dirs", None, "gpu_node_toolkit_dirs: null is not a list"),
    # gpu_node_root and gpu_node_data_dir: absolute, no .. (a relative data dir landed in a sibling <root>var/...)
    ("gpu_node_root", "srv/node", "gpu_node_root: 'srv/node' is not an absolute path"),
    ("gpu_node_root", "/srv/../node", "gpu_node_root: '/srv/../node' has a .. part"),
    ("gpu_node_root", "/srv/node\n", "gpu_node_root: '/srv/node\\n' holds a newline"),
    ("gpu_node_data_dir", "var/lib/rancher/k3s", "gpu_node_data_dir: 'var/lib/rancher/k3s' is not an absolute path"),
    ("gpu_node_data_dir", "/var/lib/../k3s", "gpu_node_data_dir: '/var/lib/../k3s' has a .. part"),
    ("gpu_node_data_dir", "..", "gpu_node_data_dir: '..' is not an absolute path"),
    ("gpu_node_cdi_spec_path", "nvidia.yaml", "gpu_node_cdi_spec_path: 'nvidia.yaml' is not an absolute path"),
    ("gpu_node_cdi_spec_path", "", "gpu_node_cdi_spec_path: '' is not an absolute path"),
    ("gpu_node_cdi_spec_path", "/etc/cdi/", "gpu_node_cdi_spec_path: '/etc/cdi/' is a directory, not a file"),
    # the handler's seconds
    ("gpu_node_restart_settle_seconds", -5, "gpu_node_restart_settle_seconds: -5 is below 0"),
    ("gpu_node_restart_settle_seconds", "-5", "gpu_node_restart_settle_seconds: -5 is below 0"),  # -e text
    ("gpu_node_restart_settle_seconds", "abc", "gpu_node_restart_settle_seconds: 'abc' is not a whole number"),
    ("gpu_node_restart_settle_seconds", 1.5, "gpu_node_restart_settle_seconds: 1.5 is not a whole number"),
    ("gpu_node_restart_settle_seconds", True, "gpu_node_restart_settle_seconds: true is a boolean, not a whole number"),
    ("gpu_node_restart_settle_seconds", None, "gpu_node_restart_settle_seconds: null is not a whole number"),
    ("gpu_node_restart_settle_seconds", [10], "gpu_node_restart_settle_seconds: [10] is a list, not a whole number"),
    ("gpu_node_restart_settle_seconds", 10 ** 20, "gpu_node_restart_settle_seconds: 100000000000000000000 is above 86400"),
    ("gpu_node_restart_timeout_seconds", 0, "gpu_node_restart_timeout_seconds: 0 is below 1"),
    ("gpu_node_restart_timeout_seconds", "-1", "gpu_node_restart_timeout_seconds: -1 is below 1"),
    ("gpu_node_driver_reboot_timeout_seconds", -1, "gpu_node_driver_reboot_timeout_seconds: -1 is below 1"),
    ("gpu_node_driver_reboot_timeout_seconds", 0, "gpu_node_driver_reboot_timeout_seconds: 0 is below 1"),
    # booleans and choices, by name and without Ansible's class names
    ("gpu_node_force", "maybe", "gpu_node_force: 'maybe' is not a boolean"),
    ("gpu_node_force", None, "gpu_node_force: null is not a boolean"),
    ("gpu_node_force", [True], "gpu_node_force: [true] is a list, not a boolean"),
    ("gpu_node_force", 2, "gpu_node_force: 2 is not a boolean"),
    ("gpu_node_state", "bogus", "gpu_node_state: 'bogus' is not one of present, absent"),
    ("gpu_node_state", 1, "gpu_node_state: 1 is not one of present, absent"),
    ("gpu_node_mode", None, "gpu_node_mode: null is not one of host, operator"),
    # dictionaries
    ("gpu_node_operator_values", ["a"], 'gpu_node_operator_values: ["a"] is a list, not a dictionary'),
    ("gpu_node_gpu_sharing", "strategy", "gpu_node_gpu_sharing: 'strategy' is not a dictionary"),
    ("gpu_node_gpu_sharing", None, "gpu_node_gpu_sharing: null is not a dictionary"),
    # the default runtime is a runtime's name
    ("gpu_node_default_runtime", "Nvidia Legacy", "gpu_node_default_runtime: 'Nvidia Legacy' is not a valid runtime name"),
])
def test_a_bad_value_is_refused_by_name_with_the_fix(name, value, expected):
    message = refusal(name, value)
    assert message.startswith(expected), message
    assert "; " in message  # the fix follows
    assert_short_line(message)


@pytest.mark.parametrize("entries, expected", [
    ([{"name": "nvidia-x", "binary": "/usr/bin/x", "runtime_type": "not a type"}],
     "gpu_node_runtimes[0].runtime_type: 'not a type' is not a containerd runtime type"),
    ([{"name": "a"}, {"name": "b"}, {"name": "Bad_Name"}], "gpu_node_runtimes[2].name: 'Bad_Name' is not a valid runtime name"),
    ([{"name": "a" * MB}], "gpu_node_runtimes[0].name: '%s…' (1048576 characters) is not a valid" % ("a" * 60)),
    ([{"name": "nvidia-x\n"}], "gpu_node_runtimes[0].name: 'nvidia-x\\n' is not a valid runtime name"),
    ([{"name": None}], "gpu_node_runtimes[0].name is missing"),
    ([{"binary": "/usr/bin/x"}], "gpu_node_runtimes[0].name is missing"),
    ([{"name": 5}], "gpu_node_runtimes[0].name: 5 is not a valid runtime name"),
    (["nvidia"], "gpu_node_runtimes[0]: 'nvidia' is not a mapping"),
    ([None], "gpu_node_runtimes[0]: null is not a mapping"),
    ([{"nam": "x"}], "gpu_node_runtimes[0]: 'nam' is not a runtime setting (did you mean name?)"),
    ([{"name": "x", "binary": "usr/bin/x"}], "gpu_node_runtimes[0].binary: 'usr/bin/x' is not an absolute path"),
    ([{"name": "x", "binary": ["/usr/bin/x"]}], 'gpu_node_runtimes[0].binary: ["/usr/bin/x"] is not an absolute path'),
    ([{"name": "x", "runtime_type": ["io.containerd.runc.v2"]}],
     'gpu_node_runtimes[0].runtime_type: ["io.containerd.runc.v2"] is not a containerd runtime type'),
    ([{"name": "x", "runtime_type": "io.containerd.runc.v2\n"}],
     "gpu_node_runtimes[0].runtime_type: 'io.containerd.runc.v2\\n' is not a containerd runtime type"),
    ([{"name": "x", "options": "zz"}], "gpu_node_runtimes[0].options: 'zz' is not a mapping"),
    ([{"name": "x", "systemd_cgroup": "maybe"}], "gpu_node_runtimes[0].systemd_cgroup: 'maybe' is not a boolean"),
    ({"name": "x"}, 'gpu_node_runtimes: {"name": "x"} is a dictionary, not a list'),
])
def test_a_runtime_entry_is_refused_by_its_index_and_key(entries, expected):
    message = refusal("gpu_node_runtimes", entries)
    assert message.startswith(expected), message
    assert "; " in message
    assert_short_line(message)


@pytest.mark.parametrize("entries", [
    [{"name": "nvidia-x", "binary": "/usr/bin/x", "runtime_type": "io.containerd.runc.v2", "options": {},
      "systemd_cgroup": "yes"}],
    [{"name": "kata", "runtime_type": "io.containerd.kata-qemu.v2"}],
    [{"name": "own-shim", "runtime_type": "/opt/shims/containerd-shim-own-v2"}],
    [{"name": "nvidia-x", "runtime_type": "", "binary": None, "options": None, "systemd_cgroup": None}],
    "name=nvidia-x binary=/usr/bin/x",  # -e text: Ansible's list and key=value conversions are kept
])
def test_good_runtime_entries_are_taken(entries):
    assert role_vars.read({"gpu_node_runtimes": entries}, identity, ["gpu_node_runtimes"])["runtimes"][0]["name"] in (
        "nvidia-x", "kata", "own-shim")


@pytest.mark.parametrize("variables, expected", [
    ({"gpu_node_toolkit_dirs": ""}, {"toolkit_dirs": []}),  # -e gpu_node_toolkit_dirs= is none
    ({"gpu_node_toolkit_dirs": "/opt/a,/opt/b"}, {"toolkit_dirs": ["/opt/a", "/opt/b"]}),
    ({"gpu_node_root": "/srv/node/"}, {"root": "/srv/node/"}),
    ({"gpu_node_root": ""}, {"root": ""}),  # the node's own /
    ({"gpu_node_data_dir": ""}, {"data_dir": ""}),
    ({"gpu_node_data_dir": "/srv/k3s"}, {"data_dir": "/srv/k3s"}),
    ({"gpu_node_restart_settle_seconds": "0"}, {"restart_settle_seconds": 0}),
    ({"gpu_node_restart_timeout_seconds": 60.0}, {"restart_timeout_seconds": 60}),
    ({"gpu_node_enable_cdi": None}, {"enable_cdi": None}),  # null leaves it alone
    ({"gpu_node_force": "Yes"}, {"force": True}),
    ({"gpu_node_proxy_env": "https_proxy=" + SECRET_URL}, {"proxy_env": {"https_proxy": SECRET_URL}}),
    ({"gpu_node_proxy_env": {"HTTPS_PROXY": SECRET_URL, "no_proxy": "localhost,.svc", "port": 3128}},
     {"proxy_env": {"HTTPS_PROXY": SECRET_URL, "no_proxy": "localhost,.svc", "port": 3128}}),
    ({"gpu_node_default_runtime": ""}, {"default_runtime": ""}),
    ({"gpu_node_proxy_env": ""}, {"proxy_env": {}}),  # -e gpu_node_proxy_env= is none
    ({"gpu_node_default_runtime": "nvidia-cdi"}, {"default_runtime": "nvidia-cdi"}),
])
def test_good_values_and_their_text_forms_are_taken(variables, expected):
    assert role_vars.read(variables, identity, list(variables)) == expected


@pytest.mark.parametrize("value, expected", [
    ({"https_proxy": {"url": SECRET_URL}}, "gpu_node_proxy_env.https_proxy is a dictionary, not a text"),
    ({"https_proxy": [SECRET_URL]}, "gpu_node_proxy_env.https_proxy is a list, not a text"),
    ({"https_proxy": None}, "gpu_node_proxy_env.https_proxy is null, not a text"),
    ({"https_proxy": True}, "gpu_node_proxy_env.https_proxy is a boolean, not a text"),
    ({"https proxy": SECRET_URL}, "gpu_node_proxy_env: 'https proxy' is not an environment variable's name"),
    (SECRET_URL, "gpu_node_proxy_env: its value (not shown) is not a dictionary"),
    ([SECRET_URL], "gpu_node_proxy_env: its value (not shown) is a list, not a dictionary"),
    (None, "gpu_node_proxy_env: its value (not shown) is not a dictionary"),
])
def test_a_bad_proxy_env_is_refused_without_its_secret(value, expected):
    message = refusal("gpu_node_proxy_env", value)
    assert message.startswith(expected), message
    assert "S3cr3t" not in message
    assert_short_line(message)


def test_proxy_env_is_no_log_in_the_argument_spec():
    assert role_vars.role_spec()["gpu_node_proxy_env"]["no_log"] is True


@pytest.mark.parametrize("name, value", [
    ("gpu_node_default_runtime", "a" * MB),
    ("gpu_node_default_runtime", "a " * (MB // 2)),
    ("gpu_node_state", "b" * MB),
    ("gpu_node_force", "m" * MB),
    ("gpu_node_root", "r" * MB),
    ("gpu_node_toolkit_dirs", ["d" * MB]),
    ("gpu_node_restart_timeout_seconds", "9" * 5000),
    ("gpu_node_toolkit_version", [1.5] * MB),
])
def test_a_long_value_is_cut_and_its_length_said(name, value):
    message = refusal(name, value)
    assert_short_line(message)
    assert "characters)" in message, message


def test_every_refusal_names_its_variable_once():
    with pytest.raises(K3sGpuError) as caught:
        role_vars.read({"gpu_node_root": "srv", "gpu_node_restart_settle_seconds": -1, "gpu_node_force": "x"}, identity)
    message = str(caught.value)
    for name in ("gpu_node_root: ", "gpu_node_restart_settle_seconds: ", "gpu_node_force: "):
        assert message.count(name) == 1, message
