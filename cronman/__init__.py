"""cronman: a REST cron-management service with a replicated scheduler cluster."""

__version__ = "0.1.0"
