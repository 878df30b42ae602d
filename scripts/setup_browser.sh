#!/usr/bin/env bash
# Headless Chromium + its WebDriver for the dashboard's browser test (tests/integration/dashboard/test_browser.py).
# Idempotent: does nothing when both are already installed. Debian/Ubuntu (apt-get); run as root or with sudo.
# Selenium itself comes with the Python dev extra (pip install -e '.[dev]').
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if (have chromium || have chromium-browser) && have chromedriver; then
  echo "setup_browser: chromium and chromedriver already installed"
  exit 0
fi
if ! have apt-get; then
  echo "setup_browser: no apt-get here; install Chromium and a matching chromedriver by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver
chromium --version && chromedriver --version
