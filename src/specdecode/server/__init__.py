"""`specdecode serve`: an OpenAI-compatible HTTP server with speculative decoding."""
