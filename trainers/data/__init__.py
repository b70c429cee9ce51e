"""Data: feature specs applied to Parquet/CSV/Criteo files, encoding, capping, synthesis."""
