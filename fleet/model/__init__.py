"""The words every layer shares: outcomes and reasons, the report of a run and of a host, the errors, the table of
health checks and the host log's protocol. The lowest room: it imports nothing of fleet outside itself."""
