-- The agent's session controls (`modes`, `configOptions`, `models` of its `session/new` answer,
-- kept current as they change): what `session/load` and `session/resume` answer with, so a page
-- that reloads can show the mode and model pickers. A column of its own, not part of `meta`: meta
-- is what `session/list`'s `search` looks in, and every session of an agent would match the names
-- and descriptions of its modes and models.
ALTER TABLE sessions ADD COLUMN controls TEXT NOT NULL DEFAULT '{}';
