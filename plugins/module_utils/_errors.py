# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The collection's one error type: what is wrong, what to do, and the variable that causes it.

PRIVATE to the collection. Node side (the modules raise it too); the controller's actions render it."""

from __future__ import annotations

import json
import re

# how much of a user's value a message shows: enough to know it again, never a file pasted into a variable
SHOWN_CHARACTERS = 60
# a run this long without a space, or a quoted text this long, is a value pasted in whole (no path or name is)
_PASTED = re.compile(r"[^\s'\"]{400,}|(?<=')[^'\n]{400,}(?=')")
# a message longer than this is cut at its end: a line a user reads, not a dump
_MESSAGE_CHARACTERS = 8000
# the userinfo of a URL (user:password@, or a token@); it ends at the last @ before the path, as urllib splits it
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
MASK = "********"


class K3sGpuError(ValueError):
    """A refusal the user acts on.

    cause: what is wrong; fix: what to do ("" when the cause says it); variable: the module option that causes it, or
    a tuple of them. Cause and fix are written once, without a final full stop. Where they name an option they write
    it as {option}: `text()` renders it as the option's name (a module's user sets `release`), `text(names)` as the
    name the caller's user sets (the role's user sets `gpu_node_release`)."""

    def __init__(self, cause, fix="", variable=None):
        # one place that keeps the text a clause: callers add their own ending ("Nothing was changed."); and the one
        # place that keeps a URL's password and a pasted value out of every message (a result that AWX keeps)
        self.cause = guarded(clause(cause))
        self.fix = guarded(clause(fix))
        self.variable = variable
        super(K3sGpuError, self).__init__(self.text())

    @property
    def variables(self):
        if self.variable is None:
            return ()
        return (self.variable,) if isinstance(self.variable, str) else tuple(self.variable)

    def text(self, names=None):
        """The message, each {option} this error names written as names[option] (else the option itself)."""
        parts = self.parts(names)
        return "%s; %s" % (parts["cause"], parts["fix"]) if parts["fix"] else parts["cause"]

    def parts(self, names=None):
        """{"cause", "fix"} as text() writes them, for a caller that shows the two apart (the doctor)."""
        rendered = {"cause": self.cause, "fix": self.fix}
        for option in self.variables:
            for part, value in rendered.items():
                rendered[part] = value.replace("{%s}" % option, (names or {}).get(option, option))
        return rendered

    def within(self, where):
        """The same error, its cause prefixed with where it happened (a host, a cluster, a file)."""
        return type(self)("%s: %s" % (where, self.cause), self.fix, self.variable)

    def as_dict(self):
        """For a module's failed result: the parts, so that the controller renders them in its user's names."""
        return {"cause": self.cause, "fix": self.fix, "variables": list(self.variables)}

    @classmethod
    def from_result(cls, result, what="the module"):
        """The error a module's failed result carries (its `error`), else its message as the cause."""
        parts = result.get("error") if isinstance(result, dict) else None
        if isinstance(parts, dict) and "cause" in parts:
            variables = parts.get("variables") or ()
            return cls(parts["cause"], parts.get("fix") or "", tuple(variables) if variables else None)
        message = result.get("msg") if isinstance(result, dict) else None
        return cls(clause(message) or "%s failed without a message" % what)


def several(refusals, ending):
    """One K3sGpuError for several refusals of one thing, each (label, cause, fix): the causes, then the fixes (each after
    its label where there is more than one), then the ending ("nothing was written")."""
    if len(refusals) == 1:
        fixes = [refusals[0][2]]
    else:
        fixes = ["%s: %s" % (label, fix) for label, _cause, fix in refusals]
    return K3sGpuError("; ".join(cause for _label, cause, _fix in refusals), fix="; ".join(fixes + [ending]))


def clause(text):
    """A message from outside the collection (a module of Ansible's, a command) as part of a sentence: no final stop."""
    text = str(text or "").strip()
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


def masked(text):
    """text with the password (or the token) of every URL in it replaced by MASK: http://alice:********@proxy:3128."""
    return _USERINFO.sub(_masked_userinfo, text)


def _masked_userinfo(match):
    user, colon, _secret = match.group("userinfo").partition(":")
    return "%s%s@" % (match.group("scheme"), user + colon + MASK if colon else MASK)


def cut(text, limit=SHOWN_CHARACTERS):
    """text, or its first `limit` characters and its length when it is longer."""
    return text if len(text) <= limit else "%s… (%d characters)" % (text[:limit], len(text))


def shown(value, limit=SHOWN_CHARACTERS):
    """A user's value as a message shows it: a text quoted (a newline shows as \\n), anything else as JSON; the password
    of a URL masked; cut to its start and its length when longer than `limit` ('aaaa…' (1048576 characters))."""
    if not isinstance(value, str):
        return cut(masked(_json(value)), limit)
    text = masked(str(value))  # before it is cut: a cut can end inside a password, before the @ that shows it is one
    if len(text) <= limit:
        return repr(text)
    head = repr(text[:limit])
    return "%s…%s (%d characters)" % (head[:-1], head[-1], len(value))


def _json(value):
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):  # keys of several types do not sort; an integer of 5000 digits is no JSON
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            return "(a value that cannot be shown)"


def guarded(text):
    """A message as the collection shows it: URL passwords masked, a value pasted in whole cut to its start and length."""
    return cut(_PASTED.sub(lambda pasted: cut(pasted.group(0)), masked(text)), _MESSAGE_CHARACTERS)


# the ending that says a refusal left the node as it was, however a raise site or a module phrased it
NOTHING_CHANGED = "Nothing was changed."
_ENDING = re.compile(r"(?i)\bnothing was (changed|written)\b[^;]*$")


def has_ending(text):
    """Whether a message already ends by saying that nothing was changed or written (in its last clause)."""
    return bool(_ENDING.search(str(text or "").strip()))


def ended(text, ending=NOTHING_CHANGED):
    """A refusal's message with its ending, once: `ending` is added only where the message does not already end with
    one (a raise site's fix may say "nothing was written"; the action says "Nothing was changed." for the rest)."""
    text = clause(text)
    return "%s." % text if has_ending(text) else "%s. %s" % (text, ending)
