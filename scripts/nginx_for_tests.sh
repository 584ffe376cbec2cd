#!/usr/bin/env bash
# An nginx binary for the tests (tests/unit/fleet/test_proxy.py, tests/integration/test_fleet_on_vllm.py),
# idempotent: installs the Debian `nginx-light` package if no nginx is found and prints the binary's
# path on its last line (the only line on stdout; progress goes to stderr). The tool starts its
# own nginx from it (optimizer/fleet/proxy.py), with its own config, on a loopback port; nothing
# here starts a service. Needs root, or passwordless sudo, only when the package is missing.
set -euo pipefail

say() { echo "nginx_for_tests: $*" >&2; }

find_nginx() { command -v nginx || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; }; }

if ! find_nginx >/dev/null; then
    if [[ $EUID -eq 0 ]]; then
        AS_ROOT=()
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        AS_ROOT=(sudo -n)
    else
        say "needs root (or passwordless sudo) to install the nginx-light package"
        exit 1
    fi
    say "installing the Debian nginx-light package"
    install=("${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nginx-light)
    if ! "${install[@]}" >&2; then
        say "install failed; running apt-get update and trying again"
        "${AS_ROOT[@]}" apt-get update -q >&2
        "${install[@]}" >&2
    fi
    # The package's own service is not ours to run; where an init started it, stop that one only.
    "${AS_ROOT[@]}" pkill -f "nginx: master process /usr/sbin/nginx -g daemon on" >/dev/null 2>&1 || true
fi
find_nginx
