"""The stashers: writing outbox rows in the application's transaction (psycopg, asyncio, SQLAlchemy)."""
