#!/usr/bin/env bash
# Headless Chromium from Debian's packages for the transcript viewer's browser test
# (tests/test_view.py drives it with Playwright at /usr/bin/chromium; without it that test
# is skipped). Idempotent: does nothing when /usr/bin/chromium is already there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
