#!/usr/bin/env bash
# Install Debian's chromium for the browser tests (tests/ui), once; a no-op when present.
# The tests drive it through Playwright's executable_path: no browser is downloaded.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: chromium is missing; install Debian's chromium package (tests/ui fail without it)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "install-chromium: $(chromium --version)"
