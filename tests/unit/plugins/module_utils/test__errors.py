# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one error type: cause and fix written once, each option named as its reader sets it."""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError, clause, masked, shown

ROLE = {"release": "gpu_node_release", "distribution": "gpu_node_distribution"}


def test_an_option_is_written_once_and_named_for_each_reader():
    error = K3sGpuError("neither k3s nor rke2 was found under /srv", "set {distribution} and {release}",
                        ("distribution", "release"))
    assert str(error) == "neither k3s nor rke2 was found under /srv; set distribution and release"
    assert error.text(ROLE) == "neither k3s nor rke2 was found under /srv; set gpu_node_distribution and gpu_node_release"


def test_only_the_options_the_error_names_are_rendered():
    # a template's own braces stay as they are
    error = K3sGpuError('line 1: {{ template "base" . }} is missing; add it', variable=None)
    assert error.text(ROLE) == 'line 1: {{ template "base" . }} is missing; add it'


def test_a_module_result_carries_the_parts_across_the_wire():
    error = K3sGpuError("root is not /", "set {release}", "release")
    failed = {"failed": True, "msg": str(error), "error": error.as_dict()}
    assert K3sGpuError.from_result(failed).text(ROLE) == "root is not /; set gpu_node_release"
    # a module of Ansible's: its message, as a clause
    assert str(K3sGpuError.from_result({"failed": True, "msg": "Permission denied."})) == "Permission denied"
    assert str(K3sGpuError.from_result({"failed": True}, "slurp")) == "slurp failed without a message"


@pytest.mark.parametrize("text, expected", [("done.", "done"), ("done", "done"), ("wait...", "wait..."), (None, "")])
def test_a_clause_has_no_final_stop(text, expected):
    assert clause(text) == expected


def test_within_keeps_the_fix_and_the_variables():
    error = K3sGpuError("release 'x' is not a k3s version", "set {release}", "release").within("gpu1")
    assert error.text(ROLE) == "gpu1: release 'x' is not a k3s version; set gpu_node_release"
    assert isinstance(error, K3sGpuError) and error.variables == ("release",)


# --- issue 41: no password of a URL and no pasted value in a message -------------------------------------------------

SECRET_URL = "http://alice:S3cr3t@proxy:3128"


@pytest.mark.parametrize("text, expected", [
    (SECRET_URL, "http://alice:********@proxy:3128"),
    ("https://ghp_T0k3n@github.com/o/r.git", "https://********@github.com/o/r.git"),  # a token alone is the secret
    ("http://alice:p@ss@proxy:3128/x", "http://alice:********@proxy:3128/x"),  # the last @ ends the userinfo
    ("a http://a:1@x and https://b:2@y/z", "a http://a:********@x and https://b:********@y/z"),
    ("http://proxy:3128", "http://proxy:3128"),
    ("alice@proxy:3128 has no scheme", "alice@proxy:3128 has no scheme"),
    ("", ""),
])
def test_masked_hides_the_password_of_every_url(text, expected):
    assert masked(text) == expected
    assert masked(masked(text)) == expected


@pytest.mark.parametrize("value, expected", [
    ("nvidia", "'nvidia'"),
    ("/opt/bin\n", "'/opt/bin\\n'"),  # a trailing newline shows
    ("a" * 1048576, "'%s…' (1048576 characters)" % ("a" * 60)),
    (["nvidia"], '["nvidia"]'),
    ({"b": 1, "a": None}, '{"a": null, "b": 1}'),
    (False, "false"),
    (None, "null"),
    (list(range(100)), "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1… (390 characters)"),
    (SECRET_URL, "'http://alice:********@proxy:3128'"),
    ({"https_proxy": SECRET_URL}, '{"https_proxy": "http://alice:********@proxy:3128"}'),
    ({1: "a", "b": 2}, '{"1": "a", "b": 2}'),  # keys of several types do not sort
    ("x" * 44 + SECRET_URL, "'%shttp://alice:***…' (74 characters)" % ("x" * 44)),  # masked, then cut
])
def test_shown_cuts_a_long_value_to_its_start_and_its_length(value, expected):
    assert shown(value) == expected


def test_an_error_never_shows_a_password_nor_a_whole_pasted_value():
    error = K3sGpuError("default runtime %s is not detected" % ("a" * 1048576), "check %s" % SECRET_URL, "default_runtime")
    for text in (str(error), error.text(ROLE), error.within("gpu1").text(), repr(error.as_dict()),
                 str(K3sGpuError.from_result({"failed": True, "msg": "get %s failed %s" % (SECRET_URL, "b" * 5000)}))):
        assert "S3cr3t" not in text and len(text) < 600, text[:200]
    assert "(1048576 characters)" in str(error) and "http://alice:********@proxy:3128" in str(error)


def test_a_quoted_value_of_many_words_is_cut_to_its_length():
    error = K3sGpuError("release %r is not a k3s version" % ("v1 " * 1000), "set {release}", "release")
    assert str(error) == "release '%s… (3000 characters)' is not a k3s version; set release" % ("v1 " * 20)


def test_a_message_of_many_spaced_words_is_cut_too():
    error = K3sGpuError("release %s is unknown" % ("a " * 500000))
    assert len(str(error)) < 20000 and str(error).endswith("characters)")
