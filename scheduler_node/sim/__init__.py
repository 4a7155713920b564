"""The deterministic simulation of a cluster (the FoundationDB approach): the real firing core,
ownership and control plane of several nodes on a virtual clock, against simulated Redis,
PostgreSQL and receivers, under a nemesis drawn from a seed. ``cronman sim`` runs it; a failing
seed is printed and replays exactly."""
