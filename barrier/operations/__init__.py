"""The operator's operations (DESIGN §7): :mod:`.revise` a table and its downstream back to
a barrier, :mod:`.expire` snapshots no one needs, :mod:`.repair` the metadata from the
tables themselves."""
