-- Whether a controller's share lets its holder's prompts run on the owner's agent while that agent
-- carries the owner's stored agent keys or their MCP servers' secret headers (`owner_keys`, off
-- unless the owner turns it on for that share; README "Sharing").
ALTER TABLE session_shares ADD COLUMN owner_keys BOOLEAN NOT NULL DEFAULT FALSE;
