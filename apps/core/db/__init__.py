"""Database migrations (versioned SQL files) and the connection pool helpers."""
