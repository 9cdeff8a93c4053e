"""Barriers and the job protocol: issuing epochs, reports, fencing, recovery."""
