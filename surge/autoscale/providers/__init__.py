"""Where replicas run: local processes (the default); the protocol a cluster provider implements."""
