#!/usr/bin/env bash
# System packages the test suite needs (called by .ci/run when present).
# Installs only what is missing, quietly. Fails loudly (exit 1) when it cannot: the tests that
# need nginx would otherwise fail later with a less direct message.
set -u
need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)  # tests/cache: HTTP Range server
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "ci_system_deps: not root and no sudo; cannot install ${need[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# Installing nginx would start the system service on 0.0.0.0:80; tests run their own
# loopback instances, so forbid service starts for the duration (unless a policy exists).
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ] && printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null 2>&1; then
    $SUDO chmod +x "$policy" && added_policy=1
fi
$SUDO apt-get update -qq >/dev/null 2>&1 || true
status=0
if ! $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1; then
    echo "ci_system_deps: apt-get install ${need[*]} failed" >&2
    status=1
fi
if [ "$added_policy" -eq 1 ]; then $SUDO rm -f "$policy"; fi
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || {
    echo "ci_system_deps: nginx is still not installed" >&2; status=1; }
exit $status
