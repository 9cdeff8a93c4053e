"""The coordinator as a shared HTTP service (FastAPI), and its wire format."""
