#!/usr/bin/env bash
# Copies the chat page's third-party ES modules (exact versions: package.json and
# package-lock.json here) from node_modules into ../static/vendor, with their licence files.
# Run by `make ui-vendor` after changing a version; the copies are committed, so neither the
# service nor the tests need npm. Files are copied byte for byte.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
out=../static/vendor
rm -rf "$out"
mkdir -p "$out/eventsource-parser" "$out/marked" "$out/dompurify"
cp node_modules/eventsource-parser/dist/{index,parse,errors}.js node_modules/eventsource-parser/LICENSE \
    "$out/eventsource-parser/"
cp node_modules/marked/lib/marked.esm.js node_modules/marked/LICENSE "$out/marked/"
cp node_modules/dompurify/dist/purify.es.mjs node_modules/dompurify/LICENSE "$out/dompurify/"
node -e '
const lock = require("./package-lock.json");
const lines = Object.entries(lock.packages)
  .filter(([path]) => path.startsWith("node_modules/") && !path.includes("@types"))
  .map(([path, p]) => `${path.slice("node_modules/".length)} ${p.version} ${p.license ?? ""} ${p.integrity}`);
require("fs").writeFileSync("../static/vendor/VERSIONS.txt", lines.join("\n") + "\n");
'
echo "vendored into $(cd "$out" && pwd):"
cat "$out/VERSIONS.txt"
