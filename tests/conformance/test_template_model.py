# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Python model of Go's text/template (plugins/plugin_utils/containerd/_gotemplate.py) against Go itself.

For every template of the corpus (tests/corpus) and a list of syntax cases, both render the same
concrete data (the release's field set, typical values filled in, the detected runtimes) with the
same base text: the verdict (parse error, execution error, fine) must be the same, and where both
render, the output must be byte-identical. Without Go the test FAILS with the install hint.
"""

from __future__ import annotations

import pytest

from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _distro as distro
from ansible_collections.k3s_gpu.nvidia.plugins.module_utils import _k3s_base as k3s_base
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _gotemplate as gotemplate
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils._node_facts import NodeFacts
from ansible_collections.k3s_gpu.nvidia.plugins.plugin_utils.containerd import _template_check as check
from ansible_collections.k3s_gpu.nvidia.tests.corpus import corpus
from ansible_collections.k3s_gpu.nvidia.tests.oracle import goracle

NVIDIA = [{"name": "nvidia", "binary": "/usr/bin/nvidia-container-runtime", "runtime_type": "io.containerd.runc.v2"},
          {"name": "nvidia-cdi", "binary": "/usr/bin/nvidia-container-runtime.cdi", "runtime_type": "io.containerd.runc.v2"}]

SYNTAX = [
    ("trim", 'a \n\t{{- .Program -}}\n b'),
    ("trim-number", "{{-3}}"),
    ("comment", "x{{/* c */}}y{{- /* d */ -}} z"),
    ("comment-spaced", "{{ /* c */ }}"),
    ("else-if", "{{ if .IsRunningInUserNS }}a{{ else if .SystemdCgroup }}b{{ else }}c{{ end }}"),
    ("with-else", "{{ with .NodeConfig.AgentConfig.Snapshotter }}s={{ . }}{{ else }}none{{ end }}"),
    ("range-map", "{{ range $k, $v := .ExtraRuntimes }}[{{ $k }}={{ $v.BinaryName }}]{{ end }}"),
    ("range-else", "{{ range .NodeConfig.AgentConfig.NodeIPs }}x{{ else }}empty{{ end }}"),
    ("range-break", "{{ range $k, $v := .ExtraRuntimes }}{{ if eq $k \"nvidia-cdi\" }}{{ break }}{{ end }}{{ $k }};{{ end }}"),
    ("variables", "{{ $p := .Program }}{{ $p }}{{ $p = \"x\" }}-{{ $p }}"),
    ("printf", '{{ printf "%s:%d:%q:%v" .Program 3 "q" true }}'),
    ("pipeline", '{{ .Program | printf "<%s>" }}'),
    ("paren-chain", '{{ (index .ExtraRuntimes "nvidia").BinaryName }}'),
    ("index-missing", '{{ index .ExtraRuntimes "nope" }}'),
    ("and-or-not", "{{ and .SystemdCgroup .Program }} {{ or .IsRunningInUserNS \"\" }} {{ not .DisableCgroup }}"),
    ("len", "{{ len .ExtraRuntimes }}"),
    ("define-template", '{{ define "x" }}<{{ .Program }}>{{ end }}{{ template "x" . }}{{ template "x" . }}'),
    ("block", '{{ block "b" . }}[{{ .Program }}]{{ end }}'),
    ("define-base", '{{ define "base" }}MINE{{ end }}{{ template "base" . }}'),
    ("unknown-template", '{{ template "bsae" . }}'),
    ("unknown-template-dead", '{{ if .IsRunningInUserNS }}{{ template "bsae" . }}{{ end }}ok'),
    ("unknown-function", "{{ toToml .Program }}"),
    ("unknown-function-dead", "{{ if false }}{{ toToml .Program }}{{ end }}"),
    ("missing-field", "{{ .NodeConfig.Gone }}"),
    ("missing-field-dead", "{{ if .IsRunningInUserNS }}{{ .NodeConfig.Gone }}{{ end }}ok"),
    ("missing-root-field", "{{ if .NoSuch }}x{{ end }}"),
    ("unclosed-if", "{{ if .Program }}x"),
    ("stray-end", "x{{ end }}"),
    ("stray-else", "x{{ else }}"),
    ("unclosed-action", '{{ template "base" .\n'),
    ("multiline-action", "{{ if\n .SystemdCgroup }}yes{{ end }}"),
    ("undefined-variable", "{{ $nope }}"),
    ("string-with-braces", '{{ "}}" }}|{{ `a}}b` }}'),
    ("bool-print", "{{ .SystemdCgroup }} {{ .IsRunningInUserNS }}"),
    ("toml-comment-action", '# {{ template "base" . }}\nx = 1'),
    ("eq-multi", '{{ if eq .Program "rke2" "k3s" }}k{{ end }}'),
    ("not-function", "{{ .Program 1 }}"),
    ("tojson-struct", "{{ toJson .ExtraRuntimes }}|{{ toJson .ExtraRuntimes.nvidia }}"),
    # (`.ExtraRuntimes.nope` is left out: the oracle's missingkey=error, which stands in for struct
    # fields, would fail it, where k3s reads the zero value)
    ("typed-map-missing", '{{ (index .ExtraRuntimes "nope").BinaryName }}|'),
    ("typed-map-entry-field", "{{ range .ExtraRuntimes }}{{ .SystemdCgroup }}{{ end }}"),
    ("deschemify", '{{ deschemify "unix:///run/k3s/containerd/containerd.sock" }}'),
    ("filepathjoin", '{{ filepathjoin .NodeConfig.Containerd.Template "certs.d" }}'),
    ("filepathjoin-old", '{{ filepathjoin "a" "b" }}'),
]


def concrete(type_, value):
    """(json for Go, value for the model): the model's typical data with every unknown filled in."""
    if isinstance(value, gotemplate.Unknown):
        if value.has_typical():
            return concrete(type_, value.typical)
        value = None
    kind = type_["kind"]
    if kind == "struct":
        known = value.values if isinstance(value, gotemplate.Struct) else {}
        out_json, out_model = {}, {}
        for name, field_type in type_["fields"].items():
            out_json[name], out_model[name] = concrete(field_type, known.get(name))
        return out_json, gotemplate.Struct(type_, out_model)
    if kind == "map":
        pairs = {k: concrete(type_["elem"], v) for k, v in value.items()} if isinstance(value, dict) else {}
        model = {k: p[1] for k, p in pairs.items()}
        if isinstance(value, gotemplate.TypedMap):
            model = gotemplate.TypedMap(type_["elem"], model)
        return {k: p[0] for k, p in pairs.items()}, model
    if kind == "slice":
        return [], []
    if value is None:
        value = gotemplate.zero_of(type_)
    return value, value


def facts_for(distribution):
    """The node facts the template data and the base read (paths, program, SystemdCgroup, detected runtimes)."""
    return NodeFacts(distribution=distribution, release="", root="/", profile={}, paths=distro.distribution_paths(distribution),
                     runtimes=[], release_runtimes=NVIDIA, driver={}, toolkit={}, cdi={}, gpu_operator={}, units=[], files={},
                     reading={"systemd_cgroup": True})


def model_verdict(text, profile, data, base_text):
    try:
        template = gotemplate.parse(text, check.k3s_funcs(profile), name="compiled_template")
    except gotemplate.TemplateError as exc:
        return "parse", exc.code, None
    template.trees.pop("base", None)

    def base(_execution, _dot, output):
        output.write(base_text, ("base", 1))
    runs, complete = gotemplate.explore(template, data, {"base": base}, check.FUNC_IMPLS, name="compiled_template")
    assert complete and len(runs) == 1, "concrete data must leave no decision open"
    if runs[0].error is not None:
        return "exec", runs[0].error.code, None
    return None, None, runs[0].output.text()


def _cases():
    cases = []
    for name, text in SYNTAX:
        release = "v1.33.5+k3s1" if name.endswith("-old") else "v1.33.10+k3s1"
        cases.append(("syntax-" + name, text, release, "k3s", 3))
    for case in corpus.load_cases():
        data = case["data"]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # an encoding case: refused before any template is parsed
        release = case["release"]
        distribution = "rke2" if "rke2" in release else "k3s"
        cases.append(("corpus-" + case["id"], text, release, distribution, case["schema"]))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def oracle_results():
    try:
        goracle.build()
    except goracle.OracleUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    batch, expected = [], {}
    for name, text, release, distribution, schema in CASES:
        profile = distro.profile(distribution, release)
        facts = facts_for(distribution)
        type_ = check.data_type(profile)
        data_json, data_model = concrete(type_, check.node_data(facts, profile, NVIDIA, None))
        base_text = k3s_base.render_base(profile, schema, check.base_params(facts, profile, NVIDIA, None))
        batch.append({"name": name, "main": text, "base": base_text, "data": data_json,
                      "funcs": list(check.k3s_funcs(profile))})
        expected[name] = model_verdict(text, profile, data_model, base_text)
    results = {r["name"]: r for r in goracle.render_batch(batch)}
    return results, expected


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_model_agrees_with_go(oracle_results, name):
    results, expected = oracle_results
    go = results[name]
    phase, code, output = expected[name]
    assert phase == go["phase"], "model says %s (%s), Go says %s: %s" % (phase, code, go["phase"], go["error"])
    if phase is None:
        assert output == go["output"]


def test_the_comparison_covers_every_verdict(oracle_results):
    results, _expected = oracle_results
    phases = [r["phase"] for r in results.values()]
    assert phases.count("parse") >= 5 and phases.count("exec") >= 4 and phases.count(None) >= 20, phases
