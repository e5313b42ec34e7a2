-- Read-only keys (issue 35): a key that recalls and searches its user's memories but never
-- writes or forgets (the API, the memory proxy, MCP and the web page all honour it).

ALTER TABLE api_keys ADD COLUMN read_only boolean NOT NULL DEFAULT false;
