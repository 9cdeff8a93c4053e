{{ config(materialized='table', file_format='iceberg') }}
select user_id, sum(price) as spend from {{ source('lockstep', 'shopping') }} group by user_id
