"""The coordinator as a shared HTTP service (FastAPI); its wire format is lockstep.api."""
