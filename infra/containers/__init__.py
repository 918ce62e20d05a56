"""The stack as containers: images built from this folder (``images``), the engine that runs
them (``engine``) and a stack of containers started through its API (``stack``)."""
