# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one-pass reader answers only where tomllib gives the same answer: the same values (types
included) and the same tables as scan_tables; on anything tomllib refuses it gives up."""

from __future__ import annotations

import random
import tomllib

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml as toml
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _toml_read as toml_read
from ansible_collections.k3s_gpu.nvidia.tests.corpus import corpus
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils._errors import K3sGpuError


def typed(value):
    """Values with their types, so that True and 1 (equal in Python) differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def table_rows(tables):
    return [(t.path, t.array, t.start, t.content_end, t.end) for t in tables]


def agrees(text):
    """Check one document; returns whether the fast reader answered."""
    lines = text.split("\n")
    plain = toml_read.read_plain(lines)
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert plain is None, "read_plain accepted a document tomllib refuses: %r" % text
        return False
    if plain is None:
        return False
    data, tables = plain
    assert typed(data) == typed(expected), text
    assert table_rows(tables) == table_rows(toml.scan_tables(lines)), text
    return True


BASE_PARAMS = {"root": "/var/lib/rancher/k3s/agent/containerd", "state": "/run/k3s/containerd",
               "address": "/run/k3s/containerd/containerd.sock", "opt": "/var/lib/rancher/k3s/agent/containerd",
               "pause_image": "rancher/mirrored-pause:3.6", "snapshotter": "overlayfs",
               "cni_bin_dir": "/var/lib/rancher/k3s/data/current/bin",
               "cni_conf_dir": "/var/lib/rancher/k3s/agent/etc/cni/net.d",
               "registry_dir": "/var/lib/rancher/k3s/agent/etc/containerd/certs.d",
               "detected": [{"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime",
                             "runtime_type": distro.RUNC_V2}],
               "systemd_cgroup": True, "default_runtime": "nvidia",
               "containerd_dir": "/var/lib/rancher/k3s/agent/etc/containerd"}


@pytest.mark.parametrize("release,schema", [("v1.28.15+k3s1", 2), ("v1.31.6+k3s1", 2), ("v1.31.6+k3s1", 3),
                                            ("v1.33.10+rke2r1", 3), ("v1.37.0+k3s1", 3)])
def test_base_output_is_read_in_one_pass(release, schema):
    profile = distro.profile("rke2" if "rke2" in release else "k3s", release)
    text = k3s_base.render_base(profile, schema, BASE_PARAMS)
    assert agrees(text), "the base of %s (schema %d) should be plain TOML" % (release, schema)


@pytest.mark.parametrize("release,schema", [("v1.28.15+k3s1", 2), ("v1.31.6+k3s1", 2), ("v1.31.6+k3s1", 3),
                                            ("v1.33.10+rke2r1", 3), ("v1.37.0+k3s1", 3)])
@pytest.mark.parametrize("default_runtime", ["nvidia", None])
def test_one_base_rendering_reads_the_same_as_its_text(release, schema, default_runtime):
    profile = distro.profile("rke2" if "rke2" in release else "k3s", release)
    base = k3s_base.Rendering(profile, schema, dict(BASE_PARAMS, default_runtime=default_runtime))
    parsed = tomllib.loads(base.text)
    assert base.document() == parsed  # what containerd reads, built from the tables without a parser
    base.document()["plugins"].clear()
    assert base.document() == parsed  # each call a fresh dict: a caller merges into it
    for path, keys in base.tables:
        table = parsed
        for part in path:
            table = table[part]
        assert base.table(path) == dict((k, v) for k, v in table.items() if not isinstance(v, dict)) == dict(keys)
    assert base.table(("plugins", "no-such-plugin")) is None
    assert k3s_base.render_base(profile, schema, base.params) == base.text
    assert base.fits(profile, schema, dict(base.params)) and not base.fits(profile, 5 - schema, base.params)
    assert not base.fits(profile, schema, dict(base.params, default_runtime="runc"))


def test_corpus_templates_agree_and_most_are_plain():
    answered = checked = 0
    for case in corpus.load_cases():
        try:
            text = case["data"].decode("utf-8")
            masked, _originals = toml.mask_template(text, case["id"])
        except (UnicodeDecodeError, K3sGpuError):
            continue
        checked += 1
        answered += agrees(masked)
    # the fast path must be the common one, or it buys nothing
    assert checked > 80 and answered > checked // 2, (answered, checked)


# lines of the plain subset (several of them clash with each other: a table or a key twice) ...
PLAIN_LINES = [
    "", "   ", "# comment", "  # comment with 'quotes' and [brackets]", "\t# tab",
    "[a]", "[a.b]", "[ a . b ]", "[a.b.c]", "['a'.\"b\"]", "[\"a.b\"]", "[a] # c",
    "[plugins.\"io.containerd.grpc.v1.cri\".containerd]", "x = 1", "x = 1 # c", "x=1", "b = true", "b = false",
    "c = \"s\"", "c = 'lit'", "c = ''", "c = \"\"", "c = \"tab\there\"", "i = +0", "i = -0", "i = 1_000",
    "a = []", "a = [ ]", "a = [1,]", "a = [\"x\", 'y', true, 3]", "\"x\" = 2", "'x' = 3", "k-e_y = 1",
    "x = \"é ü\"", "a = [\"]\", ','] # ]",
]
# ... and lines outside it, valid TOML or not
OTHER_LINES = [
    "#\x7f del in comment", "[a]]", "[[a]]", "[[a.b]]", "[a]x", "[]", "[a.]", "[\"x\\u0041\"]", "[é]",
    "b = truex", "c = \"a\\\"b\"", "c = \"\"\"m\"\"\"", "c = '''m'''", "i = 01", "i = 1__0", "i = 0x1F",
    "i = 1.5", "i = 1e3", "i = inf", "d = 1979-05-27", "d = 07:32:00", "a = [,]", "a = [1 2]", "a = [[1], [2]]",
    "a = [1, # c", "t = {a = 1}", "x.y = 1", "x = ", "= 1", "x = 1 2", "é = 1", "\u00a0x = 1", "x = \"a\x01\"",
    "\ufeffx = 1", "x = 1\r", "y = \"multi",
]


def test_generated_documents_agree():
    rng = random.Random(1402)
    answered = refused = 0
    for _doc in range(6000):
        lines = [rng.choice(PLAIN_LINES if rng.random() < 0.9 else OTHER_LINES) for _line in range(rng.randint(1, 9))]
        text = "\n".join(lines)
        answered += agrees(text)
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            refused += 1
    # the generator reaches both sides: documents read in one pass, documents tomllib refuses
    assert answered > 1500 and refused > 1500, (answered, refused)


@pytest.mark.parametrize("text", [
    "[a]\nx = 1\n[a]\n",           # table twice
    "x = 1\nx = 2\n",              # key twice
    "[a.b]\n[a]\nb = 1\n",         # a key where a table is
    "[a]\nb = 1\n[a.b]\n",         # a table where a key is
    "x = 1\n[x.y]\n",              # a table under a value
    "\"x\" = 1\nx = 2\n",          # quoted and bare are the same key
])
def test_invalid_documents_fall_back(text):
    assert toml_read.read_plain(text.split("\n")) is None
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(text)


def test_loads_is_tomllib_where_it_falls_back():
    text = "a = 1.5\n[[b]]\nc = {d = 1}\n"
    assert toml_read.read_plain(text.split("\n")) is None
    assert toml.loads(text) == tomllib.loads(text)
