# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The containerd engine's decide and render steps for the unit tests: compute() gives (plan, changes), the plan as
one flat mapping of what was decided and said (the EditPlan's fields, then the Rendered's, under the names the task's
result uses), the changes as the engine's FileChange values."""

from __future__ import annotations

import dataclasses

# _decide and _render, not _configure: ansible-test runs the module_utils tests without Ansible's controller modules
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _decide as decide
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _render as render


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


class PlanView(dict):
    """The flat mapping, with the Rendered it was made from (result_fields reads it)."""

    rendered = None


def plan_view(rendered):
    """What the engine decided and said, as a dict the assertions read."""
    plan = rendered.plan
    view = PlanView((f.name, _plain(getattr(plan, f.name))) for f in dataclasses.fields(plan)
                    if f.name not in ("base", "verdict"))
    verdict = rendered.verdict
    view.update(
        notes=list(rendered.notes), warnings=list(rendered.warnings), template_outcome=verdict.outcome,
        template_findings=list(verdict.findings), upgrade_findings=list(verdict.upgrade_findings),
        upgrade_messages=list(verdict.upgrade_messages), removed_for_base=list(rendered.removed_for_base),
        removed_stale=list(rendered.removed_stale), inherited_from=rendered.inherited_from,
        node_labels=_plain(rendered.node_labels), cgroup_driver_mismatch=rendered.cgroup_driver_mismatch,
        restored=list(rendered.restored), changed_since_written=list(rendered.changed_since_written))
    view.rendered = rendered
    return view


def result_fields(facts, view):
    """The task's result fields (before the write) for a plan view."""
    return render.outcome(facts, view.rendered)


def compute(facts, params, own_files=False, check_cache=None):
    """(plan view, [FileChange]) for params on the node the facts (a NodeFacts) read."""
    plan = decide.decide(facts, params, check_cache=check_cache)
    rendered = render.render(facts, plan, params, own_files=own_files, check_cache=check_cache)
    return plan_view(rendered), list(rendered.changes)
