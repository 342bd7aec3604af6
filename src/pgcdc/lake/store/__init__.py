"""Where a lake keeps things: storage (local folders or S3, the lease), the pipeline's
state, the tables' layout and names, Delta's connector and log APIs, delta-rs reads, and
the catalog the tables are registered in."""
