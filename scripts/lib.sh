# shellcheck shell=bash
# Helpers for scripts/test.sh (sourced, runs nothing by itself).
# No machine-specific paths: everything derives from the repository root, $HOME and pyenv.

# ---------------------------------------------------------------- output
log() { printf '%s\n' "$*"; }
step() { printf -- '--- %s\n' "$*"; }
warn() { printf 'WARNING: %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# need_cmd CMD HINT: fail (never skip) when a tool is missing.
need_cmd() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found. Install it: $2"
}

# ---------------------------------------------------------------- repository
repo_root() {
    git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel 2>/dev/null \
        || die "not inside a git checkout (the test tooling lists files from git)"
}

# ---------------------------------------------------------------- apt
# apt_ensure PKG...: apt-get install only what is missing (one 'apt-get update' at most).
apt_ensure() {
    local pkg missing=()
    for pkg in "$@"; do
        if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" != installed ]]; then
            missing+=("$pkg")
        fi
    done
    ((${#missing[@]})) || return 0
    need_cmd apt-get "this tooling expects Debian/Ubuntu; install ${missing[*]} by hand"
    [[ $(id -u) -eq 0 ]] || die "missing packages ${missing[*]}: run as root or 'sudo apt-get install -y ${missing[*]}'"
    step "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------- python
pyenv_root() {
    if command -v pyenv >/dev/null 2>&1; then
        pyenv root
    else
        printf '%s\n' "${PYENV_ROOT:-$HOME/.pyenv}"
    fi
}

# find_python X.Y: print a real interpreter path for Python X.Y (newest pyenv X.Y.*, else pythonX.Y on
# PATH that is not a pyenv shim). Fails with an install hint.
find_python() {
    local want=$1 root cand best=""
    root=$(pyenv_root)
    for cand in "$root"/versions/"$want".*/bin/python"$want"; do
        [[ -x "$cand" ]] || continue
        # keep the highest patch release (versions sort naturally with sort -V)
        best=$(printf '%s\n%s\n' "$best" "$cand" | sed '/^$/d' | sort -V | tail -n1)
    done
    if [[ -z "$best" ]]; then
        cand=$(command -v "python$want" 2>/dev/null || true)
        if [[ -n "$cand" && "$cand" != */shims/* ]]; then
            best=$cand
        fi
    fi
    [[ -n "$best" ]] || die "Python $want not found (looked in $root/versions/$want.* and PATH). Install it: pyenv install $want"
    "$best" -c 'import ensurepip, venv' 2>/dev/null \
        || die "$best lacks ensurepip/venv; rebuild it with pyenv (pyenv install --force $want)"
    printf '%s\n' "$best"
}

# pip output on this machine kind carries a warning per package about local index folders; drop those.
pip_quiet() {
    "$@" 2>&1 | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }
}

# venv_ensure DIR PYTHON REQFILE...: (re)create a venv unless its stamp (hash of the interpreter
# version and the requirement files) is unchanged.
venv_ensure() {
    local dir=$1 python=$2 stamp_file want have="" req args=()
    shift 2
    stamp_file="$dir/.k3s-gpu-requirements.sha256"
    want=$({
        printf 'stamp-v1\n'
        "$python" -c 'import sys; print(sys.version)'
        for req in "$@"; do printf '== %s\n' "$req"; cat "$req"; done
    } | sha256sum | cut -d' ' -f1)
    [[ -f "$stamp_file" ]] && have=$(cat "$stamp_file")
    if [[ "$have" == "$want" && -x "$dir/bin/python" ]] && "$dir/bin/python" -c '' 2>/dev/null; then
        log "$dir: up to date ($("$dir/bin/python" --version), requirements unchanged)"
        return 0
    fi
    step "creating $dir with $("$python" --version) from $*"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    for req in "$@"; do args+=(-r "$req"); done
    pip_quiet "$dir/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off "${args[@]}"
    printf '%s\n' "$want" >"$stamp_file"
}

# ---------------------------------------------------------------- ansible-test
# ansible-test bootstraps each venv it creates with get-pip-<v>.py downloaded from a host that CI
# cannot reach; it uses ~/.ansible/test/cache/get_pip_<v>.py when present. Seed that file with a
# stand-in: stdlib ensurepip, then 'pip install' of the requirements ansible-test passes
# (e.g. pip==24.2), dropping get-pip's own --no-setuptools/--no-wheel options.
seed_get_pip() {
    local venv=$1 file version cache
    file=$("$venv/bin/python" -c 'import ansible_test, os; print(os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py"))')
    version=$(sed -n "s/^ *pip='\([0-9.]*\)',.*/\1/p" "$file" | head -n1)
    [[ -n "$version" ]] || die "cannot find ansible-test's pip version in $file (ansible-core changed?)"
    cache="$HOME/.ansible/test/cache/get_pip_${version//./_}.py"
    mkdir -p "$(dirname "$cache")"
    local tmp="$cache.k3s-gpu.$$"
    cat >"$tmp" <<'PY'
# Stand-in for get-pip.py, written by the k3s_gpu.nvidia test tooling (scripts/lib.sh).
# ansible-test runs it inside a new venv: bootstrap pip with the stdlib's ensurepip, then
# 'pip install' the packages ansible-test asks for (e.g. pip==24.2).
import subprocess
import sys

GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")


def main():
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet"] + args)
    if "--no-setuptools" in sys.argv[1:]:
        # ensurepip before Python 3.12 also installs setuptools; ansible-test wants none.
        subprocess.call([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "setuptools"])


main()
PY
    if cmp -s "$tmp" "$cache"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$cache"
        log "seeded $cache (pip $version bootstrap via ensurepip)"
    fi
}

# sync_copy SRC DEST: make DEST a real copy of the git-visible files of SRC (tracked and untracked,
# not ignored; deleted files skipped). Keeps DEST/tests/output (ansible-test's venvs and results)
# and DEST/.git (a bare 'git init' so ansible-test lists files from DEST, not from SRC's repository).
sync_copy() {
    local src=$1 dest=$2
    mkdir -p "$dest"
    find "$dest" -mindepth 1 \( -path "$dest/.git" -o -path "$dest/tests/output" \) -prune \
        -o \( -type f -o -type l \) -exec rm -f {} +
    find "$dest" -mindepth 1 -type d -empty -not -path "$dest/.git" -not -path "$dest/.git/*" \
        -not -path "$dest/tests/output" -not -path "$dest/tests/output/*" -delete
    (
        cd "$src"
        git ls-files -z --cached --others --exclude-standard \
            | while IFS= read -r -d '' f; do
                if [[ -e "$f" || -L "$f" ]]; then printf '%s\0' "$f"; fi
            done \
            | tar --null --no-recursion -T - -cf -
    ) | tar -xf - -C "$dest"
    if [[ ! -d "$dest/.git" ]]; then
        git -C "$dest" init -q
    fi
}

# ---------------------------------------------------------------- stages
declare -a STAGE_RESULTS=()

# run_stage NAME: run function stage_NAME in a subshell with set -e, banner + elapsed seconds,
# record PASS/FAIL in STAGE_RESULTS and its exit status in STAGE_RC. Always returns 0: call it as a
# plain command, never after if/&&/|| (bash ignores set -e inside such a context).
# shellcheck disable=SC2034  # read by scripts/test.sh
STAGE_RC=0
run_stage() {
    local name=$1 start rc out tails_before
    start=$(date +%s)
    printf '\n======== [%s] %s (started %s)\n' "$name" "${STAGE_DESC[$name]:-}" "$(date +%H:%M:%S)"
    out=$(mktemp)
    tails_before=$(count_check_tails)
    set +e
    (set -euo pipefail; "stage_$name") 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    set -e
    # a stage that failed outside its checks (integration) leaves its own tail
    if ((rc)) && [[ -n ${CHECK_TAILS:-} ]] && (($(count_check_tails) == tails_before)); then
        keep_check_tail "stage $name (exit $rc)" "$out"
    fi
    rm -f "$out"
    local secs=$(($(date +%s) - start))
    if ((rc == 0)); then
        printf '======== [%s] PASS in %ss\n' "$name" "$secs"
        STAGE_RESULTS+=("PASS  $name  ${secs}s")
    else
        printf '======== [%s] FAIL (exit %s) in %ss\n' "$name" "$rc" "$secs"
        STAGE_RESULTS+=("FAIL  $name  ${secs}s  (exit $rc)")
    fi
    # shellcheck disable=SC2034  # read by scripts/test.sh
    STAGE_RC=$rc
}

# check NAME CMD...: run one check inside a stage with set -e in force, keep going when it fails,
# remember the failure; checks_result fails the stage if any check failed. When CHECK_TAILS names a
# folder, a failed check leaves what it said there (keep_check_tail), which test.sh prints again at
# the end of the run, where a CI log's tail shows it. Its output goes through tee: every daemon a
# check starts must write to its own log, not to the check's stdout.
declare -a CHECK_FAILURES=()
check() {
    local name=$1 rc start out
    shift
    start=$(date +%s)
    step "$name"
    out=$(mktemp)
    set +e
    (set -euo pipefail; "$@") 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    set -e
    if ((rc)); then
        CHECK_FAILURES+=("$name (exit $rc)")
        log "--- FAILED: $name (exit $rc, $(($(date +%s) - start))s)"
        [[ -z ${CHECK_TAILS:-} ]] || keep_check_tail "$name (exit $rc)" "$out"
    else
        log "--- ok: $name ($(($(date +%s) - start))s)"
    fi
    rm -f "$out"
}

# keep_check_tail TITLE OUTPUT: what a failed check said, in two files of CHECK_TAILS: NNN.tail (its
# error lines, each cut at 3000 characters, then its last 30 lines) and NNN.cause (one line: its
# last failed Ansible task that was not ignored, else pytest's last FAILED line, else its last error).
CHECK_ERROR_PATTERN='fatal: |FAILED|ERROR|Error:|Traceback|AssertionError|^E  '
keep_check_tail() {
    local base
    mkdir -p "$CHECK_TAILS"
    base=$CHECK_TAILS/$(date +%s%N)
    {
        log "--- FAILED: $1; its error lines:"
        grep -aE "$CHECK_ERROR_PATTERN" "$2" | tail -n 20 | cut -c1-3000
        log "--- and its last 30 lines:"
        tail -n 30 "$2"
    } >"$base.tail"
    printf -- '--- FAILED: %s: %s\n' "$1" "$(check_cause "$2" | cut -c1-600)" >"$base.cause"
}

# check_cause OUTPUT: the line of a check's output most likely to say why it failed, colours removed:
# the last failed Ansible task that was not ignored (with the lines molecule wrapped it into, which
# it indents under its box drawing), else pytest's last FAILED line, else the last error or line.
check_cause() {
    awk -v errors="$CHECK_ERROR_PATTERN" '{ gsub(/\033\[[0-9;]*m/, ""); sub(/\r$/, "") }
         in_fatal && /^[ \t]*│   / { sub(/^[ \t]*│[ \t]+/, ""); fatal = fatal " " $0; next }
         in_fatal { in_fatal = 0; if ($0 ~ /^[ \t]*(│[ \t]*)?\.\.\.ignoring/) { fatal = before; next } }
         /fatal: \[/ { before = fatal; fatal = $0; sub(/^[ \t]*(│[ \t]*)?/, "", fatal); in_fatal = 1; next }
         /^FAILED / { pytest = $0 }
         $0 ~ errors { other = $0 }
         NF { last = $0 }
         END { print (fatal != "" ? fatal : pytest != "" ? pytest : other != "" ? other : last) }' "$1"
}

count_check_tails() {
    if [[ -n ${CHECK_TAILS:-} && -d $CHECK_TAILS ]]; then find "$CHECK_TAILS" -name '*.tail' | wc -l; else echo 0; fi
}

# failed_checks_said SUFFIX: every failed check's .tail or .cause file of this run, oldest first.
failed_checks_said() {
    local file
    [[ -n ${CHECK_TAILS:-} && -d $CHECK_TAILS ]] || return 0
    for file in $(find "$CHECK_TAILS" -name "*.$1" | sort); do
        cat "$file"
    done
}
checks_result() {
    ((${#CHECK_FAILURES[@]} == 0)) && return 0
    printf 'failed checks:\n' >&2
    printf '  %s\n' "${CHECK_FAILURES[@]}" >&2
    return 1
}

# use_venv DIR: put a venv first on PATH (molecule and ansible-test shell out to its tools).
use_venv() {
    [[ -x "$1/bin/python" ]] || die "$1 missing: run ./scripts/test.sh setup"
    export VIRTUAL_ENV=$1
    export PATH="$1/bin:$PATH"
    unset PYTHONHOME
}

# ---------------------------------------------------------------- the main venv and collection path
# dev_env ROOT: the venv (.venv, Python 3.11) and the collection path (.tmp/collections) that the
# demo and the benchmarks run with; sets VENV and COLL_PATH. Run from ROOT: the requirement files
# are named as scripts/test.sh names them, so that both share one venv stamp.
dev_env() {
    local root=$1
    VENV=$root/.venv
    COLL_PATH=$root/.tmp/collections
    venv_ensure "$VENV" "$(find_python 3.11)" requirements.txt tests/requirements.txt
    mkdir -p "$COLL_PATH/ansible_collections/k3s_gpu"
    ln -sfn ../../../.. "$COLL_PATH/ansible_collections/k3s_gpu/nvidia"
}

# enter_dev_env: cd to the repository root (ROOT) and set up dev_env there: the start of the demo and the benchmarks.
enter_dev_env() {
    ROOT=$(repo_root)
    cd "$ROOT"
    dev_env "$ROOT"
}

# ---------------------------------------------------------------- go
# go_path: the Go the tests build with: the machine's /usr/local/go, else `go` on PATH.
go_path() {
    if [[ -x /usr/local/go/bin/go ]]; then
        printf '%s\n' /usr/local/go/bin/go
    else
        command -v go
    fi
}

# ---------------------------------------------------------------- kubernetes.core
# kubernetes_core_ensure PYTHON DEST: the kubernetes.core collection (an optional dependency of the
# runtimeclasses and verify playbooks) under DEST/ansible_collections, taken from the `ansible` wheel
# on PyPI (Galaxy is not reachable here); only that collection is extracted.
KUBERNETES_CORE_FROM=ansible==12.3.0   # carries kubernetes.core 6.2.0 (ansible-core 2.16+)
kubernetes_core_ensure() {
    local python=$1 dest=$2 wheel_dir
    [[ -f "$dest/ansible_collections/kubernetes/core/MANIFEST.json" ]] && return 0
    wheel_dir=$(mktemp -d)
    "$python" -m pip download -q --no-deps -d "$wheel_dir" "$KUBERNETES_CORE_FROM" \
        || die "pip download $KUBERNETES_CORE_FROM failed (the source of kubernetes.core)"
    mkdir -p "$dest"
    "$python" - "$wheel_dir" "$dest" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/ansible-*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name.startswith("ansible_collections/kubernetes/core/"):
            archive.extract(name, sys.argv[2])
PY
    rm -rf "$wheel_dir"
    [[ -f "$dest/ansible_collections/kubernetes/core/MANIFEST.json" ]] || die "kubernetes.core not found in $KUBERNETES_CORE_FROM"
    log "kubernetes.core from $KUBERNETES_CORE_FROM in $dest"
}
