"""Two-phase token ledger (D6): contract in `api`, PostgreSQL implementation in `pg`."""
