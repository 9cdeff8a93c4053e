{{ config(materialized='table', file_format='iceberg') }}
select user_id, spend from {{ ref('user_totals') }} order by spend desc limit 2
