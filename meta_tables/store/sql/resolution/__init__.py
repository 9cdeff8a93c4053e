"""Snapshot-set resolution (docs/design.md §3): the rule (``resolve``), its one statement
(``lookup``), and, on the service, the same resolution on the event loop (``on_loop``)
answered from the heads in memory when it may (``head_cache``)."""
