-- The shopping pipeline's sum_amount as a plain Spark SQL file: no Lockstep code.
-- Run it as a job's barrier: lockstep exec sum_amount -- spark-sql -f sum_amount.sql
-- Names are unqualified: the run's catalog is the default one (spark.sql.defaultCatalog),
-- its namespace default. Under the run's view, shopping is at the job's barrier and the
-- MERGE is staged until the barrier is published. Recomputed from shopping at the
-- barrier, so a rerun of the barrier writes the same rows.
CREATE TABLE IF NOT EXISTS user_item_amount (
  user_id STRING, item_id STRING, amount BIGINT
) USING iceberg;

MERGE INTO user_item_amount AS t
USING (
  SELECT user_id, item_id, SUM(amount) AS amount
  FROM shopping
  GROUP BY user_id, item_id
) AS s
ON t.user_id = s.user_id AND t.item_id = s.item_id
WHEN MATCHED AND t.amount <> s.amount THEN UPDATE SET amount = s.amount
WHEN NOT MATCHED THEN INSERT (user_id, item_id, amount) VALUES (s.user_id, s.item_id, s.amount);
