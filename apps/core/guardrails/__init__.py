"""Guardrails: per-team policies of checks on a request's text (input) and its streamed answer (output),
each a detector and an action (redact, block, flag), plus an optional guard model (docs/guardrails.md).

`policy` (the document, its validation and compiled form), `detectors` (SSN, phone, email, date of
birth), `custom` (a team's own patterns on RE2, over the subset of `syntax`, with `forms` and `rules`),
`scan` (one text), `stream` (one streamed choice, `OutputScanner`), `bodies` (`scan_input` of a request
body), `guard_model` (prompt and verdict), `decisions` (what was decided, `GuardrailBlocked`), `api`
(the store's contract, `GuardrailPolicies`), `store` (PostgreSQL, cached) and `metrics`. Nothing here
stores or logs content.
"""
