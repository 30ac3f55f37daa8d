"""Test-only FencedModels with unique keys besides the primary key (no migrations: the test
database gets their tables from the models)."""
