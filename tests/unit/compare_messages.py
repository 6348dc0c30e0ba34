# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compare two recordings of the unit suite's messages (K3S_GPU_MESSAGES=<file> pytest tests/unit): every message one
head renders that the other does not, after what differs from run to run (temporary paths, ports, times) is masked.

Run: python tests/unit/compare_messages.py BEFORE.jsonl AFTER.jsonl [--rendered]
(--rendered: only what a user reads, the failed actions' and modules' messages, not every error the code raises)
"""

from __future__ import annotations

import collections
import json
import re
import sys

_VARYING = [
    (re.compile(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/\s'\"]+"), "/tmp/<pytest>"),
    (re.compile(r"/tmp/[A-Za-z0-9_.-]*(k3s-gpu|tmp)[A-Za-z0-9_.-]*"), "/tmp/<tmp>"),
    (re.compile(r"(127\.0\.0\.1|localhost):\d+"), r"\1:<port>"),
    (re.compile(r"\.\d+\.\d{4}-\d\d-\d\d@\d\d:\d\d:\d\d(\.\d+)?~"), ".<pid>.<time>~"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "<time> UTC"),
    (re.compile(r"Valid booleans include: .*"), "Valid booleans include: <Ansible's set, in hash order>"),
]


def load(path, kinds=None):
    out = collections.Counter()
    with open(path) as handle:
        for line in handle:
            entry = json.loads(line)
            if kinds and entry["kind"] not in kinds:
                continue
            text = entry["text"]
            for pattern, replacement in _VARYING:
                text = pattern.sub(replacement, text)
            out[(entry["test"], entry["kind"], text)] += 1
    return out


def main(before_path, after_path, *options):
    kinds = ("action", "module") if "--rendered" in options else None
    before, after = load(before_path, kinds), load(after_path, kinds)
    gone, new = before - after, after - before
    for (test, kind, text), count in sorted(gone.items()):
        print("- %s [%s] x%d: %s" % (test, kind, count, text))
    for (test, kind, text), count in sorted(new.items()):
        print("+ %s [%s] x%d: %s" % (test, kind, count, text))
    print("%d messages before, %d after; %d only before, %d only after" % (
        sum(before.values()), sum(after.values()), sum(gone.values()), sum(new.values())))
    return 1 if gone or new else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
