"""Contract tests: the catalog and the stand-ins held to the published contracts."""
