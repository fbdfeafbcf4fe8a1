#!/usr/bin/env bash
# Runs every test: formatting, lints, Rust unit + integration tests (SQLite and a real Postgres),
# the browser tests of the web UI, and the container test. Installs what a fresh machine lacks
# first.
#   bash scripts/test.sh          everything (what CI runs)
#   bash scripts/test.sh --fast   before a commit: lints, unit tests, the integration tests on SQLite
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
case "${1:-}" in
  --fast) fast=1 ;;
  "") ;;
  *) echo "usage: bash scripts/test.sh [--fast]" >&2; exit 2 ;;
esac

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }
apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null; then echo "missing: $* (no apt-get: install it yourself)" >&2; return 1; fi
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Postgres binaries for the throwaway test server (unless DATABASE_URL points at one).
have_initdb() { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
if [[ "${DATABASE_URL:-}" != postgres* ]] && ! have_initdb; then
  echo "== installing postgresql"; apt_install postgresql
fi
# bubblewrap for the agent sandbox (tests/tenancy.rs requires it to work), and the system
# Python the probe agent runs on (no launcher scripts between it and the gateway).
command -v bwrap >/dev/null || { echo "== installing bubblewrap"; apt_install bubblewrap; }
# slirp4netns (and iproute2's `ip`) for network = "egress-only" (tests/tenancy.rs and
# tests/signin_terminal.rs start agents with it).
command -v slirp4netns >/dev/null || { echo "== installing slirp4netns"; apt_install slirp4netns; }
command -v ip >/dev/null || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || { echo "== installing iproute2"; apt_install iproute2; }
[ -x /usr/bin/python3 ] || { echo "== installing python3"; apt_install python3; }
# The official ACP Python SDK, for the third-party agent in tests/agents.
if ! python3 -c 'import acp, websockets, httpx, h2' 2>/dev/null; then
  echo "== installing the ACP Python SDK"; python3 -m pip install -q -r tests/agents/requirements.txt
fi
# The OpenID provider the sign-in tests run (oidc-provider from npm, tests/oidc).
command -v node >/dev/null || { echo "== installing nodejs"; apt_install nodejs npm; }
[ -d tests/oidc/node_modules/oidc-provider ] || { echo "== installing the test OpenID provider"; (cd tests/oidc && npm ci --no-audit --no-fund --silent); }
# Chromium and playwright-core for the browser test.
if [ -f tests/ui/package.json ]; then
  command -v chromium >/dev/null || { echo "== installing chromium"; apt_install chromium; }
  # Installed again whenever a pinned package is missing (an older checkout's node_modules).
  for pkg in playwright-core axe-core @agentclientprotocol/sdk; do
    [ -d "tests/ui/node_modules/$pkg" ] || { echo "== installing the browser tests' packages"; (cd tests/ui && npm ci --no-audit --no-fund --silent); break; }
  done
fi

# Each step says when it began (seconds since the start), so a slow CI run shows which step grew.
section() { echo "== $* (at ${SECONDS} s)"; }

# The tests must leave shared directories as they found them (mode and owner): checked at the end.
shared_dirs() { stat -c '%n %a %u:%g' / /tmp /var/tmp "${TMPDIR:-/tmp}" 2>/dev/null; }
shared_before=$(shared_dirs)

section "cargo fmt --check"
cargo fmt --check
section "cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings
# The crate's rustdoc is for the people who work on it: private items are documented, so a link
# to one is fine; a link to nothing is not.
section "rustdoc: every intra-doc link resolves"
RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" cargo doc --no-deps --document-private-items --quiet
if [ "$fast" = 1 ]; then
  # The unit tests and the integration binary without Postgres, built side by side in one cargo
  # run: the *_postgres twins, row-level security and every test of several replicas (which share
  # one Postgres) are skipped, and a test that reaches for Postgres anyway fails, saying so
  # (ACP_TEST_NO_POSTGRES).
  section "unit tests, and the integration tests on SQLite"
  ACP_TEST_NO_POSTGRES=1 cargo test --quiet --lib --bins --test it -- \
    --skip postgres --skip replicas --skip _replica_ --skip rls::
section "fast tier passed"
  exit 0
fi
section "cargo test"
cargo test --no-fail-fast 2>&1 | tee target/test-output.txt | grep -Ev '^test .* \.\.\. ok$'
if grep -q "test result: FAILED" target/test-output.txt || ! grep -q "test result: ok" target/test-output.txt; then
  echo "cargo test failed" >&2; exit 1
fi
if [ -f tests/ui/package.json ]; then
  section "vendored web UI libraries match their pinned npm packages"
  bash scripts/vendor-ui.sh --check
  section "the test OpenID provider's own check"
  (cd tests/oidc && node --test)
  section "browser tests (chromium)"
  cargo build --quiet
  (cd tests/ui && node --test)
fi
section "container and Kubernetes test"
# The debug binary the tests above built: a dist build here would add 15-20 min on 2 cores
# (ACP_CONTAINER_PROFILE=dist tests the binary the image ships).
cargo build --quiet
ACP_CONTAINER_PROFILE="${ACP_CONTAINER_PROFILE:-debug}" bash scripts/container-test.sh
section "shared directories keep their mode and owner"
if [ "$(shared_dirs)" != "$shared_before" ]; then
  echo "a test changed a shared directory:" >&2; diff <(echo "$shared_before") <(shared_dirs) >&2; exit 1
fi
echo "$shared_before" | sed 's/^/   /'
section "all tests passed"
