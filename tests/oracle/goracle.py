# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Go's own text/template as the test oracle for the Python template model (lab-recipes §8).

tests/oracle/render.go renders a user's containerd template the way k3s does (the user text as the
main template "compiled_template", "base" added to the same set, k3s's Linux template functions
registered before parsing, missingkey=error). This module builds it once and feeds it batches.

available()          True when the machine's Go (/usr/local/go, else `go` on PATH) is there.
build(force=False)   compile render.go into <repo>/.cache/oracle/render (GOCACHE and GOPATH inside
                     .cache/oracle, no network: stdlib only, GOPROXY=off); rebuilt when render.go or
                     the Go version changes. Returns the binary's path.
render_batch(cases)  cases: [{"name", "main", "base" (str or None: no "base" template),
                     "data" (JSON-able), "funcs" (optional list of function names, default all)}]
                     -> [{"name", "ok", "phase" ("parse"|"exec"|None), "error", "output"}], one
                     Go process for the whole batch, results in the order of the cases.
render(main, base=None, data=None, ...)  one case; returns its result dict.

Without Go every entry point raises OracleUnavailable, whose message carries the install hint
(`bash scripts/install-go.sh`): tests must fail, never skip, when the oracle is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCE = HERE / "render.go"
CACHE = ROOT / ".cache" / "oracle"
BINARY = CACHE / "render"
STAMP = CACHE / "render.stamp"
INSTALL_HINT = "bash scripts/install-go.sh"
MACHINE_GO = "/usr/local/go/bin/go"
PHASES = ("parse", "exec")
RUN_TIMEOUT = 300


class OracleUnavailable(RuntimeError):
    """Go is not installed; the message says how to install it."""


class OracleError(RuntimeError):
    """The oracle could not be built or run, or answered something unexpected."""


def go_binary():
    """The machine's Go (/usr/local/go/bin/go), else `go` on PATH, else None."""
    if os.access(MACHINE_GO, os.X_OK):
        return MACHINE_GO
    return shutil.which("go")


def available():
    return go_binary() is not None


def _require_go():
    go = go_binary()
    if go is None:
        raise OracleUnavailable(
            "Go ('go') not found on PATH: the template oracle (tests/oracle/render.go) needs it. "
            "Install it: %s" % INSTALL_HINT
        )
    return go


def go_env():
    """The environment for `go`: caches inside .cache/oracle, GOPATH mode, no downloads, no cgo."""
    env = dict(os.environ)
    for name in ("GOROOT", "GOBIN", "GOOS", "GOARCH"):
        env.pop(name, None)  # Go finds its own GOROOT; build for this machine
    env.update(
        GOCACHE=str(CACHE / "gocache"),
        GOPATH=str(CACHE / "gopath"),
        GO111MODULE="off",      # a single stdlib-only file: no go.mod, nothing to resolve
        GOFLAGS="",
        GOPROXY="off",
        GOTOOLCHAIN="local",    # Go >= 1.21 must not try to fetch another toolchain
        GOENV="off",            # ignore a user's go env file
        CGO_ENABLED="0",        # no C compiler needed
    )
    return env


def _go_version(go):
    proc = subprocess.run([go, "version"], env=go_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OracleError("'%s version' failed (exit %d): %s" % (go, proc.returncode, proc.stderr.strip()))
    return proc.stdout.strip()


def _want_stamp(go):
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    return "render.go sha256 %s\n%s\n" % (digest, _go_version(go))


@contextlib.contextmanager
def _build_lock():
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".build.lock", "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # parallel test processes build once
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(path):
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def build(force=False):
    """Compile render.go unless the binary matches its source and the Go version; return its path."""
    go = _require_go()
    with _build_lock():
        want = _want_stamp(go)
        if not force and BINARY.is_file() and os.access(BINARY, os.X_OK) and _read(STAMP) == want:
            return str(BINARY)
        fd, tmp = tempfile.mkstemp(prefix=".render.", dir=str(CACHE))
        os.close(fd)
        try:
            proc = subprocess.run(
                [go, "build", "-trimpath", "-o", tmp, str(SOURCE)],
                cwd=str(HERE), env=go_env(), capture_output=True, text=True, check=False,
            )
            if proc.returncode != 0:
                raise OracleError("go build %s failed (exit %d):\n%s%s" % (SOURCE, proc.returncode, proc.stdout, proc.stderr))
            os.chmod(tmp, 0o755)
            os.replace(tmp, BINARY)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        STAMP.write_text(want, encoding="utf-8")
    return str(BINARY)


def _case(index, case):
    if not isinstance(case, dict):
        raise TypeError("case %d: want a dict, got %r" % (index, type(case).__name__))
    unknown = set(case) - {"name", "main", "base", "data", "funcs"}
    if unknown:
        raise ValueError("case %d: unknown keys %s" % (index, sorted(unknown)))
    name = case.get("name", "case-%d" % index)
    main = case.get("main")
    base = case.get("base")
    funcs = case.get("funcs")
    if not isinstance(name, str):
        raise TypeError("case %d: name must be a str" % index)
    if not isinstance(main, str):
        raise TypeError("case %r: main must be a str (the user template text)" % name)
    if base is not None and not isinstance(base, str):
        raise TypeError("case %r: base must be a str or None" % name)
    if funcs is not None and not (isinstance(funcs, (list, tuple)) and all(isinstance(f, str) for f in funcs)):
        raise TypeError("case %r: funcs must be None or a list of function names" % name)
    out = {"name": name, "main": main, "base": base, "data": case.get("data")}
    if funcs is not None:
        out["funcs"] = list(funcs)
    return out


def render_batch(cases):
    """Render every case in one Go process; results in the cases' order (see the module doc)."""
    payload = [_case(i, c) for i, c in enumerate(cases)]
    if not payload:
        return []
    text = json.dumps(payload, allow_nan=False)  # TypeError/ValueError here for data Go could not read
    binary = build()
    try:
        proc = subprocess.run([binary], input=text, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OracleError("%s did not answer within %ds (%d cases)" % (binary, RUN_TIMEOUT, len(payload))) from exc
    if proc.returncode != 0:
        raise OracleError("%s failed (exit %d): %s" % (binary, proc.returncode, proc.stderr.strip()))
    try:
        results = json.loads(proc.stdout)
    except ValueError as exc:
        raise OracleError("%s wrote no JSON: %s\n%s" % (binary, exc, proc.stdout[:2000])) from exc
    if not isinstance(results, list) or len(results) != len(payload):
        raise OracleError("%s answered %s for %d cases" % (binary, type(results).__name__, len(payload)))
    for case, result in zip(payload, results):
        if result.get("name") != case["name"]:
            raise OracleError("result %r answers case %r (out of order)" % (result.get("name"), case["name"]))
        if not result["ok"] and result.get("phase") not in PHASES:
            # phase "input": the case itself was bad (e.g. an unknown name in funcs); a harness bug
            raise OracleError("case %r: %s" % (case["name"], result.get("error")))
    return results


def render(main, base=None, data=None, name="render", funcs=None):
    """Render one template; returns {"name", "ok", "phase", "error", "output"}."""
    case = {"name": name, "main": main, "base": base, "data": data}
    if funcs is not None:
        case["funcs"] = funcs
    return render_batch([case])[0]
