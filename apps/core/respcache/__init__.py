"""The response cache (docs/response-cache.md): opt-in per team and model, exact and semantic matches,
answers encrypted with the team's key. `policy` (the admin's settings), `keys` (what is cacheable and its
match keys), `sealing` (the team's keys), `entry` (what is stored and how it is replayed), `store`
(PostgreSQL with pgvector)."""
