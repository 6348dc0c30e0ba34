# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The template corpus: cases.yml entries with their template bytes, validated.

load_cases() returns the entries of cases.yml, each with key `data` (the bytes of its template
file, read in binary: BOM, CRLF, NUL and invalid UTF-8 are kept exactly; such files are stored
base64-encoded as <id>.tmpl.b64). Any entry that does not
follow the schema described in README.md raises CorpusError.
"""

from __future__ import annotations

import base64
import os
import re

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_FILE = os.path.join(HERE, "cases.yml")

CODES = frozenset((
    "encoding_bom", "encoding_crlf", "encoding_nul", "encoding_utf8", "empty", "parse_error",
    "unknown_template", "unknown_function", "missing_field", "removed_field", "duplicate_table",
    "duplicate_key", "imports_clash", "mirrors_config_path", "wrong_schema_path", "no_base",
    "after_install_duplicate", "toml_invalid", "action_in_comment",
))
OUTCOMES = ("refuse", "warn", "edit")
TEMPLATE_NAMES = {2: "config.toml.tmpl", 3: "config-v3.toml.tmpl"}
NVIDIA_RUNTIMES = frozenset(("nvidia", "nvidia-cdi", "nvidia-experimental"))
RELEASE_RE = re.compile(r"^v1\.\d+\.\d+\+(k3s|rke2r)\d+$")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Codes that only an upgrade check can give (the field exists on the node's release).
UPGRADE_ONLY = frozenset(("removed_field",))
ENCODING = frozenset(c for c in CODES if c.startswith("encoding_"))

KEYS = ("id", "file", "schema", "template_name", "release", "detected", "after_install",
        "default_runtime", "target_release", "expect", "provenance", "why")
EXPECT_KEYS = ("outcome", "codes", "upgrade_codes")


class CorpusError(ValueError):
    pass


def _fail(case_id, msg):
    raise CorpusError("tests/corpus/cases.yml, case %s: %s" % (case_id, msg))


def _check_names(cid, value, what, kind, known, unknown_message):
    """value: a list of strings (kind names them), all in known; unknown_message takes what and the others."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        _fail(cid, "%s must be a list of %s" % (what, kind))
    unknown = sorted(set(value) - known)
    if unknown:
        _fail(cid, unknown_message % (what, ", ".join(unknown)))


def _check_codes(cid, codes, what):
    _check_names(cid, codes, what, "finding codes", CODES, "unknown finding code(s) in %s: %s")
    if len(set(codes)) != len(codes):
        _fail(cid, "%s lists a code twice" % what)


def _check_runtimes(cid, value, what):
    _check_names(cid, value, what, "runtime names", NVIDIA_RUNTIMES, "%s names runtimes k3s does not detect as NVIDIA runtimes: %s")


