"""Storage: what is on disk and how it is read and written. Tables (Parquet written and read in
batches, with their provenance), the layout of every file the rules make, and the readers of users'
prompt files (JSONL, JSON, Parquet, Arrow, compressed) into normalised rows.

Imports `settings` only.
"""
