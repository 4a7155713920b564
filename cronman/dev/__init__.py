"""Development servers: real PostgreSQL, Redis and SQS run from pip packages (`cronman dev`, the
tests, the benchmarks) and a test receiver. Never imported by the API or the scheduler nodes; may
import cronman.store and everything below it."""
