"""The ground floor: settings, roles and identity, ACL parsing, the database, telemetry.

Everything else may import these; they import nothing else of this project."""
