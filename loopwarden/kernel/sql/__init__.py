"""The SQL beneath the store: every table described once, one module per backend behind a registry keyed by the store URL's scheme, their dialects, migrations and whole-store copies."""
