-- The shopping pipeline's sum_price as a plain Spark SQL file: no Lockstep code.
-- Run it as a job's barrier: lockstep exec sum_price -- spark-sql -f sum_price.sql
-- Names are unqualified: the run's catalog is the default one (spark.sql.defaultCatalog),
-- its namespace default. Under the run's view, shopping is at the job's barrier and the
-- MERGE is staged until the barrier is published. Recomputed from shopping at the
-- barrier, so a rerun of the barrier writes the same rows.
CREATE TABLE IF NOT EXISTS user_item_price (
  user_id STRING, item_id STRING, price BIGINT
) USING iceberg;

MERGE INTO user_item_price AS t
USING (
  SELECT user_id, item_id, SUM(price) AS price
  FROM shopping
  GROUP BY user_id, item_id
) AS s
ON t.user_id = s.user_id AND t.item_id = s.item_id
WHEN MATCHED AND t.price <> s.price THEN UPDATE SET price = s.price
WHEN NOT MATCHED THEN INSERT (user_id, item_id, price) VALUES (s.user_id, s.item_id, s.price);
