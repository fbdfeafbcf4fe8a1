// "Fork from here" on an agent's message: `session/fork` (ACP's draft, answered by the gateway
// for any agent) with the gateway's `_meta.gateway.upToSeq`, the seq of that message's last
// update. The fork is a new session whose history is the conversation up to there; its agent
// either forked its own session or gets that history with the fork's first prompt.

/**
 * Forks `from` ({id, cwd, title, agent}) after update `seq`; the new session's list entry.
 * Its MCP servers are the original's (none are named here). At the newest update (`lastSeq`)
 * the whole session is forked, which an agent that forks sessions itself does on its own.
 */
export async function forkSession(conn, from, seq, lastSeq) {
  const params = { sessionId: from.id, cwd: from.cwd };
  if (seq < lastSeq) params._meta = { gateway: { upToSeq: seq } };
  const result = await conn.request('session/fork', params);
  const now = new Date().toISOString();
  return {
    sessionId: result.sessionId, cwd: from.cwd, title: from.title ? `${from.title} (fork)` : null,
    createdAt: now, updatedAt: now, _meta: { agent: from.agent, forkedFrom: { sessionId: from.id, seq } },
  };
}
