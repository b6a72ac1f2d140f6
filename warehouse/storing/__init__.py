"""The warehouse file: opening it (single writer), schema and views, transactions, revisions, checks, and the
one-line failures every room raises. Imports nothing from `running/` or `publishing/`."""
