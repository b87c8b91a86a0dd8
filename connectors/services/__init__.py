"""The connector engine: every write of the connectors app (services hold the rules)."""
