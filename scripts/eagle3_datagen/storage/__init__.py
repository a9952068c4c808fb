"""Storage: what is on disk and how it is read and written: tables, the layout of every file the rules
make, and the readers of users' prompt files into normalised rows.

Imports `settings` only.
"""
