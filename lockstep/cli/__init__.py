"""The ``lockstep`` command line (entry point :func:`main`)."""

from lockstep.cli.main import main

__all__ = ["main"]
