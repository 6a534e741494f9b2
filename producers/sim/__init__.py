"""aegis-stream: producers/sim."""
