#!/usr/bin/env bash
# The project's test command. On a fresh Debian 12 machine (as root, with pyenv's 3.11 and 3.12)
# it installs what it needs and runs every test:
#
#   ./scripts/test.sh                  # every stage
#   ./scripts/test.sh lint units       # setup (always, cheap when warm) + the stages named
#   ./scripts/test.sh --list           # stage names
#
# Extra arguments for ansible-test integration: K3S_GPU_INTEGRATION_ARGS="--allow-destructive -v"
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$HERE/lib.sh"
ROOT=$(repo_root)
cd "$ROOT"
# Every check's output goes through a pipe (see check): tools that cut or wrap lines to a terminal's
# width (pytest's summary, molecule's boxes) get a wide one, so that a failure's line stays whole.
export COLUMNS=${COLUMNS:-200}

# Stages in run order. To add one: write stage_<name>() below, add <name> here and a description.
STAGES=(setup lint release units sanity integration conformance kubernetes molecule)
# Run only when named (scripts/test.sh kubernetes-1.34): CI runs the newer Kubernetes line.
EXTRA_STAGES=(kubernetes-1.34)
declare -A STAGE_DESC=(
    [setup]="apt packages, venvs, get-pip seed, collection paths"
    [lint]="yamllint, shellcheck, ansible-lint production, antsibull-changelog/-docs lint, ansible-doc"
    [release]="the Galaxy artifact: build, its contents and links, galaxy-importer (0 errors/warnings), install, the demo from it"
    [units]="pytest (2.19); ansible-test units 2.19/py3.11, 2.20/py3.12 and 2.21/py3.12"
    [sanity]="ansible-test sanity 2.19/py3.11 and 2.21/py3.12; compile+import on py3.8"
    [integration]="ansible-test integration 2.19/py3.11; site's report on a sandbox fleet (tests/fleet)"
    [conformance]="real containerd 1.6/1.7/2.1 (Debian) and 2.2/2.3 (built): config dump, CRI, pods; nvidia-ctk; Helm"
    [kubernetes]="the cluster lab (scripts/cluster-lab.sh): real kube-apiserver and kubelet, the seed's GPU pod on k3s and rke2 nodes, DRA"
    [kubernetes-1.34]="the cluster lab's tests on the older Kubernetes line (1.34, k3s and rke2; not in the default run)"
    [molecule]="molecule scenarios of the gpu_node role (extensions/molecule)"
)

NS=k3s_gpu
NAME=nvidia
FQ=$NS.$NAME
PY_MAIN=3.11                      # ansible-core 2.19 (newest for 3.11)
PY_NEW=3.12                       # ansible-core 2.21
PY_TARGET_MIN=3.8                 # oldest target Python of ansible-core 2.19 (modules, module_utils)
PYBIN=$ROOT/.tmp/pybin            # pythonX.Y links to real interpreters (pyenv shims fail there)
VENV=$ROOT/.venv
VENV_NEW=$ROOT/.venv-2.21
VENV_MID=$ROOT/.venv-2.20           # ansible-core 2.20 (Python 3.12): requires_ansible >=2.19 covers it
VENV_IMPORTER=$ROOT/.venv-importer  # galaxy-importer (release stage), pinned apart
RELEASE_DIR=$ROOT/.tmp/release
COLL_PATH=$ROOT/.tmp/collections  # ansible_collections/k3s_gpu/nvidia -> the checkout (symlink)
AT_DIR=$ROOT/.tmp/ansible-test/ansible_collections/$NS/$NAME  # real copy, for ansible-test

# ansible_test VENV ARGS...: ansible-test from VENV, in the copy (refreshed by setup).
ansible_test() {
    local venv=$1
    shift
    use_venv "$venv"
    unset ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS
    cd "$AT_DIR"
    ansible-test "$@"
}

