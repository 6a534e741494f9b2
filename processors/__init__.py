"""aegis-stream: processors."""
