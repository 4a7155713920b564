"""``cronman bench``: start a private stack (embedded PostgreSQL and Redis, the API, scheduler
nodes and a fast ledger receiver), run load scenarios against it and report the figures.

Modules:
- :mod:`cronman.bench.receiver` - the ledger receiver (its own process) and the handle to it;
- :mod:`cronman.bench.ledger` - what arrived compared with what the schedules say;
- :mod:`cronman.bench.loader` - jobs written straight into PostgreSQL with COPY;
- :mod:`cronman.bench.stack` - the processes of one bench run;
- :mod:`cronman.bench.ceiling` - the bare HTTP client (the machine's practical ceiling);
- :mod:`cronman.bench.peer` - APScheduler 3 firing the same job set (the peer);
- :mod:`cronman.bench.scenarios` - steady, ceiling, peer, burst, failover, scale, crud;
- :mod:`cronman.bench.report` - targets, the table and the JSON document;
- :mod:`cronman.bench.profiling` - py-spy on one node, and a summary of where it spends its time.
"""