# ------------------------------------------------------------------ setup
stage_setup() {
    # ansible-test sanity's shellcheck test needs the shellcheck program (it skips silently without it).
    apt_ensure git ca-certificates tar coreutils findutils shellcheck
    local py_main py_new py_min
    py_main=$(find_python "$PY_MAIN")
    py_new=$(find_python "$PY_NEW")
    py_min=$(find_python "$PY_TARGET_MIN")
    mkdir -p "$PYBIN"
    ln -sfn "$py_min" "$PYBIN/python$PY_TARGET_MIN"
    venv_ensure "$VENV" "$py_main" requirements.txt tests/requirements.txt
    venv_ensure "$VENV_NEW" "$py_new" tests/requirements-2.21.txt
    venv_ensure "$VENV_MID" "$py_new" tests/requirements-2.20.txt
    seed_get_pip "$VENV"
    seed_get_pip "$VENV_NEW"
    seed_get_pip "$VENV_MID"

    local link=$COLL_PATH/ansible_collections/$NS/$NAME
    mkdir -p "$(dirname "$link")"
    ln -sfn ../../../.. "$link"
    [[ -f "$link/galaxy.yml" ]] || die "$link does not resolve to the checkout"

    sync_copy "$ROOT" "$AT_DIR"
    local count
    count=$(git -C "$AT_DIR" ls-files -co --exclude-standard | wc -l)
    ((count > 0)) || die "ansible-test copy $AT_DIR lists no files from git"
    log "collection path (symlink): $link"
    log "ansible-test copy: $AT_DIR ($count files)"
    local v
    for v in "$VENV" "$VENV_MID" "$VENV_NEW"; do
        log "$v: ansible-core $("$v/bin/python" -c 'from ansible.release import __version__ as v; print(v)')"
    done
}

