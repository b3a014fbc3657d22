#!/usr/bin/env bash
# Rebuild the chat page's vendored libraries (marked, DOMPurify, highlight.js; versions pinned
# in ui-src/package.json and package-lock.json) into src/kvmem/ui/static/vendor.js.
# Needs Node.js and npm; the built file is committed, so `pip install` never needs Node.
set -euo pipefail
cd "$(dirname "$0")/../ui-src"
npm ci --no-audit --no-fund --ignore-scripts
out=../src/kvmem/ui/static
npx esbuild vendor.js --bundle --minify --format=iife --target=es2020 --legal-comments=eof \
  --outfile="$out/vendor.js"
cp node_modules/highlight.js/styles/github.min.css "$out/hljs-light.css"
cp node_modules/highlight.js/styles/github-dark.min.css "$out/hljs-dark.css"
echo "build-ui: wrote $out/vendor.js ($(wc -c <"$out/vendor.js") bytes)"
