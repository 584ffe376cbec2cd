#!/usr/bin/env bash
# A Prometheus binary for the tests (tests/integration/test_daemon_live_traffic.py), idempotent:
# installs the Debian `prometheus` package if it is missing and prints the binary's path on its
# last line (the only line on stdout; progress goes to stderr). The test starts its own server
# from it, with its own scrape config and data directory, on a loopback port; nothing here
# starts a service. Needs root, or passwordless sudo, only when the package is missing.
set -euo pipefail

say() { echo "prometheus_for_tests: $*" >&2; }

if ! command -v prometheus >/dev/null; then
    if [[ $EUID -eq 0 ]]; then
        AS_ROOT=()
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        AS_ROOT=(sudo -n)
    else
        say "needs root (or passwordless sudo) to install the prometheus package"
        exit 1
    fi
    say "installing the Debian prometheus package"
    install=("${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus)
    if ! "${install[@]}" >&2; then
        say "install failed; running apt-get update and trying again"
        "${AS_ROOT[@]}" apt-get update -q >&2
        "${install[@]}" >&2
    fi
    # The package's own service is not ours to run (a container has no init to start it anyway);
    # where an init did start it, stop that one only (it runs as the package's user).
    "${AS_ROOT[@]}" pkill -u prometheus -x prometheus >/dev/null 2>&1 || true
fi
command -v prometheus
