"""The job protocol's store functions: what each call reads, checks and writes
(docs/design.md §4). Barriers and instances (``instances``), the next-barrier search
(``search``) and the next barrier (``next_barrier``), reports (``reports``), recovery
(``recovery``), and the writes that wake waiting jobs (``announced``). Their I/O goes
through a batch (``batching/``)."""
