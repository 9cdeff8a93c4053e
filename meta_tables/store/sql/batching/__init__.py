"""How a protocol call's reads and writes reach the database: alone (``batch.Immediate``) or
as one call of a group (``grouped.Grouped``, ``groups.apply_in_order``; on PostgreSQL the
group's searches are read ahead in one statement, ``read_ahead``)."""
