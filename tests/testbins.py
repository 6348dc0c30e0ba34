# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The test suite's own binaries, built at test time from the Go module proxy (never committed).

Each entry of BUILDS is one module at one version (or one program of ours under tests/ on one module).
It is built with the machine's Go into a cache OUTSIDE the clone, keyed by name and version:

    $K3S_GPU_TEST_BINARIES, else ${XDG_CACHE_HOME:-~/.cache}/k3s-gpu-nvidia/test-binaries
      <name>/<version>/bin/<binary>...      the programs
      <name>/<version>/build.json           module, version, Go version, flags, seconds, sha256 per binary
      <name>/<version>.failed.json          the last failed build: command, exit status, last error line
      versions.json                         every build.json, one place (what was built, from what)

Go's own build and module caches (GOCACHE, GOMODCACHE) stay where the machine keeps them, so a CI run
after a session on the same machine builds in seconds.

    python3 tests/testbins.py build [KEY...]    build what is missing (default: the conformance stage's
                                                keys; --stage NAME: that stage's); one line per build with
                                                its time; exit 1 naming module, version, error
    python3 tests/testbins.py list              keys, modules, versions and whether each is built
    python3 tests/testbins.py path KEY BINARY   the binary's path (builds it first when missing)

Tests call require(KEY, BINARY): the path of a built binary whose sha256 still matches its record; a
binary that cannot be built FAILS the test with the module, the version and the builder's last error
line (pytest.fail), it never skips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GO_CANDIDATES = ("/usr/local/go/bin/go",)  # the machine's Go; `go` on PATH otherwise
GO_MIN = (1, 26)
BUILD_TIMEOUT = 3600


@dataclasses.dataclass(frozen=True)
class Build:
    """One module at one version and the commands built from it."""

    key: str              # what tests ask for
    name: str             # cache directory name
    module: str           # Go module path
    version: str          # module version (vX.Y.Z), as the proxy serves it
    packages: tuple       # package paths inside the module (each a `main`), or "." for a local program
    binaries: tuple       # file names they produce, in the same order
    ldflags: str = ""     # -X version stamps, as the upstream Makefile sets them
    cgo: bool = False     # CGO_ENABLED; static (0) where the upstream release is
    source: str = ""      # a program of ours: its directory under the repository (a Go module of its own)
    stage: str = "conformance"  # the scripts/test.sh stage that builds it first (`build` with no key)
    purpose: str = ""

    @property
    def cache_version(self):
        """The cache key's version: the module version, plus the source hash for a program of ours."""
        if not self.source:
            return self.version
        return "%s-src.%s" % (self.version, source_digest(ROOT / self.source)[:12])


def _containerd(key, version, purpose):
    pkg = "github.com/containerd/containerd/v2"
    return Build(
        key=key, name="containerd", module=pkg, version=version,
        packages=("cmd/containerd", "cmd/containerd-shim-runc-v2", "cmd/ctr"),
        binaries=("containerd", "containerd-shim-runc-v2", "ctr"),
        # containerd's Makefile stamps version.Version/Revision/Package; the revision here says where
        # the source came from (the proxy serves no commit id)
        ldflags="-s -w -X %s/version.Version=%s -X %s/version.Revision=goproxy -X %s/version.Package=%s"
        % (pkg, version, pkg, pkg, pkg),
        purpose=purpose,
    )


def _dra_test_driver(minor, version):
    """Kubernetes' own DRA test driver (its e2e tests' kubelet plugin), from the lab's Kubernetes module and version:
    built in the same go.mod as _kubernetes(minor) but as a key of its own, so the lab's builds and caches stay as
    they are. `go build -o DIR/` names it after the package's last element: test-driver."""
    return Build(
        key="dra-test-driver-%s" % minor, name="dra-test-driver", module="k8s.io/kubernetes", version=version,
        packages=("k8s.io/kubernetes/test/e2e/dra/test-driver",), binaries=("test-driver",),
        source="tests/kubernetes/%s" % minor, ldflags="-s -w", stage="kubernetes",
        purpose="Kubernetes' DRA test driver (test/e2e/dra/test-driver, Kubernetes %s): a reference kubelet plugin"
        % version,
    )


def _kubernetes(minor, version):
    """kube-apiserver, controller-manager, scheduler, kubelet and kubectl of one release."""
    stamp = "k8s.io/component-base/version"
    major_minor = version[1:].split(".")
    ldflags = " ".join("-X %s.%s=%s" % (package, name, value)
                       for package in (stamp, "k8s.io/client-go/pkg/version")
                       for name, value in (("gitVersion", version), ("gitMajor", major_minor[0]),
                                           ("gitMinor", major_minor[1]), ("gitTreeState", "clean"),
                                           ("gitCommit", "goproxy")))
    commands = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
    return Build(
        key="kubernetes-%s" % minor, name="kubernetes", module="k8s.io/kubernetes", version=version,
        packages=tuple("k8s.io/kubernetes/cmd/%s" % command for command in commands), binaries=commands,
        source="tests/kubernetes/%s" % minor, ldflags="-s -w " + ldflags, stage="kubernetes",
        purpose="the cluster lab's control plane, kubelet and kubectl (Kubernetes %s)" % version,
    )


TOOLKIT_MODULE = "github.com/NVIDIA/nvidia-container-toolkit"
BUILDS = {
    build.key: build
    for build in (
        # the 2.2 line: what k3s/rke2 1.33.10+, 1.34, 1.35 and 1.36.0-1.36.1 embed (config version 3)
        _containerd("containerd-2.2", "v2.2.7", "containerd 2.2: config dump, private daemon + CRI"),
        # the 2.3 line: k3s/rke2 1.36.2+ and 1.37 (config version 4)
        _containerd("containerd-2.3", "v2.3.4", "containerd 2.3: config version 4, drop-in rules"),
        Build(
            key="nvidia-container-toolkit", name="nvidia-container-toolkit", module=TOOLKIT_MODULE,
            version="v1.20.0",
            packages=("cmd/nvidia-ctk", "cmd/nvidia-container-runtime", "cmd/nvidia-container-runtime.cdi",
                      "cmd/nvidia-container-runtime.legacy", "cmd/nvidia-cdi-hook",
                      "cmd/nvidia-container-runtime-hook"),
            binaries=("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime.cdi",
                      "nvidia-container-runtime.legacy", "nvidia-cdi-hook", "nvidia-container-runtime-hook"),
            # the toolkit's Makefile: -X <module>/internal/info.version=<version without v>
            ldflags="-s -w -X %s/internal/info.version=1.20.0 -X %s/internal/info.gitCommit=goproxy"
            % (TOOLKIT_MODULE, TOOLKIT_MODULE),
            cgo=True,  # internal/cuda and go-nvml are cgo (dlopen of the driver's libraries at run time)
            purpose="nvidia-ctk (the peer) and the runtime wrappers as real handlers",
        ),
        Build(
            key="helm-render", name="helm-render", module="helm.sh/helm/v4", version="v4.3.2",
            packages=(".",), binaries=("helm-render",), source="tests/helm_render",
            ldflags="-s -w",
            purpose="our renderer on Helm's engine: NVIDIA's charts as `helm template` renders them",
        ),
        # a line at or below 1.34 and one at or above 1.36 (k3s/rke2 ship both; 1.36.2+ embeds containerd 2.3)
        _kubernetes("v1.34", "v1.34.4"),
        _kubernetes("v1.36", "v1.36.3"),
        Build(
            key="device-plugin-testdouble", name="device-plugin-testdouble", module="k8s.io/kubelet",
            version="v0.36.3", packages=(".",), binaries=("device-plugin-testdouble",),
            source="tests/device_plugin_testdouble", ldflags="-s -w", stage="kubernetes",
            purpose="the cluster lab's TEST DOUBLE of NVIDIA's device plugin (kubelet's v1beta1 API)",
        ),
        Build(
            key="dra-plugin-testdouble", name="dra-plugin-testdouble", module="k8s.io/dynamic-resource-allocation",
            version="v0.36.3", packages=(".",), binaries=("dra-plugin-testdouble",),
            source="tests/dra_plugin_testdouble", ldflags="-s -w", stage="kubernetes",
            purpose="the cluster lab's TEST DOUBLE of NVIDIA's DRA driver (gpu.nvidia.com, DRA gRPC v1 and v1beta1)",
        ),
        # the same Kubernetes lines' own DRA test driver, next to the test double
        _dra_test_driver("v1.34", "v1.34.4"),
        _dra_test_driver("v1.36", "v1.36.3"),
        Build(
            key="kine", name="kine", module="github.com/k3s-io/kine", version="v0.17.5",
            packages=("",), binaries=("kine",),
            ldflags="-s -w -X github.com/k3s-io/kine/pkg/version.Version=v0.17.5",
            cgo=True, stage="kubernetes",  # SQLite through mattn/go-sqlite3, as k3s runs it
            purpose="the cluster lab's datastore: kine on SQLite, what k3s runs",
        ),
    )
}

# the upstream containerd lines by the version the tests name them with -> their key
UPSTREAM_CONTAINERD = {
    BUILDS[key].version[1:]: key for key in ("containerd-2.2", "containerd-2.3")
}


class BuildError(RuntimeError):
    """A build failed; the message names the module, the version and the builder's last error line."""


# ------------------------------------------------------------------ places
def cache_root():
    explicit = os.environ.get("K3S_GPU_TEST_BINARIES")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "k3s-gpu-nvidia" / "test-binaries"


def build_dir(build):
    return cache_root() / build.name / build.cache_version


def failure_file(build):
    return cache_root() / build.name / ("%s.failed.json" % build.cache_version)


def source_digest(directory):
    """sha256 over a program's files (names and bytes), so an edit is a new cache key."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------ Go
def go_binary():
    for candidate in GO_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("go")
    if found:
        return found
    raise BuildError("Go not found (%s or `go` on PATH): run scripts/install-go.sh" % ", ".join(GO_CANDIDATES))


def go_version(go=None):
    """'go1.26.8' of the Go that builds."""
    go = go or go_binary()
    proc = subprocess.run([go, "env", "GOVERSION"], env=go_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError("%s env GOVERSION failed: %s" % (go, last_line(proc.stderr)))
    return proc.stdout.strip()


def go_env(cgo=False):
    env = dict(os.environ)
    for name in ("GOOS", "GOARCH", "GOBIN", "GOPATH", "GO111MODULE"):
        env.pop(name, None)
    env.update(
        CGO_ENABLED="1" if cgo else "0",
        GOFLAGS="-buildvcs=false -trimpath",
        # the machine's Go builds: a module asking for a newer one is an error, not a download
        GOTOOLCHAIN=os.environ.get("GOTOOLCHAIN", "local"),
    )
    return env


def last_line(text):
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


# ------------------------------------------------------------------ records
def read_record(build):
    try:
        with open(build_dir(build) / "build.json", encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def is_built(build, go_ver=None):
    """The record exists, was made by this Go, and every binary is there with its recorded sha256."""
    record = read_record(build)
    if not record or record.get("go") != (go_ver or go_version()):
        return False
    for name in build.binaries:
        path = build_dir(build) / "bin" / name
        if not path.is_file() or sha256_of(path) != record.get("sha256", {}).get(name):
            return False
    return True


def _write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % path.name, dir=str(path.parent))
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def _update_versions():
    """versions.json: every build record of the cache, keyed by name/version."""
    root = cache_root()
    records = {}
    for record_path in sorted(root.glob("*/*/build.json")):
        with contextlib.suppress(OSError, ValueError):
            with open(record_path, encoding="utf-8") as handle:
                records["%s/%s" % (record_path.parent.parent.name, record_path.parent.name)] = json.load(handle)
    _write_json(root / "versions.json", records)


@contextlib.contextmanager
def _lock():
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # one build at a time (2 cores), parallel tests wait
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------ build
def _commands(build, go, gobin):
    """The go command lines of a build (run in order)."""
    flags = ["-ldflags", build.ldflags] if build.ldflags else []
    if build.source:
        # a module of ours under tests/: its go.mod/go.sum pin every dependency; several packages build in
        # one command so that what they share compiles once
        out = str(gobin / build.binaries[0]) if build.packages == (".",) else str(gobin) + os.sep
        return [[go, "build"] + flags + ["-o", out] + list(build.packages)]
    # `go install module/pkg@version`: module-aware, ignores any go.mod around, checked against go.sum's
    # database (GONOSUMDB unset); refused when the module's go.mod has replace directives
    targets = ["%s@%s" % ("/".join(filter(None, (build.module, pkg))), build.version) for pkg in build.packages]
    return [[go, "install"] + flags + targets]


def _run_build(build, go, go_ver, log):
    dest = build_dir(build)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-%s." % build.cache_version, dir=str(dest.parent)))
    gobin = work / "bin"
    gobin.mkdir()
    env = go_env(build.cgo)
    env["GOBIN"] = str(gobin)
    cwd = str(ROOT / build.source) if build.source else str(work)
    started = time.monotonic()
    output = []
    try:
        for command in _commands(build, go, gobin):
            # nice: builds share the machine with the tests
            proc = subprocess.run(["nice", "-n", "10"] + command, cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT, check=False)
            output.append("$ %s\n%s%s" % (" ".join(command), proc.stdout, proc.stderr))
            if proc.returncode != 0:
                failure = {
                    "module": build.module, "version": build.version, "go": go_ver,
                    "command": command, "exit": proc.returncode, "error": last_line(proc.stderr or proc.stdout),
                    "output_tail": (proc.stdout + proc.stderr)[-4000:], "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                _write_json(failure_file(build), failure)
                raise BuildError("%s %s (%s) could not be built with %s: %s"
                                 % (build.module, build.version, build.key, go_ver, failure["error"]))
        missing = [name for name in build.binaries if not (gobin / name).is_file()]
        if missing:
            raise BuildError("%s %s: the build made no %s" % (build.module, build.version, ", ".join(missing)))
        seconds = round(time.monotonic() - started, 1)
        record = {
            "key": build.key, "module": build.module, "version": build.version, "go": go_ver,
            "packages": list(build.packages), "ldflags": build.ldflags, "cgo": build.cgo,
            "source": build.source or None, "seconds": seconds,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "sha256": {name: sha256_of(gobin / name) for name in build.binaries},
        }
        _write_json(work / "build.json", record)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(work, dest)
        with contextlib.suppress(FileNotFoundError):
            failure_file(build).unlink()
        _update_versions()
        built = (build.module, build.version, build.key, go_ver, seconds, ", ".join(build.binaries))
        log("built %s %s (%s) with %s in %.1f s: %s" % built)
        return record
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure(key, log=print):
    """Build KEY unless it is built; return (its build record, whether it was built now). Raises BuildError."""
    build = BUILDS[key]
    go = go_binary()
    go_ver = go_version(go)
    _check_go(go_ver)
    if is_built(build, go_ver):  # without the lock: a long build of another key must not hold up a ready one
        return read_record(build), False
    with _lock():
        if is_built(build, go_ver):
            return read_record(build), False
        log("building %s %s (%s) with %s into %s ..." % (build.module, build.version, key, go_ver, build_dir(build)))
        return _run_build(build, go, go_ver, log), True


def _check_go(go_ver):
    try:
        numbers = tuple(int(part) for part in go_ver[2:].split(".")[:2])
    except ValueError:
        return
    if numbers < GO_MIN:
        raise BuildError("%s is older than go%d.%d, which these modules need: run scripts/install-go.sh"
                         % (go_ver, GO_MIN[0], GO_MIN[1]))


def path_of(key, binary):
    build = BUILDS[key]
    if binary not in build.binaries:
        raise KeyError("%s builds %s, not %s" % (key, ", ".join(build.binaries), binary))
    return str(build_dir(build) / "bin" / binary)


def require(key, binary):
    """For tests: the binary's path, built first when missing; pytest.fail naming module, version, error."""
    try:
        ensure(key, log=lambda line: sys.stderr.write(line + "\n"))
    except BuildError as exc:
        import pytest  # only tests call this

        pytest.fail("test binary %s/%s unavailable: %s" % (key, binary, exc), pytrace=False)
    return path_of(key, binary)


# ------------------------------------------------------------------ command line
def _main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, args = argv[0], argv[1:]
    if command == "list":
        go_ver = go_version()
        for build in BUILDS.values():
            print("%-26s %-40s %-10s %s" % (build.key, build.module, build.version,
                                            "built" if is_built(build, go_ver) else "not built"))
        return 0
    if command == "path" and len(args) == 2:
        ensure(args[0])
        print(path_of(*args))
        return 0
    if command == "build":
        if args[:1] == ["--stage"] and len(args) == 2:
            args = [key for key, build in BUILDS.items() if build.stage == args[1]]
        keys = args or [key for key, build in BUILDS.items() if build.stage == "conformance"]
        unknown = [key for key in keys if key not in BUILDS]
        if unknown:
            print("unknown key(s) %s; known: %s" % (", ".join(unknown), ", ".join(BUILDS)), file=sys.stderr)
            return 2
        failed = []
        started = time.monotonic()
        for key in keys:
            try:
                record, fresh = ensure(key)
            except BuildError as exc:
                print("FAILED %s" % exc, file=sys.stderr)
                failed.append(key)
                continue
            if not fresh:  # one line per binary set either way: cached ones with their first build time
                print("cached %s %s (%s) in %s (built with %s in %.1f s)"
                      % (record["module"], record["version"], key, build_dir(BUILDS[key]), record["go"],
                         record["seconds"]))
        print("test binaries: %d of %d ready in %.1f s; records in %s"
              % (len(keys) - len(failed), len(keys), time.monotonic() - started, cache_root() / "versions.json"))
        return 1 if failed else 0
    print("unknown command %r (try --help)" % command, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
