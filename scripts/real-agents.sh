#!/usr/bin/env bash
# Signing in the real agents, offline (not part of scripts/test.sh: it downloads ~300 MB from npm).
# Installs @zed-industries/claude-agent-acp 0.23.1 and @zed-industries/codex-acp 0.16.0 under
# target/real-agents, starts the debug gateway with claude as the default agent and codex beside
# it, and shows: each agent's sign-in methods as /api/agents gives them; codex taking a user's key
# (PUT /api/agents/codex/keys); `claude /login` starting in the terminal route for that user (it
# cannot finish offline); and no login process left once the socket is closed.
#   cargo build && bash scripts/real-agents.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$PWD/target/real-agents
mkdir -p "$dir"
[ -x "$dir/node_modules/.bin/claude-agent-acp" ] && [ -x "$dir/node_modules/.bin/codex-acp" ] || \
  (cd "$dir" && npm install --no-audit --no-fund --silent @zed-industries/claude-agent-acp@0.23.1 @zed-industries/codex-acp@0.16.0)
rm -rf "$dir/data"
exec python3 scripts/real_agents.py "$dir" "$PWD/target/debug/acp-gateway"
