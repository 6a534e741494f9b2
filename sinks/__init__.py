"""aegis-stream: sinks."""
