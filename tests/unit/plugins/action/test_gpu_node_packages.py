# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The package step's flow against a fake node: which modules run in which order, check mode, the key check,
the undo of a failed install, holds and locks, removal. The fake stands in for apt/dnf, gpg and the files only;
the real modules run in the molecule scenarios nspawn_toolkit (apt) and nspawn_dnf (dnf)."""

from __future__ import annotations

import base64
from unittest import mock

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.action import gpu_node_packages as action_plugin
from ansible_collections.k3s_gpu.nvidia.tests.unit.plugins.action.action_harness import make_action

TOOLKIT_FP = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
DEBIAN = {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "12", "distribution_version": "12.8",
          "architecture": "x86_64", "kernel": "6.1.0-28-amd64"}
ROCKY = {"os_family": "RedHat", "distribution": "Rocky", "distribution_major_version": "9", "distribution_version": "9.5",
         "architecture": "x86_64", "kernel": "5.14.0-503.el9.x86_64"}


class FakeNode(object):
    """Files, packages, holds and version locks of a host; each module call is recorded."""

    def __init__(self, check_mode, key_fingerprint=TOOLKIT_FP, files=None, broken=(), locks=(), installed=(), held=(),
                 failing=None):
        self.check_mode = check_mode
        self.failing = dict(failing or {})  # module name: the message it fails with
        self.key_fingerprint = key_fingerprint
        self.files = dict({"/usr/bin/gpg": "", "/usr/lib/python3/dist-packages/debian/deb822.py": ""}, **(files or {}))
        self.broken = set(broken)
        self.locks = list(locks)
        self.installed = set(installed)
        self.held = set(held)
        self.calls = []

    def run(self, action, module_name, module_args):
        check = self.check_mode and not action._read_only
        name = module_name.rsplit(".", 1)[-1]
        self.calls.append((name, module_args.get("argv") or module_args.get("name") or module_args.get("path")
                           or module_args.get("dest") or module_args.get("src")))
        if name in self.failing:
            return {"failed": True, "msg": self.failing[name], "url": module_args.get("url"), "invocation": module_args}
        return getattr(self, "_" + name)(module_args, check)

    def _write(self, path, content, check):
        changed = self.files.get(path) != content
        if changed and not check:
            self.files[path] = content
        return {"changed": changed}

    def _stat(self, args, check):
        return {"stat": {"exists": args["path"] in self.files}}

    def _tempfile(self, args, check):
        self.files["/tmp/ansible.key"] = ""
        return {"path": "/tmp/ansible.key", "changed": True}

    def _get_url(self, args, check):
        return self._write(args["dest"], "KEY " + self.key_fingerprint, check)

    def _copy(self, args, check):
        return self._write(args["dest"], self.files[args["src"]], check)

    def _file(self, args, check):
        if args["state"] == "absent":
            changed = args["path"] in self.files
            if changed and not check:
                del self.files[args["path"]]
            return {"changed": changed}
        return {"changed": False}

    def _slurp(self, args, check):
        if args["src"] not in self.files:
            return {"failed": True, "msg": "file not found: %s" % args["src"]}
        return {"content": base64.b64encode(self.files[args["src"]].encode()).decode()}

    def _deb822_repository(self, args, check):
        return self._write("/etc/apt/sources.list.d/%s.sources" % args["name"],
                           "URIs: %s\nSuites: %s\nSigned-By: %s\n" % (args["uris"][0], args["suites"][0], args["signed_by"]),
                           check)

    def _yum_repository(self, args, check):
        return self._write("/etc/yum.repos.d/%s.repo" % args["file"], "baseurl=%s\ngpgkey=%s\n" % (
            args["baseurl"][0], args["gpgkey"][0]), check)

    def _packages(self, args, check):
        names = set(n.split("=")[0] for n in args["name"])
        if names & self.broken:
            return {"failed": True, "msg": "Failed to fetch", "stderr": "E: NO_PUBKEY DDCAE044F796ECB0\n"}
        if args["state"] == "absent":
            changed = bool(names & self.installed)
            if not check:
                self.installed -= names
            return {"changed": changed}
        changed = not names <= self.installed
        if not check:
            self.installed |= names
        return {"changed": changed}

    _apt = _dnf = _packages

    def _dpkg_selections(self, args, check):
        changed = args["name"] not in self.held
        if not check:
            self.held.add(args["name"])
        return {"changed": changed}

    def _command(self, args, check):
        argv = args["argv"]
        if argv[0] == "gpg":
            key = self.files[argv[-1]]
            return {"rc": 0, "stdout": "pub:-:4096:1::\nfpr:::::::::%s:\n" % key.split()[1], "changed": True}
        if check:
            return {"skipped": True, "changed": False, "msg": "Command would have run if not in check mode"}
        if argv[:2] == ["apt-mark", "showhold"]:
            return {"rc": 0, "stdout_lines": sorted(self.held), "changed": True}
        if argv[:2] == ["apt-mark", "unhold"]:
            self.held -= set(argv[2:])
            return {"rc": 0, "stdout": "", "changed": True}
        if "versionlock" in argv:
            verb = argv[argv.index("versionlock") + 1]
            if verb == "list":
                return {"rc": 0, "stdout_lines": list(self.locks), "changed": True}
            if verb == "delete":
                self.locks = [line for line in self.locks if not any(line.startswith(n + "-") for n in argv[argv.index("delete") + 1:])]
            if verb == "add":
                self.locks += [n + ".*" for n in argv[argv.index("add") + 1:]]
            return {"rc": 0, "stdout": "", "changed": True}
        if argv[0] == "modinfo":
            return {"rc": 1, "stdout": "", "changed": True, "failed": True}
        if argv[0] == "modprobe":
            return {"rc": 1, "stderr": "modprobe: FATAL: Module nvidia not found\n", "failed": True, "changed": True}
        return {"rc": 0, "stdout": "", "changed": True}


def run_action(node, args, facts=None, check_mode=False, role_vars=None):
    action = make_action(action_plugin, args, check_mode)
    action._execute_module = lambda module_name, module_args, task_vars: node.run(action, module_name, dict(module_args))
    action._remove_tmp_path = lambda path: None
    action._write = lambda content, dest, mode: action._run_module(
        "ansible.builtin.copy_content", {"dest": dest, "content": content}, False)
    node._copy_content = lambda module_args, check: node._write(module_args["dest"], module_args["content"], check)
    task_vars = dict(inventory_hostname="gpu1", ansible_facts=facts or DEBIAN, **(role_vars or {}))
    task_vars.setdefault("gpu_node_toolkit_operator_extensions", False)
    return action.run(task_vars=task_vars)


def names(node):
    return [name for name, _target in node.calls]


def test_install_adds_the_checked_key_the_sources_file_then_pinned_packages_and_holds():
    node = FakeNode(check_mode=False, files={"/etc/apt/sources.list.d/nvidia-container-toolkit.list": "deb old /\n"})
    result = run_action(node, {"source": "toolkit"})
    assert not result.get("failed"), result
    assert result["changed"] and result["key_changed"] and result["repository_changed"] and result["packages_changed"]
    assert node.files["/etc/apt/keyrings/nvidia-container-toolkit.asc"] == "KEY " + TOOLKIT_FP
    assert "Signed-By: /etc/apt/keyrings/nvidia-container-toolkit.asc" in node.files[
        "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"]
    assert "/etc/apt/sources.list.d/nvidia-container-toolkit.list" not in node.files  # the .sources file replaces it
    assert "/tmp/ansible.key" not in node.files
    assert node.held == {"nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
                         "libnvidia-container1"}
    order = names(node)
    assert order.index("get_url") < order.index("command") < order.index("deb822_repository") < order.index("apt")
    # the second run changes nothing
    again = run_action(node, {"source": "toolkit"})
    assert not again["changed"] and not again["packages_changed"], again


def test_check_mode_writes_nothing_and_says_the_package_step_is_not_evaluated():
    node = FakeNode(check_mode=True)
    before = dict(node.files)
    with mock.patch.object(action_plugin.display, "display") as said:
        result = run_action(node, {"source": "toolkit"}, check_mode=True)
    assert result["changed"] and result["unseen"] and not result["packages_changed"]
    assert node.files == before
    assert "apt" not in names(node) and not node.held
    assert "would add the repository https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /" in said.call_args[0][0]


def test_a_key_with_another_fingerprint_is_refused_before_apt_sees_the_repository():
    node = FakeNode(check_mode=False, key_fingerprint="EB693B3035CD5710E231E123A4B469963BF863CC")
    result = run_action(node, {"source": "toolkit"})
    assert result["failed"] and not result["changed"]
    assert result["msg"].startswith("gpu1: the key from https://nvidia.github.io/libnvidia-container/gpgkey has "
                                    "fingerprint(s) EB693B3035CD5710E231E123A4B469963BF863CC, not " + TOOLKIT_FP)
    assert "deb822_repository" not in names(node) and not node.installed
    assert "/tmp/ansible.key" not in node.files


def test_a_failed_install_puts_the_repository_files_back():
    legacy = "deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] https://old /\n"
    node = FakeNode(check_mode=False, broken={"nvidia-container-toolkit"},
                    files={"/etc/apt/sources.list.d/nvidia-container-toolkit.list": legacy})
    result = run_action(node, {"source": "toolkit"})
    assert result["failed"]
    assert "failed, and the repository change was undone: Failed to fetch E: NO_PUBKEY" in result["msg"]
    assert node.files["/etc/apt/sources.list.d/nvidia-container-toolkit.list"] == legacy
    assert "/etc/apt/sources.list.d/nvidia-container-toolkit.sources" not in node.files


def test_dnf_releases_stale_locks_and_locks_at_the_pinned_version():
    node = FakeNode(check_mode=False, locks=["nvidia-container-toolkit-0:1.17.8-1.*", "libnvidia-container1-0:1.18.0-1.*"])
    result = run_action(node, {"source": "toolkit"}, facts=ROCKY, role_vars={"gpu_node_toolkit_version": "1.17.8-1"})
    assert not result.get("failed"), result
    assert "/etc/yum.repos.d/nvidia-container-toolkit.repo" in node.files
    assert sorted(node.locks) == ["libnvidia-container-tools-1.17.8-1.*", "libnvidia-container1-1.17.8-1.*",
                                  "nvidia-container-toolkit-0:1.17.8-1.*", "nvidia-container-toolkit-base-1.17.8-1.*"]


def test_driver_install_blacklists_nouveau_and_reports_the_reboot_it_needs():
    node = FakeNode(check_mode=False, key_fingerprint="EB693B3035CD5710E231E123A4B469963BF863CC",
                    files={"/usr/sbin/update-initramfs": ""})
    result = run_action(node, {"source": "driver"}, role_vars={"gpu_node_driver_reboot": "never"})
    assert not result.get("failed"), result
    assert node.files["/etc/modprobe.d/blacklist-nouveau.conf"].startswith("# written by k3s_gpu.nvidia.gpu_node")
    assert ("command", ["update-initramfs", "-u"]) in node.calls
    assert node.installed >= {"nvidia-driver-pinning-580", "nvidia-driver-cuda", "nvidia-kernel-open-dkms"}
    assert result["driver_changed"] and result["reboot_required"] and not result["reboot"]
    assert result["reboot_reason"] == "modprobe nvidia failed: modprobe: FATAL: Module nvidia not found"


def test_removal_releases_holds_then_removes_packages_repository_and_our_blacklist_only():
    node = FakeNode(check_mode=False, installed={"nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-driver-pinning-580"},
                    held={"nvidia-driver-cuda", "nvidia-kernel-open-dkms"},
                    files={"/etc/apt/sources.list.d/nvidia-cuda.sources": "x", "/etc/apt/keyrings/nvidia-cuda.asc": "k",
                           "/etc/modprobe.d/blacklist-nouveau.conf": "blacklist nouveau\n"})
    result = run_action(node, {"source": "driver", "state": "absent", "remove_source": True})
    assert not result.get("failed"), result
    assert not node.installed and not node.held and result["packages_changed"]
    assert result["files_removed"] == ["/etc/apt/sources.list.d/nvidia-cuda.sources", "/etc/apt/keyrings/nvidia-cuda.asc"]
    assert "/etc/modprobe.d/blacklist-nouveau.conf" in node.files  # the user's, not ours
    assert names(node).index("command") < names(node).index("apt")


@pytest.mark.parametrize("facts", [DEBIAN, ROCKY])
def test_removal_in_check_mode_changes_nothing(facts):
    node = FakeNode(check_mode=True, installed={"nvidia-container-toolkit"}, held={"nvidia-container-toolkit"},
                    files={"/etc/apt/sources.list.d/nvidia-container-toolkit.sources": "x"})
    before = (dict(node.files), set(node.installed), set(node.held))
    result = run_action(node, {"source": "toolkit", "state": "absent", "remove_source": True}, facts=facts, check_mode=True)
    assert result["changed"] and (node.files, node.installed, node.held) == before


def test_a_module_that_fails_names_the_step_and_its_message_not_its_whole_result():
    node = FakeNode(check_mode=False, failing={"get_url": "Request failed: <urlopen error timed out>"})
    result = run_action(node, {"source": "toolkit"})
    assert result["failed"] and result["changed"] is False
    assert result["msg"] == ("gpu1: ansible.builtin.get_url (https://nvidia.github.io/libnvidia-container/gpgkey) failed: "
                             "Request failed: <urlopen error timed out>"), result["msg"]
    assert not set(result) & {"url", "invocation"}, sorted(result)
    assert "/tmp/ansible.key" not in node.files and "deb822_repository" not in names(node)


def test_a_file_the_copy_action_cannot_write_fails_the_step_by_its_path():
    node = FakeNode(check_mode=False, key_fingerprint="EB693B3035CD5710E231E123A4B469963BF863CC",
                    files={"/usr/sbin/update-initramfs": ""})
    action = make_action(action_plugin, {"source": "driver"})
    action._execute_module = lambda module_name, module_args, task_vars: node.run(action, module_name, dict(module_args))
    action._remove_tmp_path = lambda path: None
    copy = mock.MagicMock()
    copy.run.return_value = {"failed": True, "msg": "Destination directory /etc/modprobe.d does not exist"}
    with mock.patch.object(action._shared_loader_obj.action_loader, "get", return_value=copy):
        result = action.run(task_vars={"inventory_hostname": "gpu1", "ansible_facts": DEBIAN, "gpu_node_driver_reboot": "never"})
    assert result["failed"] and result["msg"] == (
        "gpu1: ansible.builtin.copy (/etc/modprobe.d/blacklist-nouveau.conf) failed: Destination directory "
        "/etc/modprobe.d does not exist"), result["msg"]
    assert copy.run.call_count == 1 and "apt" not in names(node)  # the blacklist comes before the packages


# ---- issue 41: gpu_node_proxy_env goes to the modules' environment, never into a result or a message ------------------

SECRET_URL = "http://alice:S3cr3t@proxy:3128"


def environments_of(node, action):
    """Record the environment each module of the step runs with, as Ansible computes it for the module."""
    seen = []
    run = node.run

    def recording(action_, module_name, module_args):
        environment = {}
        action._compute_environment_string(environment)
        seen.append((module_name, dict(environment)))
        return run(action_, module_name, module_args)
    node.run = recording
    return seen


def test_the_proxy_env_is_the_environment_of_every_module_and_of_no_result():
    node = FakeNode(check_mode=False)
    action = make_action(action_plugin, {"source": "toolkit"})
    action._task.environment = [{"LANG": "C", "https_proxy": "http://play-level:3128"}]
    seen = environments_of(node, action)
    action._execute_module = lambda module_name, module_args, task_vars: node.run(action, module_name, dict(module_args))
    action._remove_tmp_path = lambda path: None
    result = action.run(task_vars={"inventory_hostname": "gpu1", "ansible_facts": DEBIAN,
                                   "gpu_node_proxy_env": {"https_proxy": SECRET_URL, "no_proxy": "localhost"}})
    assert not result.get("failed"), result.get("msg")
    assert seen and all(env == {"LANG": "C", "https_proxy": SECRET_URL, "no_proxy": "localhost"} for _name, env in seen), seen
    assert "S3cr3t" not in repr(result)


def test_without_a_proxy_env_the_tasks_environment_is_left_as_it_is():
    node = FakeNode(check_mode=False)
    action = make_action(action_plugin, {"source": "toolkit"})
    action._task.environment = [{"LANG": "C"}]
    seen = environments_of(node, action)
    action._execute_module = lambda module_name, module_args, task_vars: node.run(action, module_name, dict(module_args))
    action._remove_tmp_path = lambda path: None
    assert not action.run(task_vars={"inventory_hostname": "gpu1", "ansible_facts": DEBIAN}).get("failed")
    assert all(env == {"LANG": "C"} for _name, env in seen), seen


def test_a_refused_proxy_env_stops_the_step_before_any_module_without_its_password():
    node = FakeNode(check_mode=False)
    result = run_action(node, {"source": "toolkit"}, role_vars={"gpu_node_proxy_env": {"https_proxy": {"u": SECRET_URL}}})
    assert result["failed"] and result["msg"].startswith("gpu_node_proxy_env.https_proxy is a dictionary, not a text")
    assert not node.calls and "S3cr3t" not in repr(result)


@pytest.mark.parametrize("failing, variable", [
    ({"get_url": "Request failed: <urlopen error timed out> for %s/key" % SECRET_URL}, "gpu_node_toolkit_gpg_key_url"),
    ({"apt": "Failed to fetch %s/deb/Release 407 Proxy Authentication Required" % SECRET_URL},
     "gpu_node_toolkit_apt_repo_url"),
])
def test_a_failure_shows_urls_without_their_password(failing, variable):
    node = FakeNode(check_mode=False, failing=failing)
    result = run_action(node, {"source": "toolkit"}, role_vars={variable: SECRET_URL + "/nvidia"})
    assert result["failed"] and "http://alice:********@proxy:3128" in result["msg"], result["msg"]
    assert "S3cr3t" not in repr(result)


def test_check_mode_says_the_repository_without_its_password():
    node = FakeNode(check_mode=True)
    with mock.patch.object(action_plugin.display, "display") as said:
        run_action(node, {"source": "toolkit"}, check_mode=True,
                   role_vars={"gpu_node_toolkit_apt_repo_url": SECRET_URL + "/deb"})
    assert "would add the repository http://alice:********@proxy:3128/deb /" in said.call_args[0][0]
    assert "S3cr3t" not in repr(said.call_args_list)
