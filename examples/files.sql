-- A udfchain script over this repository's own example files.
-- Run: cargo run -- run examples/files.sql
SET prefetch = 4;
SET parallel = 2;

-- Built-in UDFs by name; the engine prefetches the files they read.
CREATE DATASET example_files AS
  SELECT file.path AS path,
         file_size(file) AS bytes,
         line_count(file) AS lines,
         sha256(file) AS sha256
  FROM read_storage('examples', '*.rs');

-- The dataset reads back like any table.
SELECT path, bytes, lines FROM read_dataset('example_files') ORDER BY path;

SHOW DATASETS;
