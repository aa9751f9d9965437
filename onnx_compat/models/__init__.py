"""Bundled reference models, written as a user would write them."""
