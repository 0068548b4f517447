"""Registry Coordinator: durable, auditable workflows over Registry Stack products."""

__version__ = "0.1.0"
