"""An app with no models of its own: the models a docs example defines are registered here,
in an isolated registry, while tests/test_doc_examples.py runs it."""
