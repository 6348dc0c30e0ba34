# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's package step on one host: NVIDIA's signed repository and the pinned, held packages of the
container toolkit or the driver, or taking them back, in one task. The decisions are in _packages; this runs them
with Ansible's own modules (stat, get_url, deb822_repository, yum_repository, apt, dnf, dpkg_selections, ...).

The key is downloaded to a temporary file and its fingerprint checked before apt/dnf may see it; the repository
trusts only that key. If the install fails, the repository change is undone, so a bad or unreachable repository
never breaks the host's next apt/dnf run.

Every module runs with gpu_node_proxy_env over the task's own environment. The step reads it itself, instead of the
role passing it as the task's `environment:` from a registered result: a result holds no proxy password (issue 41),
and a URL in a message has its password masked."""

from __future__ import annotations

import base64

from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _packages as packages
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, masked
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction

display = Display()

SETTINGS = ("gpu_node_package_manager", "gpu_node_toolkit_version", "gpu_node_toolkit_operator_extensions",
            "gpu_node_toolkit_apt_repo_url", "gpu_node_toolkit_dnf_repo_url", "gpu_node_toolkit_dnf_gpgcheck",
            "gpu_node_toolkit_gpg_key_url", "gpu_node_toolkit_gpg_fingerprint", "gpu_node_toolkit_hold",
            "gpu_node_driver_branch", "gpu_node_driver_version", "gpu_node_driver_hold",
            "gpu_node_driver_open_kernel_modules", "gpu_node_driver_packages", "gpu_node_driver_kernel_headers",
            "gpu_node_driver_blacklist_nouveau", "gpu_node_driver_repo_url", "gpu_node_driver_gpg_key_url",
            "gpu_node_driver_gpg_fingerprint", "gpu_node_driver_reboot", "gpu_node_proxy_env")
GPG = "/usr/bin/gpg"
PYTHON_DEBIAN = "/usr/lib/python3/dist-packages/debian/deb822.py"  # ansible.builtin.deb822_repository needs it
NOUVEAU_BLACKLIST = "%s\nblacklist nouveau\noptions nouveau modeset=0\n" % release_rules.NOUVEAU_BLACKLIST_HEADER
INITRAMFS = {packages.APT: (["update-initramfs", "-u"], "/usr/sbin/update-initramfs"),
             packages.DNF: (["dracut", "--force"], "/usr/bin/dracut")}


# the argument that says what a module worked on, for the message of its failure
_SUBJECT_ARGS = ("argv", "name", "url", "src", "dest", "path")


class StepFailed(K3sGpuError):
    """A module failed; the result says why (the cause, kept whole in `result`), the module and its arguments say
    where."""

    def __init__(self, result, module="", module_args=None):
        super(StepFailed, self).__init__(result.get("msg") or "")
        self.result = result
        subject = next((module_args[key] for key in _SUBJECT_ARGS if (module_args or {}).get(key)), None)
        shown = " ".join(subject) if isinstance(subject, list) else subject
        self.step = masked("%s (%s)" % (module, shown) if shown else module)

    def reason(self):
        return masked(("%s %s" % (self.result.get("msg") or "", (self.result.get("stderr") or "").strip())).strip())


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_NODE_PACKAGES_SPEC

    def run_validated(self, result, args, task_vars):
        self._task_vars = task_vars
        self._host = task_vars.get("inventory_hostname", "")
        self._read_only = False
        self._changed = False
        self._proxy_env = {}
        kind, state = args["source"], args["state"]
        try:
            settings = role_vars.read(task_vars, self._templar.template, SETTINGS)
            self._proxy_env = settings["proxy_env"]
            facts = self._templar.template(task_vars.get("ansible_facts") or {})
            family = packages.package_family(settings, facts)
            if state == "absent":
                outcome = self._remove(packages.removal(kind, settings, facts, family, self._host,
                                                        args["remove_source"]))
            elif kind == packages.DRIVER:
                outcome = self._driver(settings, facts, packages.driver_source(settings, facts, family, self._host))
            else:
                outcome = self._install(packages.toolkit_source(settings, family, self._host))
        except StepFailed as exc:  # before K3sGpuError, which it is: the step and its module's own message
            changed = self._changed
            host_step.failed(result, "%s: %s failed: %s" % (self._host, exc.step, exc.reason()))
            result["changed"] = changed  # what was written before the failure stays written
            return result
        except K3sGpuError as exc:
            changed = self._changed
            host_step.failed(result, str(exc))
            result["changed"] = changed  # what was written before the failure stays written
            return result
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(outcome, changed=self._changed)
        return result

    # ---- running modules ------------------------------------------------------------------------------

    def _compute_environment_string(self, raw_environment_out=None):
        """The task's environment (play, block, task), then gpu_node_proxy_env over it, for every module the step runs
        (Ansible's own module runner and Mitogen's both ask here)."""
        environment = {}
        super(ActionModule, self)._compute_environment_string(environment)
        environment.update(getattr(self, "_proxy_env", None) or {})
        if isinstance(raw_environment_out, dict):
            raw_environment_out.clear()
            raw_environment_out.update(environment)
        return self._connection._shell.env_prefix(**environment)

    def _update_module_args(self, module_name, module_args, task_vars, *args, **kwargs):
        super(ActionModule, self)._update_module_args(module_name, module_args, task_vars, *args, **kwargs)
        if self._read_only:
            module_args["_ansible_check_mode"] = False  # scratch files and reads run in check mode too

    def _module(self, name, module_args, read_only=False, may_fail=False, changed_when=None):
        """Run a module on the host; read_only runs it in check mode too and never counts as a change."""
        self._read_only = read_only
        try:
            outcome = self._execute_module(module_name=name, module_args=module_args, task_vars=self._task_vars)
        finally:
            self._read_only = False
        if outcome.get("failed") and not may_fail:
            raise StepFailed(outcome, name, module_args)
        if read_only:
            outcome["changed"] = False
        elif changed_when is not None and not outcome.get("skipped"):
            outcome["changed"] = bool(changed_when(outcome))
        self._changed = self._changed or bool(outcome.get("changed"))
        return outcome

    def _command(self, argv, read_only=False, may_fail=False, changed_when=None):
        return self._module("ansible.builtin.command", {"argv": argv}, read_only=read_only, may_fail=may_fail,
                            changed_when=changed_when)

    def _exists(self, path):
        return bool(self._module("ansible.builtin.stat", {"path": path, "get_checksum": False}, read_only=True)["stat"]["exists"])

    def _packages(self, family, names, state="present", update_cache=False):
        if family == packages.APT:
            args = {"name": names, "state": state}
            if state == "present":
                args.update(update_cache=update_cache, allow_downgrade=True, allow_change_held_packages=True)
            return self._module("ansible.builtin.apt", args)
        args = {"name": names, "state": state, "use_backend": "dnf4"}  # RHEL 8 and 9; also where pkg_mgr is not dnf
        if state == "present":
            args.update(update_cache=update_cache, allow_downgrade=True)
        return self._module("ansible.builtin.dnf", args)

    def _write(self, content, dest, mode):
        """A file with this content, through the copy action (check mode and diff as a copy task has them)."""
        task = self._task.copy()
        task.args.clear()
        task.args.update(content=content, dest=dest, mode=mode)
        copy = self._shared_loader_obj.action_loader.get(
            "ansible.legacy.copy", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        outcome = copy.run(task_vars=self._task_vars)
        if outcome.get("failed"):
            raise StepFailed(outcome, "ansible.builtin.copy", {"dest": dest})
        self._changed = self._changed or bool(outcome.get("changed"))
        return outcome

    # ---- install ------------------------------------------------------------------------------------

    def _checked_key(self, source):
        """Download the key to a temporary file, refuse it unless it has the pinned fingerprint, install it.
        Returns whether the installed key changed."""
        temp = self._module("ansible.builtin.tempfile", {"suffix": ".key"}, read_only=True)["path"]
        try:
            self._module("ansible.builtin.get_url", {"url": source["key_url"], "dest": temp, "mode": "0600", "force": True},
                         read_only=True)
            shown = self._command(["gpg", "--batch", "--show-keys", "--with-colons", temp], read_only=True)
            found = packages.key_fingerprints(shown.get("stdout") or "")
            if not packages.fingerprint_matches(source["fingerprint"], found):
                raise K3sGpuError(
                    "%s: the key from %s has fingerprint(s) %s, not "
                    "%s" % (self._host, source["key_url"], ", ".join(found) or "none", source["fingerprint"]),
                    fix="the repository %s was not added and nothing was installed. Check the key URL (or your mirror) "
                        "and the fingerprint variable." % (source["url"],))
            self._module("ansible.builtin.file", {"path": release_rules.KEYRING_DIRS[source["family"]], "state": "directory",
                                                  "mode": "0755"})
            return bool(self._module("ansible.builtin.copy", {"src": temp, "remote_src": True, "dest": source["key_path"],
                                                              "mode": "0644"}).get("changed"))
        finally:
            self._module("ansible.builtin.file", {"path": temp, "state": "absent"}, read_only=True, may_fail=True)

    def _repository(self, source, python_debian_pending):
        """Add the repository, trusted only for its own key. Returns whether a repository file changed."""
        if source["family"] == packages.DNF:
            return bool(self._module("ansible.builtin.yum_repository", {
                "name": source["name"], "file": source["name"], "description": source["title"], "baseurl": [source["url"]],
                "enabled": True, "gpgcheck": source["gpgcheck"], "repo_gpgcheck": source["repo_gpgcheck"],
                "gpgkey": ["file://" + source["key_path"]], "mode": "0644"}).get("changed"))
        changed = False
        # in check mode python3-debian may be only "would be installed": the repository counts as not added yet
        if not python_debian_pending:
            fields = source["url"].split()  # "URI SUITE [COMPONENT...]"; a flat repository is "URI /"
            args = {"name": source["name"], "types": ["deb"], "uris": [fields[0]], "suites": [fields[1]],
                    "signed_by": source["key_path"], "mode": "0644"}
            if fields[2:]:
                args["components"] = fields[2:]
            changed = bool(self._module("ansible.builtin.deb822_repository", args).get("changed"))
        # the one-line .list file of earlier versions: the .sources file replaces it
        removed = self._module("ansible.builtin.file", {"path": source["legacy_file"], "state": "absent"})
        return changed or bool(removed.get("changed"))

    def _install(self, source):
        """The repository and the packages of one source. Returns what happened."""
        family, check = source["family"], bool(self._task.check_mode)
        outcome = dict(source=source["kind"], family=family, key_changed=False, repository_changed=False,
                       packages_changed=False, unseen=False)
        gpg_pending = False
        if not self._exists(GPG):
            gpg_pending = bool(self._packages(family, ["gnupg" if family == packages.APT else "gnupg2"]).get("changed")) and check
        python_debian_pending = False
        if family == packages.APT and not self._exists(PYTHON_DEBIAN):
            python_debian_pending = bool(self._packages(family, ["python3-debian"]).get("changed")) and check
        if not gpg_pending:
            outcome["key_changed"] = self._checked_key(source)
        before = self._repository_files(source)
        try:
            outcome["repository_changed"] = self._repository(source, python_debian_pending)
            # check mode: the package manager cannot see a repository or key that is not there yet
            if check and (outcome["repository_changed"] or outcome["key_changed"] or gpg_pending or python_debian_pending):
                outcome["unseen"] = True
                display.display(
                    "%s: would add the repository %s and install %s (%s cannot see a repository that is not added yet, so "
                    "the package step is not evaluated in check mode)." % (
                        self._host, masked(source["url"]), ", ".join(source["packages"]), family))
                return outcome
            locks = self._release_stale_locks(source)
            if source["dnf_module"]:
                self._command(["dnf", "-y", "module", "enable", source["dnf_module"]],
                              changed_when=lambda done: "Nothing to do" not in (done.get("stdout") or ""))
            refresh = outcome["repository_changed"] or outcome["key_changed"]
            for index, stage in enumerate(packages.stages(source)):
                installed = self._packages(family, stage, update_cache=refresh and index == 0)
                outcome["packages_changed"] = outcome["packages_changed"] or bool(installed.get("changed"))
        except StepFailed as failure:
            self._undo_repository(source, before, outcome["repository_changed"])
            raise K3sGpuError(
                "%s: installing %s from %s failed, and the repository change was undone: %s" % (
                    self._host, ", ".join(source["packages"]), source["url"], failure.reason()))
        self._hold(source, locks)
        return outcome

    def _repository_files(self, source):
        """The repository files there now ({path: base64 content}), to put back if the install fails."""
        before = {}
        for path in (source["repo_file"], source["legacy_file"]):
            if path:
                read = self._module("ansible.builtin.slurp", {"src": path}, read_only=True, may_fail=True)
                if "content" in read:
                    before[path] = read["content"]
        return before

    def _undo_repository(self, source, before, repository_changed):
        for path, content in sorted(before.items()):
            self._write(base64.b64decode(content).decode("utf-8", "surrogateescape"), path, "0644")
        if repository_changed and source["repo_file"] not in before:
            self._module("ansible.builtin.file", {"path": source["repo_file"], "state": "absent"})

    def _version_locks(self):
        """(whether `dnf versionlock` works, [(name, version-release)]). The lock list needs no repository."""
        listed = self._command(["dnf", "-q", "-y", "--disablerepo=*", "versionlock", "list"], read_only=True, may_fail=True)
        return listed.get("rc") == 0, packages.version_locks(listed.get("stdout_lines") or [])

    def _release_stale_locks(self, source):
        if source["family"] != packages.DNF or not source["held"]:
            return None
        works, locks = self._version_locks()
        stale = packages.stale_locks(source, locks)
        if works and stale:
            self._command(["dnf", "-q", "-y", "--disablerepo=*", "versionlock", "delete"] + stale)
        return (works, locks)

    def _hold(self, source, locks):
        """Keep the held packages at their version: dpkg hold, or dnf versionlock (its plugin installed when missing)."""
        if not source["held"]:
            return
        if source["family"] == packages.APT:
            for name in source["held"]:
                self._module("ansible.builtin.dpkg_selections", {"name": name, "selection": "hold"})
            return
        works, found = locks
        if not works:
            self._packages(packages.DNF, ["python3-dnf-plugin-versionlock"])
        wanted = packages.locks_to_add(source, found)
        if wanted:
            self._command(["dnf", "-q", "-y", "versionlock", "add"] + wanted)

    # ---- the driver -----------------------------------------------------------------------------------

    def _driver(self, settings, facts, source):
        """nouveau kept off, the driver installed, and whether the new driver needs a reboot."""
        family, check = source["family"], bool(self._task.check_mode)
        nouveau_changed = False
        if settings["driver_blacklist_nouveau"]:
            self._module("ansible.builtin.file", {"path": release_rules.NOUVEAU_BLACKLIST.rsplit("/", 1)[0], "state": "directory",
                                                  "mode": "0755"})  # a minimal image may have no kmod yet
            nouveau_changed = bool(self._write(NOUVEAU_BLACKLIST, release_rules.NOUVEAU_BLACKLIST, "0644").get("changed"))
            if nouveau_changed:
                self._rebuild_initramfs(family)
        outcome = self._install(source)
        outcome["driver_changed"] = outcome["packages_changed"] or nouveau_changed
        required, reason = False, ""
        if outcome["driver_changed"] and not check:
            before = self._driver_before()
            modinfo = self._command(["modinfo", "-F", "version", "nvidia"], read_only=True, may_fail=True)
            nouveau_loaded = self._exists("/sys/module/nouveau")
            modprobe = None
            if not before.get("loaded") and not nouveau_loaded:
                modprobe = self._command(["modprobe", "nvidia"], may_fail=True, changed_when=lambda done: done.get("rc") == 0)
            required, reason = packages.reboot_decision(before, (modinfo.get("stdout") or "").strip(), nouveau_loaded,
                                                        modprobe)
        policy = settings["driver_reboot"]
        outcome.update(reboot_required=required, reboot_reason=reason,
                       reboot=outcome["driver_changed"] and not check and (
                           policy == "always" or (policy == "if_needed" and required)))
        if required and policy == "never":
            display.display(
                "%s: the NVIDIA driver is installed but not loaded (%s); gpu_node_driver_reboot is never, so reboot the "
                "host yourself. The containerd runtimes are configured anyway; pods get the GPUs after the reboot." % (
                    self._host, reason))
        return outcome

    def _driver_before(self):
        """The driver the host step read before the install ({loaded, version})."""
        node = self._templar.template(self._task_vars.get("gpu_node_result") or {})
        return ((host_state.decoded(node.get("node")) or {}).get("facts") or {}).get("driver") or {}

    def _rebuild_initramfs(self, family):
        argv, tool = INITRAMFS[family]
        if self._exists(tool):  # where the host has one
            self._command(argv)

    # ---- taking back -----------------------------------------------------------------------------------

    def _remove(self, plan):
        """Holds and locks released (apt and dnf refuse to remove held or locked packages), the packages removed,
        and with remove_source the repository, its key and (the driver) the nouveau blacklist the role wrote."""
        family = plan["family"]
        if family == packages.APT:
            held = self._command(["apt-mark", "showhold"], read_only=True, may_fail=True).get("stdout_lines") or []
            ours = [name for name in plan["packages"] if name in held]
            if ours:
                self._command(["apt-mark", "unhold"] + ours)
        else:
            works, locks = self._version_locks()
            ours = sorted(set(name for name, _evr in locks if name in plan["packages"]))
            if works and ours:
                self._command(["dnf", "-q", "-y", "--disablerepo=*", "versionlock", "delete"] + ours)
        removed = self._packages(family, plan["packages"], state="absent")
        outcome = dict(source=plan["kind"], family=family, packages_changed=bool(removed.get("changed")), files_removed=[])
        for path in plan["files"]:
            if self._module("ansible.builtin.file", {"path": path, "state": "absent"}).get("changed"):
                outcome["files_removed"].append(path)
        if plan["nouveau_blacklist"]:
            read = self._module("ansible.builtin.slurp", {"src": release_rules.NOUVEAU_BLACKLIST}, read_only=True, may_fail=True)
            text = base64.b64decode(read.get("content") or "").decode("utf-8", "replace")
            if text.startswith(release_rules.NOUVEAU_BLACKLIST_HEADER):  # ours, never one the user wrote
                self._module("ansible.builtin.file", {"path": release_rules.NOUVEAU_BLACKLIST, "state": "absent"})
                outcome["files_removed"].append(release_rules.NOUVEAU_BLACKLIST)
                self._rebuild_initramfs(family)
        if plan["kind"] == packages.DRIVER and outcome["packages_changed"]:
            display.display("%s: the NVIDIA driver packages are removed; a loaded nvidia kernel module stays until the "
                            "next reboot." % self._host)
        return outcome
