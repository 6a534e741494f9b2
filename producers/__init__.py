"""aegis-stream: producers."""
