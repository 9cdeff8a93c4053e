"""The coordinator's HTTP contract, shared by the service and its client: the wire format
of every value and error (:mod:`.wire`)."""
