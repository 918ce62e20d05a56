"""event_store package."""
