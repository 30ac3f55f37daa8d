"""Support modules for the test suite."""
