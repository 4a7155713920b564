"""Redis: the connection for any topology (standalone, Sentinel, Cluster), the key names, the Lua
scripts (lua/) and the live cluster's membership. Imports cronman.errors and cronman.model, nothing
above."""
