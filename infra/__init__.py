"""Settings, the local stack, the supervisor, the CLI and the demo."""
