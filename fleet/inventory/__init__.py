"""The inventory: which hosts there are, and every variable of each, resolved.

`datafile` reads a YAML or TOML file into plain data; `schema` says what each level
(defaults, a group's vars, a host's vars) may write; `load` validates, merges and resolves
one frozen `host.Host` per node, whose fields declare every host variable once
(`variables` reads that declaration back, for docs/operating.md's table); `nodesets` expands
ClusterShell node sets; `targeting.select` picks the hosts a command works on;
`validate` holds the checks every value reaching a remote command passes;
`files.check_files` refuses, before anything connects, a missing key or known_hosts.
"""
