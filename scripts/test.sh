#!/usr/bin/env bash
# The one command that tests dlock on a fresh Debian machine:
#
#     ./scripts/test.sh
#
# It installs what the tests need where it is missing (the servers are started privately by the
# tests themselves, on free ports, so nothing here touches a server you already run), then runs
# every test of the workspace with all features: unit, integration, UI (trybuild) and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs Debian package $2 when command (or file) $1 is missing.
need() {
    if ! [ -e "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
        echo "test.sh: installing $2 (for $1)"
        if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
    fi
}

need redis-server redis-server
need java default-jre-headless
need /usr/share/java/zookeeper.jar zookeeper

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --all-features --no-fail-fast
else
    cargo test --workspace --all-features --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --all-features --doc
