"""The log tier (FLIP-188's log, Paimon's LogStore): a table's changes in a Kafka topic,
one transaction per barrier, so that streaming consumers see each barrier's changes whole.

- :mod:`~lockstep.barrier.log.changelog`: the changes between two versions of a table and
  their Debezium JSON records, with a marker per partition after each barrier;
- :mod:`~lockstep.barrier.log.kafka_log`: a table's topic and its transactional writer,
  fenced by Kafka as a job instance is by Lockstep, which writes a published barrier's
  changes exactly once (what the log already holds is read back after fencing).

The reader that aligns several tables' logs on barriers is ``lockstep.readers.log_stream``.
"""
