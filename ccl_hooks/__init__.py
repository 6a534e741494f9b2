"""aegis-stream: ccl_hooks."""
