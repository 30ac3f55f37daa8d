"""The reader's project the docs' examples assume (``Product``, ``Order``, ``Invoice``...),
for tests/test_doc_examples.py, which runs them (no migrations: the test database gets the
tables from the models)."""
