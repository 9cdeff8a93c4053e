"""How a protocol call's reads and writes reach the database: in one of two batches, alone
(``immediate.Immediate``) or as one call of a group (``grouped.Grouped``; on PostgreSQL the
group's searches are read ahead in one statement, ``read_ahead``). ``group_commit`` applies
a group's calls in one transaction, each in the group's batch (``apply_in_order``)."""
