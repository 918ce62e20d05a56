"""cdc package."""
