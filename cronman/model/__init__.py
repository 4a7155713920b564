"""The domain: job documents and their validation, schedules and cron, calendars, misfire and
backfill plans, slot hashing, URL and queue guards, signatures. Pure: no SQL, no Redis, no HTTP
client, no settings read here (a function that needs settings is handed them); imports only
cronman.errors and itself."""
