"""Example pipelines, importable as ``lockstep.examples.<name>`` (copy them as a start)."""
