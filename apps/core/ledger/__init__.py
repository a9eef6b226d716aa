"""Two-phase token ledger (docs/architecture.md D6): contract in `api`, PostgreSQL implementation in `pg`."""
