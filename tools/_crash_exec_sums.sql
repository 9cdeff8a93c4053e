-- The crash harness's exec-mode intermediate job as a SQL file run by exec itself over
-- Spark Connect (lockstep exec sums --loop --remote sc://... --sql _crash_exec_sums.sql):
-- the same statements as _crash_exec_sums_spark.py, both aggregates of shopping at the
-- run's barrier, one sink after the other. exec SIGKILLed between the two INSERTs has
-- committed one sink of two (neither may be published); killed while one runs, the server
-- may finish it after exec is gone, and the catalog must refuse that late commit.
CREATE TABLE IF NOT EXISTS user_item_amount (user_id STRING, item_id STRING, amount BIGINT) USING iceberg;
INSERT OVERWRITE user_item_amount
  SELECT user_id, item_id, CAST(SUM(amount) AS BIGINT) FROM shopping GROUP BY user_id, item_id;
CREATE TABLE IF NOT EXISTS user_item_price (user_id STRING, item_id STRING, price BIGINT) USING iceberg;
INSERT OVERWRITE user_item_price
  SELECT user_id, item_id, CAST(SUM(price) AS BIGINT) FROM shopping GROUP BY user_id, item_id;
