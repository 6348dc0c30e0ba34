# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's package step on one host (the action k3s_gpu.nvidia.gpu_node_packages only runs it): NVIDIA's
signed repository and the pinned, held packages of the container toolkit or the driver, or taking them back. The
decisions are in _packages; this runs them with Ansible's own modules (stat, get_url, deb822_repository,
yum_repository, apt, dnf, dpkg_selections, ...), through the PackageTask of its Ansible task.

The key is downloaded to a temporary file and its fingerprint checked before apt/dnf may see it; the repository
trusts only that key. If the install fails, the repository change is undone, so a bad or unreachable repository
never breaks the host's next apt/dnf run. A refusal or a failed module is raised (K3sGpuError, StepFailed), which the
action's failure boundary (_spec_action.SpecAction) reports with failure_message().

PRIVATE to the collection. Controller side."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, masked
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils import _release_rules as release_rules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _packages as packages

# the role's variables the step reads (gpu_node_proxy_env: for the action, which runs every module with it)
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


@dataclass(frozen=True)
class PackageTask:
    """What the step needs of its Ansible task: the host, its check flag, the templar, the display, a runner of modules
    on the host (run_module(name, args, read_only) -> result; read_only runs the module in check mode too) and a writer
    of a file with a given content (write_file(content, dest, mode) -> the copy action's result)."""
    host: str
    check_mode: bool
    template: Callable[[Any], Any]
    display: Any
    run_module: Callable[[str, Dict[str, Any], bool], Dict[str, Any]]
    write_file: Callable[[str, str, str], Dict[str, Any]]


class StepFailed(K3sGpuError):
    """A module failed; the result says why (the cause, kept whole in `result`), the module and its arguments say
    where."""

    def __init__(self, result, module="", module_args=None, host=""):
        super(StepFailed, self).__init__(result.get("msg") or "")
        self.result = result
        self.host = host
        subject = next((module_args[key] for key in _SUBJECT_ARGS if (module_args or {}).get(key)), None)
        shown = " ".join(subject) if isinstance(subject, list) else subject
        self.step = masked("%s (%s)" % (module, shown) if shown else module)

    def reason(self) -> str:
        return masked(("%s %s" % (self.result.get("msg") or "", (self.result.get("stderr") or "").strip())).strip())


def failure_message(exc: K3sGpuError) -> str:
    """A refusal as the step reports it: a failed module by the host, the module and what it worked on, and the
    module's own message (not its whole result); any other refusal as raised."""
    if isinstance(exc, StepFailed):
        return "%s: %s failed: %s" % (exc.host, exc.step, exc.reason())
    return str(exc)


