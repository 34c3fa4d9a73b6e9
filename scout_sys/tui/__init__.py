"""The terminal dashboard (textual). It renders Source snapshots and never probes."""
