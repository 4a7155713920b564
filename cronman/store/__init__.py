"""PostgreSQL: the tables (db), the stores of jobs, calendars, backfills, keys, audit, commands,
notifications and throttles, the migrations' runner and the partitions. Imports cronman.errors,
cronman.settings, cronman.model and cronman.redis; never the CLI or the development servers."""
