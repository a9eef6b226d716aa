-- 0011's checks on the ledger's cached-token columns, validated in a transaction of their own: the
-- scan of the existing rows holds SHARE UPDATE EXCLUSIVE, so reserves and settles go on meanwhile
-- (a CHECK added with the column would have scanned under ACCESS EXCLUSIVE, holding them up).
ALTER TABLE usage_ledger VALIDATE CONSTRAINT usage_ledger_cached_price_per_million_check;
ALTER TABLE usage_ledger VALIDATE CONSTRAINT usage_ledger_cached_prompt_tokens_check;
-- The names are the ones PostgreSQL gave the checks when 0011 still declared them with the columns:
-- on a database that applied that 0011, they are valid already and this changes nothing.
