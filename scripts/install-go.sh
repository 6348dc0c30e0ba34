#!/usr/bin/env bash
# Installs Go for the test suite's template oracle (tests/oracle/render.go, built by
# tests/oracle/goracle.py): Debian's golang-go (1.19 on bookworm). Nodes and the controller never
# need Go; only the conformance tests do.
#
#   ./scripts/install-go.sh     # no-op when 'go' is already on PATH; prints 'go version'
#
# The oracle imports only the standard library, so nothing is downloaded at build time.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh disable=SC1091  # plain shellcheck does not follow; test.sh runs shellcheck -x
source "$HERE/lib.sh"

for arg in "$@"; do
    case $arg in
        -h | --help)
            sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

if ! command -v go >/dev/null 2>&1; then
    need_cmd apt-get "this script expects Debian/Ubuntu; install Go 1.19 or newer by hand"
    [[ $(id -u) -eq 0 ]] || die "'go' not found: run as root or 'sudo apt-get install -y golang-go'"
    step "apt-get install golang-go"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    command -v go >/dev/null 2>&1 || die "'go' still not on PATH after apt-get install golang-go"
fi
log "$(go version) ($(command -v go))"