def validate(entry, seen_ids):
    if not isinstance(entry, dict):
        raise CorpusError("tests/corpus/cases.yml: every entry must be a mapping")
    cid = entry.get("id")
    if not isinstance(cid, str) or not ID_RE.match(cid):
        raise CorpusError("tests/corpus/cases.yml: bad or missing id %r" % (cid,))
    if cid in seen_ids:
        _fail(cid, "duplicate id")
    missing = [k for k in KEYS if k not in entry]
    extra = [k for k in entry if k not in KEYS]
    if missing or extra:
        _fail(cid, "keys missing: %s; keys unknown: %s" % (missing or "none", extra or "none"))
    if entry["file"] not in _file_names(cid):
        _fail(cid, "file must be templates/%s.tmpl (or .tmpl.b64 for bytes that are not clean text)" % cid)
    path = os.path.join(HERE, entry["file"])
    if not os.path.isfile(path):
        _fail(cid, "template file %s does not exist" % entry["file"])
    schema = entry["schema"]
    if schema not in TEMPLATE_NAMES:
        _fail(cid, "schema must be 2 or 3")
    if entry["template_name"] != TEMPLATE_NAMES[schema]:
        _fail(cid, "template_name %r does not match schema %s" % (entry["template_name"], schema))
    for key in ("release", "target_release"):
        value = entry[key]
        if value is None and key == "target_release":
            continue
        if not isinstance(value, str) or not RELEASE_RE.match(value):
            _fail(cid, "%s %r is not a k3s/rke2 release such as v1.33.10+k3s1" % (key, value))
    if entry["target_release"] is not None:
        if entry["target_release"].split("+")[1].rstrip("0123456789") != entry["release"].split("+")[1].rstrip("0123456789"):
            _fail(cid, "target_release must be of the same distribution as release")
    _check_runtimes(cid, entry["detected"], "detected")
    _check_runtimes(cid, entry["after_install"], "after_install")
    if entry["default_runtime"] is not None and not isinstance(entry["default_runtime"], str):
        _fail(cid, "default_runtime must be null or a runtime name")
    expect = entry["expect"]
    if not isinstance(expect, dict) or sorted(expect) != sorted(EXPECT_KEYS):
        _fail(cid, "expect must have exactly the keys %s" % ", ".join(EXPECT_KEYS))
    if expect["outcome"] not in OUTCOMES:
        _fail(cid, "outcome %r is not one of %s" % (expect["outcome"], ", ".join(OUTCOMES)))
    _check_codes(cid, expect["codes"], "codes")
    _check_codes(cid, expect["upgrade_codes"], "upgrade_codes")
    if set(expect["codes"]) & UPGRADE_ONLY:
        _fail(cid, "removed_field belongs in upgrade_codes")
    if expect["upgrade_codes"] and entry["target_release"] is None:
        _fail(cid, "upgrade_codes need a target_release")
    if expect["outcome"] == "edit" and (expect["codes"] or expect["upgrade_codes"]):
        _fail(cid, "an edit outcome has no findings")
    if expect["outcome"] != "edit" and not (expect["codes"] or expect["upgrade_codes"]):
        _fail(cid, "a %s outcome needs at least one code" % expect["outcome"])
    if set(expect["codes"]) & ENCODING and set(expect["codes"]) - ENCODING:
        _fail(cid, "encoding codes are reported alone")
    if "empty" in expect["codes"] and expect["codes"] != ["empty"]:
        _fail(cid, "empty is reported alone")
    for key in ("provenance", "why"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            _fail(cid, "%s must be a non-empty line" % key)
    data = _read_template(path)
    case = dict(entry)
    case["expect"] = dict(expect)
    case["data"] = data
    return case


def _file_names(cid):
    return ("templates/%s.tmpl" % cid, "templates/%s.tmpl.b64" % cid)


def _read_template(path):
    """The template's bytes; a .b64 file holds them base64-encoded (a BOM, CR, NUL or invalid UTF-8,
    which the repository's own text checks would reject as a file)."""
    with open(path, "rb") as fh:
        data = fh.read()
    return base64.b64decode(data) if path.endswith(".b64") else data


def load_cases(path=CASES_FILE):
    """Every case of cases.yml, validated, with `data` = the template's bytes."""
    with open(path, "rb") as fh:
        entries = yaml.safe_load(fh)
    if not isinstance(entries, list) or not entries:
        raise CorpusError("tests/corpus/cases.yml must be a non-empty list")
    cases, seen = [], set()
    for entry in entries:
        case = validate(entry, seen)
        seen.add(case["id"])
        cases.append(case)
    listed = set(c["file"] for c in cases)
    on_disk = set("templates/" + f for f in os.listdir(os.path.join(os.path.dirname(path), "templates")))
    stray = sorted(on_disk - listed)
    if stray:
        raise CorpusError("tests/corpus/templates holds files no case names: %s" % ", ".join(stray))
    return cases


if __name__ == "__main__":
    import collections
    cases = load_cases()
    print("%d cases" % len(cases))
    print(dict(collections.Counter(c["expect"]["outcome"] for c in cases)))
    codes = collections.Counter(x for c in cases for x in c["expect"]["codes"] + c["expect"]["upgrade_codes"])
    for code in sorted(CODES):
        print("  %-24s %d" % (code, codes.get(code, 0)))
