# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_node role's step on one host, in one task: read the node, decide, and configure its containerd
when nothing has to be installed first. The role registers the result as gpu_node_result.

The role's variables are read here, converted by the role's argument spec, so `-e gpu_node_force=false`
means false; a refusal is one message that names the user's variables, never a filter's wrapping."""

from __future__ import annotations

import base64
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.utils.display import Display

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import NOTHING_CHANGED, K3sGpuError, ended
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _specs as specs
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _configure as configure
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.cluster import _device_plugin as device_plugin
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.diagnosis import _doctor as doctor
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_state as host_state
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _host_step as host_step
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _restart as restart
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.role import _role_vars as role_vars
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _node_reading as node_reading
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._spec_action import SpecAction

display = Display()

READ_VARS = ("gpu_node_root", "gpu_node_distribution", "gpu_node_release", "gpu_node_newer_release", "gpu_node_data_dir",
             "gpu_node_toolkit_dirs")
PLAN_VARS = ("gpu_node_force", "gpu_node_mode", "gpu_node_operator_toolkit", "gpu_node_operator_driver",
             "gpu_node_toolkit_install", "gpu_node_driver_install", "gpu_node_driver_reboot", "gpu_node_default_runtime",
             "gpu_node_remove_operator_leftovers", "gpu_node_cdi_generate", "gpu_node_cdi_spec_path", "gpu_node_state",
             "gpu_node_absent_remove_toolkit", "gpu_node_absent_remove_driver", "gpu_node_dev_char_symlinks",
             "gpu_node_cdi_refresh")
CONFIGURE_VARS = ("gpu_node_runtimes", "gpu_node_enable_cdi", "gpu_node_handler_labels", "gpu_node_backup",
                  "gpu_node_target_release")
# the upgrade_check playbook: the node as the role reads it, and the release it is about to get
UPGRADE_CHECK_VARS = READ_VARS + ("gpu_node_runtimes", "gpu_node_target_release")
# the handler: restart, verify, roll back
RESTART_VARS = READ_VARS + ("gpu_node_restart", "gpu_node_restart_timeout_seconds", "gpu_node_restart_settle_seconds")
# gpu_node_result's keys that belong to the task that registered it, not to the result
TASK_KEYS = ("changed", "failed", "msg", "warnings", "deprecations", "diff", "skipped", "invocation")
# the device plugin's node labels are written with the containerd step (config.yaml.d)
DEVICE_PLUGIN_VARS = device_plugin.ROLE_VARS
# the doctor playbook: what the role plans on the node, and what the doctor checks it against
DOCTOR_VARS = READ_VARS + PLAN_VARS + CONFIGURE_VARS + DEVICE_PLUGIN_VARS + (
    "gpu_node_toolkit_version", "gpu_node_operator_namespace")


def _read_node(execute_module, settings, distribution, release):
    """runtime_info's reading of the node with the role's node settings."""
    return node_reading.read_node(execute_module, dict(
        root=settings["root"], distribution=distribution, release=release or None, newer_release=settings["newer_release"],
        data_dir=settings["data_dir"] or None, toolkit_dirs=settings["toolkit_dirs"]))


def _reading_failed(result, host, reading, ending):
    """A failed reading as the role reports it: the module's message in the role's variable names, and its ending once."""
    return host_step.failed(result, ended("%s: %s" % (host, host_step.role_message(reading)), ending))


class ActionModule(SpecAction):

    ARGUMENT_SPEC = specs.GPU_NODE_HOST_SPEC
    REQUIRED_IF = specs.GPU_NODE_HOST_REQUIRED_IF

    def run_validated(self, result, args, task_vars):
        phase = args["phase"]
        self._host = task_vars.get("inventory_hostname", "")
        try:
            # every variable of the role in the plan phase: the site playbook imports the role without Ansible's own
            # validation task (rolespec_validate: false), one task per host less
            settings = role_vars.read(task_vars, self._templar.template,
                                      None if phase == "plan" else UPGRADE_CHECK_VARS if phase == "upgrade_check"
                                      else DOCTOR_VARS if phase == "doctor"
                                      else RESTART_VARS if phase == "restart" else READ_VARS + PLAN_VARS + CONFIGURE_VARS + DEVICE_PLUGIN_VARS)
            result["settings"] = host_step.task_settings(settings, task_vars, self._templar.template)  # the role's tasks read these
        except K3sGpuError as exc:
            return host_step.failed(result, ended("%s: %s" % (task_vars.get("inventory_hostname"), exc)))
        warnings = result.setdefault("warnings", [])
        if phase == "plan":
            warnings.extend(role_vars.unknown_variables(task_vars))

        def execute_module(name, module_args):
            return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)

        try:
            if phase in ("reread", "configure"):
                try:
                    state = host_state.HostState.from_result(args["node"], "the argument node")
                except K3sGpuError as exc:
                    return host_step.failed(result, ended("%s: %s" % (self._host, exc)))
            if phase == "plan":
                return self._plan(result, settings, task_vars, execute_module)
            if phase == "reread":
                return self._reread(result, settings, state, execute_module)
            if phase == "restart":
                return self._restart(result, settings, task_vars, execute_module)
            if phase == "upgrade_check":
                return self._upgrade_check(result, settings, args["fail"], execute_module)
            if phase == "doctor":
                return self._doctor(result, settings, task_vars, execute_module)
            result["reboot_required"] = bool(self._templar.template(task_vars.get("gpu_node_reboot_required", False)))
            return self._configure(result, settings, state.facts, state.plan, execute_module)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)

    def _plan(self, result, settings, task_vars, execute_module):
        host = self._host
        settings = self._release_settings(settings, task_vars)
        if settings.get("release_from"):
            result["release_from"] = settings["release_from"]
        reading = _read_node(execute_module, settings, settings["distribution"], settings["release"] or None)
        if reading.get("failed"):
            return _reading_failed(result, host, reading, NOTHING_CHANGED)
        result["warnings"].extend(reading.pop("warnings", None) or [])
        facts = NodeFacts.from_reading(reading)
        plan_settings = dict((k, settings[k]) for k in (
            "force", "root", "mode", "operator_toolkit", "operator_driver", "toolkit_install", "driver_install",
            "driver_reboot", "default_runtime", "remove_operator_leftovers", "state", "absent_remove_toolkit",
            "absent_remove_driver"))
        plan_settings["local_connection"] = task_vars.get("ansible_connection", "ssh") == "local"
        try:
            plan = host_step.plan_host(facts, plan_settings, host)
            if plan.selected:
                host_step.device_plugin_labels(settings, host)  # the sharing settings refused before any install
        except K3sGpuError as exc:
            return host_step.failed(result, ended(str(exc)))
        for message in plan.messages:
            display.display(message)
        cdi = host_step.cdi_due(facts, plan, settings)
        devices = self._device_steps(facts, plan, settings)
        due = plan.selected and bool(plan.mode.installs_or_removes or cdi or devices["dev_char_due"]
                                     or devices["cdi_refresh_due"])
        result.update(install_due=due, cdi_due=cdi, **devices)
        if not plan.selected or due:
            result.update(host_step.node_result(plan, facts, None), configure_due=False,
                          node=host_state.HostState(facts, plan, host_step.cdi_marker(settings)).to_result())
            return result
        # where k3s/rke2 can restart, a change is written by the role's next task, which notifies the restart handler;
        # elsewhere (check mode, a sandbox tree, gpu_node_restart false) it is written here and no handler runs
        restarts = restart.notified(self._task.check_mode, settings["restart"], plan.live)
        result = self._configure(result, settings, facts, plan, execute_module, write=not restarts)
        if result.get("changed") and not result.get("failed") and not restarts:
            reason = restart.why_not(bool(self._task.check_mode), settings["restart"], plan.live, facts.units)
            display.display(restart.not_restarted(self._host, facts.units[0] if facts.units else facts.distribution, reason))
        return result

    def _release_settings(self, settings, task_vars):
        """settings with the distribution and release the node is read for (the inventory's, when gpu_node_release is
        empty) and release_from, the inventory variable it came from, or None."""
        distribution, release, source = role_vars.release_to_read(settings["distribution"], settings["release"], task_vars,
                                                                  self._templar.template)
        return dict(settings, distribution=distribution, release=release, release_from=source)

    def _reread(self, result, settings, state, execute_module):
        """After the installs: the node as it is now (runtimes, nvidia-ctk, driver), and whether the CDI spec is due."""
        reading = _read_node(execute_module, settings, state.facts.distribution, state.facts.release)
        if reading.get("failed"):
            message = host_step.role_message(reading)
            return host_step.failed(result, "%s: reading the node after the installs failed: %s" % (self._host, message))
        reading.pop("warnings", None)  # said by the first reading
        fresh, plan = NodeFacts.from_reading(reading), state.plan
        result.update(host_step.node_result(plan, fresh, None), install_due=False, configure_due=False,
                      cdi_due=host_step.cdi_due(fresh, plan, settings),
                      node=host_state.HostState(fresh, plan, host_step.cdi_marker(settings)).to_result(),
                      **self._device_steps(fresh, plan, settings))
        return result

    @staticmethod
    def _device_steps(facts, plan, settings):
        """The node's device steps the role's tasks take: the /dev/char links and their udev rule, nvidia-cdi-refresh."""
        return {"dev_char_due": host_step.dev_char_due(facts, plan, settings) or False,
                "cdi_refresh_due": host_step.cdi_refresh_due(facts, plan, settings)}

    def _configure_params(self, settings, facts, plan):
        """containerd_runtimes' options for the role's settings and plan (the node labels may refuse: raises)."""
        absent = settings["state"] == "absent"
        params = dict(
            state=settings["state"], root=settings["root"], distribution=facts.distribution, release=facts.release,
            newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
            toolkit_dirs=settings["toolkit_dirs"], runtimes=settings["runtimes"] or None,
            default_runtime=plan.mode.default_runtime or None, enable_cdi=settings["enable_cdi"],
            # k3s/rke2 add node-label entries to the node at every start (labels are added, never removed)
            handler_labels=settings["handler_labels"] if facts.distribution in (distro.K3S, distro.RKE2) else None,
            backup=settings["backup"], node_facts=facts.reading,
            # the release the inventory asks for (k3s/rke2 nodes): its template check is reported before the upgrade
            # reaches the node; a plain containerd node of the same inventory has no release to upgrade to
            target_release=settings["target_release"] if settings["target_release"] not in ("", facts.release) and not absent
            and facts.distribution in (distro.K3S, distro.RKE2) else None)
        if params["handler_labels"] is not None:
            params["node_labels"] = host_step.device_plugin_labels(settings, self._host)
        return params

    def _configure(self, result, settings, facts, plan, execute_module, write=True):
        """Configure containerd (write=False: only decide; configure_due then says that files are to be written)."""
        absent = settings["state"] == "absent"
        try:
            params = self._configure_params(settings, facts, plan)
        except K3sGpuError as exc:
            return host_step.failed(result, ended(str(exc)))
        validated = ArgumentSpecValidator(configure.SPEC).validate(params)
        if validated.error_messages:
            # the role's variables were checked by the role's spec (gpu_node_runtimes by the module's own): not the user's
            return host_step.failed(result, "%s: the host step built options that containerd_runtimes refuses (%s): a "
                                            "defect of k3s_gpu.nvidia, please report it. Nothing was changed." % (
                                                self._host, "; ".join(validated.error_messages)))
        # state absent: the CDI spec the role generated goes in the same node_files execution
        extra, extra_warnings = host_step.cdi_spec_changes(facts, settings) if absent else ([], [])
        result["warnings"].extend(extra_warnings)
        runtimes = configure.run({}, validated.validated_parameters, execute_module, self._task.diff, own_files=True,
                                 extra_changes=extra, write=write)
        if runtimes.get("write_due") and not runtimes.get("failed"):
            # nothing written: the configure phase decides again from this reading, writes and reports the files
            result.update(host_step.node_result(plan, facts, None), install_due=False, configure_due=True, changed=False,
                          node=host_state.HostState(facts, plan, host_step.cdi_marker(settings)).to_result())
            return result
        result["warnings"].extend(runtimes.pop("warnings", None) or [])
        for key in ("changed", "failed", "msg", "diff"):
            if key in runtimes:
                result[key] = runtimes[key]
        reboot = result.get("reboot_required", False)
        state = host_state.HostState(facts, plan, host_step.cdi_marker(settings), host_state.Changes.of_step(runtimes))
        result.update(host_step.node_result(plan, facts, runtimes), node=state.to_result())
        # for the cluster step's device plugin: this node's CDI readiness and its named plugin config
        result.update(cdi=host_step.cdi_readiness(facts, plan, settings), device_plugin_config=settings["device_plugin_config"])
        result.update(reboot_required=reboot, install_due=False, configure_due=False, cdi_due=False, dev_char_due=False,
                      cdi_refresh_due=False)
        if runtimes.get("failed"):
            changed = result.get("changed", False)
            host_step.failed(result, "%s: %s" % (self._host, host_step.role_message(runtimes)))
            result["changed"] = changed  # files written before a failed write stay written
        return result

    def _doctor(self, result, settings, task_vars, execute_module):
        """Read-only (the doctor playbook runs it in check mode): the node as the role reads it, what the role would
        change there, the services' states, and the first broken layer between the GPU and containerd."""
        host = self._host
        result["changed"] = False
        if not self._task.check_mode:
            return host_step.failed(result, "%s: phase doctor only reads: run it with check_mode: true (the "
                                            "k3s_gpu.nvidia.doctor playbook does)" % host)
        settings = self._release_settings(settings, task_vars)
        reading = _read_node(execute_module, settings, settings["distribution"], settings["release"] or None)
        if reading.get("failed"):
            result["doctor"] = doctor.unread(host, host_step.role_message(reading))
            return result
        reading.pop("warnings", None)
        facts = NodeFacts.from_reading(reading)
        self._doctor_generated_config(settings, facts, execute_module)
        node = {"mode": settings["mode"], "operator_namespace": settings["operator_namespace"],
                "toolkit_version": settings["toolkit_version"], "toolkit_install": settings["toolkit_install"],
                "enable_cdi": settings["enable_cdi"], "device_list_strategy": settings["device_plugin_device_list_strategy"],
                "cdi_spec_path": settings["cdi_spec_path"], "cdi_refresh": settings["cdi_refresh"],
                "unit": (facts.units or [None])[0], "handlers": [h for h in facts.handlers if h.startswith("nvidia")]}
        try:
            node["labels"] = host_step.device_plugin_labels(settings, host)
        except K3sGpuError:
            node["labels"] = []  # the plan refuses the same settings, and says so
        self._doctor_plan(node, settings, facts, execute_module)
        node["services"] = self._doctor_services(settings, facts, node["unit"], execute_module)
        node["existing_binaries"] = self._doctor_binaries(settings, facts, execute_module)
        result["doctor"] = doctor.check_node(host, facts, node)
        return result

    def _doctor_plan(self, node, settings, facts, execute_module):
        """What the role would do here: its refusal, the handlers it writes or relies on, the files it would change."""
        plan_settings = dict((k, settings[k]) for k in (
            "force", "root", "mode", "operator_toolkit", "operator_driver", "toolkit_install", "driver_install",
            "driver_reboot", "default_runtime", "remove_operator_leftovers", "state", "absent_remove_toolkit",
            "absent_remove_driver"))
        # the doctor installs nothing: what the role would write into containerd's config is planned for the node as it
        # is (a template that breaks with the toolkit installed is the configure step's refusal then, not the install's)
        plan_settings.update(local_connection=False, toolkit_install=False, driver_install=False)
        try:
            plan = host_step.plan_host(facts, plan_settings, self._host)
            if not plan.selected:
                return
            params = self._configure_params(settings, facts, plan)
        except K3sGpuError as exc:
            node["refusal"] = exc.parts(host_step.ROLE_NAMES)
            return
        validated = ArgumentSpecValidator(configure.SPEC).validate(params)
        checked = configure.run({}, validated.validated_parameters, execute_module, False, own_files=True)
        if checked.get("failed"):
            node["refusal"] = K3sGpuError.from_result(checked).parts(host_step.ROLE_NAMES)
            return
        node["handlers"] = host_state.handlers_of(checked)
        node["changes"] = [f for f in checked.get("files") or [] if f.get("action") in ("created", "updated", "removed")]

    @staticmethod
    def _doctor_generated_config(settings, facts, execute_module):
        """The text of the config.toml k3s/rke2 wrote at its last start (the reading has only its facts)."""
        generated = facts.files.get("generated_config") or {}
        if generated.get("state") != "file" or "content" in generated:
            return
        read = execute_module("ansible.builtin.slurp", {"src": settings["root"].rstrip("/") + generated["path"]})
        if not read.get("failed") and "content" in read:
            generated["content"] = base64.b64decode(read["content"]).decode("utf-8", "replace")

    def _doctor_services(self, settings, facts, unit, execute_module):
        """{unit: ActiveState, or not-found} of k3s/rke2, the fabric manager and persistenced, on a live root with
        systemd; {} in a sandbox tree (nothing to ask)."""
        if settings["root"] not in ("/", "") or not facts.reading.get("systemd"):
            return {}
        states = {}
        for name in [u for u in (unit, doctor.FABRIC_MANAGER_UNIT, doctor.PERSISTENCED_UNIT) if u]:
            found = execute_module("ansible.builtin.systemd_service", {"name": name})
            status = found.get("status") or {}
            states[name] = "not-found" if status.get("LoadState") == "not-found" else status.get("ActiveState", "unknown")
        return states

    def _doctor_binaries(self, settings, facts, execute_module):
        """The BinaryNames of what containerd loads that exist and are executable on the node (those detection found,
        and the others looked at one by one)."""
        found = set(r["binary"] for r in facts.runtimes + facts.release_runtimes)
        for binary, _path in node_reading.loaded_runtimes(facts).values():
            if binary and binary not in found and binary.startswith("/"):
                looked = execute_module("ansible.builtin.stat", {"path": settings["root"].rstrip("/") + binary})
                stat = looked.get("stat") or {}
                if stat.get("exists") and stat.get("executable") and not stat.get("isdir"):
                    found.add(binary)
        return sorted(found)

    def _upgrade_check(self, result, settings, fail, execute_module):
        """Read-only: render the node's template for gpu_node_target_release (check mode, nothing is written), as the
        node is and once the toolkit is installed; report it, and fail a node that breaks there or is refused now."""
        host, target = self._host, settings["target_release"]
        if not target:
            return host_step.failed(result, "Set gpu_node_target_release to the k3s or rke2 release the nodes are about to "
                                            "get (for example v1.35.3+k3s1 or v1.35.3+rke2r1). Nothing was checked.")
        reading = _read_node(execute_module, settings, settings["distribution"], settings["release"] or None)
        if reading.get("failed"):
            return _reading_failed(result, host, reading, "Nothing was checked.")
        result["warnings"].extend(reading.pop("warnings", None) or [])
        facts = NodeFacts.from_reading(reading)
        if facts.distribution not in (distro.K3S, distro.RKE2):
            result.update(skipped=True, msg="%s: %s has no k3s/rke2 template to check" % (host, facts.distribution))
            return result
        params = dict(root=settings["root"], distribution=facts.distribution, release=facts.release,
                      newer_release=settings["newer_release"], data_dir=settings["data_dir"] or None,
                      toolkit_dirs=settings["toolkit_dirs"], runtimes=settings["runtimes"] or None, target_release=target,
                      node_facts=facts.reading)
        checked = configure.run({}, ArgumentSpecValidator(configure.SPEC).validate(params).validated_parameters,
                                execute_module, False)
        result["warnings"].extend(checked.pop("warnings", None) or [])
        refused = host_step.role_message(checked) if checked.get("failed") else ""
        report = dict(node=host, release="%s -> %s" % (facts.release, target), refused_now=refused,
                      breaks_on_target=checked.get("upgrade_findings") or [],
                      warnings_now=[f for f in checked.get("template_findings") or [] if f.get("when") != "upgrade"])
        result.update(changed=False, report=report)
        problems = list(checked.get("upgrade_messages") or []) + ([refused] if refused else [])
        fine = ("the template renders and loads on the target release" if checked.get("template_outcome") is not None
                else "no containerd template on the node, nothing to render for the target release")
        display.display("%s: %s: %s" % (host, report["release"], "; ".join(problems) if problems else fine))
        if fail and problems:
            host_step.failed(result, ended("%s: %s" % (host, "; ".join(problems))))
        return result

    def _restart(self, result, settings, task_vars, execute_module):
        """The handler: restart the service once after a change to a file it reads at start, verify it, and roll back
        (and fail the host) when it is not healthy. Returns gpu_node_result with restarted and verified."""
        node = self._templar.template(task_vars.get("gpu_node_result") or {})
        result.update((k, v) for k, v in node.items() if k not in TASK_KEYS and not k.startswith("_ansible"))
        # what the host step changed, for the summary: this task's own `changed` is the restart only
        result["host_changed"] = bool(node.get("host_changed", node.get("changed")))
        try:
            state = host_state.HostState.from_result(node.get("node"))
        except K3sGpuError as exc:
            return host_step.failed(result, "%s: nothing to restart: %s" % (self._host, exc))
        facts, changes = state.facts, state.changes or host_state.Changes()
        units = facts.units
        reason = restart.why_not(bool(self._task.check_mode), settings["restart"], state.plan.live, units)
        if reason:
            display.display(restart.not_restarted(self._host, units[0] if units else facts.distribution, reason))
            result["changed"] = False
            return result
        unit = units[0]

        def systemd(state=None):
            args = {"name": unit}
            if state:
                args["state"] = state
            return execute_module("ansible.builtin.systemd_service", args)

        restarted = systemd("restarted")
        if restarted.get("failed"):
            return host_step.failed(result, "%s: restarting %s failed: %s" % (self._host, unit, restarted.get("msg")))
        result["changed"] = True
        timeout, settle = settings["restart_timeout_seconds"], settings["restart_settle_seconds"]
        first = restart.unit_state(systemd().get("status"))
        for _attempt in range(max(1, -(-int(timeout) // 2))):  # every 2 s, at least once: 1 s still waits
            if first[0] == "active":
                break
            time.sleep(2)
            first = restart.unit_state(systemd().get("status"))
        if first[0] == "active":
            time.sleep(settle)  # longer than the unit's restart delay: a crash loop shows as a restart
        second = restart.unit_state(systemd().get("status"))
        after = _read_node(execute_module, settings, facts.distribution, facts.release)
        found = restart.problems(unit, first, second, changes.handlers, after.get("loaded_config"), timeout, settle)
        result.update(restarted=True, verified=not found)
        if found:
            self._roll_back(result, changes, unit, found, execute_module)
        return result

    def _roll_back(self, result, changes, unit, found, execute_module):
        journal = execute_module("ansible.builtin.command", {"argv": [
            "journalctl", "--unit", unit, "--lines", str(restart.JOURNAL_LINES), "--no-pager", "--output", "cat"]})
        created, restored = restart.rollback(changes.files)
        undone = []
        for path in created:
            undone.append((path, execute_module("ansible.builtin.file", {"path": path, "state": "absent"})))
        for backup, path in restored:
            undone.append((path, execute_module("ansible.builtin.copy", {"src": backup, "dest": path, "remote_src": True,
                                                                         "mode": "preserve"})))
        rewrites = restart.rewritten(changes.files)
        if rewrites:
            # the text the run read, written back by the collection's own writer (the copy module alone takes no
            # `content`: that is its action plugin's work)
            undone.append((", ".join(path for _text, path in rewrites), execute_module("k3s_gpu.nvidia.node_files", {
                "files": [{"path": path, "state": "file", "content": text} for text, path in rewrites]})))
        execute_module("ansible.builtin.systemd_service", {"name": unit, "state": "restarted"})
        message = restart.failure(self._host, found, unit, journal.get("stdout_lines") or [])
        not_undone = ["%s (%s)" % (path, outcome.get("msg")) for path, outcome in undone if outcome.get("failed")]
        if not_undone:
            message += " Could NOT put back: %s; restore them by hand." % "; ".join(not_undone)
        host_step.failed(result, message)
        result["changed"] = True