# ------------------------------------------------------------------ lint
# ansible-doc must render every module, filter and role of the collection without error or warning.
ansible_doc_all() {
    local names=() n kind out rc fails=0 f
    for f in plugins/modules/*.py; do
        if [[ -e "$f" && "$(basename "$f")" != __init__.py ]]; then names+=("module:$(basename "$f" .py)"); fi
    done
    if compgen -G 'plugins/filter/*.py' >/dev/null; then
        local err
        err=$(mktemp)
        out=$(ansible-doc -t filter -l "$FQ" --json 2>"$err") || { cat "$err"; rm -f "$err"; return 1; }
        if grep -qE '\[(ERROR|WARNING)\]|ERROR!' "$err"; then
            log "ansible-doc -t filter -l $FQ:"; cat "$err"; rm -f "$err"; return 1
        fi
        rm -f "$err"
        mapfile -t f < <(printf '%s' "$out" | python -c 'import json,sys; [print(k) for k in json.load(sys.stdin)]')
        ((${#f[@]})) || { log "plugins/filter has files but ansible-doc lists no filter for $FQ: $out"; return 1; }
        for n in "${f[@]}"; do names+=("filter:${n#"$FQ".}"); done
    fi
    for f in roles/*/; do
        if [[ -d "$f" ]]; then names+=("role:$(basename "$f")"); fi
    done
    ((${#names[@]})) || { log "no modules, filters or roles yet: nothing to render"; return 0; }
    for n in "${names[@]}"; do
        kind=${n%%:*}
        rc=0
        out=$(ansible-doc -t "$kind" "$FQ.${n#*:}" 2>&1 >/dev/null) || rc=$?
        if ((rc)) || grep -qE '\[(ERROR|WARNING)\]|ERROR!' <<<"$out"; then
            log "FAIL ansible-doc -t $kind $FQ.${n#*:} (exit $rc):"
            log "$out"
            fails=$((fails + 1))
        else
            log "ok   ansible-doc -t $kind $FQ.${n#*:}"
        fi
    done
    return $((fails > 0))
}

# Run shellcheck on every git-visible *.sh file and every file with a sh/bash shebang (.ci/run, ...).
shellcheck_all() {
    local files=() f
    while IFS= read -r -d '' f; do
        [[ -f "$f" ]] || continue
        if [[ "$f" == *.sh ]] || head -n1 "$f" | grep -qE '^#!.*[/ ](ba)?sh( |$)'; then files+=("$f"); fi
    done < <(git ls-files -z --cached --others --exclude-standard)
    ((${#files[@]})) || { log "no shell scripts"; return 0; }
    log "shellcheck ${files[*]}"
    shellcheck -x "${files[@]}"
}

# What ansible-builder reads of the collection when it is installed into an execution environment
# (meta/execution-environment.yml -> requirements.txt): tomlkit must come out of it.
ee_introspect() {
    local out
    out=$(ansible-builder introspect "$COLL_PATH") || return 1
    printf '%s\n' "$out"
    grep -q 'tomlkit.*from collection k3s_gpu.nvidia' <<<"$out"
}

# antsibull-docs needs the collection under ansible_collections/<ns>/<name>: lint through the symlink.
docs_lint() {
    cd "$COLL_PATH/ansible_collections/$NS/$NAME"
    antsibull-docs lint-collection-docs --plugin-docs .
}

stage_lint() {
    use_venv "$VENV"
    export ANSIBLE_COLLECTIONS_PATH=$COLL_PATH
    check "yamllint -s ." yamllint -s .
    check "shellcheck (every shell script in git)" shellcheck_all
    # --offline: no ansible-galaxy install into a cache (Galaxy is unreachable here, and the
    # collection is already on ANSIBLE_COLLECTIONS_PATH through the symlink).
    check "ansible-lint (profile production)" ansible-lint --offline --profile production
    check "antsibull-changelog lint" antsibull-changelog lint
    check "antsibull-docs lint-collection-docs --plugin-docs" docs_lint
    check "ansible-doc renders every module/filter/role" ansible_doc_all
    # the build context only: no container engine here, so the image itself is not built
    check "ansible-builder create (the sample execution environment)" \
        ansible-builder create -f "$ROOT/execution-environment.yml" -c "$ROOT/.tmp/ee-context"
    check "ansible-builder introspect (the collection's requirements in any execution environment)" ee_introspect
    checks_result
}

# ------------------------------------------------------------------ release
# The artifact a user installs from Galaxy, built from the git-visible copy (AT_DIR) as ansible-galaxy builds it.
release_artifact() {
    local version
    version=$(python -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["version"])' "$ROOT/galaxy.yml")
    printf '%s/%s-%s-%s.tar.gz' "$RELEASE_DIR" "$NS" "$NAME" "$version"
}

release_build() {
    rm -rf "$RELEASE_DIR"
    mkdir -p "$RELEASE_DIR"
    ansible-galaxy collection build --output-path "$RELEASE_DIR" "$AT_DIR"
    python "$ROOT/scripts/check-artifact.py" "$(release_artifact)"
}

# Galaxy's importer with what Automation Hub turns on (1.0.0 or newer, a required tag, flake8): no error, no warning.
release_import() {
    local out rc=0
    out=$(cd "$RELEASE_DIR" && env PATH="$VENV_IMPORTER/bin:$PATH" GALAXY_IMPORTER_REQUIRE_V1_OR_GREATER=true \
        GALAXY_IMPORTER_CHECK_REQUIRED_TAGS=true GALAXY_IMPORTER_RUN_FLAKE8=true \
        "$VENV_IMPORTER/bin/python" -m galaxy_importer.main "$(release_artifact)" 2>&1) || rc=$?
    printf '%s\n' "$out" | grep -v '^Loading \|^Linting .* via flake8\.\.\.$'
    ((rc == 0)) || { log "galaxy-importer exited $rc"; return 1; }
    if grep -qE '^(WARNING|ERROR)' <<<"$out"; then
        log "galaxy-importer: $(grep -cE '^(WARNING|ERROR)' <<<"$out") warnings or errors (above)"
        return 1
    fi
    grep -q 'Importer processing completed successfully' <<<"$out"
}

# Installed into an empty collections path, with nothing of the checkout on it: the demo runs from the installed copy
# (its node built by the installed demo/make-node.sh) and its second write changes nothing (demo.yml fails otherwise).
release_install_demo() {
    local installed=$RELEASE_DIR/installed node=$RELEASE_DIR/demo-node out
    ansible-galaxy collection install --offline -p "$installed" "$(release_artifact)"
    local copy=$installed/ansible_collections/$NS/$NAME
    ansible-galaxy collection list -p "$installed" "$FQ" | grep -E "^$FQ +[0-9]"
    bash "$copy/demo/make-node.sh" "$node"
    printf 'demo ansible_connection=local ansible_python_interpreter=%s demo_root=%s\n' "$VENV/bin/python" "$node" \
        >"$RELEASE_DIR/demo-inventory.ini"
    unset ANSIBLE_COLLECTIONS_PATHS
    out=$(cd "$RELEASE_DIR" && ANSIBLE_COLLECTIONS_PATH=$installed ANSIBLE_NOCOWS=1 \
        ansible-playbook -i "$RELEASE_DIR/demo-inventory.ini" "$copy/demo/demo.yml")
    printf '%s\n' "$out"
    grep -q 'second run changed: False' <<<"$out" && grep -qE 'demo +: ok=[0-9]+ +changed=1 .*failed=0' <<<"$out"
}

stage_release() {
    venv_ensure "$VENV_IMPORTER" "$(find_python "$PY_MAIN")" tests/requirements-release.txt
    use_venv "$VENV"
    check "build the Galaxy artifact; no repository-only path, every link resolves inside it, its version released" \
        release_build
    check "galaxy-importer on the artifact (Automation Hub's checks): 0 errors, 0 warnings" release_import
    check "install the artifact into an empty collections path and run the demo from it" release_install_demo
    checks_result
}

# ------------------------------------------------------------------ units
stage_units() {
    if ! find tests/unit -name 'test_*.py' -print -quit 2>/dev/null | grep -q .; then
        log "NO UNIT TESTS: tests/unit has no test_*.py yet"
        return 1
    fi
    check "pytest tests/unit (ansible-core 2.19, py$PY_MAIN)" \
        env PYTHONPATH="$COLL_PATH" "$VENV/bin/python" -m pytest tests/unit -q
    check "ansible-test units (2.19, py$PY_MAIN)" ansible_test "$VENV" units --venv --python "$PY_MAIN"
    check "ansible-test units (2.20, py$PY_NEW)" ansible_test "$VENV_MID" units --venv --python "$PY_NEW"
    check "ansible-test units (2.21, py$PY_NEW)" ansible_test "$VENV_NEW" units --venv --python "$PY_NEW"
    checks_result
}

# ------------------------------------------------------------------ sanity
# Modules and module_utils run on the nodes: compile and import them on the oldest target Python.
sanity_target_min() {
    export PATH="$PYBIN:$PATH"
    ansible_test "$VENV" sanity --venv --python "$PY_TARGET_MIN" --test compile --test import
}

stage_sanity() {
    check "ansible-test sanity (2.19, py$PY_MAIN)" ansible_test "$VENV" sanity --venv --python "$PY_MAIN"
    check "ansible-test sanity (2.21, py$PY_NEW)" ansible_test "$VENV_NEW" sanity --venv --python "$PY_NEW"
    check "ansible-test sanity compile+import (2.19, target py$PY_TARGET_MIN)" sanity_target_min
    checks_result
}

# ------------------------------------------------------------------ integration
stage_integration() {
    local targets=()
    if [[ -d tests/integration/targets ]]; then
        mapfile -t targets < <(find tests/integration/targets -mindepth 1 -maxdepth 1 -type d \
            -not -name 'setup_*' -not -name 'prepare_*' -printf '%f\n' | sort)
    fi
    if ((${#targets[@]} == 0)); then
        log "NO INTEGRATION TARGETS under tests/integration/targets: nothing to run (stage passes only in this case)"
        return 0
    fi
    log "targets: ${targets[*]}"
    local out=$ROOT/.tmp/integration.log
    # shellcheck disable=SC2086  # word-splitting of the optional extra arguments is intended
    ansible_test "$VENV" integration --venv --python "$PY_MAIN" ${K3S_GPU_INTEGRATION_ARGS:-} 2>&1 | tee "$out"
    # Targets excluded by aliases (destructive, needs/..., skip/...) are not a pass.
    if grep -qE 'All targets skipped|WARNING: Excluding tests marked' "$out"; then
        log "integration targets were skipped (see above): fix their aliases or set K3S_GPU_INTEGRATION_ARGS"
        return 1
    fi
    apt_ensure openssh-client  # the fleet's unreachable host is an ssh connection to a closed port
    check "pytest tests/fleet (k3s_gpu.nvidia.site's report on a 56-host sandbox fleet, ansible-playbook and ansible-runner)" \
        env PYTHONPATH="$COLL_PATH" "$VENV/bin/python" -m pytest tests/fleet -q -s -p no:cacheprovider
    checks_result
}

# ------------------------------------------------------------------ conformance
stage_conformance() {
    check "install containerd 1.6 (apt), 1.7 and 2.x (Debian .debs, cached)" bash scripts/install-containerd.sh
    check "Go (the text/template oracle, tests/oracle, and the test binaries)" bash scripts/install-go.sh
    check "build the test binaries from the Go module proxy (containerd 2.2/2.3, NVIDIA toolkit, helm-render)" \
        bash scripts/build-test-binaries.sh
    check "pytest tests/conformance (real containerd)" \
        env PYTHONPATH="$COLL_PATH" "$VENV/bin/python" -m pytest tests/conformance -q -p no:cacheprovider
    checks_result
}

# ------------------------------------------------------------------ kubernetes
# The cluster lab's binaries are built from the Go module proxy on first use (the Kubernetes line: about
# 5 minutes on 2 cores when Go's caches are cold), then each lab starts in seconds.
cluster_lab_tests() {
    local lines=$1
    check "build the cluster lab's binaries (Kubernetes $lines, kine, containerd, toolkit, device plugin and DRA test doubles, Kubernetes' DRA test driver)" \
        bash scripts/build-test-binaries.sh "kubernetes-v$lines" kine device-plugin-testdouble containerd-2.3 \
        containerd-2.2 nvidia-container-toolkit dra-plugin-testdouble "dra-test-driver-v$lines" helm-render
    apt_ensure containernetworking-plugins openssl
    kubernetes_core_ensure "$VENV/bin/python" "$ROOT/.tmp/extra-collections"
    check "pytest tests/cluster (Kubernetes $lines, k3s and rke2 nodes, strategies envvar and cdi-cri; a DRA node)" \
        env PYTHONPATH="$COLL_PATH" K3S_GPU_LAB_KUBERNETES="$lines" "$VENV/bin/python" -m pytest tests/cluster -q -s \
        -p no:cacheprovider
    checks_result
}

stage_kubernetes() {
    cluster_lab_tests 1.36
}

# shellcheck disable=SC2329  # called through run_stage by its name
stage_kubernetes-1.34() {
    cluster_lab_tests 1.34
}

# ------------------------------------------------------------------ molecule
stage_molecule() {
    local scenario lane_log lane_pid nspawn=() others=()
    check "install containerd (the scenarios verify in real containerd)" bash scripts/install-containerd.sh
    for scenario in $(find extensions/molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -n1 basename | sort); do
        if [[ $scenario == nspawn_* ]]; then nspawn+=("$scenario"); else others+=("$scenario"); fi
    done
    # Two lanes at once: the nspawn scenarios mostly wait on systemd and settle timers, the sandbox
    # ones work on localhost. One after the other they take 10.5 min here; side by side about 8.
    lane_log=$ROOT/.tmp/molecule-sandbox-lane.log
    mkdir -p "$(dirname "$lane_log")"
    (
        # shellcheck disable=SC2030 # the lane's own failures, reported by its exit status
        CHECK_FAILURES=()
        for scenario in "${others[@]}"; do molecule_check "$scenario"; done
        checks_result
    ) >"$lane_log" 2>&1 &
    lane_pid=$!
    for scenario in "${nspawn[@]}"; do molecule_check "$scenario"; done
    if ! wait "$lane_pid"; then
        # shellcheck disable=SC2031 # this is the parent's list; the lane's stayed in its subshell
        CHECK_FAILURES+=("sandbox lane: ${others[*]} (its output follows)")
    fi
    log "--- output of the sandbox lane (run alongside the nspawn lane):"
    cat "$lane_log"
    checks_result
}

# molecule_check SCENARIO: molecule test, with the venv's bin first on PATH (molecule shells out to ansible-config)
molecule_check() {
    check "molecule test -s $1" env PATH="$VENV/bin:$PATH" ANSIBLE_COLLECTIONS_PATH="$COLL_PATH" \
        "$VENV/bin/molecule" test -s "$1"
}

# ------------------------------------------------------------------ main
usage() {
    printf 'usage: %s [--list] [STAGE...]\nstages (run in this order; setup always runs first):\n' "$0"
    local s
    for s in "${STAGES[@]}" "${EXTRA_STAGES[@]}"; do printf '  %-16s %s\n' "$s" "${STAGE_DESC[$s]}"; done
}

main() {
    local arg s wanted=() selected=()
    for arg in "$@"; do
        case $arg in
            -h | --help) usage; return 0 ;;
            --list) printf '%s\n' "${STAGES[@]}"; return 0 ;;
            -*) usage >&2; die "unknown option $arg" ;;
            *) [[ -v "STAGE_DESC[$arg]" ]] || { usage >&2; die "unknown stage '$arg'"; }
               wanted+=("$arg") ;;
        esac
    done
    for s in "${STAGES[@]}" "${EXTRA_STAGES[@]}"; do
        if [[ " ${EXTRA_STAGES[*]} " == *" $s "* && " ${wanted[*]} " != *" $s "* ]]; then continue; fi
        if [[ $s == setup || ${#wanted[@]} -eq 0 || " ${wanted[*]} " == *" $s "* ]]; then
            selected+=("$s")
        fi
    done

    local start failed=0 passed=0
    start=$(date +%s)
    CHECK_TAILS=$ROOT/.tmp/failed-checks
    rm -rf "$CHECK_TAILS"
    log "k3s_gpu.nvidia tests: ${selected[*]} (in $ROOT)"
    for s in "${selected[@]}"; do
        run_stage "$s"
        if ((STAGE_RC)); then
            failed=$((failed + 1))
            if [[ $s == setup ]]; then
                log "setup failed: not running the other stages"
                break
            fi
        else
            passed=$((passed + 1))
        fi
    done

    if ((failed)); then
        printf '\n======== what the failed checks printed (their error lines and last lines; the whole output is above)\n'
        failed_checks_said tail
    fi
    printf '\n======== summary (%ss in all)\n' "$(($(date +%s) - start))"
    printf '  %s\n' "${STAGE_RESULTS[@]}"
    printf 'stages: %d passed, %d failed\n' "$passed" "$failed"
    # last, one line per failed check: a CI page that shows only the log's last lines still says why
    failed_checks_said cause
    ((failed == 0))
}

main "$@"
