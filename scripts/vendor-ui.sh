#!/usr/bin/env bash
# Vendors the web UI's third-party libraries into static/vendor/ from the npm registry: exact
# versions, tarballs checked against the registry's sha512 integrity, licences copied beside them.
# The gateway serves static/ as it is (no build step), so what this writes is committed.
#   bash scripts/vendor-ui.sh          rewrite static/vendor/
#   bash scripts/vendor-ui.sh --check  fail if static/vendor/ differs from what it would write
set -euo pipefail
cd "$(dirname "$0")/.."

# name@version, then what to take from the package (source path -> file under static/vendor/).
PACKAGES=(
  "marked@18.2.1"                  # Markdown: CommonMark + GFM (tables, task lists)
  "dompurify@3.4.18"               # HTML sanitizer for everything Markdown produces
  "@highlightjs/cdn-assets@11.12.0" # syntax highlighting (common languages) and its themes
  "diff@9.0.0"                     # line diffs for `diff` tool-call content
  "anser@2.3.5"                    # ANSI SGR escapes to structured spans (terminal output)
  "@xterm/xterm@6.0.0"             # the in-page terminal of terminal sign-ins (signin-terminal.html)
)

out=static/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/vendor"
mkdir -p "$dest/licenses"

fetch() { # fetch NAME@VERSION DIR: unpacks the checked tarball into DIR
  local spec=$1 dir=$2 integrity tarball
  integrity=$(npm view "$spec" dist.integrity 2>/dev/null)
  (cd "$work" && npm pack --silent "$spec" >/dev/null 2>&1)
  tarball=$(ls -t "$work"/*.tgz | head -1)
  local got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
  [ "$got" = "$integrity" ] || { echo "integrity mismatch for $spec: $got != $integrity" >&2; exit 1; }
  mkdir -p "$dir" && tar xzf "$tarball" -C "$dir" && rm "$tarball"
}

# A CommonJS or UMD file as an ES module with one default export (no bundler needed).
as_module() { # as_module SRC DEST BANNER
  { echo "// $3"; echo "// Wrapped as an ES module by scripts/vendor-ui.sh; the original follows unchanged."
    echo "const module = { exports: {} }; const exports = module.exports;"
    cat "$1"; echo; echo "export default module.exports;"; } > "$2"
}

manifest="$dest/VERSIONS"
: > "$manifest"
for spec in "${PACKAGES[@]}"; do
  name=${spec%@*}; version=${spec##*@}; pkg="$work/$(echo "$name" | tr '/@' '__')"
  fetch "$spec" "$pkg"
  p="$pkg/package"
  case "$name" in
    marked) cp "$p/lib/marked.esm.js" "$dest/marked.js" ;;
    dompurify) cp "$p/dist/purify.es.mjs" "$dest/purify.js" ;;
    @highlightjs/cdn-assets)
      cp "$p/es/highlight.min.js" "$dest/highlight.js"
      cp "$p/styles/github.min.css" "$dest/highlight-light.css"
      cp "$p/styles/github-dark.min.css" "$dest/highlight-dark.css" ;;
    diff) as_module "$p/dist/diff.js" "$dest/diff.js" "jsdiff $version (BSD-3-Clause), dist/diff.js" ;;
    anser) as_module "$p/lib/index.js" "$dest/anser.js" "anser $version (MIT), lib/index.js" ;;
    @xterm/xterm)
      # The ES module without its source-map comment (the map is not vendored).
      sed '/^\/\/# sourceMappingURL=/d' "$p/lib/xterm.mjs" > "$dest/xterm.js"
      cp "$p/css/xterm.css" "$dest/xterm.css" ;;
  esac
  license=$(ls "$p" | grep -iE '^licen[cs]e' | head -1)
  cp "$p/$license" "$dest/licenses/$(echo "$name" | tr '/@' '__' | sed 's/^_//').txt"
  [ "$name" = dompurify ] && cp "$p/LICENSE-MPL" "$dest/licenses/dompurify-MPL.txt"
  echo "$name $version $(npm view "$spec" license 2>/dev/null) $(npm view "$spec" dist.integrity 2>/dev/null)" >> "$manifest"
done

if [ "${1:-}" = --check ]; then
  if ! diff -r "$dest" "$out" >/dev/null; then
    diff -r "$dest" "$out" | head -20 >&2
    echo "static/vendor/ differs from scripts/vendor-ui.sh's output: run it and commit" >&2; exit 1
  fi
  echo "static/vendor/ matches the pinned packages"
else
  rm -rf "$out" && cp -r "$dest" "$out"
  echo "vendored into $out:"; cat "$out/VERSIONS"
fi
