#!/usr/bin/env bash
# Checks the Go that the test suite builds with: the machine's Go at /usr/local/go (else `go` on PATH),
# at least go1.26 (containerd 2.3.4 and helm.sh/helm/v4 v4.3.2 ask for 1.26). Go builds the template
# oracle (tests/oracle/render.go, standard library only) and the test binaries from the Go module proxy
# (scripts/build-test-binaries.sh). Nodes and the controller never need Go.
#
#   ./scripts/install-go.sh     # prints 'go version' and where Go's build and module caches are
#
# Debian's golang-go (1.19 on bookworm) is too old and is not installed. Without a Go >= 1.26 this
# fails and says so; it downloads nothing.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh disable=SC1091  # plain shellcheck does not follow; test.sh runs shellcheck -x
source "$HERE/lib.sh"

GO_MIN_MINOR=26

for arg in "$@"; do
    case $arg in
        -h | --help)
            sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

GO=$(go_path) || die "Go not found at /usr/local/go/bin/go nor on PATH: install Go 1.$GO_MIN_MINOR or newer (https://go.dev/dl/) into /usr/local/go"
version=$("$GO" env GOVERSION)
minor=$(sed -E 's/^go1\.([0-9]+).*/\1/' <<<"$version")
[[ "$minor" =~ ^[0-9]+$ ]] || die "$GO reports '$version', not a go1.N version"
((minor >= GO_MIN_MINOR)) || die "$GO is $version; the test binaries need go1.$GO_MIN_MINOR or newer (install it into /usr/local/go)"
log "$version ($GO); GOCACHE=$("$GO" env GOCACHE) GOMODCACHE=$("$GO" env GOMODCACHE) GOPROXY=$("$GO" env GOPROXY)"
