"""Test doubles shared by the unit and bench tests: a fake engine, app helpers, fake bench models."""