class PackageStep:
    """The step on one host; `changed` says whether a module changed something (what was written before a failure
    stays written)."""

    def __init__(self, task: PackageTask):
        self.task = task
        self.changed = False

    def run(self, settings: Mapping[str, Any], args: Mapping[str, Any], task_vars: Mapping[str, Any]) -> Dict[str, Any]:
        """What the step did (the task's result but `changed`). settings: SETTINGS as _role_vars reads them; args:
        gpu_node_packages' arguments. Raises K3sGpuError (StepFailed where a module failed)."""
        host, kind = self.task.host, args["source"]
        facts = self.task.template(task_vars.get("ansible_facts") or {})
        family = packages.package_family(settings, facts)
        if args["state"] == "absent":
            return self.remove(packages.removal(kind, settings, facts, family, host, args["remove_source"]))
        if kind == packages.DRIVER:
            return self.driver(settings, facts, packages.driver_source(settings, facts, family, host), task_vars)
        return self.install(packages.toolkit_source(settings, family, host))

    # ---- running modules ------------------------------------------------------------------------------

    def module(self, name: str, module_args: Dict[str, Any], read_only: bool = False, may_fail: bool = False,
               changed_when: Optional[Callable[[Dict[str, Any]], bool]] = None) -> Dict[str, Any]:
        """Run a module on the host; read_only runs it in check mode too and never counts as a change."""
        outcome = self.task.run_module(name, module_args, read_only)
        if outcome.get("failed") and not may_fail:
            raise StepFailed(outcome, name, module_args, self.task.host)
        if read_only:
            outcome["changed"] = False
        elif changed_when is not None and not outcome.get("skipped"):
            outcome["changed"] = bool(changed_when(outcome))
        self.changed = self.changed or bool(outcome.get("changed"))
        return outcome

    def command(self, argv: List[str], read_only: bool = False, may_fail: bool = False,
                changed_when: Optional[Callable[[Dict[str, Any]], bool]] = None) -> Dict[str, Any]:
        return self.module("ansible.builtin.command", {"argv": argv}, read_only=read_only, may_fail=may_fail,
                           changed_when=changed_when)

    def exists(self, path: str) -> bool:
        return bool(self.module("ansible.builtin.stat", {"path": path, "get_checksum": False}, read_only=True)["stat"]["exists"])

    def apt_or_dnf(self, family: str, names: List[str], state: str = "present", update_cache: bool = False) -> Dict[str, Any]:
        if family == packages.APT:
            args = {"name": names, "state": state}
            if state == "present":
                args.update(update_cache=update_cache, allow_downgrade=True, allow_change_held_packages=True)
            return self.module("ansible.builtin.apt", args)
        args = {"name": names, "state": state, "use_backend": "dnf4"}  # RHEL 8 and 9; also where pkg_mgr is not dnf
        if state == "present":
            args.update(update_cache=update_cache, allow_downgrade=True)
        return self.module("ansible.builtin.dnf", args)

    def write(self, content: str, dest: str, mode: str) -> Dict[str, Any]:
        """A file with this content, through the copy action (check mode and diff as a copy task has them)."""
        outcome = self.task.write_file(content, dest, mode)
        if outcome.get("failed"):
            raise StepFailed(outcome, "ansible.builtin.copy", {"dest": dest}, self.task.host)
        self.changed = self.changed or bool(outcome.get("changed"))
        return outcome

    # ---- install ------------------------------------------------------------------------------------

    def checked_key(self, source: Dict[str, Any]) -> bool:
        """Download the key to a temporary file, refuse it unless it has the pinned fingerprint, install it.
        Returns whether the installed key changed."""
        temp = self.module("ansible.builtin.tempfile", {"suffix": ".key"}, read_only=True)["path"]
        try:
            self.module("ansible.builtin.get_url", {"url": source["key_url"], "dest": temp, "mode": "0600", "force": True},
                        read_only=True)
            shown = self.command(["gpg", "--batch", "--show-keys", "--with-colons", temp], read_only=True)
            found = packages.key_fingerprints(shown.get("stdout") or "")
            if not packages.fingerprint_matches(source["fingerprint"], found):
                raise K3sGpuError(
                    "%s: the key from %s has fingerprint(s) %s, not "
                    "%s" % (self.task.host, source["key_url"], ", ".join(found) or "none", source["fingerprint"]),
                    fix="the repository %s was not added and nothing was installed. Check the key URL (or your mirror) "
                        "and the fingerprint variable." % (source["url"],))
            self.module("ansible.builtin.file", {"path": release_rules.KEYRING_DIRS[source["family"]], "state": "directory",
                                                 "mode": "0755"})
            return bool(self.module("ansible.builtin.copy", {"src": temp, "remote_src": True, "dest": source["key_path"],
                                                             "mode": "0644"}).get("changed"))
        finally:
            self.module("ansible.builtin.file", {"path": temp, "state": "absent"}, read_only=True, may_fail=True)

    def repository(self, source: Dict[str, Any], python_debian_pending: bool) -> bool:
        """Add the repository, trusted only for its own key. Returns whether a repository file changed."""
        if source["family"] == packages.DNF:
            return bool(self.module("ansible.builtin.yum_repository", {
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
            changed = bool(self.module("ansible.builtin.deb822_repository", args).get("changed"))
        # the one-line .list file of earlier versions: the .sources file replaces it
        removed = self.module("ansible.builtin.file", {"path": source["legacy_file"], "state": "absent"})
        return changed or bool(removed.get("changed"))

    def install(self, source: Dict[str, Any]) -> Dict[str, Any]:
        """The repository and the packages of one source. Returns what happened."""
        family, check = source["family"], self.task.check_mode
        outcome = dict(source=source["kind"], family=family, key_changed=False, repository_changed=False,
                       packages_changed=False, unseen=False)
        gpg_pending = False
        if not self.exists(GPG):
            gpg_pending = bool(self.apt_or_dnf(family, ["gnupg" if family == packages.APT else "gnupg2"]).get("changed")) and check
        python_debian_pending = False
        if family == packages.APT and not self.exists(PYTHON_DEBIAN):
            python_debian_pending = bool(self.apt_or_dnf(family, ["python3-debian"]).get("changed")) and check
        if not gpg_pending:
            outcome["key_changed"] = self.checked_key(source)
        before = self.repository_files(source)
        try:
            outcome["repository_changed"] = self.repository(source, python_debian_pending)
            # check mode: the package manager cannot see a repository or key that is not there yet
            if check and (outcome["repository_changed"] or outcome["key_changed"] or gpg_pending or python_debian_pending):
                outcome["unseen"] = True
                self.task.display.display(
                    "%s: would add the repository %s and install %s (%s cannot see a repository that is not added yet, so "
                    "the package step is not evaluated in check mode)." % (
                        self.task.host, masked(source["url"]), ", ".join(source["packages"]), family))
                return outcome
            locks = self.release_stale_locks(source)
            if source["dnf_module"]:
                self.command(["dnf", "-y", "module", "enable", source["dnf_module"]],
                             changed_when=lambda done: "Nothing to do" not in (done.get("stdout") or ""))
            refresh = outcome["repository_changed"] or outcome["key_changed"]
            for index, stage in enumerate(packages.stages(source)):
                installed = self.apt_or_dnf(family, stage, update_cache=refresh and index == 0)
                outcome["packages_changed"] = outcome["packages_changed"] or bool(installed.get("changed"))
        except StepFailed as failure:
            self.undo_repository(source, before, outcome["repository_changed"])
            raise K3sGpuError(
                "%s: installing %s from %s failed, and the repository change was undone: %s" % (
                    self.task.host, ", ".join(source["packages"]), source["url"], failure.reason()))
        self.hold(source, locks)
        return outcome

    def repository_files(self, source: Dict[str, Any]) -> Dict[str, str]:
        """The repository files there now ({path: base64 content}), to put back if the install fails."""
        before = {}
        for path in (source["repo_file"], source["legacy_file"]):
            if path:
                read = self.module("ansible.builtin.slurp", {"src": path}, read_only=True, may_fail=True)
                if "content" in read:
                    before[path] = read["content"]
        return before

    def undo_repository(self, source: Dict[str, Any], before: Dict[str, str], repository_changed: bool) -> None:
        for path, content in sorted(before.items()):
            self.write(base64.b64decode(content).decode("utf-8", "surrogateescape"), path, "0644")
        if repository_changed and source["repo_file"] not in before:
            self.module("ansible.builtin.file", {"path": source["repo_file"], "state": "absent"})

    def version_locks(self):
        """(whether `dnf versionlock` works, [(name, version-release)]). The lock list needs no repository."""
        listed = self.command(["dnf", "-q", "-y", "--disablerepo=*", "versionlock", "list"], read_only=True, may_fail=True)
        return listed.get("rc") == 0, packages.version_locks(listed.get("stdout_lines") or [])

    def release_stale_locks(self, source: Dict[str, Any]):
        if source["family"] != packages.DNF or not source["held"]:
            return None
        works, locks = self.version_locks()
        stale = packages.stale_locks(source, locks)
        if works and stale:
            self.command(["dnf", "-q", "-y", "--disablerepo=*", "versionlock", "delete"] + stale)
        return (works, locks)

    def hold(self, source: Dict[str, Any], locks) -> None:
        """Keep the held packages at their version: dpkg hold, or dnf versionlock (its plugin installed when missing)."""
        if not source["held"]:
            return
        if source["family"] == packages.APT:
            for name in source["held"]:
                self.module("ansible.builtin.dpkg_selections", {"name": name, "selection": "hold"})
            return
        works, found = locks
        if not works:
            self.apt_or_dnf(packages.DNF, ["python3-dnf-plugin-versionlock"])
        wanted = packages.locks_to_add(source, found)
        if wanted:
            self.command(["dnf", "-q", "-y", "versionlock", "add"] + wanted)

    # ---- the driver -----------------------------------------------------------------------------------

    def driver(self, settings: Mapping[str, Any], facts: Mapping[str, Any], source: Dict[str, Any],
               task_vars: Mapping[str, Any]) -> Dict[str, Any]:
        """nouveau kept off, the driver installed, and whether the new driver needs a reboot."""
        family, check = source["family"], self.task.check_mode
        nouveau_changed = False
        if settings["driver_blacklist_nouveau"]:
            self.module("ansible.builtin.file", {"path": release_rules.NOUVEAU_BLACKLIST.rsplit("/", 1)[0], "state": "directory",
                                                 "mode": "0755"})  # a minimal image may have no kmod yet
            nouveau_changed = bool(self.write(NOUVEAU_BLACKLIST, release_rules.NOUVEAU_BLACKLIST, "0644").get("changed"))
            if nouveau_changed:
                self.rebuild_initramfs(family)
        outcome = self.install(source)
        outcome["driver_changed"] = outcome["packages_changed"] or nouveau_changed
        required, reason = False, ""
        if outcome["driver_changed"] and not check:
            before = self.driver_before(task_vars)
            modinfo = self.command(["modinfo", "-F", "version", "nvidia"], read_only=True, may_fail=True)
            nouveau_loaded = self.exists("/sys/module/nouveau")
            modprobe = None
            if not before.get("loaded") and not nouveau_loaded:
                modprobe = self.command(["modprobe", "nvidia"], may_fail=True, changed_when=lambda done: done.get("rc") == 0)
            required, reason = packages.reboot_decision(before, (modinfo.get("stdout") or "").strip(), nouveau_loaded,
                                                        modprobe)
        policy = settings["driver_reboot"]
        outcome.update(reboot_required=required, reboot_reason=reason,
                       reboot=outcome["driver_changed"] and not check and (
                           policy == "always" or (policy == "if_needed" and required)))
        if required and policy == "never":
            self.task.display.display(
                "%s: the NVIDIA driver is installed but not loaded (%s); gpu_node_driver_reboot is never, so reboot the "
                "host yourself. The containerd runtimes are configured anyway; pods get the GPUs after the reboot." % (
                    self.task.host, reason))
        return outcome

    def driver_before(self, task_vars: Mapping[str, Any]) -> Dict[str, Any]:
        """The driver the host step read before the install ({loaded, version})."""
        node = self.task.template(task_vars.get("gpu_node_result") or {})
        return ((host_state.decoded(node.get("node")) or {}).get("facts") or {}).get("driver") or {}

    def rebuild_initramfs(self, family: str) -> None:
        argv, tool = INITRAMFS[family]
        if self.exists(tool):  # where the host has one
            self.command(argv)

    # ---- taking back -----------------------------------------------------------------------------------

    def remove(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        """Holds and locks released (apt and dnf refuse to remove held or locked packages), the packages removed,
        and with remove_source the repository, its key and (the driver) the nouveau blacklist the role wrote."""
        family = plan["family"]
        if family == packages.APT:
            held = self.command(["apt-mark", "showhold"], read_only=True, may_fail=True).get("stdout_lines") or []
            ours = [name for name in plan["packages"] if name in held]
            if ours:
                self.command(["apt-mark", "unhold"] + ours)
        else:
            works, locks = self.version_locks()
            ours = sorted(set(name for name, _evr in locks if name in plan["packages"]))
            if works and ours:
                self.command(["dnf", "-q", "-y", "--disablerepo=*", "versionlock", "delete"] + ours)
        removed = self.apt_or_dnf(family, plan["packages"], state="absent")
        outcome = dict(source=plan["kind"], family=family, packages_changed=bool(removed.get("changed")), files_removed=[])
        for path in plan["files"]:
            if self.module("ansible.builtin.file", {"path": path, "state": "absent"}).get("changed"):
                outcome["files_removed"].append(path)
        if plan["nouveau_blacklist"]:
            read = self.module("ansible.builtin.slurp", {"src": release_rules.NOUVEAU_BLACKLIST}, read_only=True, may_fail=True)
            text = base64.b64decode(read.get("content") or "").decode("utf-8", "replace")
            if text.startswith(release_rules.NOUVEAU_BLACKLIST_HEADER):  # ours, never one the user wrote
                self.module("ansible.builtin.file", {"path": release_rules.NOUVEAU_BLACKLIST, "state": "absent"})
                outcome["files_removed"].append(release_rules.NOUVEAU_BLACKLIST)
                self.rebuild_initramfs(family)
        if plan["kind"] == packages.DRIVER and outcome["packages_changed"]:
            self.task.display.display("%s: the NVIDIA driver packages %s removed; a loaded nvidia kernel module stays "
                                      "until the next reboot." % (self.task.host,
                                                                  "would be" if self.task.check_mode else "are"))
        return outcome
