"""A pipeline's life: planning from the source catalog, bootstrap, the initial copy, the
stream, failures, monitoring, DDL the lake follows or stops on, and verification."""
